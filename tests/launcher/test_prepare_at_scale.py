"""`keras-pipe prepare --instance-count N`: a Processing job's instances, each with its ShardedByS3Key
share, together make the dataset one machine makes (here: 3 local processes over moto's S3)."""

import collections
import hashlib
import json
import re
from pathlib import Path

import pytest
import tensorflow as tf

from keras_pipe_launch.prepare.dataset import PrepareError, prepare
from keras_pipe_launch.prepare.processing import prepare_locally
from tests.conftest import REPO, prepared_features, run_logged, sdk2_python
from tests.launcher.conftest import dry_run_request, launch_cli, sent

FEATURES = prepared_features()


def upload_folder(client, bucket: str, root: Path, prefix: str) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}{path.relative_to(root).as_posix()}", Body=path.read_bytes())


def examples_by_part(client, bucket: str, prefix: str, folder: Path, sources: bool = False
                     ) -> dict[str, collections.Counter]:
    """(image digest, label) of every example of each part, from the shards under s3://bucket/prefix;
    with `sources`, (image digest, label, where the image came from)."""
    found = {}
    for part in ("train", "validation"):
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}{part}/")["Contents"]]
        files = []
        for key in keys:
            files.append(str(folder / key.replace("/", "_")))
            client.download_file(bucket, key, files[-1])
        found[part] = collections.Counter(
            described(e, sources) for e in (tf.io.parse_single_example(r, FEATURES)
                                            for r in tf.data.TFRecordDataset(files)))
    return found


def described(example, sources: bool, moved_to: str = "") -> tuple:
    """(image digest, label), with `sources` and its source (under `moved_to`) too."""
    found = (hashlib.sha256(example["image/encoded"].numpy()).hexdigest(), int(example["image/class/label"]))
    return (*found, moved_to + example["image/source"].numpy().decode()) if sources else found


def local_examples_by_part(folder: Path, sources: bool = False, moved_to: str = "") -> dict[str, collections.Counter]:
    """examples_by_part's of a local dataset; its sources, paths under the local folder it was
    prepared from, put under `moved_to` (the S3 prefix the same images were uploaded to)."""
    return {part: collections.Counter(
        described(e, sources, moved_to)
        for e in (tf.io.parse_single_example(r, FEATURES)
                  for r in tf.data.TFRecordDataset(sorted(str(p) for p in (folder / part).glob("*.tfrecord")))))
        for part in ("train", "validation")}


@pytest.mark.slow
def test_three_instances_prepare_each_image_exactly_once_as_one_machine_does(photos, tmp_path, s3_bucket, capsys):
    root, _ = photos
    client, bucket = s3_bucket
    upload_folder(client, bucket, root, "photos/")
    client.put_object(Bucket=bucket, Key="photos/README.txt", Body=b"in no class folder: skipped, as one machine does")
    # (with duplicates looked for, one machine and the plan split alike only where the plan sees
    # every group: test_prepare_duplicates has the split of both with duplicates)
    one = prepare(root, tmp_path / "one", validation_fraction=0.2, duplicate_distance=None)
    many = prepare_locally(f"s3://{bucket}/photos/", f"s3://{bucket}/prepared/", instance_count=3,
                           job_dir=tmp_path / "jobs", validation_fraction=0.2, arguments=["--shard-mb", "0.02"],
                           duplicate_distance=None)
    assert many["classes"] == one["classes"]
    said = capsys.readouterr().err
    assert f"1 file at the top of s3://{bucket}/photos/ is in no class folder: skipped (README.txt)" in said, said
    assert "after it was listed" not in said, said
    assert (many["train"], many["validation"], many["rejected"]) == (one["train"], one["validation"], 2)
    # the same examples, each once, in the same part (the split is the plan's, made as one machine makes it)
    # the same examples, each naming its image's S3 URI (what the job's manifest of suspects needs)
    assert examples_by_part(client, bucket, "prepared/", tmp_path, sources=True) == local_examples_by_part(
        tmp_path / "one", sources=True, moved_to=f"s3://{bucket}/photos/")
    # every instance had a share, and named its shards after the run and itself
    run = json.loads(client.get_object(Bucket=bucket, Key="prepared/prepare-run.json")["Body"].read())
    assert run["state"] == "complete" and run["instance_count"] == 3
    shards = [url for urls in many["shards"].values() for url in urls]
    assert {re.fullmatch(rf"part-{run['run']}-(algo-\d)-\d{{5}}\.tfrecord", url.rsplit("/", 1)[1])[1]
            for url in shards} == {"algo-1", "algo-2", "algo-3"}
    assert len(shards) == len(set(shards))
    stored = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="prepared/")["Contents"]}
    assert {"prepared/classes.json", "prepared/rejected.txt", "prepared/plan/plan.json.gz", "prepared/report.html",
            "prepared/data_report.json",
            "prepared/prepare-run.json", *(f"prepared/reports/{run['run']}-algo-{i}.json.gz" for i in (1, 2, 3))} == {
        key for key in stored if "/train/" not in key and "/validation/" not in key}
    rejected = client.get_object(Bucket=bucket, Key="prepared/rejected.txt")["Body"].read().decode()
    assert sorted(line.split("\t")[0] for line in rejected.splitlines()) == [
        f"s3://{bucket}/photos/digit3/broken.jpg", f"s3://{bucket}/photos/digit5/readme.txt"]
    assert client.get_object(Bucket=bucket, Key="prepared/classes.json")["Body"].read() == (
        (tmp_path / "one" / "classes.json").read_bytes())


@pytest.mark.slow
def test_an_instance_that_fails_fails_the_run_with_its_reason(photos, tmp_path, s3_bucket, capsys):
    root, _ = photos
    client, bucket = s3_bucket
    upload_folder(client, bucket, root, "photos/")
    with pytest.raises(PrepareError, match="an instance failed .* marked incomplete"):
        prepare_locally(f"s3://{bucket}/photos/", f"s3://{bucket}/prepared/", instance_count=2,
                        job_dir=tmp_path / "jobs", arguments=["--max-image-pixels", "not-a-number"])
    out = capsys.readouterr().out
    # The first to fail gets the others stopped (SIGTERM, exit 143), as SageMaker does: whichever it
    # was, its reason is shown, from where SageMaker takes the ExitMessage
    failed = re.findall(r"(algo-\d) failed with exit code 1: ArgumentError: argument --max-image-pixels: "
                        r"'not-a-number': give a whole number of at least 1", out)
    assert failed, out
    for host in failed:
        assert (tmp_path / "jobs" / host / "output" / "message").read_text().startswith("ArgumentError: ")
    assert not client.list_objects_v2(Bucket=bucket, Prefix="prepared/train/").get("KeyCount")  # nothing merged
    state = json.loads(client.get_object(Bucket=bucket, Key="prepared/prepare-run.json")["Body"].read())
    assert state["state"] == "incomplete" and "an instance failed" in state["reason"]
    # --finish removes what the run left, and OUT can be used again
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/prepared/")
    assert out.returncode == 1 and "no report from algo-1, algo-2" in out.stderr, out.stderr
    assert "which can be used again" in out.stderr
    assert not client.list_objects_v2(Bucket=bucket, Prefix="prepared/").get("KeyCount")


@pytest.mark.slow
def test_the_output_prefix_must_be_new_and_the_source_a_prefix_of_class_folders(photos, tmp_path, s3_bucket):
    root, _ = photos
    client, bucket = s3_bucket
    upload_folder(client, bucket, root, "photos/")
    client.put_object(Bucket=bucket, Key="used/x", Body=b"x")
    with pytest.raises(PrepareError, match=f"s3://{bucket}/used/ already holds objects"):
        prepare_locally(f"s3://{bucket}/photos/", f"s3://{bucket}/used/", instance_count=2, job_dir=tmp_path / "a")
    with pytest.raises(PrepareError, match="prepare a CSV or a manifest on one machine"):
        prepare_locally(f"s3://{bucket}/labels.csv", f"s3://{bucket}/new/", instance_count=2, job_dir=tmp_path / "b")
    with pytest.raises(PrepareError, match="prepare a CSV or a manifest on one machine"):
        prepare_locally(f"s3://{bucket}/gt/output.manifest", f"s3://{bucket}/new/", instance_count=2,
                        job_dir=tmp_path / "c")
    # the output inside the source (its plan and shards would be source objects) or around it
    for out in (f"s3://{bucket}/photos/prepared/", f"s3://{bucket}/"):
        with pytest.raises(PrepareError, match="the output prefix must be outside the source prefix"):
            prepare_locally(f"s3://{bucket}/photos/", out, instance_count=2, job_dir=tmp_path / "c")
    (tmp_path / "file").write_text("x")
    with pytest.raises(PrepareError, match="--job-dir .* is a file"):
        prepare_locally(f"s3://{bucket}/photos/", f"s3://{bucket}/new/", instance_count=2, job_dir=tmp_path / "file")


AT_SCALE = ["s3://photos-bucket/photos/", "s3://photos-bucket/prepared/", "--instance-count", "3",
            "--role", "arn:aws:iam::123456789012:role/SageMakerRole",
            "--image-uri", "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:1", "--max-side", "512"]


def test_dry_run_prints_the_create_processing_job_request():
    request = dry_run_request("prepare", *AT_SCALE, "--job-name", "prep-1", "--volume-size", "200", "--max-run", "6h")
    assert request == {
        "ProcessingJobName": "prep-1",
        "ProcessingInputs": [
            {"InputName": "source", "AppManaged": False, "S3Input": {
                "S3Uri": "s3://photos-bucket/photos/", "LocalPath": "/opt/ml/processing/input/source",
                "S3DataType": "S3Prefix", "S3InputMode": "File", "S3DataDistributionType": "ShardedByS3Key",
                "S3CompressionType": "None"}},
            {"InputName": "plan", "AppManaged": False, "S3Input": {
                "S3Uri": "s3://photos-bucket/prepared/plan/", "LocalPath": "/opt/ml/processing/input/plan",
                "S3DataType": "S3Prefix", "S3InputMode": "File", "S3DataDistributionType": "FullyReplicated",
                "S3CompressionType": "None"}}],
        "ProcessingOutputConfig": {"Outputs": [{"OutputName": folder, "AppManaged": False, "S3Output": {
            "S3Uri": f"s3://photos-bucket/prepared/{folder}/", "LocalPath": f"/opt/ml/processing/output/{folder}",
            "S3UploadMode": "EndOfJob"}} for folder in ("train", "validation", "reports")]},
        "ProcessingResources": {"ClusterConfig": {"InstanceCount": 3, "InstanceType": "ml.c5.4xlarge",
                                                  "VolumeSizeInGB": 200}},
        "StoppingCondition": {"MaxRuntimeInSeconds": 6 * 3600},
        "AppSpecification": {"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:1",
                             "ContainerEntrypoint": ["/usr/bin/tini", "--", "python3", "-m",
                                                     "keras_pipe_launch.prepare.instance"],
                             "ContainerArguments": ["--shard-mb", "100", "--jpeg-quality", "90",
                                                    "--max-image-pixels", "100000000", "--max-side", "512"]},
        "RoleArn": "arn:aws:iam::123456789012:role/SageMakerRole",
    }


@pytest.mark.slow
@pytest.mark.parametrize("sdk", ["v3", "v2"])
def test_both_sdks_send_exactly_the_dry_run_request(sdk, aws, moto_endpoint):
    import json
    import sys

    request = dry_run_request("prepare", *AT_SCALE, "--job-name", f"prep-{sdk}")
    python = sys.executable if sdk == "v3" else str(sdk2_python())
    out = run_logged([python, "-c", "import json, sys; from keras_pipe_launch.sagemaker.sdk import process; "
                      "print(process(json.loads(sys.argv[1])))", json.dumps(request)], 120, env=aws, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sent(moto_endpoint, "CreateProcessingJob") == [request]


@pytest.mark.parametrize("args, message", [
    (["./photos", "s3://b-b-b/out/", "--instance-count", "2", "--local"], "prepares an s3:// SOURCE into an s3:// OUT"),
    (["s3://b-b-b/photos/", "s3://b-b-b/out/", "--instance-count", "2"], "needs --role and --image-uri"),
    ([*AT_SCALE, "--instance-type", "ml.g9.huge"], "'ml.g9.huge' is not a SageMaker Processing instance type"),
    ([*AT_SCALE, "--max-run", "10d"], "--max-run must be 1 s to 9 days"),
    (["s3://b-b-b/photos/", "./out", "--dry-run"], "--dry-run is for a prepare at scale: give --instance-count"),
    ([*AT_SCALE, "--upload", "s3://b-b-b/x/"], "--upload is for a one-machine prepare"),
    ([*AT_SCALE, "--job-name", "../up"], "--job-name '../up': 1-63 letters, digits and hyphens"),
    # checked where the command starts, not inside the instances once the plan is written
    ([*AT_SCALE, "--workers", "-3"], "argument --workers: '-3': give a whole number of at least 1"),
    ([*AT_SCALE, "--max-image-pixels", "-5"], "argument --max-image-pixels: '-5': give a whole number"),
    ([*AT_SCALE, "--shard-mb", "nan"], "argument --shard-mb: 'nan': give a size in MB, more than 0"),
    ([*AT_SCALE, "--shard-mb", "-1"], "argument --shard-mb: '-1': give a size in MB"),
    ([*AT_SCALE[:3], "1000", *AT_SCALE[4:]], "--instance-count must be 1 to 100"),
    # what the real run refuses before it sends anything, the dry run refuses too
    (["s3://photos-bucket/photos/", "s3://photos-bucket/photos/prepared/", *AT_SCALE[2:]],
     "the output prefix must be outside the source prefix"),
    (["s3://photos-bucket/photos/", "s3://photos-bucket/photos/", *AT_SCALE[2:]],
     "the output prefix must be outside the source prefix"),
    (["s3://photos-bucket/labels.csv", *AT_SCALE[1:]], "prepare a CSV or a manifest on one machine"),
    ([*AT_SCALE, "--local"], "--local runs the instances here and sends none: give one of them"),
    (["s3://b-b-b/photos/", "s3://b-b-b/out/", "--finish", "s3://b-b-b/out/"], "--finish OUT takes no SOURCE"),
    (["s3://b-b-b/photos/"], "give SOURCE and OUT (or --finish OUT)"),
])
def test_prepare_at_scale_options_given_wrongly(args, message):
    out = launch_cli("prepare", *args, "--dry-run" if "--dry-run" not in args else "--seed=0")
    assert out.returncode == 2 and message in out.stderr, out.stderr


@pytest.mark.slow
def test_on_sagemaker_the_plan_is_written_the_job_created_followed_and_an_empty_output_refused(
        photos, tmp_path, aws, moto_endpoint):
    """The whole SageMaker path against moto, whose processing jobs complete at once without running
    anything: so the merge finds no instance's report, and says so rather than writing a dataset."""
    import boto3

    root, _ = photos
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="photos-bucket")
    upload_folder(client, "photos-bucket", root, "photos/")
    out = launch_cli("prepare", *AT_SCALE, "--job-name", "prep-on-sagemaker", env=aws)
    assert out.returncode == 1, out.stderr
    assert "keras-pipe prepare: submitting with SageMaker SDK v3" in out.stderr
    assert "keras-pipe prepare: prep-on-sagemaker: Completed" in out.stderr
    assert "error: no report from algo-1, algo-2, algo-3" in out.stderr
    assert "s3://photos-bucket/prepared/ is marked incomplete" in out.stderr
    (request,) = sent(moto_endpoint, "CreateProcessingJob")
    assert request["ProcessingJobName"] == "prep-on-sagemaker"
    stored = [o["Key"] for o in client.list_objects_v2(Bucket="photos-bucket", Prefix="prepared/")["Contents"]]
    assert stored == ["prepared/plan/plan.json.gz", "prepared/prepare-run.json"]  # the plan, no dataset
    state = json.loads(client.get_object(Bucket="photos-bucket", Key="prepared/prepare-run.json")["Body"].read())
    assert (state["state"], state["job"], state["where"]) == ("incomplete", "prep-on-sagemaker", "sagemaker")
    # a new run on that OUT says how to free it; --finish asks SageMaker how the job ended, then removes the run
    out = launch_cli("prepare", *AT_SCALE, "--job-name", "prep-again", env=aws)
    assert out.returncode == 2 and "--finish s3://photos-bucket/prepared/" in out.stderr, out.stderr
    out = launch_cli("prepare", "--finish", "s3://photos-bucket/prepared/", env=aws)
    assert out.returncode == 1 and "removed what it left in s3://photos-bucket/prepared/" in out.stderr, out.stderr
    assert not client.list_objects_v2(Bucket="photos-bucket", Prefix="prepared/").get("KeyCount")
