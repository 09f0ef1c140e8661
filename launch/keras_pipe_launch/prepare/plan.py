"""What every instance of a distributed prepare must agree on, decided once before any of them
starts: the run's id, its hosts, the classes, and for each image (its key under the source prefix)
its label and whether it goes to train or validation. Decided on one listing, with the same split
as the one-machine prepare (same seed: the same images in validation, where the listing shows
every group of duplicates: prepare.moves for the others), so that N instances, each seeing only its
ShardedByS3Key share of the objects, together make the dataset one machine would make.

At the end, the instances' reports are checked against the plan and merged (prepare.reports);
what does not add up is a PlanError naming what.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import secrets
from collections.abc import Callable
from pathlib import Path

from keras_pipe_launch.prepare import sources
from keras_pipe_launch.prepare.duplicates import DISTANCE, MAX_DISTANCE, same_objects
from keras_pipe_launch.prepare.sources import Listing, Location, shown

PLAN_FILE = "plan.json.gz"
REPORTS = "reports"  # the instances' reports, next to train/ and validation/ in the output
PARTS = ("train", "validation")
_FORMAT = "keras-pipe prepare plan"
_VERSION = 2


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


def moved_shard(name: str) -> str:
    """The train shard that holds what the merge moved out of validation shard `name` (prepare.moves)."""
    return name.removesuffix(".tfrecord") + "-moved.tfrecord"


def kept_shard(name: str) -> str:
    """The validation shard that holds what the merge left of validation shard `name` (prepare.moves)."""
    return name.removesuffix(".tfrecord") + "-kept.tfrecord"


def shard_names(run: str, host: str) -> re.Pattern:
    """The file names a host's shards have in this run (numbered from 00000 as they are written)."""
    return re.compile(re.escape(shard_prefix(run, host)) + r"\d{5}\.tfrecord")


@dataclasses.dataclass
class Plan:
    run: str
    hosts: list[str]
    source: str  # the s3:// prefix of class folders (ending in "/")
    classes: list[str]
    items: dict[str, tuple[int, str]]  # key under the source prefix -> (label, "train" | "validation")
    rejected: list[tuple[str, str]]  # (key, why): refused at listing, never given to an instance
    # duplicates.py's distance: the instances fingerprint each image they prepare, and the merge
    # groups them; None: duplicates not looked for
    duplicates: int | None = None

    @classmethod
    def of(cls, run: str, instance_count: int, source: str, listing: Listing, train: list, validation: list,
           duplicates: int | None = None) -> Plan:
        def key(location: Location) -> str:
            return str(location)[len(source):]

        items = {key(where): (label, "train") for where, label in train}
        items |= {key(where): (label, "validation") for where, label in validation}
        return cls(run, hosts_of(instance_count), source, listing.classes, items,
                   [(key(where), why) for where, why in listing.rejected], duplicates)

    def write(self, path: Path) -> None:
        """JSON Lines, gzipped: a header, then one line per planned image in the plan's (shuffled)
        order, then one per refused file; an instance can keep just its share (read's `keep`)."""
        header = {"format": _FORMAT, "version": _VERSION, "run": self.run, "hosts": self.hosts, "source": self.source,
                  "classes": self.classes, "items": len(self.items), "rejected": len(self.rejected),
                  "duplicates": self.duplicates}
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
                if not isinstance(header, dict) or header.get("format") != _FORMAT or header.get("version") != _VERSION:
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
                plan = cls(header["run"], header["hosts"], header["source"], header["classes"], items, rejected,
                           header["duplicates"])
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
        if not (self.duplicates is None or (type(self.duplicates) is int and 0 <= self.duplicates <= MAX_DISTANCE)):
            said.append(f"its duplicate distance is not 0 to {MAX_DISTANCE} bits")
        return said


def make_plan(source: str, reader: sources.Reader, validation_fraction: float, seed: int, *, run: str,
              instance_count: int, duplicate_distance: int | None = DISTANCE) -> Plan:
    """Lists the source once (the classes every instance uses) and splits it as prepare() does,
    objects of the same bytes (their ETags) kept in one part: no instance has read an image yet,
    so the near duplicates, and copies uploaded unalike, are found by the merge (prepare.reports)."""
    from keras_pipe_launch.prepare.dataset import read_listing, split

    listing = read_listing(source, reader)
    together = [] if duplicate_distance is None else same_objects([w for w, _ in listing.items], listing.etags)
    train, validation = split(listing.items, validation_fraction, seed, together)
    return Plan.of(run, instance_count, source, listing, train, validation, duplicate_distance)
