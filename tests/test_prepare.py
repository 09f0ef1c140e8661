"""`launch prepare`: images -> TFRecord shards the job reads; rejects reported; upload skips unchanged."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from launch.prepare import PrepareError, prepare, upload
from launch.sample_data import digit_jpeg, load_digits
from tests.conftest import REPO

FEATURES = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}


@pytest.fixture
def photos(tmp_path):
    """A folder of class folders: 200 digits as JPEG, PNG in one class, plus two bad files."""
    images, labels = load_digits()
    root = tmp_path / "photos"
    for i, (image, label) in enumerate(zip(images[:200], labels[:200])):
        folder = root / f"digit{label}"
        folder.mkdir(parents=True, exist_ok=True)
        if label == 7:
            (folder / f"{i}.png").write_bytes(tf.io.encode_png(tf.io.decode_jpeg(digit_jpeg(image))).numpy())
        else:
            (folder / f"{i}.jpg").write_bytes(digit_jpeg(image))
    (root / "digit3" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "digit5" / "readme.txt").write_text("not an image")
    return root, labels[:200]


def read_examples(folder: Path):
    files = sorted(str(p) for p in folder.glob("*.tfrecord"))
    return [tf.io.parse_single_example(r, FEATURES) for r in tf.data.TFRecordDataset(files)]


def test_prepare_folder_into_shards_the_job_can_read(photos, tmp_path, capsys):
    root, labels = photos
    summary = prepare(root, tmp_path / "out", validation_fraction=0.2, shard_mb=0.02, seed=1)
    out = tmp_path / "out"
    assert json.loads((out / "classes.json").read_text()) == [f"digit{d}" for d in range(10)]
    assert summary["rejected"] == 2 and summary["train"] + summary["validation"] == 200
    rejected = (out / "rejected.txt").read_text()
    assert "broken.jpg\tcorrupt image:" in rejected and "readme.txt\tnot an image file" in rejected
    assert "REJECTED 2 of 202 images" in capsys.readouterr().err
    train, validation = read_examples(out / "train"), read_examples(out / "validation")
    assert (len(train), len(validation)) == (summary["train"], summary["validation"])
    counts = np.bincount(labels, minlength=10)
    val_counts = np.bincount([int(e["image/class/label"]) for e in validation], minlength=10)
    np.testing.assert_array_equal(val_counts, np.round(counts * 0.2))  # stratified
    for example in train[:5] + validation[:5]:
        assert tf.io.decode_image(example["image/encoded"], channels=3).shape == (32, 32, 3)
    shards = sorted((out / "train").glob("*.tfrecord"))
    assert len(shards) > 3 and all(p.stat().st_size < 0.02e6 + 3000 for p in shards)  # ~ the target size


def test_same_inputs_give_identical_shards(photos, tmp_path):
    root, _ = photos
    prepare(root, tmp_path / "a", seed=5)
    prepare(root, tmp_path / "b", seed=5)
    digest = lambda folder: {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
                             for p in folder.rglob("*") if p.is_file()}
    assert digest(tmp_path / "a") == digest(tmp_path / "b")


def test_csv_of_path_and_label(tmp_path):
    images, labels = load_digits()
    lines = ["path,label"]
    for i in range(40):
        (tmp_path / f"img{i}.jpg").write_bytes(digit_jpeg(images[i]))
        lines.append(f"img{i}.jpg,{'odd' if labels[i] % 2 else 'even'}")
    (tmp_path / "labels.csv").write_text("\n".join(lines) + "\n")
    summary = prepare(tmp_path / "labels.csv", tmp_path / "out", validation_fraction=0)
    assert summary["classes"] == ["even", "odd"] and summary["train"] == 40 and summary["validation"] == 0
    assert [int(e["image/class/label"]) for e in read_examples(tmp_path / "out" / "train")].count(1) == \
        sum(1 for y in labels[:40] if y % 2)


def test_errors(photos, tmp_path):
    root, _ = photos
    with pytest.raises(PrepareError, match="could not be used"):
        prepare(root, tmp_path / "strict", strict=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(PrepareError, match="is not empty"):
        prepare(root, tmp_path / "full")
    with pytest.raises(PrepareError, match="one subfolder per class"):
        prepare(root / "digit1", tmp_path / "o1")
    (tmp_path / "bad.csv").write_text("a.jpg,cat,extra\n")
    with pytest.raises(PrepareError, match="expected path,label"):
        prepare(tmp_path / "bad.csv", tmp_path / "o2")


def test_upload_then_rerun_uploads_nothing(photos, tmp_path, s3_bucket):
    client, bucket = s3_bucket
    root, _ = photos
    prepare(root, tmp_path / "out", shard_mb=0.05)
    files = sorted(p for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert upload(tmp_path / "out", f"s3://{bucket}/datasets/digits") == (len(files), 0)
    for path in files:
        key = "datasets/digits/" + path.relative_to(tmp_path / "out").as_posix()
        head = client.head_object(Bucket=bucket, Key=key)
        assert head["Metadata"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == path.read_bytes()
    assert upload(tmp_path / "out", f"s3://{bucket}/datasets/digits/") == (0, len(files))
    (tmp_path / "out" / "classes.json").write_text('["changed"]\n')
    assert upload(tmp_path / "out", f"s3://{bucket}/datasets/digits/") == (1, len(files) - 1)


def test_cli_rejects_a_bad_upload_uri_before_doing_any_work(photos, tmp_path):
    root, _ = photos
    out = subprocess.run([sys.executable, "-m", "launch", "prepare", str(root), str(tmp_path / "out"),
                          "--upload", "s3://Bad_Bucket/x"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "not a valid bucket name" in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_prepared_records_train_with_the_job_unchanged(photos, tmp_path):
    root, _ = photos
    prepare(root, tmp_path / "out", validation_fraction=0.2)
    classes = ",".join(json.loads((tmp_path / "out" / "classes.json").read_text()))
    out = subprocess.run([sys.executable, "-m", "launch", "local", "--train", "out/train", "--validation",
                          "out/validation", "--hp", f"class_names={classes}", "--hp", "image_size=32",
                          "--hp", "epochs=1", "--hp", "weights=none", "--hp", "batch_size=16", "--job-dir", "job"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "algo-1 | metrics: epoch=1" in out.stdout
    assert json.loads((tmp_path / "job/algo-1/model/classes.json").read_text()) == classes.split(",")
