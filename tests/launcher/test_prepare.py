"""`keras-pipe prepare`: images -> TFRecord shards the job reads; rejects reported; upload skips unchanged."""

import collections
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_launch.prepare.dataset import PrepareError, prepare
from keras_pipe_launch.prepare.upload import upload
from keras_pipe_launch.sample_data import digit_jpeg, load_digits
from tests.conftest import REPO, prepared_features, run_logged
from tests.timeouts import wait_s

FEATURES = prepared_features()

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
    assert "broken.jpg\tthe file is a damaged image" in rejected and "readme.txt\tnot an image file" in rejected
    assert "REJECTED 2 of 202 files" in capsys.readouterr().err
    train, validation = read_examples(out / "train"), read_examples(out / "validation")
    assert (len(train), len(validation)) == (summary["train"], summary["validation"])
    counts = np.bincount(labels, minlength=10)
    val_counts = np.bincount([int(e["image/class/label"]) for e in validation], minlength=10)
    np.testing.assert_array_equal(val_counts, np.round(counts * 0.2))  # stratified
    for example in train[:5] + validation[:5]:
        assert tf.io.decode_image(example["image/encoded"], channels=3).shape == (32, 32, 3)
    shards = sorted((out / "train").glob("*.tfrecord"))
    assert len(shards) > 3 and all(p.stat().st_size < 0.02e6 + 3000 for p in shards)  # ~ the target size


def digests(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def test_same_inputs_give_identical_shards(photos, tmp_path):
    root, _ = photos
    prepare(root, tmp_path / "a", seed=5)
    prepare(root, tmp_path / "b", seed=5)
    assert digests(tmp_path / "a") == digests(tmp_path / "b")


ENCODE = ("import hashlib; from keras_pipe_train.sources.example import encode_example; "
          "print(hashlib.sha256(encode_example(b'an image', 3)).hexdigest())")


@pytest.mark.slow
def test_an_example_is_the_same_bytes_in_every_process():
    """protobuf writes an Example's feature map in an order of its own in each process (seen here:
    either order, at random, from one process to the next) unless asked for a deterministic one;
    within one process it cannot be seen. Five processes: one order in all has a 1/16 chance of
    hiding it (and the separate runs of prepare below a 1/2)."""
    from tensorflow.core.example import example_pb2

    from keras_pipe_train.sources.example import encode_example

    reference = encode_example(b"an image", 3)
    sorted_keys = example_pb2.Example.FromString(reference).SerializeToString(deterministic=True)
    assert reference == sorted_keys
    runs = {subprocess.run([sys.executable, "-c", ENCODE], capture_output=True, text=True, timeout=wait_s(120),
                           check=True).stdout.strip() for _ in range(5)}
    assert runs == {hashlib.sha256(reference).hexdigest()}


@pytest.mark.slow
def test_separate_processes_with_any_number_of_workers_write_the_same_bytes(photos, tmp_path):
    """What upload's skip-unchanged relies on: the whole command, run again, in another process."""
    root, _ = photos
    for run, workers in enumerate((1, 3)):
        out = subprocess.run([sys.executable, "-m", "keras_pipe_launch", "prepare", str(root), str(tmp_path / f"{run}"),
                              "--max-side", "16", "--shard-mb", "0.01", "--workers", str(workers)], cwd=REPO,
                             capture_output=True, text=True, timeout=wait_s(270),
                             env={**os.environ, "PYTHONHASHSEED": str(run)})  # (set hashes differ too)
        assert out.returncode == 0, out.stderr[-2000:]
    first = digests(tmp_path / "0")
    assert len([name for name in first if name.endswith(".tfrecord")]) > 3
    assert digests(tmp_path / "1") == first


@pytest.mark.slow
def test_rerunning_into_a_used_folder_refuses_unless_overwrite_replaces_the_dataset(photos, tmp_path, capsys):
    root, _ = photos
    out = tmp_path / "out"
    prepare(root, out, shard_mb=0.02, seed=1)
    before = digests(out)
    with pytest.raises(PrepareError, match="is not empty: give a new output folder, or --overwrite to replace"):
        prepare(root, out, seed=1)
    (out / "train" / "part-00099.tfrecord").write_bytes(b"left from an older run")
    prepare(root, out, shard_mb=0.02, seed=1, overwrite=True)
    assert digests(out) == before  # the same bytes, and nothing of the old dataset left
    prepare(root, out, shard_mb=1, seed=2, overwrite=True)  # other options: the new dataset only
    assert sorted(p.name for p in (out / "train").iterdir()) == ["part-00000.tfrecord"]
    assert (out / "rejected.txt").exists() and (out / "classes.json").exists()
    # a folder holding anything else is never emptied
    (out / "notes.txt").write_text("mine")
    with pytest.raises(PrepareError, match="also holds 'notes.txt'"):
        prepare(root, out, seed=1, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and (out / "train" / "part-00000.tfrecord").exists()


def test_a_failed_overwrite_leaves_the_earlier_dataset_as_it_was(photos, tmp_path):
    root, _ = photos
    out = tmp_path / "out"
    prepare(root, out, seed=1)
    before = digests(out)
    with pytest.raises(PrepareError, match="could not be used"):
        prepare(root, out, seed=1, strict=True, overwrite=True)  # (the photos hold two bad files)
    after = digests(out)
    failed_run = after.pop(".rejected-by-failed-run.txt")  # why it failed, beside the dataset it left alone
    assert after == before and not (out / ".incomplete").exists()
    assert len((out / ".rejected-by-failed-run.txt").read_text().splitlines()) == 2 and failed_run
    prepare(root, out, seed=1, overwrite=True)  # a later run replaces both
    assert digests(out) == before


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


def test_a_multi_label_csv_becomes_examples_holding_each_images_class_ids(tmp_path, capsys):
    """Rows of any number of labels (a header, an image of none, short rows padded by a
    spreadsheet); every image's ids in its Example, the classes sorted, each class in both parts."""
    from keras_pipe_train.sources.example import record_check

    images, _ = load_digits()
    rows = ["path,label,label,label"]
    tags = [("cat",), ("dog",), ("cat", "dog"), ("bird", "cat"), (), ("bird",)] * 5
    for index, labels in enumerate(tags):
        (tmp_path / f"{index}.jpg").write_bytes(digit_jpeg(images[index]))
        rows.append(",".join([f"{index}.jpg", *labels] + [""] * (3 - len(labels))))
    (tmp_path / "tags.csv").write_text("\n".join(rows) + "\n")
    summary = prepare(tmp_path / "tags.csv", tmp_path / "out", validation_fraction=0.2, multi_label=True)
    assert summary["classes"] == ["bird", "cat", "dog"] and summary["train"] + summary["validation"] == 30
    assert "train with --hp class_names=bird,cat,dog --hp multi_label=true" in capsys.readouterr().err
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.VarLenFeature(tf.int64)}
    expected = {digit_jpeg(images[i]): sorted(["bird", "cat", "dog"].index(t) for t in labels)
                for i, labels in enumerate(tags)}
    check = record_check("image/encoded", "image/class/label", 3, 10**6, multi_label=True)
    seen = collections.Counter()
    for part in ("train", "validation"):
        files = sorted(str(p) for p in (tmp_path / "out" / part).glob("*.tfrecord"))
        for record in tf.data.TFRecordDataset(files).as_numpy_iterator():
            assert check(record) is None
            parsed = tf.io.parse_single_example(record, features)
            ids = tf.sparse.to_dense(parsed["image/class/label"]).numpy().tolist()
            assert ids == expected[parsed["image/encoded"].numpy()]
            seen.update(f"{part}:{i}" for i in ids)
    assert all(seen[f"validation:{i}"] for i in range(3)) and all(seen[f"train:{i}"] for i in range(3))


@pytest.mark.parametrize("rows, options, message", [
    (["a.jpg,cat,dog"], (), "expected path,label; got ['a.jpg', 'cat', 'dog'] (for several labels per image, give --multi-label)"),
    (["a.jpg,cat,cat", "b.jpg,dog"], ("--multi-label",), "tags.csv:1: a label is given twice"),
    (["a.jpg,cat"], ("--multi-label",), "lists 1 label(s); a classifier needs at least two"),
])
def test_a_multi_label_csv_that_cannot_be_read_says_where(rows, options, message, tmp_path):
    (tmp_path / "tags.csv").write_text("\n".join(rows) + "\n")
    out = subprocess.run([sys.executable, "-m", "keras_pipe_launch", "prepare", str(tmp_path / "tags.csv"),
                          str(tmp_path / "out"), *options], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_the_multi_label_split_leaves_every_class_an_image_to_train_on():
    """Split by each image's rarest class, class 1's images could all go to validation with their
    rarer classes: one comes back to train."""
    from keras_pipe_launch.prepare.dataset import split

    items = [("a", (0, 1)), ("b", (1,)), ("c", (0, 2)), ("d", (2,)), ("e", (0, 3)), ("f", (3,))]
    for seed in range(20):
        train, validation = split(items, 0.5, seed)
        assert sorted(train + validation) == sorted(items)
        assert {label for _, labels in train for label in labels} == {0, 1, 2, 3}, (seed, train)


def test_a_spreadsheets_padded_rows_and_header_read_as_they_look(tmp_path):
    images, _ = load_digits()
    for index in range(4):
        (tmp_path / f"{index}.jpg").write_bytes(digit_jpeg(images[index]))
    (tmp_path / "tags.csv").write_text("path,labels,,\n0.jpg,cat,,\n1.jpg,dog,cat,\n2.jpg,,,\n3.jpg,dog,,\n")
    summary = prepare(tmp_path / "tags.csv", tmp_path / "out", validation_fraction=0.0, multi_label=True)
    assert summary["classes"] == ["cat", "dog"] and summary["train"] == 4 and summary["rejected"] == 0
    (tmp_path / "labels.csv").write_text("path,label,\n0.jpg,cat,\n1.jpg,dog,\n")
    assert prepare(tmp_path / "labels.csv", tmp_path / "out2", validation_fraction=0.0)["classes"] == ["cat", "dog"]


def test_multi_label_needs_a_csv(photos, tmp_path):
    root, _ = photos
    with pytest.raises(PrepareError, match="--multi-label reads a CSV of path,label,label,... rows"):
        prepare(root, tmp_path / "out", multi_label=True)


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
    out = subprocess.run([sys.executable, "-m", "keras_pipe_launch", "prepare", str(root), str(tmp_path / "out"),
                          "--upload", "s3://Bad_Bucket/x"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "not a valid bucket name" in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_prepared_records_train_with_the_job_unchanged(photos, tmp_path):
    root, _ = photos
    prepare(root, tmp_path / "out", validation_fraction=0.2)
    classes = ",".join(json.loads((tmp_path / "out" / "classes.json").read_text()))
    out = subprocess.run([sys.executable, "-m", "keras_pipe_launch", "local", "--train", "out/train", "--validation",
                          "out/validation", "--hp", f"class_names={classes}", "--hp", "image_size=32",
                          "--hp", "epochs=1", "--hp", "weights=none", "--hp", "batch_size=16", "--job-dir", "job"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=wait_s(270))
    assert out.returncode == 0, out.stdout[-3000:]
    assert "algo-1 | metrics: epoch=1" in out.stdout
    assert json.loads((tmp_path / "job/algo-1/model/classes.json").read_text()) == classes.split(",")


# --- inputs nobody sanitised -----------------------------------------------------------------------


def digit_folder(root: Path, classes: dict[str, int]) -> Path:
    """Class folders holding that many digit JPEGs each."""
    images, _ = load_digits()
    n = 0
    for name, count in classes.items():
        folder = root / name
        folder.mkdir(parents=True)
        for _ in range(count):
            (folder / f"{n}.jpg").write_bytes(digit_jpeg(images[n]))
            n += 1
    return root


@pytest.mark.slow
def test_file_names_that_are_not_utf8_are_prepared_or_listed_never_a_crash(tmp_path):
    root = digit_folder(tmp_path / "photos", {"a": 5, "b": 5})
    images, _ = load_digits()
    (root / "a").joinpath(os.fsdecode(b"\xff\xfe.jpg")).write_bytes(digit_jpeg(images[50]))
    (root / "b").joinpath(os.fsdecode(b"bad\xff\tname.jpg")).write_bytes(b"garbage")
    out = subprocess.run([sys.executable, "-m", "keras_pipe_launch", "prepare", str(root), str(tmp_path / "out")], cwd=REPO,
                         capture_output=True, timeout=270)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    assert json.loads((tmp_path / "out/classes.json").read_text()) == ["a", "b"]
    assert len(read_examples(tmp_path / "out/train")) + len(read_examples(tmp_path / "out/validation")) == 11
    rejected = (tmp_path / "out/rejected.txt").read_text()  # UTF-8 text, one line per file
    assert rejected.count("\n") == 1 and "b/bad\\xff\\tname.jpg\tthe file is not an image" in rejected


def test_a_class_folder_whose_name_is_not_utf8_is_refused(tmp_path):
    root = digit_folder(tmp_path / "photos", {"a": 2, "b": 2})
    (root / "b").rename(root / os.fsdecode(b"b\xff"))
    with pytest.raises(PrepareError, match=r"class folder .*b\\xff: its name must be printable UTF-8 text"):
        prepare(root, tmp_path / "out")


def labels_csv(tmp_path: Path, rows: list[str], prefix: bytes = b"") -> Path:
    images, _ = load_digits()
    for i in range(12):
        (tmp_path / f"img{i}.jpg").write_bytes(digit_jpeg(images[i]))
    path = tmp_path / "labels.csv"
    path.write_bytes(prefix + "\n".join(rows).encode() + b"\n")
    return path


def test_a_csv_saved_by_excel_with_a_byte_order_mark_keeps_its_header_out_of_the_classes(tmp_path):
    source = labels_csv(tmp_path, ["path,label"] + [f"img{i}.jpg,{'cat' if i % 2 else 'dog'}" for i in range(12)],
                        prefix=b"\xef\xbb\xbf")
    assert prepare(source, tmp_path / "out")["classes"] == ["cat", "dog"]


def test_class_names_with_commas_get_a_hint_the_job_reads_back(tmp_path, capsys):
    from keras_pipe_train.settings.config import JobConfig

    names = ["cat, tabby", "dog", "bird's nest"]
    rows = ["path,label"] + [f'img{i}.jpg,"{names[i % 3]}"' for i in range(12)]
    assert prepare(labels_csv(tmp_path, rows), tmp_path / "out")["classes"] == sorted(names)
    hint = capsys.readouterr().err.strip().splitlines()[-1].split("train with ", 1)[1]
    option = shlex.split(hint)
    assert option[0] == "--hp" and option[1].startswith("class_names=[")
    config = JobConfig.from_hyperparameters({"class_names": option[1].split("=", 1)[1]})
    assert list(config.class_names) == sorted(names)


@pytest.mark.parametrize("rows, message", [
    (["img0.jpg,cat", "img1.jpg,", "img2.jpg,dog"], r"labels.csv:2: empty label"),
    (["img0.jpg,cat", ",dog"], r"labels.csv:2: empty path"),
    (["img0.jpg,cat", "img1.jpg,dog", "./img0.jpg,dog"], r"labels.csv:3: .*img0.jpg is listed again with label 'dog' \(line 1: 'cat'\)"),
    (["img0.jpg,cat", "img1.jpg,dog", "img1.jpg,dog"], r"labels.csv:3: .*img1.jpg is listed again; list each image once"),
])
def test_csv_rows_that_would_train_wrongly_are_refused(tmp_path, rows, message):
    with pytest.raises(PrepareError, match=message):
        prepare(labels_csv(tmp_path, rows), tmp_path / "out")


def test_a_class_too_small_for_the_split_keeps_a_training_image_and_says_so(tmp_path, capsys):
    root = digit_folder(tmp_path / "photos", {"common": 20, "rare": 1})
    summary = prepare(root, tmp_path / "out", validation_fraction=0.6)
    labels = [int(e["image/class/label"]) for e in read_examples(tmp_path / "out/train")]
    assert labels.count(1) == 1 and summary["validation"] == 12
    assert "class rare has too few images for a validation share: none in validation" in capsys.readouterr().err


def test_a_class_with_no_usable_image_is_refused(tmp_path):
    root = digit_folder(tmp_path / "photos", {"a": 3, "b": 0})
    (root / "b" / "x.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(PrepareError, match="class b: no usable training image, so the model would have an output it never"):
        prepare(root, tmp_path / "out")
    # no half-made dataset is left to be uploaded by mistake: only the list of what was rejected
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rejected.txt"]


def test_links_out_of_the_source_folder_are_listed_never_read(tmp_path):
    root = digit_folder(tmp_path / "photos", {"a": 3, "b": 3})
    secret = tmp_path / "elsewhere" / "secret.jpg"
    secret.parent.mkdir()
    secret.write_bytes(digit_jpeg(load_digits()[0][40]))
    (root / "a" / "out.jpg").symlink_to(secret)
    (root / "a" / "in.jpg").symlink_to(root / "b" / "3.jpg")  # inside the source: followed
    (root / "b" / "folder").symlink_to(secret.parent)
    summary = prepare(root, tmp_path / "out", validation_fraction=0)
    assert summary["train"] == 7 and summary["rejected"] == 2
    rejected = (tmp_path / "out/rejected.txt").read_text()
    assert f"a/out.jpg\ta symbolic link to {secret}, outside the source folder" in rejected
    assert "b/folder\ta symbolic link to a folder (not followed)" in rejected
    (root / "c").symlink_to(secret.parent)
    with pytest.raises(PrepareError, match=f"class folder .*/c is a symbolic link to {secret.parent}, outside"):
        prepare(root, tmp_path / "out2")


def test_a_decompression_bomb_is_rejected_from_its_header(tmp_path):
    from tests.conftest import png_bomb

    root = digit_folder(tmp_path / "photos", {"a": 3, "b": 3})
    (root / "a" / "bomb.png").write_bytes(png_bomb())
    summary = prepare(root, tmp_path / "out", validation_fraction=0)
    assert summary["rejected"] == 1
    assert ("bomb.png\tthe file is a 16000x16000 PNG image, 256 megapixels: more than max_image_pixels (100000000)"
            in (tmp_path / "out/rejected.txt").read_text())


# --- photos of real sizes, and sources in S3 ---------------------------------------------------------


def test_max_side_shrinks_large_photos_to_jpeg_and_keeps_small_ones_as_they_are(tmp_path):
    from tests.conftest import image_bytes

    root = digit_folder(tmp_path / "photos", {"a": 2, "b": 2})
    large = image_bytes("JPEG", 2000, 1500, quality=90)
    (root / "a" / "large.jpg").write_bytes(large)
    (root / "b" / "tall.png").write_bytes(image_bytes("PNG", 300, 1400))
    (root / "b" / "edge.jpg").write_bytes(edge := image_bytes("JPEG", 512, 200))
    prepare(root, tmp_path / "out", validation_fraction=0, max_side=512, quality=80)
    stored = {}
    for example in read_examples(tmp_path / "out" / "train"):
        data = example["image/encoded"].numpy()
        stored[tf.io.decode_image(data).shape[:2]] = data
    assert set(stored) == {(32, 32), (384, 512), (512, 110), (200, 512)}  # aspect kept, longer side 512
    assert all(tf.io.is_jpeg(data) for data in stored.values())  # the PNG became a JPEG too
    assert stored[(200, 512)] == edge  # already small enough: the original bytes
    assert len(stored[(384, 512)]) < len(large) / 8
    # what the job reads from it: the picture, not another one (the synthetic photo is noise, so
    # compare it with the original shrunk the same way)
    shrunk = tf.image.resize(tf.io.decode_jpeg(large), [384, 512], antialias=True).numpy()
    assert np.abs(tf.io.decode_jpeg(stored[(384, 512)]).numpy() - shrunk).mean() < 12
    same = prepare(root, tmp_path / "again", validation_fraction=0, max_side=512, quality=80, workers=1)
    assert same["train"] == 7 and digest(tmp_path / "out") == digest(tmp_path / "again")


def sources_of(folder: Path) -> collections.Counter:
    """Where each example's image came from (its image/source), train and validation."""
    return collections.Counter(e["image/source"].numpy().decode() for part in ("train", "validation")
                               for e in read_examples(folder / part))


def test_each_image_is_recorded_under_its_source_however_the_source_was_typed(tmp_path, monkeypatch):
    from keras_pipe_launch.prepare.dataset import recorded

    (tmp_path / "photos/cat").mkdir(parents=True)
    (tmp_path / "labels.csv").write_text("photos/cat/x.jpg,cat\n")
    monkeypatch.chdir(tmp_path)
    for source in ("photos", "./photos", "photos/", str(tmp_path / "photos")):
        assert recorded(Path("photos/cat/x.jpg"), source) == "cat/x.jpg"
        assert recorded(tmp_path / "photos/cat/x.jpg", source) == "cat/x.jpg"
    # a CSV's (or a manifest's) images: under the folder it is in; elsewhere, as listed
    assert recorded(tmp_path / "photos/cat/x.jpg", "labels.csv") == "photos/cat/x.jpg"
    assert recorded(Path("/elsewhere/y.jpg"), str(tmp_path / "labels.csv")) == "/elsewhere/y.jpg"
    assert recorded("S3://bucket/a b/ü.jpg", "labels.csv") == "s3://bucket/a b/ü.jpg"


def digest(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def examples_of(folder: Path) -> collections.Counter:
    """(image digest, label) of every example under folder, train and validation."""
    return collections.Counter(
        (hashlib.sha256(e["image/encoded"].numpy()).hexdigest(), int(e["image/class/label"]))
        for part in ("train", "validation") for e in read_examples(folder / part))


@pytest.mark.slow
def test_an_s3_prefix_of_class_folders_prepares_as_the_same_local_folder_does(photos, tmp_path, s3_bucket):
    root, _ = photos
    client, bucket = s3_bucket
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.put_object(Bucket=bucket, Key=f"photos/{path.relative_to(root).as_posix()}", Body=path.read_bytes())
    # what a listing of an S3 prefix also holds: console folder markers, hidden objects, objects
    # at the top, keys that are not paths
    client.put_object(Bucket=bucket, Key="photos/digit1/", Body=b"")
    client.put_object(Bucket=bucket, Key="photos/.cache/x.jpg", Body=b"x")
    client.put_object(Bucket=bucket, Key="photos/digit2/.DS_Store", Body=b"x")
    client.put_object(Bucket=bucket, Key="photos/README.md", Body=b"x")
    client.put_object(Bucket=bucket, Key="photos/digit4/../../../escape.jpg", Body=b"x")  # hidden: '..'
    copy = sorted((root / "digit4").iterdir())[0].read_bytes()
    client.put_object(Bucket=bucket, Key="photos/digit4/sub dir/a\\b%20ü #?.jpg", Body=copy)  # an image like any other
    local = prepare(root, tmp_path / "local", validation_fraction=0.2)
    remote = prepare(f"s3://{bucket}/photos", tmp_path / "remote", validation_fraction=0.2, workers=3)
    assert remote["classes"] == local["classes"]
    both = examples_of(tmp_path / "remote")
    (twice,) = [key for key in both if both[key] == 2]  # the odd key's copy
    both[twice] -= 1
    assert both == examples_of(tmp_path / "local")
    assert remote["rejected"] == local["rejected"] == 2
    assert not list(tmp_path.glob("**/escape.jpg"))  # keys are read, never written anywhere
    # each Example names its image: the S3 URI (what the job's Ground Truth manifest of suspects
    # needs), or the local path under the source folder (not this machine's folders)
    named = sources_of(tmp_path / "local")
    assert sum(named.values()) == 200 and max(named.values()) == 1
    assert all((root / name).is_file() and not Path(name).is_absolute() for name in named)
    uris = sources_of(tmp_path / "remote")
    assert uris == collections.Counter({f"s3://{bucket}/photos/{name}": 1 for name in named}
                                       | {f"s3://{bucket}/photos/digit4/sub dir/a\\b%20ü #?.jpg": 1})


def test_a_csv_of_s3_uris_and_relative_keys_reads_each_and_lists_the_missing(tmp_path, s3_bucket):
    client, bucket = s3_bucket
    images, labels = load_digits()
    lines = []
    for i in range(30):
        client.put_object(Bucket=bucket, Key=f"data/img/{i}.jpg", Body=digit_jpeg(images[i]))
        path = f"s3://{bucket}/data/img/{i}.jpg" if i % 2 else f"img/{i}.jpg"  # both forms
        lines.append(f"{path},{'odd' if labels[i] % 2 else 'even'}")
    lines.append(f"s3://{bucket}/data/img/missing.jpg,odd")
    client.put_object(Bucket=bucket, Key="data/labels.csv", Body="\n".join(lines).encode())
    summary = prepare(f"s3://{bucket}/data/labels.csv", tmp_path / "out", validation_fraction=0)
    assert summary["train"] == 30 and summary["rejected"] == 1
    assert f"s3://{bucket}/data/img/missing.jpg\tunreadable: " in (tmp_path / "out/rejected.txt").read_text()
    (tmp_path / "local.csv").write_text("\n".join(lines[1::2]) + "\n")  # a local CSV of S3 URIs
    assert prepare(tmp_path / "local.csv", tmp_path / "out2", validation_fraction=0)["train"] == 15


def test_an_s3_source_that_cannot_be_listed_is_an_error_naming_it(tmp_path, s3_bucket):
    _, bucket = s3_bucket
    out = launch_prepare(f"s3://{bucket}-missing/photos/", tmp_path / "out")
    assert out.returncode == 2 and f"cannot list s3://{bucket}-missing/photos/: NoSuchBucket" in out.stderr
    out = launch_prepare(f"s3://{bucket}/nothing/", tmp_path / "out")
    assert out.returncode == 2 and "holds no objects" in out.stderr


def launch_prepare(*args) -> subprocess.CompletedProcess:
    return run_logged([sys.executable, "-m", "keras_pipe_launch", "prepare", *map(str, args)], 270, cwd=REPO)


MEMORY_PROBE = """
import resource, sys
from pathlib import Path
from keras_pipe_launch.prepare.dataset import prepare
prepare(Path(sys.argv[1]), Path(sys.argv[2]), shard_mb=20, workers=2)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.slow
def test_memory_stays_bounded_whatever_the_size_of_the_photo_set(tmp_path):
    """~300 MB of 2000x1500 photos are prepared in little more memory than 8 of them: images are
    read, checked and written a few at a time (the whole set used to be held, twice)."""
    from tests.conftest import image_bytes

    photo = image_bytes("JPEG", 2000, 1500, quality=90)
    peaks = {}
    for count in (8, 300_000_000 // len(photo)):
        root = tmp_path / f"set{count}"
        for i in range(count):
            folder = root / ("a" if i % 2 else "b")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i}.jpg").write_bytes(photo)
        out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(root), str(tmp_path / f"out{count}")],
                             cwd=REPO, capture_output=True, text=True, timeout=wait_s(270))
        assert out.returncode == 0, out.stderr[-2000:]
        peaks[count] = int(out.stdout.split()[-1])
    (few, small), (many, large) = sorted(peaks.items())
    assert large - small < 100e6, f"peak RSS {small / 1e6:.0f} MB for {few} photos, {large / 1e6:.0f} MB for {many}"


@pytest.mark.slow
def test_cli_max_side_and_jpeg_quality_reach_the_images(tmp_path):
    root = digit_folder(tmp_path / "photos", {"a": 3, "b": 3})
    out = launch_prepare(root, tmp_path / "out", "--max-side", "16", "--jpeg-quality", "50", "--validation-fraction", "0")
    assert out.returncode == 0, out.stderr[-2000:]
    shapes = {tuple(tf.io.decode_jpeg(e["image/encoded"]).shape) for e in read_examples(tmp_path / "out/train")}
    assert shapes == {(16, 16, 3)}
    out = launch_prepare(root, tmp_path / "out2", "--jpeg-quality", "101")
    assert out.returncode == 2 and "'101' is not a JPEG quality" in out.stderr


def test_a_folder_that_cannot_be_listed_is_an_error_not_a_silent_gap(tmp_path):
    """Folders nested deeper than PATH_MAX (4096 bytes) can be made, not listed by their path, even
    by root: os.walk would skip them and the images in them without a word."""
    root = digit_folder(tmp_path / "photos", {"a": 2, "b": 2})
    fd = os.open(root / "b", os.O_DIRECTORY)
    try:
        for _ in range(18):  # 18 x 255 bytes
            os.mkdir("d" * 255, dir_fd=fd)
            inner = os.open("d" * 255, os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("deep.jpg", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "wb") as f:
            f.write(digit_jpeg(load_digits()[0][0]))
    finally:
        os.close(fd)
    with pytest.raises(PrepareError, match=r"cannot list .*/b/ddd.*: File name too long"):
        prepare(root, tmp_path / "out")
    with pytest.raises(PrepareError, match="nowhere does not exist"):
        prepare(tmp_path / "nowhere", tmp_path / "out")
