"""What the server reads of the instance (keras_pipe_serve.sizing): the CPUs it may use, its affinity
narrowed by a cgroup CPU quota, and the memory limit, each the smallest along the process's cgroup
path (/proc/self/cgroup) up to the mount's root, in fake cgroup v2 and v1 trees; and never an
exception for a file it cannot make sense of."""

import os

import pytest
from keras_pipe_serve.sizing import Cpus, cpus, memory_available, memory_limit, plan

MB = 2**20
V1_NO_LIMIT = "9223372036854771712\n"  # (what cgroup v1 writes for none)


@pytest.fixture(autouse=True)
def host_of_64_cores(monkeypatch):
    """A host of 64 cores, all in the process's affinity: only a quota makes fewer."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)


def cgroups(tmp_path, proc_self_cgroup, files: dict):
    """A cgroup mount (its root: tmp_path/"cgroup") holding `files` (text, bytes, or None for a
    folder in a file's place), and the /proc/self/cgroup that places the process in it."""
    root = tmp_path / "cgroup"
    root.mkdir()
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    proc = tmp_path / "proc-self-cgroup"
    if proc_self_cgroup is not None:
        proc.write_bytes(proc_self_cgroup) if isinstance(proc_self_cgroup, bytes) else proc.write_text(proc_self_cgroup)
    return root, proc


@pytest.mark.parametrize("files, limit", [
    ({"memory.max": "2147483648\n"}, 2 * 1024 * MB),  # cgroup v2, --memory 2g
    ({"memory.max": "max\n"}, None),  # cgroup v2, no limit
    ({"memory/memory.limit_in_bytes": "1258291200\n"}, 1200 * MB),  # cgroup v1, --memory 1200m
    ({"memory/memory.limit_in_bytes": V1_NO_LIMIT}, None),  # cgroup v1, no limit
    ({}, None),  # neither (not Linux, or no memory controller)
])
def test_without_proc_self_cgroup_the_memory_limit_is_the_mounts_roots(tmp_path, files, limit):
    """No /proc/self/cgroup (not Linux): the mount's root alone is read, as a private cgroup
    namespace (Docker on cgroup v2) shows the container's own cgroup there."""
    root, proc = cgroups(tmp_path, None, files)
    assert memory_limit(root, proc) == limit


# a process in a nested cgroup v2, the namespace the host's (--cgroupns=host, Kubernetes): the root
# has no memory.max nor cpu.max (the kernel makes none there)
V2_POD = "0::/kubepods/pod1/ctr\n"


@pytest.mark.parametrize("files, limit", [
    ({"kubepods/pod1/ctr/memory.max": "1073741824\n"}, 1024 * MB),
    # the container's own says none; the pod's binds it
    ({"kubepods/pod1/ctr/memory.max": "max\n", "kubepods/pod1/memory.max": "536870912\n"}, 512 * MB),
    # the smallest along the path, wherever it is
    ({"kubepods/pod1/ctr/memory.max": "268435456\n", "kubepods/pod1/memory.max": "536870912\n",
      "kubepods/memory.max": "max\n"}, 256 * MB),
    ({"kubepods/pod1/ctr/memory.max": "max\n", "kubepods/memory.max": "max\n"}, None),
    # a sibling's limit is no limit of the process's
    ({"kubepods/pod1/ctr/memory.max": "max\n", "kubepods/pod2/memory.max": "1048576\n"}, None),
])
def test_the_memory_limit_is_the_smallest_along_the_cgroup_v2_path(tmp_path, files, limit):
    root, proc = cgroups(tmp_path, V2_POD, files)
    assert memory_limit(root, proc) == limit


@pytest.mark.parametrize("files, meminfo, left", [
    # v2: the limit less what is used but for the page cache the kernel can drop (a multi-model
    # endpoint's 507: keras_pipe_serve.models)
    ({"kubepods/pod1/ctr/memory.max": "1073741824\n", "kubepods/pod1/ctr/memory.current": "629145600\n",
      "kubepods/pod1/ctr/memory.stat": "anon 314572800\ninactive_file 209715200\nactive_file 1\n"}, None,
     (1024 - 600 + 200) * MB),
    # the pod's limit binds tighter than the container's
    ({"kubepods/pod1/ctr/memory.max": "max\n", "kubepods/pod1/ctr/memory.current": "1\n",
      "kubepods/pod1/memory.max": "536870912\n", "kubepods/pod1/memory.current": "419430400\n"}, None, 112 * MB),
    # no limit: the host's MemAvailable
    ({"kubepods/pod1/ctr/memory.max": "max\n", "kubepods/pod1/ctr/memory.current": "1\n"},
     "MemTotal: 8000000 kB\nMemAvailable:    2048000 kB\n", 2000 * MB),
    # both: the least
    ({"kubepods/pod1/ctr/memory.max": "4294967296\n", "kubepods/pod1/ctr/memory.current": "0\n"},
     "MemAvailable: 1024000 kB\n", 1000 * MB),
    ({}, None, None),  # nothing to read
])
def test_the_memory_left_is_the_least_of_the_cgroups_room_and_the_hosts(tmp_path, files, meminfo, left):
    root, proc = cgroups(tmp_path, V2_POD, files)
    info = tmp_path / "meminfo"
    if meminfo is not None:
        info.write_text(meminfo)
    assert memory_available(root, proc, info) == left


def test_the_memory_left_under_cgroup_v1_counts_its_page_cache_as_room(tmp_path):
    root, proc = cgroups(tmp_path, "4:memory:/docker/abc\n", {
        "memory/docker/abc/memory.limit_in_bytes": "1073741824\n", "memory/docker/abc/memory.usage_in_bytes": "943718400\n",
        "memory/docker/abc/memory.stat": "cache 500\ntotal_inactive_file 314572800\n",
        "memory/memory.limit_in_bytes": V1_NO_LIMIT, "memory/memory.usage_in_bytes": "1\n"})
    assert memory_available(root, proc, tmp_path / "no-meminfo") == (1024 - 900 + 300) * MB


@pytest.mark.parametrize("files, expected", [
    ({"kubepods/pod1/ctr/cpu.max": "200000 100000\n"}, (2, "cgroup cpu.max quota")),  # --cpus 2
    ({"kubepods/pod1/ctr/cpu.max": "max 100000\n"}, (64, "sched_getaffinity")),  # no quota
    ({"kubepods/pod1/ctr/cpu.max": "max 100000\n", "kubepods/pod1/cpu.max": "400000 100000\n"},
     (4, "cgroup cpu.max quota")),  # the pod's quota binds its containers
    ({"kubepods/pod1/ctr/cpu.max": "300000 100000\n", "kubepods/cpu.max": "800000 100000\n"},
     (3, "cgroup cpu.max quota")),
    ({"kubepods/pod1/ctr/cpu.max": "150000 100000\n"}, (2, "cgroup cpu.max quota")),  # 1.5 CPUs: rounded up
    ({"kubepods/pod1/ctr/cpu.max": "50000 100000\n"}, (1, "cgroup cpu.max quota")),  # half a CPU: 1
    ({"kubepods/pod1/ctr/cpu.max": "20000000 100000\n"}, (64, "sched_getaffinity")),  # above the affinity
    ({"kubepods/pod1/ctr/cpu.max": "6400000 100000\n"}, (64, "sched_getaffinity")),  # equal: the affinity
    ({}, (64, "sched_getaffinity")),
])
def test_the_cpus_are_the_affinity_or_the_smallest_cgroup_v2_quota(tmp_path, files, expected):
    root, proc = cgroups(tmp_path, V2_POD, files)
    count = cpus(root, proc)
    assert (count, count.source) == expected


# a process in a nested cgroup v1, as Docker on cgroup v1 with --cgroupns=host, or a systemd unit
V1_NESTED = "12:pids:/docker/abc\n4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"


@pytest.mark.parametrize("files, limit", [
    ({"memory/memory.limit_in_bytes": V1_NO_LIMIT, "memory/docker/memory.limit_in_bytes": V1_NO_LIMIT,
      "memory/docker/abc/memory.limit_in_bytes": "1258291200\n"}, 1200 * MB),
    ({"memory/memory.limit_in_bytes": V1_NO_LIMIT, "memory/docker/memory.limit_in_bytes": "2147483648\n",
      "memory/docker/abc/memory.limit_in_bytes": V1_NO_LIMIT}, 2048 * MB),
    ({"memory/memory.limit_in_bytes": V1_NO_LIMIT, "memory/docker/abc/memory.limit_in_bytes": V1_NO_LIMIT}, None),
])
def test_the_memory_limit_is_the_smallest_along_the_cgroup_v1_path(tmp_path, files, limit):
    root, proc = cgroups(tmp_path, V1_NESTED, files)
    assert memory_limit(root, proc) == limit


@pytest.mark.parametrize("hierarchy", ["cpu,cpuacct", "cpu"])  # (mounted under either name)
@pytest.mark.parametrize("quota, period, expected", [
    ("200000\n", "100000\n", (2, "cgroup cpu.cfs_quota_us quota")),
    ("150000\n", "100000\n", (2, "cgroup cpu.cfs_quota_us quota")),
    ("-1\n", "100000\n", (64, "sched_getaffinity")),  # no quota
])
def test_the_cpus_are_the_affinity_or_the_smallest_cgroup_v1_quota(tmp_path, hierarchy, quota, period, expected):
    root, proc = cgroups(tmp_path, V1_NESTED, {
        f"{hierarchy}/cpu.cfs_quota_us": "-1\n", f"{hierarchy}/cpu.cfs_period_us": "100000\n",
        f"{hierarchy}/docker/cpu.cfs_quota_us": "-1\n", f"{hierarchy}/docker/cpu.cfs_period_us": "100000\n",
        f"{hierarchy}/docker/abc/cpu.cfs_quota_us": quota, f"{hierarchy}/docker/abc/cpu.cfs_period_us": period})
    count = cpus(root, proc)
    assert (count, count.source) == expected


def test_a_v1_parents_cpu_quota_binds_its_child(tmp_path):
    root, proc = cgroups(tmp_path, V1_NESTED, {
        "cpu,cpuacct/docker/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/docker/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cpus(root, proc) == 3


@pytest.mark.parametrize("proc_self_cgroup", [
    "0::/\n",  # a private cgroup namespace (Docker on cgroup v2)
    "0::/system.slice/docker-abc.scope\n",  # a path the container's mount does not have
    "0::/../host.slice\n",  # a path outside a private namespace: never read outside the mount
    "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n",  # Docker on cgroup v1: its cgroup mounted as the root
])
def test_a_path_not_under_the_mount_reads_the_mounts_root(tmp_path, proc_self_cgroup):
    root, proc = cgroups(tmp_path, proc_self_cgroup, {
        "memory.max": "1073741824\n", "cpu.max": "200000 100000\n",
        "memory/memory.limit_in_bytes": "1073741824\n", "cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    (tmp_path / "host.slice").mkdir()  # (what "/../host.slice" would reach from the mount's root)
    (tmp_path / "host.slice" / "memory.max").write_text("1048576\n")
    (tmp_path / "host.slice" / "cpu.max").write_text("100000 100000\n")
    assert (memory_limit(root, proc), cpus(root, proc)) == (1024 * MB, 2)


@pytest.mark.parametrize("files", [
    {"kubepods/pod1/ctr/memory.max": "lots\n", "kubepods/pod1/ctr/cpu.max": "two\n"},
    {"kubepods/pod1/ctr/memory.max": b"\xff\xfe\x00", "kubepods/pod1/ctr/cpu.max": b"\xff\xfe\x00"},
    {"kubepods/pod1/ctr/memory.max": "", "kubepods/pod1/ctr/cpu.max": ""},
    {"kubepods/pod1/ctr/memory.max": None, "kubepods/pod1/ctr/cpu.max": None},  # unreadable: a folder
    {"kubepods/pod1/ctr/memory.max": "-4096\n", "kubepods/pod1/ctr/cpu.max": "-5 100000\n"},
    {"kubepods/pod1/ctr/memory.max": "0\n", "kubepods/pod1/ctr/cpu.max": "200000 0\n"},
    {"kubepods/pod1/ctr/cpu.max": "200000\n"},  # no period
    {"kubepods/pod1/ctr/cpu.max": "200000 100000 7\n"},
    {"kubepods/pod1/ctr/cpu.max": "abc 100000\n"},
    {"kubepods/pod1/ctr/cpu.max": "1.5 1\n"},
])
def test_a_garbled_limit_counts_as_none(tmp_path, files):
    root, proc = cgroups(tmp_path, V2_POD, files)
    assert (memory_limit(root, proc), cpus(root, proc)) == (None, 64)


@pytest.mark.parametrize("proc_self_cgroup", [
    b"\xff\xfe\x00garbage", "no colons here\n", "0:\n", "::::\n", "", "0::relative/path\n", "0::/a\x00b\n",
    "0::/" + "x" * 5000 + "\n", None,  # (None: no file at all)
])
def test_a_garbled_proc_self_cgroup_reads_the_mounts_root(tmp_path, proc_self_cgroup):
    root, proc = cgroups(tmp_path, proc_self_cgroup, {"memory.max": "1073741824\n", "cpu.max": "300000 100000\n"})
    assert (memory_limit(root, proc), cpus(root, proc)) == (1024 * MB, 3)


def test_a_proc_self_cgroup_that_is_a_folder_reads_the_mounts_root(tmp_path):
    root, proc = cgroups(tmp_path, None, {"memory.max": "1073741824\n"})
    proc.mkdir()
    assert (memory_limit(root, proc), cpus(root, proc)) == (1024 * MB, 64)


def test_without_sched_getaffinity_the_cpus_are_os_cpu_count(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity")  # (not Linux)
    monkeypatch.setattr(os, "cpu_count", lambda: 12)
    root, proc = cgroups(tmp_path, None, {})
    count = cpus(root, proc)
    assert (count, count.source) == (12, "os.cpu_count")


def test_the_plan_says_where_the_cpu_count_came_from():
    chosen = plan(Cpus(2, "cgroup cpu.max quota"), 0, None, 0)
    assert chosen.why[0] == "2 CPUs (cgroup cpu.max quota)"
    assert (chosen.workers, chosen.runners) == (1, 2)
    assert plan(1, 0, None, 0).why[0] == "1 CPU"  # (a count given as a plain number: no source to say)


def test_this_machines_own_cgroups_are_read_without_error(monkeypatch):
    """The real /sys/fs/cgroup and /proc/self/cgroup (or none, off Linux), the real affinity."""
    monkeypatch.undo()  # (the fake 64 cores off)
    count = cpus()
    assert isinstance(count, int) and count >= 1 and count.source
    limit = memory_limit()
    assert limit is None or limit > 0
