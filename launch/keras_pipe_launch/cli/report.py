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
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import webbrowser
from pathlib import Path

from keras_pipe_launch.common.archives import unpack
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError
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
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        path = find(args.job, args.out)
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
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        described = boto3.client("sagemaker").describe_training_job(TrainingJobName=job)
    except (BotoCoreError, ClientError) as err:
        raise UsageError(f"training job {job}: {err}") from None
    status = described.get("TrainingJobStatus")
    if status == "InProgress":
        raise NoReport(f"training job {job} is still in progress: its report is written at its end")
    base = described["OutputDataConfig"]["S3OutputPath"].rstrip("/")
    return f"{base}/{job}/output/output.tar.gz"


def unpacked_from_s3(uri: str, out: Path) -> Path:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from keras_pipe_launch.common.objects import SourceError, parse_s3_uri

    try:
        bucket, key = parse_s3_uri(uri)
    except SourceError as err:
        raise UsageError(str(err)) from None
    with tempfile.TemporaryDirectory(prefix="keras-pipe-report-") as work:
        local = Path(work) / "output.tar.gz"
        try:
            boto3.client("s3").download_file(bucket, key, str(local))
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise NoReport(f"{uri} does not exist: the job wrote no output.tar.gz (it failed before its end?)") \
                    from None
            raise UsageError(f"{uri}: {err}") from None
        except BotoCoreError as err:
            raise UsageError(f"{uri}: {err}") from None
        return unpacked(local, out)
