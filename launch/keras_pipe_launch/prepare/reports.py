"""The instances' reports of a prepare at scale, and their merge.

Each instance writes reports/RUN-HOST.json.gz: gzipped JSON Lines, each line exactly as
json.dumps writes it:

    {"format": "keras-pipe prepare report", "version": 3, "run": ..., "host": ..., "unplanned": N}
    ["count", part, label, examples]   examples of a class it wrote to the part's shards
    ["shard", part, name, examples]    a shard it wrote, and how many examples it holds
    ["prepared", part, key]            an image it prepared (its key under the source prefix)
    ["rejected", key, why]             an image it could not use, and why
    ["unplanned", key]                 an object given to it that the plan does not hold (added after
                                       the listing): at most EXAMPLES of them; the header counts all
    ["print", key, sha256, phash, width, height]
                                       the fingerprint of an image it prepared (prepare.duplicates;
                                       hex; the phash and sides null where Pillow cannot read them),
                                       one per prepared image when the plan looks for duplicates

The launcher reads the reports one at a time, line by line, and checks each line as it comes,
against the plan and what the reports before it said (an instance runs an image, and what it
leaves in S3 may be stale, tampered with or from another run): one report per host of this run,
each image of the plan handled by exactly one of them, in the plan's part with the plan's label,
counts that add up, shards named after this run and host that exist, and nothing else in OUT's
train/ and validation/. Any of it wrong is a PlanError naming the host and what. A line longer than
write() makes it, or listing an image of the plan a second time, is refused as it is read: so a
report costs the launcher what its own share's lines honestly take, whatever its bytes expand to,
and nothing of it is kept but what the merge adds up, and (when the plan looks for duplicates) each
prepared image's fingerprint and each validation shard's keys: ~300 bytes an image (docs/speed.md,
Figures behind the code's choices: Duplicates), 300 MB for a million.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from keras_pipe_launch.prepare.duplicates import Fingerprint
from keras_pipe_launch.prepare.plan import (
    PARTS,
    REPORTS,
    Plan,
    PlanError,
    kept_shard,
    moved_shard,
    shard_names,
    shard_prefix,
)
from keras_pipe_launch.prepare.sources import shown

_FORMAT = "keras-pipe prepare report"
_VERSION = 3
EXAMPLES = 10  # unplanned objects listed by name (all are counted)
MAX_KEY = 1024  # S3's longest key, in bytes (so at most as many characters)
MAX_REASON = 500  # characters of a rejected image's reason
MAX_LINE = 32 << 10  # bytes: more than the longest line write() makes, every character escaped


def report_name(run: str, host: str) -> str:
    return f"{run}-{host}.json.gz"


def host_of_report(plan: Plan, name: str) -> str:
    """The host of this run whose report has the object name `name` under reports/; any other
    name is a PlanError, said before such a report is read, let alone merged."""
    for host in plan.hosts:
        if report_name(plan.run, host) == name:
            return host
    raise PlanError(f"{REPORTS}/{shown(name)} is not the report of a host of this run ({shown(plan.run)}, hosts "
                    f"{shown(plan.hosts[0])} to {shown(plan.hosts[-1])}): a report of another run, or one not made by "
                    "an instance, is never merged")


def reason(why: str) -> str:
    """A rejected image's reason as a report holds it: at most MAX_REASON characters."""
    return why if len(why) <= MAX_REASON else why[:MAX_REASON - 5] + "[...]"


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
    records: dict[str, list[int]]  # part -> each shard's examples (the prepared keys, in order, fill them)
    prints: dict[str, Fingerprint] = dataclasses.field(default_factory=dict)  # key -> its prepared image's

    def entries(self) -> Iterator:
        """The report's lines, as values (the header first)."""
        yield {"format": _FORMAT, "version": _VERSION, "run": self.run, "host": self.host,
               "unplanned": len(self.unplanned)}
        for part, by_label in self.counts.items():
            yield from (["count", part, label, n] for label, n in sorted(by_label.items()) if n)
        for part, names in self.shards.items():
            yield from (["shard", part, name, n] for name, n in zip(names, self.records[part], strict=True))
        for part, keys in self.prepared.items():
            yield from (["prepared", part, key] for key in keys)
        yield from (["rejected", key, reason(why)] for key, why in self.rejected)
        yield from (["unplanned", key] for key in [k for k in self.unplanned if len(k) <= MAX_KEY][:EXAMPLES])
        yield from (["print", key, p.digest.hex(), None if p.phash is None else f"{p.phash:016x}", p.width, p.height]
                    for key, p in self.prints.items())

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        with gzip.open(folder / report_name(self.run, self.host), "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(entry) + "\n" for entry in self.entries())


def read_entries(stream, who: str) -> Iterator:
    """The values of a report's lines, from its gzipped bytes (a file object: an S3 object's body),
    one line at a time: each line at most MAX_LINE bytes, and exactly as write() writes it; a
    PlanError saying `who` and what is wrong otherwise, whatever the bytes."""
    with gzip.GzipFile(fileobj=stream, mode="rb") as lines:
        number = 0
        while True:
            try:
                line = lines.readline(MAX_LINE + 1)
            except (OSError, EOFError, zlib.error) as err:  # (BadGzipFile is an OSError)
                raise PlanError(f"{who} is not a gzip file, or a damaged or truncated one ({type(err).__name__}: "
                                f"{shown(str(err))})") from None
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE or not line.endswith(b"\n"):
                raise PlanError(f"{who}: line {number} is "
                                + ("longer than any line of a report" if len(line) > MAX_LINE else "cut short"))
            try:
                text = line.decode("utf-8")
                entry = json.loads(text)
            except (ValueError, RecursionError) as err:  # (RecursionError: JSON nested deeper than Python goes)
                raise PlanError(f"{who}: line {number} is not JSON text ({type(err).__name__})") from None
            if json.dumps(entry) + "\n" != text:
                raise PlanError(f"{who}: line {number} is not a line as an instance writes it")
            yield entry


# each kind of line after the header: the types of its values after the kind
_LINES = {"count": ("part", "label", "examples"), "shard": ("part", "text", "examples"), "prepared": ("part", "text"),
          "rejected": ("text", "reason"), "unplanned": ("text",), "print": ("text", "digest", "phash", "side", "side")}
_HEX = frozenset("0123456789abcdef")


@dataclasses.dataclass
class Merged:
    counts: dict[str, collections.Counter]
    rejected: list[tuple[str, str]]  # (s3 URI, why), the listing's and the instances'
    unplanned: list[str]  # a few of the objects the instances were given that the plan does not hold
    unplanned_count: int
    shards: dict[str, list[str]]
    prints: dict[str, Fingerprint]  # key -> the fingerprint of its prepared image (the plan's duplicates)
    in_shards: dict[str, list[str]]  # a validation shard's name -> the keys of its examples, in order


class Merger:
    """The reports of a run, merged one at a time (add), then checked as a whole (result)."""

    def __init__(self, plan: Plan, names: Iterable[str], stored: dict[str, set[str]]):
        """`names`: the reports' object names under reports/; `stored`: the names of the objects
        in OUT's train/ and validation/."""
        self.plan, self.stored = plan, stored
        self.hosts = {name: host_of_report(plan, name) for name in names}
        missing_hosts = [host for host in plan.hosts if host not in self.hosts.values()]
        if missing_hosts:
            raise PlanError(f"no report from {shown(', '.join(missing_hosts))} (each instance writes one when it "
                            "succeeds): the dataset would be incomplete")
        self.handled: dict[str, str] = {}  # key -> the host that reported it
        self.refused = {key for key, _ in plan.rejected}
        self.merged = Merged({part: collections.Counter() for part in PARTS},
                             [(plan.source + key, why) for key, why in plan.rejected], [], 0,
                             {part: [] for part in PARTS}, {}, {})
        self._shards: set[tuple[str, str]] = set()  # (part, name) of every shard reported

    def add(self, name: str, entries: Iterable) -> None:
        """Merges the report `name`, given as the values of its lines (read_entries, or a
        Report's entries()), each checked as it comes."""
        host = self.hosts[name]
        lines = iter(entries)
        unplanned = self._header(name, host, next(lines, None))
        who = shown(host)  # (the plan's: read back from OUT by --finish)
        counted = {part: collections.Counter() for part in PARTS}
        reported: dict[str, dict[int, int]] = {part: {} for part in PARTS}
        listed: list[str] = []
        prepared: set[str] = set()
        keys: dict[str, list[str]] = {part: [] for part in PARTS}  # in the order they fill the shards
        shards: dict[str, list[tuple[str, int]]] = {part: [] for part in PARTS}
        for number, entry in enumerate(lines, 2):
            kind = self._shape(who, number, entry)
            if kind == "count":
                _, part, label, n = entry
                if label in reported[part]:
                    raise PlanError(f"{who} counts its {part} examples of class {label} twice (line {number})")
                reported[part][label] = n
            elif kind == "shard":
                self._shard(who, host, entry[1], entry[2])
                shards[entry[1]].append((entry[2], entry[3]))
            elif kind == "prepared":
                label = self._handle(who, host, entry[2], entry[1])
                counted[entry[1]][label] += 1
                prepared.add(entry[2])
                keys[entry[1]].append(entry[2])
            elif kind == "rejected":
                self._handle(who, host, entry[1])
                self.merged.rejected.append((self.plan.source + entry[1], entry[2]))
            elif kind == "unplanned":
                self._unplanned(who, entry[1], listed, unplanned)
            else:
                self._print(who, entry, prepared)
        for part in PARTS:
            if dict(counted[part]) != reported[part]:
                raise PlanError(f"{who}'s {part} counts per label {dict(sorted(reported[part].items()))} are not "
                                f"those of the images it lists ({dict(sorted(counted[part].items()))})")
            self.merged.counts[part].update(counted[part])
        self._fill(who, shards, keys)
        self._printed(who, prepared)
        self.merged.unplanned += listed[:EXAMPLES - len(self.merged.unplanned)]
        self.merged.unplanned_count += unplanned

    def _header(self, name: str, host: str, header) -> int:
        """The header's count of unplanned objects, once it is checked to be this run's and host's."""
        who = f"{shown(host)}'s report {REPORTS}/{shown(name)}"
        fields = {"format", "version", "run", "host", "unplanned"}
        if not (isinstance(header, dict) and set(header) == fields and header["format"] == _FORMAT):
            raise PlanError(f"{who} does not start as a report does: written by another version of the image?")
        if header["version"] != _VERSION:
            raise PlanError(f"{who} is a report of version {shown(str(header['version']))}, not {_VERSION}: written "
                            "by another version of the image?")
        if (header["run"], header["host"]) != (self.plan.run, host):
            raise PlanError(f"{REPORTS}/{shown(name)} says it is {shown(str(header['host']))}'s of run "
                            f"{shown(str(header['run']))}: a report's content must match its name")
        if type(header["unplanned"]) is not int or header["unplanned"] < 0:
            raise PlanError(f"{who}: its count of unplanned objects is not one")
        return header["unplanned"]

    def _shape(self, who: str, number: int, entry) -> str:
        """The kind of a line after the header, once its values are checked to have their types."""
        kind = entry[0] if isinstance(entry, list) and entry and isinstance(entry[0], str) else None
        types = _LINES.get(kind)
        if types is None or len(entry) != 1 + len(types) or not all(
                _is(what, value, len(self.plan.classes)) for what, value in zip(types, entry[1:])):
            raise PlanError(f"{who}'s report: line {number} is not a report's line ({shown(str(entry)[:200])})")
        return kind

    def _handle(self, who: str, host: str, key: str, part: str | None = None) -> int:
        """An image of the plan, reported prepared (in `part`) or rejected: once, by one host;
        its label."""
        uri = shown(self.plan.source + key)
        if key not in self.plan.items:
            raise PlanError(f"{who} reports {uri}, which is not an image of the plan")
        if key in self.handled:
            if self.handled[key] == host:
                raise PlanError(f"{who} reports {uri} twice")
            raise PlanError(f"{uri} was handled by both {shown(self.handled[key])} and {who}")
        self.handled[key] = host
        label, planned_part = self.plan.items[key]
        if part is not None and part != planned_part:
            raise PlanError(f"{who} reports {uri} in {part}; the plan has it in {planned_part}")
        return label

    def _shard(self, who: str, host: str, part: str, name: str) -> None:
        if not shard_names(self.plan.run, host).fullmatch(name):
            raise PlanError(f"{who} reports a shard {shown(name)}: not a name its shards have "
                            f"({shown(shard_prefix(self.plan.run, host))}NNNNN.tfrecord)")
        moved = part == "validation" and moved_shard(name) in self.stored.get("train", set())
        if name not in self.stored.get(part, set()) and not moved:  # (moved: prepare.moves checks it)
            raise PlanError(f"{who} reports {part}/{name}, which is not in the output")
        if (part, name) in self._shards:
            raise PlanError(f"{who} reports {part}/{name} twice")
        self._shards.add((part, name))
        self.merged.shards[part].append(name)

    def _fill(self, who: str, shards: dict[str, list[tuple[str, int]]], keys: dict[str, list[str]]) -> None:
        """Checks that a host's shards hold as many examples as it prepared, part by part, and
        keeps which keys each validation shard holds (where a duplicate found later is moved from)."""
        for part in PARTS:
            held = sum(n for _, n in shards[part])
            if held != len(keys[part]):
                raise PlanError(f"{who}'s {part} shards hold {held} examples, it prepared {len(keys[part])}")
        start = 0
        for name, n in shards["validation"] if self.plan.duplicates is not None else ():
            self.merged.in_shards[name] = keys["validation"][start:start + n]
            start += n

    def _printed(self, who: str, prepared: set[str]) -> None:
        """Checks that a host gave a fingerprint for each image it prepared, if the plan asks."""
        printed = sum(key in self.merged.prints for key in prepared)
        if printed != (len(prepared) if self.plan.duplicates is not None else 0):
            raise PlanError(f"{who} gives the fingerprints of {printed} of the {len(prepared)} images it prepared; the "
                            + ("plan looks for duplicates: one each" if self.plan.duplicates is not None
                               else "plan does not look for duplicates: none"))

    def _print(self, who: str, entry: list, prepared: set[str]) -> None:
        _, key, digest, phash, width, height = entry
        if (width is None) != (height is None):
            raise PlanError(f"{who} gives a fingerprint with one side of its picture: {shown(str(entry)[:200])}")
        if key not in prepared:
            raise PlanError(f"{who} gives the fingerprint of {shown(self.plan.source + key)}, which it has not "
                            "listed as prepared")
        if key in self.merged.prints:
            raise PlanError(f"{who} gives the fingerprint of {shown(self.plan.source + key)} twice")
        self.merged.prints[key] = Fingerprint(bytes.fromhex(digest), None if phash is None else int(phash, 16),
                                              width, height)

    def _unplanned(self, who: str, key: str, listed: list[str], count: int) -> None:
        if key in self.plan.items or key in self.refused:
            raise PlanError(f"{who} reports {shown(self.plan.source + key)} as not in the plan; it is")
        if len(listed) >= min(count, EXAMPLES):
            raise PlanError(f"{who} names more unplanned objects than its report counts ({count}), or more than "
                            f"{EXAMPLES}")
        listed.append(self.plan.source + key)

    def result(self) -> Merged:
        """The merge, once every report is added: every image of the plan handled, nothing in
        train/ or validation/ that no report lists."""
        missing = [key for key in self.plan.items if key not in self.handled]
        if missing:
            listed = ", ".join(shown(self.plan.source + key) for key in missing[:5])
            raise PlanError(f"{len(missing)} of the {len(self.plan.items)} planned images were handled by no instance "
                            f"({listed}{', ...' if len(missing) > 5 else ''}): the dataset would be incomplete")
        for part in PARTS:
            # (and what a merge stopped in its moves had made of a validation shard: prepare.moves)
            made = moved_shard if part == "train" else kept_shard
            stray = sorted(self.stored.get(part, set()) - set(self.merged.shards[part])
                           - {made(name) for name in self.merged.shards["validation"]})
            if stray:
                raise PlanError(f"{part}/ holds {len(stray)} objects no report lists (e.g. {shown(stray[0])}): "
                                "the channel would read them too")
        return self.merged


def _is(what: str, value, classes: int) -> bool:
    if what == "part":
        return value in PARTS
    if what == "label":
        return type(value) is int and 0 <= value < classes
    if what == "examples":
        return type(value) is int and value > 0
    if what == "digest":  # (a SHA-256, as bytes.hex() writes it)
        return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)
    if what == "phash":
        return value is None or (isinstance(value, str) and len(value) == 16 and _HEX.issuperset(value))
    if what == "side":  # (a picture's width or height: Pillow's, at most 2^31 - 1)
        return value is None or (type(value) is int and 0 < value < 2**31)
    if what == "reason":
        return isinstance(value, str) and len(value) <= MAX_REASON
    return isinstance(value, str) and len(value) <= MAX_KEY


def merge(plan: Plan, reports: dict[str, Report], stored: dict[str, set[str]]) -> Merged:
    """Reports at hand (by their object's name under reports/) merged, as the launcher merges those
    it reads from OUT."""
    merger = Merger(plan, reports, stored)
    for name, report in sorted(reports.items()):
        merger.add(name, report.entries())
    return merger.result()
