"""What every instance of a distributed prepare must agree on, decided once before any of them
starts: the classes, and for each image (its key under the source prefix) its label and whether it
goes to train or validation. Decided on one listing, with the same split as the one-machine
prepare (same seed: the same images in validation), so that N instances, each seeing only its
ShardedByS3Key share of the objects, together make the dataset one machine would make.

At the end, the instances' reports are merged: every planned image must have been handled by
exactly one instance (prepared or rejected), or the dataset is incomplete and the run fails.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
from pathlib import Path

from keras_pipe_launch.prepare import sources
from keras_pipe_launch.prepare.sources import Listing, Location

PLAN_FILE = "plan.json.gz"
REPORTS = "reports"  # the instances' reports, next to train/ and validation/ in the output


class PlanError(ValueError):
    """The instances' work does not add up to the plan: the message says what is missing or twice."""


@dataclasses.dataclass
class Plan:
    source: str  # the s3:// prefix of class folders (ending in "/")
    classes: list[str]
    items: dict[str, tuple[int, str]]  # key under the source prefix -> (label, "train" | "validation")
    rejected: list[tuple[str, str]]  # (key, why): refused at listing, never given to an instance

    @classmethod
    def of(cls, source: str, listing: Listing, train: list, validation: list) -> Plan:
        def key(location: Location) -> str:
            return str(location)[len(source):]

        items = {key(where): (label, "train") for where, label in train}
        items |= {key(where): (label, "validation") for where, label in validation}
        return cls(source, listing.classes, items, [(key(where), why) for where, why in listing.rejected])

    def write(self, path: Path) -> None:
        document = {"source": self.source, "classes": self.classes,
                    "items": [[key, label, part] for key, (label, part) in self.items.items()],
                    "rejected": self.rejected}
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(document, f)

    @classmethod
    def read(cls, path: Path) -> Plan:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            document = json.load(f)
        return cls(document["source"], document["classes"],
                   {key: (label, part) for key, label, part in document["items"]},
                   [tuple(entry) for entry in document["rejected"]])


def make_plan(source: str, reader: sources.Reader, validation_fraction: float, seed: int) -> Plan:
    """Lists the source once (the classes every instance uses) and splits it as prepare() does."""
    from keras_pipe_launch.prepare.dataset import PrepareError, read_listing, split

    if not source.startswith("s3://") or source.lower().endswith(".csv"):
        raise PrepareError(f"{sources.shown(source)}: a Processing job prepares an s3:// prefix of class "
                           "folders (its instances share the objects under it); prepare a CSV on one machine")
    source = source if source.endswith("/") else source + "/"
    listing = read_listing(source, reader)
    train, validation = split(listing.items, validation_fraction, seed)
    return Plan.of(source, listing, train, validation)


@dataclasses.dataclass
class Report:
    """One instance's work: what it prepared, what it rejected (and why), and the files it was
    given that the plan does not hold (objects added after the listing: left out, and said)."""

    host: str
    prepared: dict[str, list[str]]  # part -> keys, in shard order
    counts: dict[str, dict[int, int]]  # part -> label -> examples
    rejected: list[tuple[str, str]]
    unplanned: list[str]
    shards: dict[str, list[str]]  # part -> shard file names

    def write(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        with gzip.open(folder / f"{self.host}.json.gz", "wt", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f)

    @classmethod
    def read(cls, data: bytes) -> Report:
        """A report from the bytes write() wrote."""
        document = json.loads(gzip.decompress(data).decode("utf-8"))
        document["counts"] = {part: {int(k): v for k, v in by_label.items()}
                              for part, by_label in document["counts"].items()}
        document["rejected"] = [tuple(entry) for entry in document["rejected"]]
        return cls(**document)


@dataclasses.dataclass
class Merged:
    counts: dict[str, collections.Counter]
    rejected: list[tuple[str, str]]  # (s3 URI, why), the listing's and the instances'
    unplanned: list[str]
    shards: dict[str, list[str]]


def merge(plan: Plan, reports: list[Report]) -> Merged:
    """The instances' reports as one, checked against the plan: each planned image handled once."""
    handled: dict[str, str] = {}
    merged = Merged({"train": collections.Counter(), "validation": collections.Counter()},
                    [(plan.source + key, why) for key, why in plan.rejected], [], {"train": [], "validation": []})
    for report in sorted(reports, key=lambda r: r.host):
        keys = [key for part in report.prepared.values() for key in part] + [key for key, _ in report.rejected]
        for key in keys:
            if key in handled:
                raise PlanError(f"{plan.source}{key} was prepared by both {handled[key]} and {report.host}")
            handled[key] = report.host
        for part, by_label in report.counts.items():
            merged.counts[part].update(by_label)
            merged.shards[part] += report.shards.get(part, [])
        merged.rejected += [(plan.source + key, why) for key, why in report.rejected]
        merged.unplanned += [plan.source + key for key in report.unplanned]
    missing = [key for key in plan.items if key not in handled]
    if missing:
        shown = ", ".join(plan.source + key for key in missing[:5])
        raise PlanError(f"{len(missing)} of the {len(plan.items)} planned images were handled by no instance "
                        f"({shown}{', ...' if len(missing) > 5 else ''}): the dataset would be incomplete")
    return merged
