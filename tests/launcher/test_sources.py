"""The data users have, through the launcher: Ground Truth manifests as a channel (`keras-pipe local`
streams them as SageMaker does: the listed attributes of each line, one RecordIO record each; lines
shuffled and sharded), from a manifest in moto's S3 on 127.0.0.1 or a local one; every bad line is
an error naming it; `submit` requests them through both SDKs; `prepare` takes them; the job trains
on them and serves. MXNet RecordIO image files fed in Pipe mode, trained and served."""

from __future__ import annotations

import json
import os

import pytest

from keras_pipe_launch.common.channels import ChannelError, ChannelSpec
from keras_pipe_launch.common.objects import SourceError
from keras_pipe_launch.local.feeder import PipeFeeder
from keras_pipe_launch.local.manifest import read_manifest
from pipemode import recordio
from pipemode.corruption import CorruptionPolicy
from tests.conftest import QUICK, REPO, launch_local, sdk2_python, stream_reader
from tests.launcher.conftest import dry_run_request, launch_cli, sent_through_sdk
from tests.launcher.test_local_runner import feed_in_background, read_passes
from tests.launcher.test_submit import IMAGE, ROLE, same_request

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SINGLE = ("source-ref", "digit", "digit-metadata")


@pytest.fixture(scope="module")
def digits():
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    images, labels = load_digits()
    return [digit_jpeg(image, 32) for image in images[:300]], [int(y) for y in labels[:300]]


def ground_truth_line(ref: str, label: int, job: str = "digits") -> dict:
    """A line of a single-label image classification job's output manifest, as Ground Truth writes
    it: the attributes it was given (source-ref, and here an id from the user), the label, its
    metadata."""
    return {"source-ref": ref, "image-id": ref.rsplit("/", 1)[-1], "digit": label, "digit-metadata": {
        "class-name": NAMES[label], "confidence": 0.91, "type": "groundtruth/image-classification",
        "job-name": f"labeling-job/{job}", "human-annotated": "yes", "creation-date": "2026-11-02T10:11:12.123456"}}


def multi_label_line(ref: str, labels: list[int]) -> dict:
    """The same, of a multi-label job (Ground Truth's image-classification-multilabel output)."""
    return {"source-ref": ref, "digits": labels, "digits-metadata": {
        "class-map": {str(i): NAMES[i] for i in labels}, "confidence-map": {str(i): 0.88 for i in labels},
        "type": "groundtruth/image-classification-multilabel", "job-name": "labeling-job/pairs",
        "human-annotated": "yes", "creation-date": "2026-11-02T10:11:12.123456"}}


def write_lines(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


@pytest.fixture
def s3_manifests(s3_bucket, digits):
    """Images in moto's S3 under names as users give them, and train/validation manifests there."""
    client, bucket = s3_bucket
    images, labels = digits
    refs = []
    for i, image in enumerate(images):
        key = f"photos/été {i:03d} (scan).jpg"
        client.put_object(Bucket=bucket, Key=key, Body=image)
        refs.append(f"s3://{bucket}/{key}")
    lines = [ground_truth_line(ref, label) for ref, label in zip(refs, labels)]
    client.put_object(Bucket=bucket, Key="labels/train.manifest", Body=write_lines(lines[:240]))
    client.put_object(Bucket=bucket, Key="labels/validation.manifest", Body=write_lines(lines[240:]))
    return bucket, refs


def streamed(data: bytes) -> list[bytes]:
    """The RecordIO records of a pass, as the job's reader frames them."""
    policy = CorruptionPolicy(0)
    return [r for batch in recordio.RecordIODecoder(policy).records(stream_reader(data), "test") for r in batch]


@pytest.mark.slow
def test_each_line_streams_its_listed_attributes_in_order_one_record_each(tmp_path, s3_manifests, digits):
    bucket, _ = s3_manifests
    images, labels = digits
    spec = ChannelSpec("train", f"s3://{bucket}/labels/train.manifest", record_wrapper="RecordIO",
                       data_type="AugmentedManifestFile", attribute_names=SINGLE)
    lines = read_manifest(spec.source, SINGLE)
    assert len(lines) == 240
    feed_in_background(PipeFeeder(str(tmp_path), spec, lines, spool_dir=str(tmp_path)), 2)
    for data in read_passes(tmp_path, "train", 2):
        records = streamed(data)
        assert records[0::3] == images[:240]  # the objects' bytes (image-id, not listed, left out)
        assert [json.loads(r) for r in records[1::3]] == labels[:240]
        assert [json.loads(r)["class-name"] for r in records[2::3]] == [NAMES[y] for y in labels[:240]]


@pytest.mark.slow
def test_shuffle_config_shuffles_the_lines_and_sharding_splits_them_between_hosts(tmp_path, s3_manifests):
    bucket, _ = s3_manifests
    spec = ChannelSpec("train", f"s3://{bucket}/labels/train.manifest", record_wrapper="RecordIO",
                       data_type="AugmentedManifestFile", attribute_names=("source-ref", "image-id"),
                       distribution="ShardedByS3Key", shuffle_seed=5)
    lines = read_manifest(spec.source, spec.attribute_names)
    for number in range(2):
        shares = [[line.number for line in PipeFeeder("d", spec, lines, host_index=h, host_count=2)
                   .objects_for_pass(number)] for h in range(2)]
        assert sorted(shares[0] + shares[1]) == list(range(1, 241))  # every line once, on one host
        assert shares[0] != sorted(shares[0])  # shuffled
    fed = PipeFeeder(str(tmp_path), spec, lines, host_index=1, host_count=2, spool_dir=str(tmp_path))
    feed_in_background(fed, 1)
    (data,) = read_passes(tmp_path, "train", 1)
    ids = [json.loads(r) for r in streamed(data)[1::2]]
    assert ids == [lines[n - 1].values[1] and json.loads(lines[n - 1].values[1]) for n in
                   (line.number for line in fed.objects_for_pass(0))]


@pytest.mark.slow
def test_a_local_manifest_reads_refs_under_its_folder_and_in_s3(tmp_path, s3_manifests, digits):
    _, refs = s3_manifests
    images, labels = digits
    (tmp_path / "set" / "imgs").mkdir(parents=True)
    (tmp_path / "set" / "imgs" / "a b.jpg").write_bytes(images[0])
    manifest = tmp_path / "set" / "out.manifest"
    manifest.write_bytes(write_lines([ground_truth_line("imgs/a b.jpg", labels[0]),
                                      ground_truth_line(refs[1], labels[1])]) + b"\n\n")
    lines = read_manifest(str(manifest), SINGLE)
    assert [line.number for line in lines] == [1, 2]
    assert [b"".join(line.values[0].chunks()) for line in lines] == images[:2]


@pytest.mark.parametrize("content, problem", [
    (b'{"source-ref": "imgs/ok.jpg", "digit": 1}\nnot json\n', "out.manifest line 2 is not JSON: not json"),
    (b'[1, 2]\n', "out.manifest line 1 is not a JSON object but [1, 2]"),
    (b'{"source-ref": "imgs/ok.jpg", "label": 1}\n',
     "out.manifest line 1 has no attribute digit (it has: label, source-ref)"),
    (b'{"source-ref": "../secret.jpg", "digit": 1}\n', "out.manifest line 1: source-ref ../secret.jpg leads out of the "
                                                       "manifest's folder"),
    (b'{"source-ref": "imgs/link.jpg", "digit": 1}\n', "out.manifest line 1: source-ref imgs/link.jpg leads out"),
    (b'{"source-ref": "/etc/passwd", "digit": 1}\n', "out.manifest line 1: source-ref /etc/passwd leads out"),
    (b'{"source-ref": "imgs/none.jpg", "digit": 1}\n', "out.manifest line 1: source-ref imgs/none.jpg cannot be read: "
                                                       "No such file or directory"),
    (b'{"source-ref": 7, "digit": 1}\n', "out.manifest line 1: attribute source-ref must be a path or s3:// URI, got 7"),
    (b'{"source-ref": "s3://Bad_Bucket/x.jpg", "digit": 1}\n', "out.manifest line 1: 's3://Bad_Bucket/x.jpg': "
                                                               "'Bad_Bucket' is not a valid bucket name"),
])
def test_a_line_that_cannot_be_streamed_is_an_error_naming_it(tmp_path, content, problem):
    (tmp_path / "secret.jpg").write_bytes(b"secret")
    (tmp_path / "set" / "imgs").mkdir(parents=True)
    (tmp_path / "set" / "imgs" / "ok.jpg").write_bytes(b"jpeg")
    os.symlink(tmp_path / "secret.jpg", tmp_path / "set" / "imgs" / "link.jpg")
    (tmp_path / "set" / "out.manifest").write_bytes(content)
    with pytest.raises(SourceError) as info:
        read_manifest(str(tmp_path / "set" / "out.manifest"), ("source-ref", "digit"))
    assert problem in str(info.value)


def test_a_manifest_in_s3_needs_s3_refs_and_is_one_object(s3_bucket):
    client, bucket = s3_bucket
    client.put_object(Bucket=bucket, Key="m/out.manifest", Body=b'{"source-ref": "img.jpg", "digit": 1}\n')
    with pytest.raises(SourceError, match=r"line 1: source-ref img.jpg is not an s3:// URI; in a manifest in S3"):
        read_manifest(f"s3://{bucket}/m/out.manifest", ("source-ref", "digit"))
    with pytest.raises(SourceError, match="a manifest is one S3 object"):
        read_manifest(f"s3://{bucket}/m/", ("source-ref", "digit"))


@pytest.mark.parametrize("options, message", [
    (dict(input_mode="File"), "an augmented manifest streams in Pipe mode only"),
    (dict(record_wrapper="None"), "an augmented manifest needs --record-wrapper RecordIO"),
    (dict(compression="Gzip"), "--compression Gzip is not for an augmented manifest"),
    (dict(attribute_names=None), "an augmented manifest needs its attribute names"),
])
def test_manifest_channel_rules(options, message):
    values = {"record_wrapper": "RecordIO", "data_type": "AugmentedManifestFile", "attribute_names": SINGLE, **options}
    with pytest.raises(ChannelError, match=message):
        ChannelSpec("train", "s3://b/x.manifest", **values)


def test_bad_manifests_fail_before_anything_is_written(tmp_path):
    (tmp_path / "out.manifest").write_bytes(b'{"source-ref": "../../etc/passwd", "digit": 1}\n')
    out = launch_cli("local", "--train", str(tmp_path / "out.manifest"), "--validation", str(tmp_path / "out.manifest"),
                     "--attribute-names", "source-ref,digit", "--job-dir", str(tmp_path / "job"), *QUICK)
    assert out.returncode == 2, out.stderr
    assert "out.manifest line 1: source-ref ../../etc/passwd leads out of the manifest's folder" in out.stderr
    assert not (tmp_path / "job").exists() or not any((tmp_path / "job").rglob("*.json"))
    out = launch_cli("local", "--train", str(tmp_path / "out.manifest"), "--attribute-names", "source-ref,digit",
                     "--hp", "attribute_names=source-ref,label", *QUICK)
    assert out.returncode == 2 and "differs from the channels' attribute names" in out.stderr


MANIFEST_JOB = ["--image-uri", IMAGE, "--role", ROLE, "--train", "s3://data/labels/train.manifest",
                "--validation", "s3://data/labels/validation.manifest", "--attribute-names", ",".join(SINGLE),
                "--distribution", "ShardedByS3Key", "--shuffle-seed", "4", "--instance-count", "2",
                "--output-path", "s3://data/jobs/", "--hp", f"class_names={json.dumps(NAMES)}"]


def test_submit_requests_augmented_manifest_channels_and_sends_their_attribute_names_to_the_job():
    request = dry_run_request("submit", *MANIFEST_JOB)
    for channel in request["InputDataConfig"]:
        assert channel["DataSource"]["S3DataSource"] == {
            "S3DataType": "AugmentedManifestFile", "S3Uri": f"s3://data/labels/{channel['ChannelName']}.manifest",
            "S3DataDistributionType": "ShardedByS3Key", "AttributeNames": list(SINGLE)}
        assert channel["RecordWrapperType"] == "RecordIO" and channel["InputMode"] == "Pipe"
    assert json.loads(request["HyperParameters"]["attribute_names"]) == list(SINGLE)


@pytest.mark.slow
@pytest.mark.parametrize("sdk", ["v3", "v2"])
def test_both_sdks_send_the_dry_run_request_for_manifest_channels(aws, moto_endpoint, sdk):
    import sys

    python = sys.executable if sdk == "v3" else sdk2_python()
    request, _ = sent_through_sdk("submit", "CreateTrainingJob", MANIFEST_JOB, aws, moto_endpoint, python=python)
    same_request(request, dry_run_request("submit", *MANIFEST_JOB))


# --- trained through `keras-pipe local`, then served ----------------------------------------------


# (a single-label manifest in S3 on two sharded hosts, then predicted: docs/sources.md, run by tests/docs)


@pytest.mark.slow
def test_a_multi_label_ground_truth_manifest_trains_locally_and_serves_every_class(tmp_path, s3_bucket):
    """The manifests here, their refs local (train) or s3:// URIs (validation: a local manifest's
    refs may be either); one host. The model learns the pairs (tests/held_out.py's recipe) and
    `keras-pipe predict` on the validation pictures ranks each class, by the name the manifests'
    class ids give it, above the pictures that do not show it."""
    from keras_pipe_launch.sample_data import digit_jpeg, digit_pairs, load_digits
    from tests.held_out import LEARNS, hp_options

    client, bucket = s3_bucket
    pairs, classes = digit_pairs(*load_digits(), count=700, seed=2)
    for folder in ("gt/pictures", "held-out"):
        (tmp_path / folder).mkdir(parents=True)
    lines = []
    for i, (image, labels) in enumerate(zip(pairs, classes)):
        if i < 600:
            (tmp_path / "gt" / "pictures" / f"pair-{i}.jpg").write_bytes(digit_jpeg(image, 32))
            lines.append(multi_label_line(f"pictures/pair-{i}.jpg", list(labels)))
        else:
            client.put_object(Bucket=bucket, Key=f"pairs/pair-{i}.jpg", Body=digit_jpeg(image, 32))
            lines.append(multi_label_line(f"s3://{bucket}/pairs/pair-{i}.jpg", list(labels)))
            (tmp_path / "held-out" / f"pair-{i}.jpg").write_bytes(digit_jpeg(image, 32))  # to predict here
    (tmp_path / "gt" / "train.manifest").write_bytes(write_lines(lines[:600]))
    (tmp_path / "gt" / "validation.manifest").write_bytes(write_lines(lines[600:]))
    out = launch_local("--train", "gt/train.manifest", "--validation", "gt/validation.manifest",
                       "--attribute-names", "source-ref,digits,digits-metadata", "--hp", "multi_label=true",
                       # (48 pixels: each digit of a pair keeps 24, where 16 left the weakest class at 0.67)
                       *hp_options(class_names=json.dumps(NAMES), **{**LEARNS, "image_size": 48}), "--job-dir", "job",
                       cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "val_f1_micro" in out.stdout
    answer = launch_cli("predict", str(tmp_path / "job" / "algo-1" / "model"), str(tmp_path / "held-out"),
                        "--format", "jsonl")
    assert answer.returncode == 0, answer.stderr
    predictions = [json.loads(line) for line in answer.stdout.splitlines()]
    assert len(predictions) == 100
    for prediction in predictions:
        assert prediction["labels"] == NAMES and len(prediction["probabilities"]) == 10  # every class's
        assert prediction["threshold"] == 0.5  # (predicted_labels: those above it)
        assert prediction["predicted_labels"] == [name for name, p in zip(NAMES, prediction["probabilities"])
                                                  if p >= 0.5]
    # Each class's AUC: the share of (picture showing it, picture not showing it) pairs where the
    # first gets the higher probability under the class's name. About 0.5 for a model that ignores
    # the pictures or names its classes one off or in another order (sd about 0.07 a class, on 20
    # pictures showing it: all ten at 0.65 or more is out of its reach); this recipe's weakest
    # class: 0.76-0.87 over six seeds of training and pairs (this one's: 0.82)
    shows = {number: set(classes[number]) for number in range(600, 700)}
    aucs = {}
    for digit, name in enumerate(NAMES):
        scores = {True: [], False: []}
        for prediction in predictions:
            number = int(prediction["path"].rsplit("pair-", 1)[1].removesuffix(".jpg"))
            scores[digit in shows[number]].append(prediction["probabilities"][prediction["labels"].index(name)])
        aucs[name] = sum((p > q) + 0.5 * (p == q) for p in scores[True] for q in scores[False]) / (
            len(scores[True]) * len(scores[False]))
    print("held out, each class's AUC:", {name: round(auc, 3) for name, auc in aucs.items()})
    assert min(aucs.values()) >= 0.65, aucs


# --- keras-pipe prepare from a manifest ------------------------------------------------------------


def prepared_records(out) -> set[bytes]:
    from pipemode import tfrecord

    return {record for part in ("train", "validation") for path in sorted((out / part).glob("*.tfrecord"))
            for batch in tfrecord.TFRecordDecoder(CorruptionPolicy(0)).decode(stream_reader(path.read_bytes()),
                                                                               str(path)) for record in batch}


def without_sources(records: set[bytes], prefix: str) -> set[bytes]:
    """The records without the image/source feature prepare adds (each checked to be under `prefix`):
    what the job makes of a manifest streamed in Pipe mode, which gives the image, not its URI."""
    import tensorflow as tf

    bare = set()
    for record in records:
        example = tf.train.Example.FromString(record)
        assert example.features.feature["image/source"].bytes_list.value[0].decode().startswith(prefix)
        del example.features.feature["image/source"]
        bare.add(example.SerializeToString(deterministic=True))
    return bare


@pytest.mark.slow
def test_prepare_makes_of_a_manifest_in_s3_the_examples_the_job_streams_from_it(tmp_path, s3_manifests, digits):
    """The same images through prepare + TFRecord, or streamed from the manifest: the same Examples
    (prepare's naming each image's S3 URI besides)."""
    from keras_pipe_launch.prepare.dataset import prepare
    from keras_pipe_train.settings.config import JobConfig
    from keras_pipe_train.sources import manifest

    bucket, _ = s3_manifests
    summary = prepare(f"s3://{bucket}/labels/train.manifest", tmp_path / "out", validation_fraction=0.2)
    assert summary["classes"] == NAMES and summary["train"] + summary["validation"] == 240
    config = JobConfig.from_hyperparameters({"class_names": json.dumps(NAMES), "attribute_names": ",".join(SINGLE)})
    combine = manifest.combiner(config)
    streamed_lines = read_manifest(f"s3://{bucket}/labels/train.manifest", SINGLE)
    expected = {combine([b"".join(line.values[0].chunks()), *line.values[1:]]) for line in streamed_lines}
    assert without_sources(prepared_records(tmp_path / "out"), f"s3://{bucket}/") == expected


def test_prepare_reads_a_multi_label_manifest_and_lists_the_lines_it_cannot_use(tmp_path, capsys):
    from keras_pipe_launch.prepare.dataset import PrepareError, prepare
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    images, _ = load_digits()
    (tmp_path / "imgs").mkdir()
    tags = [[0, 2], [1], [2, 1], [0]] * 8
    lines = []
    for i, labels in enumerate(tags):
        (tmp_path / "imgs" / f"{i}.jpg").write_bytes(digit_jpeg(images[i]))
        lines.append(multi_label_line(f"imgs/{i}.jpg", labels))
    failed = multi_label_line("imgs/0.jpg", [])
    del failed["digits"]
    failed["source-ref"] = "imgs/missing-label.jpg"
    failed["digits-metadata"] = {"failure-reason": "ClientError: annotation timed out", "type":
                                 "groundtruth/image-classification-multilabel"}
    outside = multi_label_line("../elsewhere.jpg", [1])
    (tmp_path / "out.manifest").write_bytes(write_lines([*lines, failed, outside]))
    summary = prepare(tmp_path / "out.manifest", tmp_path / "out", validation_fraction=0.25, multi_label=True)
    assert summary["classes"] == ["zero", "one", "two"] and summary["train"] + summary["validation"] == 32
    rejected = (tmp_path / "out" / "rejected.txt").read_text()
    assert "line 33: no label 'digits' (Ground Truth: ClientError: annotation timed out)" in rejected
    assert "line 34: leads out of the manifest's folder" in rejected
    with pytest.raises(PrepareError, match=r"line 1: label 'digits' is a list \(\[0, 2\]\): for a multi-label manifest"):
        prepare(tmp_path / "out.manifest", tmp_path / "again")


@pytest.mark.slow
def test_an_mxnet_rec_file_streams_in_pipe_mode_trains_and_serves(tmp_path):
    """The .rec's 240 digits (three copies of it streamed an epoch: enough steps to learn them);
    then `keras-pipe predict` on digits it never saw, one folder per class: each class's own name
    for most of them (every held-out seven a "seven", say)."""
    import shutil

    from tests.held_out import LEARNS, assert_each_folder_predicted_as_its_class, hp_options, write_held_out_digits

    data = REPO / "tests" / "data" / "digits-mxnet.rec"
    (tmp_path / "rec").mkdir()
    for copy in range(3):
        shutil.copy(data, tmp_path / "rec" / f"digits-{copy}.rec")
    out = launch_local("--train", str(tmp_path / "rec"), "--validation", str(data), "--hp", "record_format=recordio",
                       *hp_options(class_names=json.dumps(NAMES), **LEARNS), "--job-dir", "job", cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "launch | channel train (Pipe): 3 objects from" in out.stdout and "val_accuracy" in out.stdout
    write_held_out_digits(tmp_path / "held-out")
    answer = launch_cli("predict", str(tmp_path / "job" / "algo-1" / "model"), str(tmp_path / "held-out"))
    assert answer.returncode == 0, answer.stderr
    # each class's held-out images at least 30 % right, all of them 70 % (chance: 10 %; tests/held_out.py)
    print("held out, each class:", assert_each_folder_predicted_as_its_class(answer.stdout))


@pytest.mark.parametrize("args, message", [
    (["--hp", "record_format=class_folders"], "channel train is in Pipe mode, but --hp record_format=class_folders"),
    (["--hp", "train_only_top_layer=True"], "channel train is in Pipe mode, but the request is in the built-in "
     "TensorFlow algorithm's dialect, which reads class folders"),
    (["--hp", "record_format=recordio", "--record-wrapper", "RecordIO"],
     "--record-wrapper RecordIO with --hp record_format=recordio: the .rec files are RecordIO already"),
])
def test_a_record_format_the_channels_cannot_carry_is_refused_before_anything_runs(tmp_path, args, message):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.rec").write_bytes(b"")
    out = launch_cli("local", "--train", str(tmp_path / "data"), "--job-dir", str(tmp_path / "job"), *args,
                     "--hp", "num_classes=3")
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "job").exists()


def test_prepare_rejects_labels_that_are_not_class_ids_and_refuses_absurd_class_counts(tmp_path):
    from keras_pipe_launch.prepare.dataset import PrepareError, prepare
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    images, labels = load_digits()
    lines = []
    for i in range(80):
        (tmp_path / f"{i}.jpg").write_bytes(digit_jpeg(images[i]))
        lines.append(ground_truth_line(f"{i}.jpg", int(labels[i])))
    lines[3]["digit"], lines[4]["digit"], lines[5]["digit"] = "²", "9" * 5000, "3.0"  # (the last one is 3)
    lines[5]["digit-metadata"]["class-name"] = "three"
    (tmp_path / "out.manifest").write_bytes(write_lines(lines))
    summary = prepare(tmp_path / "out.manifest", tmp_path / "out", validation_fraction=0.1)
    assert summary["train"] + summary["validation"] == 78
    rejected = (tmp_path / "out" / "rejected.txt").read_text()
    assert "line 4: label attribute 'digit' holds '²', not a class id" in rejected
    assert "line 5: label attribute 'digit' holds '99999" in rejected
    lines[6]["digit"] = 10**9
    (tmp_path / "huge.manifest").write_bytes(write_lines(lines))
    with pytest.raises(PrepareError, match="has class id 1000000000: more than 100000 classes"):
        prepare(tmp_path / "huge.manifest", tmp_path / "out2")
