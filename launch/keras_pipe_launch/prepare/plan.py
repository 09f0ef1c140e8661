"""What every instance of a distributed prepare must agree on, decided once before any of them
starts: the run's id, its hosts, the classes, and for each image (its key under the source prefix)
its label and whether it goes to train or validation. Decided on one listing, with the same split
as the one-machine prepare (same seed: the same images in validation), so that N instances, each
seeing only its ShardedByS3Key share of the objects, together make the dataset one machine would make.

At the end, the instances' reports are merged, and nothing in them is taken on trust (an instance
runs an image, and what it leaves in S3 may be stale, tampered with or from another run): one
report per host of this run, each image of the plan handled by exactly one of them, in the plan's
part with the plan's label, counts that add up, shards named after this run and host that exist,
and nothing else in OUT's train/ and validation/. Any of it wrong is a PlanError naming what.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import re
import secrets
import zlib
from collections.abc import Callable
from pathlib import Path

from keras_pipe_launch.prepare import sources
from keras_pipe_launch.prepare.sources import Listing, Location, shown

PLAN_FILE = "plan.json.gz"
REPORTS = "reports"  # the instances' reports, next to train/ and validation/ in the output
PARTS = ("train", "validation")
_FORMAT = "keras-pipe prepare plan"


class PlanError(ValueError):
    """The instances' work does not add up to the plan: the message says what is missing or wrong."""


RUN_ID = re.compile(r"[0-9a-f]{8}")  # what new_run_id() makes


def new_run_id() -> str:
    """Names this run's plan, reports and shards, so that nothing of another run is ever merged."""
    return secrets.token_hex(4)


def hosts_of(instance_count: int) -> list[str]:
    return [f"algo-{i}" for i in range(1, instance_count + 1)]


def shard_prefix(run: str, host: str) -> str:
    return f"part-{run}-{host}-"


def report_name(run: str, host: str) -> str:
    return f"{run}-{host}.json.gz"


def shard_names(run: str, host: str) -> re.Pattern:
    """The file names a host's shards have in this run (numbered from 00000 as they are written)."""
    return re.compile(re.escape(shard_prefix(run, host)) + r"\d{5}\.tfrecord")


def host_of_report(plan: Plan, name: str) -> str:
    """The host of this run whose report has the object name `name` under reports/; any other
    name is a PlanError, said before such a report is read, let alone merged."""
    for host in plan.hosts:
        if report_name(plan.run, host) == name:
            return host
    raise PlanError(f"{REPORTS}/{shown(name)} is not the report of a host of this run ({shown(plan.run)}, hosts "
                    f"{shown(plan.hosts[0])} to {shown(plan.hosts[-1])}): a report of another run, or one not made by "
                    "an instance, is never merged")


@dataclasses.dataclass
class Plan:
    run: str
    hosts: list[str]
    source: str  # the s3:// prefix of class folders (ending in "/")
    classes: list[str]
    items: dict[str, tuple[int, str]]  # key under the source prefix -> (label, "train" | "validation")
    rejected: list[tuple[str, str]]  # (key, why): refused at listing, never given to an instance

    @classmethod
    def of(cls, run: str, instance_count: int, source: str, listing: Listing, train: list, validation: list) -> Plan:
        def key(location: Location) -> str:
            return str(location)[len(source):]

        items = {key(where): (label, "train") for where, label in train}
        items |= {key(where): (label, "validation") for where, label in validation}
        return cls(run, hosts_of(instance_count), source, listing.classes, items,
                   [(key(where), why) for where, why in listing.rejected])

    def write(self, path: Path) -> None:
        """JSON Lines, gzipped: a header, then one line per planned image in the plan's (shuffled)
        order, then one per refused file; an instance can keep just its share (read's `keep`)."""
        header = {"format": _FORMAT, "version": 1, "run": self.run, "hosts": self.hosts, "source": self.source,
                  "classes": self.classes, "items": len(self.items), "rejected": len(self.rejected)}
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
            for key, (label, part) in self.items.items():
                f.write(json.dumps([key, label, part]) + "\n")
            for key, why in self.rejected:
                f.write(json.dumps([key, why]) + "\n")

    @classmethod
    def read(cls, path: Path, keep: Callable[[str], bool] | None = None) -> Plan:
        """The plan write() wrote; with `keep`, only the entries of the keys it keeps (an
        instance's share: memory in proportion to it, not to the whole data set), in plan order."""
        try:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                header = json.loads(f.readline())
                if not isinstance(header, dict) or header.get("format") != _FORMAT or header.get("version") != 1:
                    raise PlanError(f"{path} is not a plan this version of keras-pipe reads")
                items, rejected = {}, []
                for _ in range(header["items"]):
                    key, label, part = json.loads(f.readline())
                    if keep is None or keep(key):
                        items[key] = (label, part)
                for _ in range(header["rejected"]):
                    key, why = json.loads(f.readline())
                    if keep is None or keep(key):
                        rejected.append((key, why))
                plan = cls(header["run"], header["hosts"], header["source"], header["classes"], items, rejected)
        except (OSError, EOFError, ValueError, KeyError, TypeError) as err:
            if isinstance(err, PlanError):
                raise
            raise PlanError(f"cannot read the plan {shown(path)}: {type(err).__name__}: {shown(str(err))}") from None
        problems = plan.problems()
        if problems:
            raise PlanError(f"{shown(path)} is not a plan this version of keras-pipe reads: {'; '.join(problems)}")
        return plan

    def problems(self) -> list[str]:
        """What does not have the shape write() gives a plan. A plan is read back from S3 by
        --finish and by every instance, so a copied or edited one must not name hosts that make
        other report or shard names (`../x`), labels beyond its classes, or parts that are none."""
        said = []
        if not (isinstance(self.run, str) and RUN_ID.fullmatch(self.run)):
            said.append("its run id is not one")
        hosts = self.hosts if isinstance(self.hosts, list) else []
        if not hosts or hosts != hosts_of(len(hosts)):
            said.append("its hosts are not algo-1 to algo-N")
        if not (isinstance(self.source, str) and self.source.startswith("s3://") and self.source.endswith("/")):
            said.append("its source is not an s3:// prefix")
        if not (isinstance(self.classes, list) and self.classes and all(isinstance(c, str) for c in self.classes)):
            said.append("its classes are not a list of names")
            return said
        if not all(isinstance(key, str) and type(label) is int and 0 <= label < len(self.classes) and part in PARTS
                   for key, (label, part) in self.items.items()):
            said.append("an image's key, label or part is not one")
        if not all(isinstance(key, str) and isinstance(why, str) for key, why in self.rejected):
            said.append("a refused file's key or reason is not text")
        return said


def make_plan(source: str, reader: sources.Reader, validation_fraction: float, seed: int, *, run: str,
              instance_count: int) -> Plan:
    """Lists the source once (the classes every instance uses) and splits it as prepare() does."""
    from keras_pipe_launch.prepare.dataset import read_listing, split

    listing = read_listing(source, reader)
    train, validation = split(listing.items, validation_fraction, seed)
    return Plan.of(run, instance_count, source, listing, train, validation)


@dataclasses.dataclass
class Report:
    """One instance's work: what it prepared, what it rejected (and why), and the files it was
    given that the plan does not hold (objects added after the listing: left out, and said)."""

    run: str
    host: str
    prepared: dict[str, list[str]]  # part -> keys, in shard order
    counts: dict[str, dict[int, int]]  # part -> label -> examples
    rejected: list[tuple[str, str]]
    unplanned: list[str]
    shards: dict[str, list[str]]  # part -> shard file names

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        with gzip.open(folder / report_name(self.run, self.host), "wt", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f)

    @classmethod
    def read(cls, data: bytes, name: str, max_bytes: int) -> Report:
        """A report from the bytes write() wrote, checked for shape: whatever the bytes, a Report
        or a PlanError naming the report and what is wrong with it (never more than max_bytes
        of memory for its text, whatever its gzip expands to)."""
        text = _gunzip_at_most(data, max_bytes, name)
        try:
            document = json.loads(text)
        except ValueError as err:
            raise PlanError(f"report {name} is not valid JSON ({err})") from None
        expected = {field.name for field in dataclasses.fields(cls)}
        if not isinstance(document, dict) or set(document) != expected:
            found = set(document) if isinstance(document, dict) else set()
            raise PlanError(f"report {name} does not have a report's fields (unknown: {sorted(found - expected)}, "
                            f"missing: {sorted(expected - found)}): written by another version of the image?")
        check = _Shape(name)
        check.text(document["run"], "run")
        check.text(document["host"], "host")
        for field in ("prepared", "shards"):
            check.by_part(document[field], field, lambda value, where: check.texts(value, where))
        check.by_part(document["counts"], "counts", check.counts)
        check.pairs(document["rejected"], "rejected")
        check.texts(document["unplanned"], "unplanned")
        document["counts"] = {part: {int(label): n for label, n in by_label.items()}
                              for part, by_label in document["counts"].items()}
        document["rejected"] = [tuple(entry) for entry in document["rejected"]]
        return cls(**document)


def _gunzip_at_most(data: bytes, max_bytes: int, name: str) -> str:
    inflate = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)  # (gzip framing)
    try:
        text = inflate.decompress(data, max_bytes + 1)
    except zlib.error as err:
        raise PlanError(f"report {name} is not a gzip file, or a damaged one ({err})") from None
    if len(text) > max_bytes:
        raise PlanError(f"report {name} expands to more than {max_bytes} bytes, more than any report of this "
                        "plan could hold: refused")
    if not inflate.eof:
        raise PlanError(f"report {name} is truncated (its gzip stream ends early)")
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PlanError(f"report {name} is not UTF-8 text ({err})") from None


class _Shape:
    """Type checks of a report's JSON, each failure a PlanError naming the report and field."""

    def __init__(self, name: str):
        self.name = name

    def fail(self, where: str, what: str):
        raise PlanError(f"report {self.name}: {where} must be {what}")

    def text(self, value, where: str) -> None:
        if not isinstance(value, str):
            self.fail(where, "a string")

    def texts(self, value, where: str) -> None:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(where, "a list of strings")

    def pairs(self, value, where: str) -> None:
        if not isinstance(value, list) or not all(
                isinstance(v, list) and len(v) == 2 and all(isinstance(s, str) for s in v) for v in value):
            self.fail(where, "a list of [key, reason] pairs")

    def counts(self, value, where: str) -> None:
        if not isinstance(value, dict) or not all(
                re.fullmatch(r"\d{1,9}", label) and type(n) is int and n > 0 for label, n in value.items()):
            self.fail(where, "a map of class label to a count of examples")

    def by_part(self, value, where: str, check: Callable) -> None:
        if not isinstance(value, dict) or not set(value) <= set(PARTS):
            self.fail(where, "a map of 'train' and 'validation'")
        for part, entries in value.items():
            check(entries, f"{where}.{part}")


@dataclasses.dataclass
class Merged:
    counts: dict[str, collections.Counter]
    rejected: list[tuple[str, str]]  # (s3 URI, why), the listing's and the instances'
    unplanned: list[str]
    shards: dict[str, list[str]]


def max_report_bytes(plan: Plan) -> int:
    """More than any honest report of this plan can take: every key of the plan, with its longest
    reason, a few times over; a report past it is refused before it is parsed."""
    keys = sum(len(key.encode()) + 16 for key in plan.items) + sum(len(key.encode()) + 16 for key, _ in plan.rejected)
    return (1 << 20) + 4 * keys + 1024 * (len(plan.items) + len(plan.rejected))


def merge(plan: Plan, reports: dict[str, Report], stored: dict[str, set[str]]) -> Merged:
    """The instances' reports (by their object's name under reports/) as one, checked against the
    plan; `stored`: the names of the objects in OUT's train/ and validation/."""
    hosts = {name: host_of_report(plan, name) for name in reports}
    missing_hosts = [host for host in plan.hosts if host not in hosts.values()]
    if missing_hosts:
        raise PlanError(f"no report from {shown(', '.join(missing_hosts))} (each instance writes one when it "
                        "succeeds): the dataset would be incomplete")
    handled: dict[str, str] = {}
    refused = {key for key, _ in plan.rejected}
    merged = Merged({part: collections.Counter() for part in PARTS},
                    [(plan.source + key, why) for key, why in plan.rejected], [], {part: [] for part in PARTS})
    for name, report in sorted(reports.items()):
        host = hosts[name]
        who = shown(host)  # (the plan's: read back from OUT by --finish)
        if (report.run, report.host) != (plan.run, host):
            raise PlanError(f"{REPORTS}/{shown(name)} says it is {shown(report.host)}'s of run {shown(report.run)}: a "
                            "report's content must match its name")
        for key in [key for keys in report.prepared.values() for key in keys] + [key for key, _ in report.rejected]:
            if key not in plan.items:
                raise PlanError(f"{who} reports {shown(plan.source + key)}, which is not an image of the "
                                "plan")
            if key in handled:
                raise PlanError(f"{shown(plan.source + key)} was handled by both {shown(handled[key])} and {who}")
            handled[key] = host
        for part, keys in report.prepared.items():
            counts = collections.Counter()
            for key in keys:
                label, planned_part = plan.items[key]
                if planned_part != part:
                    raise PlanError(f"{who} reports {shown(plan.source + key)} in {part}; the plan has it "
                                    f"in {planned_part}")
                counts[label] += 1
            if dict(counts) != report.counts.get(part, {}):
                raise PlanError(f"{who}'s {part} counts per label {dict(sorted(report.counts.get(part, {}).items()))} "
                                f"are not those of the images it lists ({dict(sorted(counts.items()))})")
            merged.counts[part].update(counts)
        for part in set(report.counts) - set(report.prepared):
            if report.counts[part]:
                raise PlanError(f"{who} counts {part} examples but lists no {part} image")
        for part, names in report.shards.items():
            pattern = shard_names(plan.run, host)
            for shard in names:
                if not pattern.fullmatch(shard):
                    raise PlanError(f"{who} reports a shard {shown(shard)}: not a name its shards have "
                                    f"({shown(shard_prefix(plan.run, host))}NNNNN.tfrecord)")
                if shard not in stored.get(part, set()):
                    raise PlanError(f"{who} reports {part}/{shard}, which is not in the output")
            merged.shards[part] += names
        for key in report.unplanned:
            if key in plan.items or key in refused:
                raise PlanError(f"{who} reports {shown(plan.source + key)} as not in the plan; it is")
        merged.rejected += [(plan.source + key, why) for key, why in report.rejected]
        merged.unplanned += [plan.source + key for key in report.unplanned]
    missing = [key for key in plan.items if key not in handled]
    if missing:
        listed = ", ".join(shown(plan.source + key) for key in missing[:5])
        raise PlanError(f"{len(missing)} of the {len(plan.items)} planned images were handled by no instance "
                        f"({listed}{', ...' if len(missing) > 5 else ''}): the dataset would be incomplete")
    for part in PARTS:
        stray = sorted(stored.get(part, set()) - set(merged.shards[part]))
        if stray:
            raise PlanError(f"{part}/ holds {len(stray)} objects no report lists (e.g. {shown(stray[0])}): "
                            "the channel would read them too")
    return merged
