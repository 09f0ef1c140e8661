"""One instance of a distributed prepare: what each instance of the SageMaker Processing job runs
(`python3 -m keras_pipe_launch.prepare.instance`), and each process of its local emulation.

SageMaker gives the instance (under /opt/ml, or $SAGEMAKER_BASE_DIR):
    config/resourceconfig.json          this host's name (algo-N) and all hosts
    processing/input/source/...         its ShardedByS3Key share of the source objects, at their keys
    processing/input/plan/plan.json.gz  the plan all instances share (classes, label and part per key)
and uploads processing/output/{train,validation,reports}/ to those folders of the output prefix when
the job ends. Shards are named after the
run and the host (part-RUN-algo-2-00000.tfrecord), so instances never write the same name; each
instance writes reports/RUN-algo-N.json.gz, which the launcher merges. An instance keeps only
its share of the plan in memory (a plan of 10 million images would take ~4 GB whole). A failure is
written to output/message, which SageMaker shows as the job's ExitMessage, and the instance exits 1
(failing the job).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from keras_pipe_launch.common.quiet_start import quiet_tensorflow_start
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.prepare import duplicates, images, sources
from keras_pipe_launch.prepare.dataset import ImageOptions, default_workers, in_order, write_examples
from keras_pipe_launch.prepare.images import jpeg_quality, megabytes, whole_number
from keras_pipe_launch.prepare.plan import PARTS, PLAN_FILE, REPORTS, Plan, shard_prefix
from keras_pipe_launch.prepare.reports import Report
from keras_pipe_train.settings.config import DEFAULT_MAX_PIXELS
from keras_pipe_train.settings.contract import is_hidden
from keras_pipe_train.settings.paused_collector import pause_collector_while_tensorflow_imports
from keras_pipe_train.settings.unneeded_imports import skip_while_keras_imports


def base_dir() -> Path:
    return Path(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"))


class ArgumentError(ValueError):
    """A ContainerArgument given wrongly (raised, not printed and exited: it is the job's failure reason)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ArgumentError(message)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The options the launcher passes (the Processing job's ContainerArguments)."""
    parser = _Parser(prog="prepare_instance")
    parser.add_argument("--shard-mb", type=megabytes, default=100)
    parser.add_argument("--max-side", type=whole_number, default=None)
    parser.add_argument("--jpeg-quality", type=jpeg_quality, default=images.DEFAULT_QUALITY)
    parser.add_argument("--max-image-pixels", type=whole_number, default=DEFAULT_MAX_PIXELS)
    parser.add_argument("--workers", type=whole_number, default=None)
    return parser.parse_args(argv)


def current_host(base: Path) -> str:
    path = base / "config" / "resourceconfig.json"
    try:
        return json.loads(path.read_text())["current_host"]
    except (OSError, ValueError, KeyError) as err:
        raise RuntimeError(f"cannot read this instance's name from {path}: {err}") from None


def given_files(folder: Path) -> list[tuple[str, Path]]:
    """(key under the source prefix, local path) of every file this instance was given; hidden
    ones are left out, as the listing left them out."""
    if not folder.is_dir():
        return []  # more instances than objects: SageMaker gives this one nothing
    found = [(p.relative_to(folder).as_posix(), p) for p in folder.rglob("*") if p.is_file()]
    return sorted((key, path) for key, path in found if not is_hidden(key.split("/")))


def prepare_share(base: Path, args: argparse.Namespace) -> Report:
    host = current_host(base)
    given = given_files(base / "processing" / "input" / "source")
    given_keys = {key for key, _ in given}
    plan = Plan.read(base / "processing" / "input" / "plan" / PLAN_FILE, keep=given_keys.__contains__)
    if host not in plan.hosts:
        raise RuntimeError(f"this instance is {shown(str(host))}, which is not a host of the plan "
                           f"({shown(', '.join(plan.hosts))})")
    order = {key: index for index, key in enumerate(plan.items)}  # the plan's shuffled order
    planned = sorted((order[key], key, path) for key, path in given if key in order)
    queue = [(path, *plan.items[key]) for _, key, path in planned]
    keys = {path: key for _, key, path in planned}
    refused = {key for key, _ in plan.rejected}
    output = base / "processing" / "output"
    for folder in (*PARTS, REPORTS):  # (the job's outputs: SageMaker makes them; here too, if it did not)
        (output / folder).mkdir(parents=True, exist_ok=True)
    options = ImageOptions(args.max_image_pixels, args.max_side, args.jpeg_quality)
    written = write_examples(queue, sources.Reader(), output, options, int(args.shard_mb * 1e6),
                             args.workers or default_workers("."), shard_prefix(plan.run, host),
                             source_of=lambda path: plan.source + keys[path])  # (its S3 URI)
    rejected = {path for path, _ in written.rejected}
    kept = [path for path, _, _ in queue if path not in rejected]
    prints = {} if plan.duplicates is None else dict(zip(
        (keys[path] for path in kept), fingerprints(kept, args.max_image_pixels, args.workers or default_workers("."))))
    report = Report(
        run=plan.run,
        host=host,
        prepared={part: [keys[path] for path, _, p in queue if p == part and path not in rejected]
                  for part in ("train", "validation")},
        counts={part: dict(counter) for part, counter in written.counts.items()},
        rejected=[(keys[path], why) for path, why in written.rejected],
        # (files the listing refused, not images by their name, are in the plan's own rejected list;
        # files at the top of the source are in no class folder: the listing said they are skipped)
        unplanned=[key for key, _ in given if key not in order and key not in refused and "/" in key],
        shards={part: [p.name for p in paths] for part, paths in written.shards.items()},
        records=written.records, prints=prints)
    report.write(output / REPORTS)
    print(f"prepare {host}: {len(queue)} images given, {sum(map(len, report.prepared.values()))} prepared, "
          f"{len(report.rejected)} rejected, {len(report.unplanned)} not in the plan", file=sys.stderr)
    return report


def fingerprints(paths: list[Path], max_pixels: int, workers: int) -> list[duplicates.Fingerprint]:
    """The fingerprints of the images this instance prepared, for the merge to find duplicates
    across all instances' shares (prepare.reports): a file read again from the local disk and a
    draft decode (docs/speed.md, Figures behind the code's choices: Duplicates)."""
    def one(path: Path) -> duplicates.Fingerprint:
        return duplicates.fingerprint(path.read_bytes(), max_pixels)

    return list(in_order(one, paths, workers))


def main(argv: list[str] | None = None) -> int:
    quiet_tensorflow_start()  # (`prepare --local` relays its lines to the terminal, where they are prepare's own)
    skip_while_keras_imports()  # (it decodes images with TensorFlow, nothing more)
    pause_collector_while_tensorflow_imports()
    base = base_dir()
    try:
        prepare_share(base, arguments(argv))
        return 0
    except Exception as err:  # any failure: its reason where SageMaker shows it, and a failed job
        message = shown(f"{type(err).__name__}: {err}")  # (a key or a file's name may hold anything)
        (base / "output").mkdir(parents=True, exist_ok=True)
        (base / "output" / "message").write_text(message[:1000] + "\n", encoding="utf-8", errors="backslashreplace")
        print(f"prepare: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
