"""How the server sizes itself from the instance: how many CPUs and GPUs it may use and how much
memory, and from them how many workers, each with how many threads (`plan`).

What is read, and why:
  sched_getaffinity      the cores the process may run on (taskset, --cpuset-cpus, Kubernetes' static
                         CPU manager); os.cpu_count() counts the host's, affinity or not
  the CPU quota          cgroup v2's cpu.max, v1's cpu.cfs_quota_us over cpu.cfs_period_us: `docker run
                         --cpus 2` and Kubernetes' CPU limits throttle the process without narrowing its
                         affinity, so that a 64-core host shows 64 cores to a container given 2, and 64
                         threads would share 2 cores' time. Rounded up: 1.5 CPUs is 2 threads, since a
                         thread per whole CPU would leave the half unused
  the memory limit       cgroup v2's memory.max, v1's memory.limit_in_bytes: more workers than it holds
                         get the container killed
  /proc/self/cgroup      which cgroup the process is in. With a private cgroup namespace (Docker on
                         cgroup v2) /sys/fs/cgroup is the container's own cgroup and this says "/"; with
                         the host's (--cgroupns=host, some Kubernetes setups, or a process in a child
                         cgroup) /sys/fs/cgroup is the host's tree and the limits are at this path. A
                         parent's limit binds its children too, whatever theirs says, so the smallest one
                         from that path up to the mount's root is the one that applies. Where the path
                         is not under the mount (Docker on cgroup v1 says /docker/<id> but mounts that
                         cgroup as the root; a path outside a private namespace reads /../..), the
                         mount's root is read alone
  /dev/nvidia[0-9]*      the GPUs (the NVIDIA runtime gives a container only the nodes of its own)
  the model's files      each worker holds about twice the SavedModel's size in memory
Nothing here logs or raises on what it reads: a file missing, unreadable or garbled counts as no
limit, and the server says what it chose (Plan.why).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
# v1 hierarchies mounted with another controller, as most distributions do: where /proc/self/cgroup
# does not say (unreadable), the names tried beside the controller's own
V1_JOINED = {"cpu": ("cpu,cpuacct", "cpuacct,cpu")}

# a worker's memory beside its model: TensorFlow's runtime, the graph, a batch's activations at
# 224x224; and each thread calling the model beyond the first, the activations of one more batch
# (`python -m bench.serve` prints a worker's PSS; docs/speed.md, Figures behind the code's choices:
# A worker's memory)
WORKER_MB = 700
RUNNER_MB = 400
UNLIMITED = 1 << 60  # cgroup v1 says "no limit" with a number near 2**63


class Cpus(int):
    """A count of CPUs that says where it came from (`source`, e.g. "cgroup cpu.max quota"): an int
    everywhere else, so that the count's source reaches Plan.why without another argument."""

    source: str

    def __new__(cls, count: int, source: str) -> Cpus:
        made = super().__new__(cls, count)
        made.source = source
        return made


def cpus(cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> Cpus:
    """The CPUs the process may use: its affinity's count, or where a cgroup CPU quota on its cgroup
    or an ancestor is smaller, that quota rounded up; at least 1."""
    best = min([_affinity(), *_cpu_quotas(cgroup_root, proc_self_cgroup)])  # (a tie: the affinity named)
    return Cpus(max(1, best), best.source)


def _affinity() -> Cpus:
    """The cores the process may run on (all the host's, off Linux)."""
    try:
        return Cpus(len(os.sched_getaffinity(0)), "sched_getaffinity")
    except (AttributeError, OSError):  # (not Linux)
        return Cpus(os.cpu_count() or 1, "os.cpu_count")


def _cpu_quotas(cgroup_root: Path, proc_self_cgroup: Path) -> list[Cpus]:
    """Each CPU quota along the process's cgroup path, in CPUs rounded up."""
    v2, v1 = _cgroup_dirs(cgroup_root, proc_self_cgroup, "cpu")
    quotas = [_cpus_of((_read(folder / "cpu.max") or "").split(), "cgroup cpu.max quota") for folder in v2]
    quotas += [_cpus_of([_read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")],
                        "cgroup cpu.cfs_quota_us quota") for folder in v1]
    return [quota for quota in quotas if quota is not None]


def _cpus_of(quota_and_period: list, source: str) -> Cpus | None:
    """`quota` microseconds of CPU time each `period` as whole CPUs, rounded up; None for no quota
    (v2's "max", v1's -1) or anything unreadable."""
    if len(quota_and_period) != 2:
        return None
    quota, period = (_integer(text) for text in quota_and_period)
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return Cpus(-(-quota // period), source)


def gpus(dev: Path = Path("/dev")) -> int:
    """The GPUs this container sees (the NVIDIA runtime gives it only /dev nodes of its own)."""
    return sum(1 for node in dev.glob("nvidia[0-9]*"))


def memory_limit(cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> int | None:
    """The memory limit in bytes that binds the process: the smallest of cgroup v2's memory.max and
    v1's memory.limit_in_bytes on its cgroup and its ancestors; None where there is none."""
    v2, v1 = _cgroup_dirs(cgroup_root, proc_self_cgroup, "memory")
    limits = [_integer(_read(folder / "memory.max")) for folder in v2]
    limits += [_integer(_read(folder / "memory.limit_in_bytes")) for folder in v1]
    limits = [limit for limit in limits if limit is not None and 0 < limit < UNLIMITED]
    return min(limits, default=None)


def memory_available(cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP,
                     meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes of memory the process can still take: the least, over the cgroups that limit it (v2's
    memory.max less memory.current, v1's memory.limit_in_bytes less memory.usage_in_bytes, each
    usage less the page cache the kernel can drop, inactive_file, as the working set of `docker
    stats` and the kubelet counts), and the host's MemAvailable; None where neither can be read."""
    v2, v1 = _cgroup_dirs(cgroup_root, proc_self_cgroup, "memory")
    left = [(_integer(_read(folder / "memory.max")),
             _less(_integer(_read(folder / "memory.current")), _stat(folder / "memory.stat", "inactive_file")))
            for folder in v2]
    left += [(_integer(_read(folder / "memory.limit_in_bytes")),
              _less(_integer(_read(folder / "memory.usage_in_bytes")),
                    _stat(folder / "memory.stat", "total_inactive_file")))
             for folder in v1]
    room = [limit - used for limit, used in left if limit is not None and used is not None and 0 < limit < UNLIMITED]
    found = re.search(r"^MemAvailable:\s+(\d+) kB", _read(meminfo) or "", re.M)
    if found:
        room.append(int(found[1]) * 1024)
    return max(0, min(room)) if room else None


def _stat(path: Path, key: str) -> int:
    """A memory.stat file's value for `key` (0 where it is not there)."""
    found = re.search(rf"^{key} (\d+)$", _read(path) or "", re.M)
    return int(found[1]) if found else 0


def _less(used: int | None, droppable: int) -> int | None:
    return None if used is None else max(0, used - droppable)


def _cgroup_dirs(cgroup_root: Path, proc_self_cgroup: Path, controller: str) -> tuple[list[Path], list[Path]]:
    """The folders holding `controller`'s limits on the process's cgroup and its ancestors: in the
    cgroup v2 tree (mounted at `cgroup_root`), and in v1's tree for the controller (under it)."""
    v2_path, v1_paths = _cgroup_paths(proc_self_cgroup)
    controllers, v1_path = v1_paths.get(controller, (controller, "/"))
    mount = _v1_mount(cgroup_root, controller, controllers)
    return _path_and_ancestors(cgroup_root, v2_path), (_path_and_ancestors(mount, v1_path) if mount else [])


def _cgroup_paths(proc_self_cgroup: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """/proc/self/cgroup's lines ("0::/path" for v2, "N:cpu,cpuacct:/path" for v1) as v2's path and,
    for each v1 controller, its hierarchy's controllers as written and its path; "/" and none where
    unreadable (not Linux), so that the mount's root is read as before."""
    v2_path, v1_paths = "/", {}
    for line in (_read(proc_self_cgroup) or "").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if not controllers:
            v2_path = path
        for controller in controllers.split(","):
            v1_paths.setdefault(controller, (controllers, path))
    return v2_path, v1_paths


def _v1_mount(cgroup_root: Path, controller: str, controllers: str) -> Path | None:
    """Where v1 mounts `controller`'s hierarchy: named as /proc/self/cgroup lists its controllers
    ("cpu,cpuacct"), or as the controller alone, or as it is usually joined (distributions make one
    and link the others to it); None where none is there (cgroup v2 alone)."""
    for name in (controllers, controller, *V1_JOINED.get(controller, ())):
        if name and _is_dir(cgroup_root / name):
            return cgroup_root / name
    return None


def _path_and_ancestors(mount: Path, path: str) -> list[Path]:
    """`mount`/`path` and each folder above it up to `mount`; `mount` alone where that path is not
    under it (or climbs out of it with "..")."""
    relative = PurePosixPath(path.strip()).relative_to("/") if path.strip().startswith("/") else None
    if relative is None or ".." in relative.parts or not _is_dir(mount / relative):
        return [mount]
    return [mount / relative] + [mount / parent for parent in relative.parents]


def _is_dir(path: Path) -> bool:
    """Whether `path` is a folder; False where it cannot be looked at."""
    try:
        return path.is_dir()
    except (OSError, ValueError):  # (a name too long, a NUL in a garbled path)
        return False


def _read(path: Path) -> str | None:
    """The file's text, or None where it cannot be read as text."""
    try:
        return path.read_text()
    except (OSError, ValueError):  # (ValueError: not UTF-8, or a NUL in the path)
        return None


def _integer(text: str | None) -> int | None:
    """The whole number `text` holds, or None."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def model_bytes(model_dir: Path) -> int:
    """The size of the model's files, in bytes."""
    return sum(f.stat().st_size for f in Path(model_dir).rglob("*") if f.is_file())


@dataclass(frozen=True)
class Plan:
    """How the server uses the instance: `workers` processes, each with `runners` threads calling
    its model at once, TensorFlow with `intra` threads within an op and `inter` ops at once; `why`
    each choice was made (logged at start)."""
    workers: int
    runners: int
    intra: int
    inter: int
    why: tuple[str, ...]


def plan(cpus: int, gpu_count: int, memory: int | None, model_size: int, asked: int | None = None,
         intra: int | None = None, inter: int | None = None) -> Plan:
    """One worker per GPU, calling its model from one thread, TensorFlow on its share of the cores
    (the decoding); on a host without one, one worker whose model is called from a thread per core,
    each call on one TensorFlow thread; never more workers than `memory` holds. `asked`
    (SAGEMAKER_MODEL_SERVER_WORKERS) and `intra`, `inter` (TF_NUM_INTRAOP_THREADS,
    TF_NUM_INTEROP_THREADS) win; the cores are shared among the workers."""
    why = [_cpus_said(cpus)]
    if asked:
        workers = asked
        why.append(f"SAGEMAKER_MODEL_SERVER_WORKERS={asked}")
    elif gpu_count:
        workers = gpu_count
        why.append(f"{gpu_count} GPU(s): one worker each")
    else:
        workers = 1
        why.append(f"no GPU: one worker, calling its model from a thread per core, {cpus}")
    runners = 1 if gpu_count else max(1, cpus // workers)
    each = (WORKER_MB + RUNNER_MB * (runners - 1)) * 2**20 + 2 * model_size
    if memory is None:
        why.append("no memory limit")
    else:
        fits = memory // each
        held = f"the memory limit, {memory / 2**20:.0f} MB, holds {fits} at about {each / 2**20:.0f} MB each"
        if fits < workers and not asked:
            workers = max(1, fits)
            why.append(held if fits else f"warning: {held}; one started anyway")
        else:
            why.append(held if fits >= workers else f"warning: {held}")
    share = max(1, cpus // workers)
    default_intra, default_inter = (share, share) if gpu_count else (1, runners)
    if intra or inter:
        why.append(f"TensorFlow threads as TF_NUM_{'INTRAOP' if intra else 'INTEROP'}_THREADS says")
    return Plan(workers, runners, intra or default_intra, inter or default_inter, tuple(why))


def _cpus_said(count: int) -> str:
    """The CPU count as Plan.why gives it: "2 CPUs (cgroup cpu.max quota)", the source where known."""
    return f"{count} CPU{'' if count == 1 else 's'}" + (f" ({count.source})" if isinstance(count, Cpus) else "")
