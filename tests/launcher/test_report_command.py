"""`keras-pipe report JOB` as a user types it: a job's output.tar.gz here or in S3, and a SageMaker
job by its name (DescribeTrainingJob, then its output.tar.gz downloaded), on moto's server; what it
says when there is no report, and that an archive cannot write outside --out. (A local job's
folder: test_local_runner's Pipe-mode run.)"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import run_logged

KERAS_PIPE = str(Path(sys.executable).parent / "keras-pipe")
PAGE = "<!DOCTYPE html><title>the report</title>"


def report(*args, cwd, env=None):
    return run_logged([KERAS_PIPE, "report", *map(str, args)], 60, cwd=cwd, env=env)


def output_archive(path: Path, files: dict[str, bytes]) -> Path:
    """An output.tar.gz as SageMaker writes it: output/data's files at its top."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return path


def test_an_output_archive_here_is_unpacked_beside_and_its_report_printed(tmp_path):
    archive = output_archive(tmp_path / "output.tar.gz", {"report.html": PAGE.encode(), "evaluation.json": b"{}"})
    out = report(archive, "--out", "unpacked", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "unpacked/report.html\n"
    assert (tmp_path / "unpacked/report.html").read_text() == PAGE
    assert (tmp_path / "unpacked/evaluation.json").is_file()
    # an archive that would write outside --out is refused, and writes nothing there
    hostile = output_archive(tmp_path / "hostile.tar.gz", {"../escaped.txt": b"outside --out",
                                                           "report.html": PAGE.encode()})
    out = report(hostile, "--out", "unpacked-hostile", cwd=tmp_path)
    assert out.returncode == 2 and "cannot be read as an output.tar.gz (OutsideDestinationError" in out.stderr
    assert not (tmp_path / "escaped.txt").exists()


def test_an_archive_without_a_report_or_a_folder_without_one_is_said_with_exit_code_1(tmp_path):
    archive = output_archive(tmp_path / "output.tar.gz", {"metrics.json": b"{}"})
    out = report(archive, cwd=tmp_path)
    assert out.returncode == 1 and "output.tar.gz holds no report.html" in out.stderr, out.stderr
    (tmp_path / "empty-job").mkdir()
    out = report("empty-job", cwd=tmp_path)
    assert out.returncode == 1 and "empty-job holds no report.html" in out.stderr, out.stderr
    out = report("not a job!", cwd=tmp_path)
    assert out.returncode == 2 and "no SageMaker job name" in out.stderr, out.stderr


@pytest.mark.slow
def test_a_sagemaker_job_by_its_name_and_by_its_output_uri(aws, tmp_path):
    import boto3

    s3 = boto3.client("s3", endpoint_url=aws["AWS_ENDPOINT_URL"], region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket="reports-bucket")
    data = (output_archive(tmp_path / "made.tar.gz", {"report.html": PAGE.encode()})).read_bytes()
    s3.put_object(Bucket="reports-bucket", Key="jobs/keras-pipe-1/output/output.tar.gz", Body=data)
    sagemaker = boto3.client("sagemaker", endpoint_url=aws["AWS_ENDPOINT_URL"], region_name="us-east-1",
                             aws_access_key_id="testing", aws_secret_access_key="testing")
    sagemaker.create_training_job(
        TrainingJobName="keras-pipe-1", RoleArn="arn:aws:iam::123456789012:role/SageMakerRole",
        AlgorithmSpecification={"TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe:1",
                                "TrainingInputMode": "Pipe"},
        OutputDataConfig={"S3OutputPath": "s3://reports-bucket/jobs/"},
        ResourceConfig={"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        StoppingCondition={"MaxRuntimeInSeconds": 3600})
    out = report("keras-pipe-1", "--no-browser", cwd=tmp_path, env=aws)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "job-reports/keras-pipe-1/report.html\n"
    assert (tmp_path / "job-reports/keras-pipe-1/report.html").read_text() == PAGE
    out = report("s3://reports-bucket/jobs/keras-pipe-1/output/output.tar.gz", cwd=tmp_path / "job-reports", env=aws)
    assert out.returncode == 0 and out.stdout == "job-reports/keras-pipe-1/report.html\n", out
    out = report("s3://reports-bucket/jobs/keras-pipe-2/output/output.tar.gz", cwd=tmp_path, env=aws)
    assert out.returncode == 1 and "does not exist: the job wrote no output.tar.gz" in out.stderr, out.stderr
    out = report("keras-pipe-3", cwd=tmp_path, env=aws)
    assert out.returncode == 2 and "training job keras-pipe-3:" in out.stderr, out.stderr
