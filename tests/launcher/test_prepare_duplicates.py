"""`keras-pipe prepare` finds duplicate images before it splits: a copy that a plain split would put
in validation beside its original in train stays with it; the same photo under two classes is
listed as a label conflict; the data's report (JSON and a page) says all of it, and opens in a
real browser with nothing asked of the network."""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from keras_pipe_launch.prepare import duplicates
from keras_pipe_launch.prepare.dataset import split
from tests.browser import open_page, painted
from tests.conftest import run_logged
from tests.launcher.test_prepare_at_scale import examples_by_part, local_examples_by_part, upload_folder

KERAS_PIPE = str(Path(sys.executable).parent / "keras-pipe")


def photo(seed: int, size=(96, 72)) -> bytes:
    """A photo-like JPEG (smooth blobs of colour, unlike any other seed's)."""
    from PIL import Image, ImageFilter

    rng = np.random.default_rng(seed)
    coarse = (rng.random((6, 8, 3)) * 255).astype(np.uint8)
    image = Image.fromarray(coarse).resize(size, Image.BICUBIC).filter(ImageFilter.GaussianBlur(2))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90)
    return out.getvalue()


def resaved(data: bytes, size=(160, 120), quality=70) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(data)).resize(size, Image.BICUBIC).save(out, "JPEG", quality=quality)
    return out.getvalue()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def planted(tmp_path):
    """Two classes of 20 photos; cat/c0.jpg copied as cat/c0 copy.jpg, placed so a split that
    ignored duplicates would put the two in different parts (checked below); cat/c1.jpg also filed
    as dog/d-stolen.jpg (a label conflict); dog/d3.jpg resized and recompressed as dog/d3-big.jpg."""
    root = tmp_path / "photos"
    for name, base in (("cat", 0), ("dog", 100)):
        (root / name).mkdir(parents=True)
        for i in range(20):
            (root / name / f"{name[0]}{i}.jpg").write_bytes(photo(base + i))
    shutil.copy(root / "cat/c0.jpg", root / "cat/c0 copy.jpg")
    shutil.copy(root / "cat/c1.jpg", root / "dog/d-stolen.jpg")
    (root / "dog/d3-big.jpg").write_bytes(resaved((root / "dog/d3.jpg").read_bytes()))
    return root


@pytest.mark.slow
def test_prepare_keeps_duplicates_in_one_part_and_lists_label_conflicts(planted, tmp_path):
    from keras_pipe_launch.prepare.dataset import read_listing
    from keras_pipe_launch.prepare.sources import Reader

    # the planted copy is one a split blind to duplicates separates (else this test proves nothing)
    listing = read_listing(str(planted), Reader())
    blind_train, blind_validation = split(listing.items, 0.3, 12)
    parts = {where.name: part for part, items in (("train", blind_train), ("validation", blind_validation))
             for where, _ in items}
    assert parts["c0.jpg"] != parts["c0 copy.jpg"], "choose another seed: the blind split kept the copy together"

    out = run_logged([KERAS_PIPE, "prepare", str(planted), str(tmp_path / "out"), "--validation-fraction", "0.3",
                      "--seed", "12"], 270, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "3 groups of duplicate images (6 images; 1 with different labels)" in out.stderr, out.stderr[-2000:]
    stored = local_examples_by_part(tmp_path / "out")  # part -> (SHA-256, label) of each example
    # no picture is in both parts: the copy went where its original went
    assert not {sha for sha, _ in stored["train"]} & {sha for sha, _ in stored["validation"]}
    copy = (digest((planted / "cat/c0.jpg").read_bytes()), 0)  # (cat: class 0)
    assert max(stored["train"][copy], stored["validation"][copy]) == 2

    report = json.loads((tmp_path / "out/data_report.json").read_text())
    found = report["duplicates"]
    assert (found["exact_groups"], found["near_groups"], found["label_conflicts"]) == (2, 1, 1)
    conflict = found["groups"][0]  # (conflicts first)
    assert conflict["label_conflict"] and conflict["kind"] == "exact"
    assert sorted((m["image"], m["labels"]) for m in conflict["members"]) == [
        ("cat/c1.jpg", ["cat"]), ("dog/d-stolen.jpg", ["dog"])]
    near = next(g for g in found["groups"] if g["kind"] == "near")
    assert sorted(m["image"] for m in near["members"]) == ["dog/d3-big.jpg", "dog/d3.jpg"]
    assert [c["class"] for c in report["classes"]] == ["cat", "dog"]
    assert sum(c["train"] + c["validation"] for c in report["classes"]) == report["images"] == 43
    assert report["sizes"]["longer_side"] == {"0-127": 42, "128-255": 1, "256-511": 0, "512-1023": 0,
                                              "1024-2047": 0, "2048+": 0}

    page = tmp_path / "out/report.html"
    opened = open_page(page, tmp_path / "browser")
    assert opened.console == [] and opened.requests == [], (opened.console, opened.requests)
    pictures, area = painted(page, tmp_path / "browser")
    assert pictures == 6 and area >= 6 * 50 * 50, (pictures, area)
    text = page.read_text()
    assert "label conflict" in text and "dog/d-stolen.jpg: dog" in text


def test_without_the_check_each_image_is_read_once_and_the_split_is_the_plain_one(planted, tmp_path):
    from keras_pipe_launch.prepare.dataset import prepare

    summary = prepare(planted, tmp_path / "out", validation_fraction=0.3, seed=12, duplicate_distance=None)
    assert summary["train"] + summary["validation"] == 43
    stored = local_examples_by_part(tmp_path / "out")
    copy = (digest((planted / "cat/c0.jpg").read_bytes()), 0)
    assert stored["train"][copy] == stored["validation"][copy] == 1  # (the blind split, as asked)
    report = json.loads((tmp_path / "out/data_report.json").read_text())
    assert report["duplicates"]["looked_for"] is False and report["duplicates"]["groups"] == []


def test_a_group_moves_as_one_and_singletons_split_as_before():
    items = [(f"img{i}", i % 3) for i in range(60)]
    plain = split(items, 0.25, 3)
    assert split(items, 0.25, 3, together=[]) == plain
    together = [[0, 3, 6, 9], [1, 31]]
    train, validation = split(items, 0.25, 3, together=together)
    assert sorted(train + validation) == sorted(items)
    for group in together:
        names = {items[i][0] for i in group}
        assert names <= {n for n, _ in train} or names <= {n for n, _ in validation}


def test_near_pairs_are_those_a_comparison_of_every_pair_finds():
    rng = random.Random(5)
    hashes = [rng.getrandbits(64) for _ in range(300)]
    # near neighbours planted at 1-6 bits
    for i in range(60):
        flipped = hashes[i]
        for bit in rng.sample(range(64), rng.randint(1, 6)):
            flipped ^= 1 << bit
        hashes.append(flipped)
    prints = [duplicates.Fingerprint(bytes([i % 256, i // 256]), h) for i, h in enumerate(hashes)] + [None]
    for distance in (0, 2, 4, 6):
        every = {(i, j) for i in range(len(hashes)) for j in range(i + 1, len(hashes))
                 if bin(hashes[i] ^ hashes[j]).count("1") <= distance}
        assert set(duplicates.near_pairs(prints, distance)) == every
        assert every or distance == 0


def test_groups_join_chains_and_tell_exact_from_near():
    a, b = b"a" * 32, b"b" * 32
    prints = [duplicates.Fingerprint(a, 0b0), duplicates.Fingerprint(b, 0b111),  # 3 bits apart
              duplicates.Fingerprint(a, 0b0), None, duplicates.Fingerprint(b"c" * 32, 0b1111111),  # 4 from [1]
              duplicates.Fingerprint(b"d" * 32, None)]
    assert duplicates.groups(prints, -1) == [duplicates.Group((0, 2), "exact")]
    assert duplicates.groups(prints, 3) == [duplicates.Group((0, 1, 2), "near")]
    assert duplicates.groups(prints, 4) == [duplicates.Group((0, 1, 2, 4), "near")]


def test_an_unreadable_or_huge_file_has_a_digest_and_no_picture_hash():
    assert duplicates.fingerprint(b"\xff\xd8 not a jpeg", 10**6).phash is None
    big = photo(1, (400, 300))
    assert duplicates.fingerprint(big, 1000).phash is None
    assert duplicates.fingerprint(big, 10**6).phash is not None
    same = duplicates.fingerprint(resaved(big, (200, 150), 60), 10**6)
    assert bin(same.phash ^ duplicates.fingerprint(big, 10**6).phash).count("1") <= duplicates.DISTANCE


@pytest.mark.slow
def test_at_scale_copies_stay_in_one_part_and_the_merge_moves_what_the_plan_could_not_see(
        planted, tmp_path, s3_bucket, monkeypatch):
    """Two instances over moto's S3, each seeing only its share: the plan keeps the copies it can see
    from the listing (the same ETag) in one part; the instances' fingerprints let the merge find the
    rest, and the near copy the plan put in validation beside its original in train is moved to train
    (its shard cut in two), so no picture is in both parts. The merge is stopped in the middle of its
    moves; `--finish` ends it as if it had not stopped."""
    from keras_pipe_launch.prepare import moves
    from keras_pipe_launch.prepare.dataset import read_listing
    from keras_pipe_launch.prepare.processing import Interrupted, prepare_locally
    from keras_pipe_launch.prepare.sources import Reader

    client, bucket = s3_bucket
    upload_folder(client, bucket, planted, "photos/")
    source = f"s3://{bucket}/photos/"
    listing = read_listing(source, Reader())
    together = duplicates.same_objects([where for where, _ in listing.items], listing.etags)
    assert sorted(sorted(listing.items[i][0][len(source):] for i in group) for group in together) == [
        ["cat/c0 copy.jpg", "cat/c0.jpg"], ["cat/c1.jpg", "dog/d-stolen.jpg"]]

    def parts(train, validation) -> dict[str, str]:
        return {where[len(source):]: part for part, items in (("train", train), ("validation", validation))
                for where, _ in items}

    # a seed whose blind split separates the copy (the plan must keep it whole) and whose plan puts
    # the near copy in validation, its original in train (only the merge can tell): found, not assumed
    seed = next(seed for seed in range(200)
                if (blind := parts(*split(listing.items, 0.3, seed)))["cat/c0.jpg"] != blind["cat/c0 copy.jpg"]
                and (planned := parts(*split(listing.items, 0.3, seed, together)))["dog/d3.jpg"] == "train"
                and planned["dog/d3-big.jpg"] == "validation")

    def stopped(client, bucket, key):  # (the merge stops once the near copy's shard is cut, before its deletion)
        raise KeyboardInterrupt

    monkeypatch.setattr(moves, "delete_original", stopped)
    with pytest.raises(Interrupted, match="marked incomplete, its dataset unfinished"):
        prepare_locally(source, f"s3://{bucket}/out/", instance_count=2, job_dir=tmp_path / "jobs",
                        validation_fraction=0.3, seed=seed, arguments=["--shard-mb", "0.005"])
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]]
    moved = [key for key in keys if key.endswith("-moved.tfrecord")]
    assert len(moved) == 1 and moved[0].replace("train/", "validation/").replace("-moved", "") in keys
    assert "out/classes.json" not in keys
    out = run_logged([KERAS_PIPE, "prepare", "--finish", f"s3://{bucket}/out/"], 270, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    said = out.stderr
    assert "moved 1 validation images to train, each a duplicate of a training image" in said, said
    assert "3 groups of duplicate images (6 images; 1 with different labels): each kept in one part" in said, said
    assert f"the data's report: s3://{bucket}/out/report.html" in said, said
    counts = re.search(r"prepare: (\d+) train and (\d+) validation examples", said)

    # what the shards hold: every example once, no picture in both parts, the near copy with its original
    stored = examples_by_part(client, bucket, "out/", tmp_path)
    assert (stored["train"].total(), stored["validation"].total()) == tuple(map(int, counts.groups()))
    assert stored["train"].total() + stored["validation"].total() == 43
    assert not {sha for sha, _ in stored["train"]} & {sha for sha, _ in stored["validation"]}
    for name in ("dog/d3.jpg", "dog/d3-big.jpg"):
        assert (digest((planted / name).read_bytes()), 1) in stored["train"]
    c0 = digest((planted / "cat/c0.jpg").read_bytes())
    assert stored[planned["cat/c0.jpg"]][(c0, 0)] == 2
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]]
    assert moved[0] in keys and moved[0].replace("train/", "validation/").replace("-moved", "") not in keys

    report = json.loads(client.get_object(Bucket=bucket, Key="out/data_report.json")["Body"].read())
    found = report["duplicates"]
    assert (found["exact_groups"], found["near_groups"], found["label_conflicts"], found["in_both_parts"],
            found["moved_to_train"]) == (2, 1, 1, 0, 1)
    by_members = {tuple(sorted(m["image"] for m in g["members"])): g for g in found["groups"]}
    assert by_members[("cat/c1.jpg", "dog/d-stolen.jpg")]["label_conflict"] and found["groups"][0]["label_conflict"]
    assert by_members[("cat/c0 copy.jpg", "cat/c0.jpg")]["part"] == planned["cat/c0.jpg"]
    near = by_members[("dog/d3-big.jpg", "dog/d3.jpg")]
    assert near["part"] == "train" and sorted(m.get("moved_from", "") for m in near["members"]) == ["", "validation"]
    assert [(c["train"], c["validation"]) for c in report["classes"]] == [
        tuple(sum(n for (_, label), n in stored[part].items() if label == wanted) for part in ("train", "validation"))
        for wanted in (0, 1)]
    assert report["sizes"]["measured"] == 43
    page = client.get_object(Bucket=bucket, Key="out/report.html")
    assert page["ContentType"].startswith("text/html")
    text = page["Body"].read().decode()
    assert "dog/d3-big.jpg: dog (moved from validation)" in text and text.count('src="data:image/jpeg') == 6
    (tmp_path / "report.html").write_text(text)
    opened = open_page(tmp_path / "report.html", tmp_path / "browser")
    assert opened.console == [] and opened.requests == [], (opened.console, opened.requests)
    pictures, area = painted(tmp_path / "report.html", tmp_path / "browser")
    assert pictures == 6 and area >= 6 * 50 * 50, (pictures, area)
