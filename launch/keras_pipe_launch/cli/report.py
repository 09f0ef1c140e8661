"""`keras-pipe report`: a job's report page (report.html), found, fetched if need be, and opened.

    keras-pipe report local-jobs/first
    keras-pipe report keras-pipe-20261124101500
    keras-pipe report s3://bucket/jobs/keras-pipe-20261124101500/output/output.tar.gz

JOB: a `keras-pipe local` job folder (its chief's algo-1/output/data/report.html), an /opt/ml-like
folder or its output/data, a report.html, an output.tar.gz here or in S3, or the name of a
SageMaker training job, whose output.tar.gz is found from DescribeTrainingJob (under its
OutputDataConfig's S3OutputPath, JOB/output/output.tar.gz) and downloaded. What an output.tar.gz
holds (the report, evaluation.json, metrics.json, the pictures) is unpacked into --out (default:
./job-reports/NAME). Prints the report's path; opens it in the browser when run in a terminal
(--no-browser: never). Exit code 1 when the job has no report (it failed, was stopped before its
end, or ran an older image).

A job that checked its labels (label_error_folds) and trained on a `keras-pipe prepare` output has
its suspects added to that dataset's data report (OUT/report.html and data_report.json, here or in
S3: prepare/label_checks.py): a SageMaker job's train channel is found from DescribeTrainingJob,
--data OUT names the prepare output for any job (`keras-pipe local` adds a local job's at its end).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import sys
import tempfile
import webbrowser
from collections.abc import Iterator
from pathlib import Path

from keras_pipe_launch.common.archives import unpack
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError
from keras_pipe_launch.local.job_folder import JOB_FILE
from keras_pipe_train.settings.channels import TRAIN, TRAINING
from keras_pipe_train.settings.contract import JOB_NAME  # (SageMaker's training job names)

REPORT = "report.html"
MAX_MEMBER_BYTES = 256 << 20  # a file of output.tar.gz unpacked (its pictures, JSON and page are far smaller)


class NoReport(Exception):
    pass


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("report", help="find, fetch and open a job's report page",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", help="a local job folder, output.tar.gz (here or s3://), or a SageMaker job's name")
    parser.add_argument("--out", type=Path, default=None, help="where an output.tar.gz is unpacked "
                                                               "(default: job-reports/NAME)")
    parser.add_argument("--no-browser", action="store_true", help="print the report's path only")
    parser.add_argument("--data", default=None, metavar="OUT",
                        help="the keras-pipe prepare output the job trained on (a folder, or s3://), whose data report "
                             "gets the job's label check (default: a SageMaker job's train channel)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        path = find(args.job, args.out)
        add_label_check(args, path)
    except UsageError as err:
        print(f"keras-pipe report: error: {shown(str(err))}", file=sys.stderr)
        return 2
    except NoReport as err:
        print(f"keras-pipe report: {shown(str(err))}", file=sys.stderr)
        return 1
    print(path)
    if not args.no_browser and sys.stdout.isatty():
        webbrowser.open(path.resolve().as_uri())
    return 0


def add_label_check(args: argparse.Namespace, page: Path) -> None:
    """The job's label check added to its dataset's data report, when it made one and the dataset
    is known: --data, or a SageMaker job's train channel (said when it is not a prepare output only
    if named with --data). A failure to is said: the job's report is found all the same."""
    from keras_pipe_launch.prepare import label_checks

    where = args.data or "the job's train channel"
    try:
        check = label_checks.check_of(page.parent, _job_named(args.job, page), str(page.resolve()))
        if check is None:
            if args.data:
                print(f"keras-pipe report: the job made no label check (label_error_folds): {shown(args.data)}'s "
                      "data report is left as it is", file=sys.stderr)
            return
        if args.data:
            dataset = label_checks.dataset_at(args.data)
            if dataset is None:
                raise UsageError(f"--data {args.data!r} is no keras-pipe prepare output: it holds no data_report.json")
        else:
            train = _train_channel(job) if (job := _sagemaker_job(args.job)) else None
            dataset = label_checks.dataset_of(train) if train else None
            if dataset is None:
                return
            where = dataset.where
        added = label_checks.add(check, dataset)
    except UsageError:
        raise
    except Exception as err:  # (S3 refused, a file of the job's unreadable: its report is there all the same)
        print(f"keras-pipe report: the job's label check was not added to the data report of {shown(where)}: "
              f"{shown(f'{type(err).__name__}: {err}')}", file=sys.stderr)
        return
    print(f"keras-pipe report: {added.suspects:,} suspects added to the data report {shown(added.page)}",
          file=sys.stderr)


def _job_named(job: str, page: Path) -> str:
    """The job's name as the data report lists it: a SageMaker job's; a local job's (its folder's
    local-job.json); else the folder its report was found or unpacked in (an /opt/ml's)."""
    if named := _sagemaker_job(job):
        return named
    page = page.resolve()
    for folder in page.parents:
        if (folder / JOB_FILE).is_file():
            return json.loads((folder / JOB_FILE).read_text()).get("name") or folder.name
    return page.parents[2].name if page.parent.parts[-2:] == ("output", "data") else page.parent.name


def _train_channel(job: str) -> str | None:
    """The S3 URI of SageMaker training job `job`'s train channel (an S3 prefix), if it has one: its
    `train` channel, or its `training` one, which the job reads as train (settings/contract.py)."""
    named = {channel.get("ChannelName"): channel.get("DataSource", {}).get("S3DataSource", {})
             for channel in described(job).get("InputDataConfig", [])}
    source = named.get(TRAIN) or named.get(TRAINING) or {}
    return source.get("S3Uri") if source.get("S3DataType", "S3Prefix") == "S3Prefix" else None


def _sagemaker_job(job: str) -> str | None:
    """The SageMaker job's name when JOB is one, or the S3 URI of one's output.tar.gz."""
    if JOB_NAME.match(job) and not Path(job).exists():
        return job
    if job.startswith("s3://") and JOB_NAME.match(name := _job_of_uri(job)) and job.rstrip("/").endswith(
            f"/{name}/output/output.tar.gz"):
        return name
    return None


def find(job: str, out: Path | None) -> Path:
    """The report.html of `job` on this machine (fetched and unpacked first when it is elsewhere)."""
    given = Path(job)
    if given.is_dir():
        return in_folder(given)
    if given.is_file():
        if given.name.endswith((".html", ".htm")):
            return given
        return unpacked(given, out or Path("job-reports") / _stem(given.name))
    if job.startswith("s3://"):
        return unpacked_from_s3(job, out or Path("job-reports") / _job_of_uri(job))
    if JOB_NAME.match(job):
        return unpacked_from_s3(output_archive(job), out or Path("job-reports") / job)
    raise UsageError(f"{job!r} is no folder or file here, no s3:// URI, and no SageMaker job name")


def in_folder(folder: Path) -> Path:
    """A local job folder's chief's report, or an /opt/ml (or output/data) folder's own."""
    for candidate in (folder / REPORT, folder / "output/data" / REPORT, folder / "algo-1/output/data" / REPORT):
        if candidate.is_file():
            return candidate
    found = sorted(folder.glob(f"*/output/data/{REPORT}"))
    if found:
        return found[0]
    raise NoReport(f"{folder} holds no {REPORT} (in output/data/, or a host's: algo-1/output/data/): the job failed "
                   "or was stopped before its end, or ran without a validation channel")


def _stem(name: str) -> str:
    return re.sub(r"\.(tar\.gz|tgz|tar)$", "", name) or "job"


def _job_of_uri(uri: str) -> str:
    """The job's name in .../JOB/output/output.tar.gz (SageMaker's layout), else the file's stem."""
    parts = uri.rstrip("/").split("/")
    if len(parts) >= 3 and parts[-2] == "output" and JOB_NAME.match(parts[-3]):
        return parts[-3]
    return _stem(parts[-1])


def unpacked(archive: Path, out: Path) -> Path:
    """output.tar.gz's plain files unpacked into `out` (common.archives), its report's path."""
    unpack(archive, out, lambda member: member.isfile() and member.size <= MAX_MEMBER_BYTES, "an output.tar.gz")
    report = out / REPORT
    if not report.is_file():
        raise NoReport(f"{archive} holds no {REPORT}: the job failed or was stopped before its end, ran without a "
                       "validation channel, or ran an image older than the report")
    return report


def output_archive(job: str) -> str:
    """The S3 URI of SageMaker training job `job`'s output.tar.gz."""
    job_description = described(job)
    if job_description.get("TrainingJobStatus") == "InProgress":
        raise NoReport(f"training job {job} is still in progress: its report is written at its end")
    base = job_description["OutputDataConfig"]["S3OutputPath"].rstrip("/")
    return f"{base}/{job}/output/output.tar.gz"


@functools.cache
def described(job: str) -> dict:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return boto3.client("sagemaker").describe_training_job(TrainingJobName=job)
    except (BotoCoreError, ClientError) as err:
        raise UsageError(f"training job {job}: {err}") from None


def unpacked_from_s3(uri: str, out: Path) -> Path:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        with downloaded(uri, "keras-pipe-report-") as local:
            if local is None:
                raise NoReport(f"{uri} does not exist: the job wrote no output.tar.gz (it failed before its end?)")
            return unpacked(local, out)
    except (BotoCoreError, ClientError) as err:
        raise UsageError(f"{uri}: {err}") from None


@contextlib.contextmanager
def downloaded(uri: str, prefix: str) -> Iterator[Path | None]:
    """A job's output.tar.gz in S3 (`uri`), downloaded into a temporary folder (named `prefix`...)
    for the time of the `with`: its path, or None when the object does not exist. An `uri` that is
    no S3 URI is a UsageError; S3's other refusals are raised as botocore raised them."""
    import boto3
    from botocore.exceptions import ClientError

    from keras_pipe_launch.common.objects import SourceError, parse_s3_uri

    try:
        bucket, key = parse_s3_uri(uri)
    except SourceError as err:
        raise UsageError(str(err)) from None
    with tempfile.TemporaryDirectory(prefix=prefix) as work:
        local = Path(work) / "output.tar.gz"
        try:
            boto3.client("s3").download_file(bucket, key, str(local))
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey"):
                raise
            local = None
        yield local
