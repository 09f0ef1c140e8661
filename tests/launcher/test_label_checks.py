"""A job's label check added to the data report of the dataset it trained on
(keras_pipe_launch/prepare/label_checks.py): prepare's data report here and in S3 (moto's server),
the job's files as the job writes them (keras_pipe_train.report.suspects), and `keras-pipe report`
of a SageMaker job, which finds the dataset from the job's train channel. (`keras-pipe local`
adding its job's check at its end: docs/local.md, run as written by tests/docs.)"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from keras_pipe_launch.prepare import data_report
from keras_pipe_launch.prepare import label_checks as L
from keras_pipe_launch.prepare.duplicates import Group
from keras_pipe_train.report import suspects as S
from keras_pipe_train.training.gathered import Gathered
from keras_pipe_train.training.label_errors import Suspects
from tests.browser import open_page
from tests.conftest import run_logged

KERAS_PIPE = str(Path(sys.executable).parent / "keras-pipe")
NAMES = ("cats/a.jpg", "cats/b.jpg", "dogs/<img src=x onerror=alert(1)>.jpg", "dogs/d.jpg")


def jpeg(shade: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (shade, 255 - shade, 90)).save(out, "JPEG")
    return out.getvalue()


def prepared(out: Path, source: str, names=NAMES) -> Path:
    """A data report as prepare writes it, of `names` in class folders (a duplicate group of the
    first two, so the page has a picture of its own to keep)."""
    items = [(f"{source}/{name}", 0 if name.startswith("cats") else 1) for name in names]
    counts = {"train": {0: 2, 1: 1}, "validation": {0: 0, 1: 1}}
    report = data_report.build(source, ["cats", "dogs"], items, [None] * len(items), [Group((0, 1), "exact")],
                               {where: "train" for where, _ in items}, counts, 0, 6)
    data_report.write(out, report, {names[0]: jpeg(10), names[1]: jpeg(10)})
    (out / "train").mkdir()
    return out


def job_output(folder: Path, sources: tuple[str, ...]) -> Path:
    """output/data of a job whose check suspects its images 2 and 0 (as the job writes it)."""
    seen = Gathered(np.zeros((len(sources), 2), np.float32), np.array([0, 0, 1, 1][:len(sources)]),
                    fingerprints=tuple(f"{i:016x}" for i in range(len(sources))), sources=sources)
    found = Suspects(np.array([2, 0]), np.array([0, 1]), np.array([0.02, 0.1]), np.array([0.97, 0.88]))
    S.write(folder, S.Checked({"train": (seen, found)}, ("cats", "dogs"), 5, trained_features=False, seconds=1.0),
            folder.name)
    (folder / "report.html").write_text("<!DOCTYPE html><title>the job's report</title>")
    return folder


def local_photos(root: Path) -> Path:
    for shade, name in enumerate(NAMES):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(jpeg(60 * shade))
    return root


def test_a_jobs_check_is_added_to_its_datasets_report_and_page_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local_photos(tmp_path / "photos")
    dataset_dir = prepared(tmp_path / "prepared", "photos")
    output = job_output(tmp_path / "local-jobs/first/algo-1/output/data", NAMES)
    before = (dataset_dir / "report.html").read_text()
    before_json = json.loads((dataset_dir / "data_report.json").read_text())
    assert "none yet: a job trained on this data" in before

    dataset = L.dataset_of("prepared/train")
    assert dataset is not None and dataset.where == "prepared"
    check = L.check_of(output, "first", str(output / "report.html"))
    added = L.add(check, dataset)
    assert added == L.Added(str(Path("prepared/report.html")), 2)
    report = json.loads((dataset_dir / "data_report.json").read_text())
    (entry,) = report["label_checks"]
    assert entry["job"] == "first" and entry["folds"] == 5
    assert entry["sets"] == {"train": {"examined": 4, "suspected": 2, "cut": False}}
    assert [(s["source"], s["rank"], s["given_label"], s["likely_label"], s["given_probability"])
            for s in entry["suspects"]] == [(NAMES[2], 1, "dogs", "cats", 0.02), (NAMES[0], 2, "cats", "dogs", 0.1)]
    assert {key: value for key, value in report.items() if key != "label_checks"} == before_json  # (kept)
    page = (dataset_dir / "report.html").read_text()
    assert "none yet: a job trained on this data" not in page and page.count(data_report.CHECKS_START) == 1
    assert "Train images that first suspects" in page and "2 of 4" in page
    # both suspects' pictures read again from the photos; the duplicates' two pictures kept
    assert page.count('alt="dogs/&lt;img src=x onerror=alert(1)&gt;.jpg: labelled dogs"') == 1
    assert page.count("data:image/jpeg;base64,") == 4 and "<img src=x" not in page
    assert '<a href="../local-jobs/first/algo-1/output/data/report.html">first</a>' in page
    assert page.replace(page[page.find(data_report.CHECKS_START):page.find(data_report.CHECKS_END)], "") == \
        before.replace(before[before.find(data_report.CHECKS_START):before.find(data_report.CHECKS_END)], "")
    opened = open_page(dataset_dir / "report.html", tmp_path / "browser")
    assert opened.console == [] and opened.requests == [], (opened.console, opened.requests)


def test_the_same_job_replaces_its_check_and_the_newest_jobs_are_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local_photos(tmp_path / "photos")
    dataset = L.dataset_at(str(prepared(tmp_path / "prepared", "photos")))
    for job in ("j1", "j2", "j1", "j3", "j4", "j5", "j6"):
        output = job_output(tmp_path / job / "output/data", NAMES)
        L.add(L.check_of(output, job), dataset)
    checks = json.loads((tmp_path / "prepared/data_report.json").read_text())["label_checks"]
    assert [c["job"] for c in checks] == ["j6", "j5", "j4", "j3", "j1"]  # (j1 again replaced its own; j2 oldest)
    page = (tmp_path / "prepared/report.html").read_text()
    assert page.count(data_report.CHECKS_START) == 1 and "suspected by 5 of 5 jobs" in page
    assert "keras-pipe report j6" in page  # (no page here to link to)


def test_a_page_of_an_older_prepare_gets_the_section_before_its_end(tmp_path):
    dataset_dir = prepared(tmp_path / "prepared", str(tmp_path / "photos"))
    page = dataset_dir / "report.html"
    page.write_text(page.read_text().replace(data_report.CHECKS_START, "").replace(data_report.CHECKS_END, ""))
    L.add(L.check_of(job_output(tmp_path / "job", NAMES), "job"), L.dataset_at(str(dataset_dir)))
    text = page.read_text()
    assert text.index(data_report.CHECKS_START) < text.index("</body>") and "Labels the jobs suspect" in text
    assert text.count("data:image/jpeg;base64,") == 2  # (the photos are not there: no picture, their names)
    assert f">labelled: dogs (2%)<br>likely: cats (97%)<br>{NAMES[2].replace('<', '&lt;').replace('>', '&gt;')}" \
           in text


def test_what_is_no_prepare_output_and_a_job_without_a_check(tmp_path):
    (tmp_path / "plain/train").mkdir(parents=True)
    assert L.dataset_of(str(tmp_path / "plain/train")) is None
    (tmp_path / "plain/data_report.json").write_text('{"format": "something else"}')
    assert L.dataset_of(str(tmp_path / "plain/train")) is None and L.dataset_at(str(tmp_path / "plain")) is None
    (tmp_path / "job").mkdir()
    assert L.check_of(tmp_path / "job", "job") is None


def test_a_dataset_in_s3_gets_the_check_of_a_job_that_read_its_images_there(s3_bucket, tmp_path):
    client, bucket = s3_bucket
    source = f"s3://{bucket}/photos"
    for shade, name in enumerate(NAMES):
        client.put_object(Bucket=bucket, Key=f"photos/{name}", Body=jpeg(60 * shade))
    local = prepared(tmp_path / "prepared", source)
    for name in (data_report.JSON_NAME, data_report.HTML_NAME):
        client.put_object(Bucket=bucket, Key=f"datasets/d1/{name}", Body=(local / name).read_bytes())
    dataset = L.dataset_of(f"s3://{bucket}/datasets/d1/train/")
    assert dataset is not None and dataset.where == f"s3://{bucket}/datasets/d1"
    assert L.dataset_of(f"s3://{bucket}/datasets/d2/train/") is None
    output = job_output(tmp_path / "output", tuple(f"{source}/{name}" for name in NAMES))
    added = L.add(L.check_of(output, "keras-pipe-7"), dataset)
    assert added.page == f"s3://{bucket}/datasets/d1/report.html"
    stored = client.get_object(Bucket=bucket, Key="datasets/d1/report.html")
    assert stored["ContentType"] == "text/html; charset=utf-8"
    page = stored["Body"].read().decode()
    assert page.count("data:image/jpeg;base64,") == 4 and "keras-pipe report keras-pipe-7" in page
    report = json.loads(client.get_object(Bucket=bucket, Key="datasets/d1/data_report.json")["Body"].read())
    assert [s["source"] for s in report["label_checks"][0]["suspects"]] == [f"{source}/{NAMES[2]}",
                                                                            f"{source}/{NAMES[0]}"]


def output_archive(folder: Path) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for path in folder.iterdir():
            tar.add(path, arcname=path.name)
    return out.getvalue()


@pytest.mark.slow
def test_keras_pipe_report_of_a_sagemaker_job_adds_its_check_to_its_train_channels_dataset(aws, tmp_path):
    import boto3

    job = "keras-pipe-8"
    clients = {name: boto3.client(name, endpoint_url=aws["AWS_ENDPOINT_URL"], region_name="us-east-1",
                                  aws_access_key_id="testing", aws_secret_access_key="testing")
               for name in ("s3", "sagemaker")}
    s3 = clients["s3"]
    s3.create_bucket(Bucket="data-bucket")
    local = prepared(tmp_path / "prepared", "s3://data-bucket/photos")
    for name in (data_report.JSON_NAME, data_report.HTML_NAME):
        s3.put_object(Bucket="data-bucket", Key=f"d/{name}", Body=(local / name).read_bytes())
    output = job_output(tmp_path / "output", tuple(f"s3://data-bucket/photos/{name}" for name in NAMES))
    s3.put_object(Bucket="data-bucket", Key=f"jobs/{job}/output/output.tar.gz", Body=output_archive(output))
    clients["sagemaker"].create_training_job(
        TrainingJobName=job, RoleArn="arn:aws:iam::123456789012:role/SageMakerRole",
        AlgorithmSpecification={"TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe:1",
                                "TrainingInputMode": "Pipe"},
        InputDataConfig=[{"ChannelName": "training", "DataSource": {"S3DataSource": {  # (the job reads it as train)
            "S3DataType": "S3Prefix", "S3Uri": "s3://data-bucket/d/train/"}}}],
        OutputDataConfig={"S3OutputPath": "s3://data-bucket/jobs/"},
        ResourceConfig={"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        StoppingCondition={"MaxRuntimeInSeconds": 3600})
    out = run_logged([KERAS_PIPE, "report", job, "--no-browser"], 60, cwd=tmp_path, env=aws)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"job-reports/{job}/report.html\n"
    assert "2 suspects added to the data report s3://data-bucket/d/report.html" in out.stderr, out.stderr
    report = json.loads(s3.get_object(Bucket="data-bucket", Key="d/data_report.json")["Body"].read())
    assert [c["job"] for c in report["label_checks"]] == [job]
    # its output.tar.gz's URI names it too: added again, in place of its own
    out = run_logged([KERAS_PIPE, "report", f"s3://data-bucket/jobs/{job}/output/output.tar.gz", "--out", "again"], 60,
                     cwd=tmp_path, env=aws)
    assert out.returncode == 0 and "2 suspects added to the data report s3://data-bucket/d/" in out.stderr, out.stderr
    report = json.loads(s3.get_object(Bucket="data-bucket", Key="d/data_report.json")["Body"].read())
    assert [c["job"] for c in report["label_checks"]] == [job]
    # --data names the dataset for a job found otherwise (its archive here); one that is none is refused
    out = run_logged([KERAS_PIPE, "report", f"job-reports/{job}", "--data", str(local), "--no-browser"], 60,
                     cwd=tmp_path, env=aws)
    assert out.returncode == 0 and "2 suspects added to the data report" in out.stderr, out.stderr
    assert [c["job"] for c in json.loads((local / data_report.JSON_NAME).read_text())["label_checks"]] == [job]
    out = run_logged([KERAS_PIPE, "report", f"job-reports/{job}", "--data", str(tmp_path / "output")], 60,
                     cwd=tmp_path, env=aws)
    assert out.returncode == 2 and "is no keras-pipe prepare output" in out.stderr, out.stderr
