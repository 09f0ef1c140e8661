"""Sample photos to follow the README with, when you have none at hand:

    python -m keras_pipe_launch.sample_data photos

writes the 1,797 built-in handwritten digits as JPEG files in one folder per class (photos/zero/,
photos/one/ ... photos/nine/), the layout `keras-pipe prepare` reads. They are small (64x64 by
default): a job on them trains in a minute on a laptop's CPU.

    python -m keras_pipe_launch.sample_data labelled --manifest s3://my-bucket/labelled/

also writes, beside them, the output manifest a SageMaker Ground Truth image classification job
would have written for them, split in train.manifest and validation.manifest (every tenth image),
and classes.json: each line's source-ref is the image under the given prefix (an s3:// prefix, to
upload the folder there; without one, paths relative to the folder), its label the class id, and
label-metadata its class name and the rest of Ground Truth's metadata.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from keras_pipe_launch.common.untrusted import shown

CLASS_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def write_photos(folder: Path, size: int, count: int | None) -> int:
    """Writes the first `count` digits (all of them by default); returns how many. Pillow, not
    TensorFlow (digit_jpeg): photos made in a second, with no TensorFlow start-up."""
    from PIL import Image

    from keras_pipe_launch.sample_data import load_digits

    images, labels = load_digits()
    if count is not None:
        images, labels = images[:count], labels[:count]
    for name in CLASS_NAMES:
        (folder / name).mkdir(parents=True, exist_ok=True)
    for index, (image, label) in enumerate(zip(images, labels)):
        ink = (255 - image.astype(np.float32) * (255 / 16)).round().astype(np.uint8)  # dark ink on white
        photo = Image.fromarray(ink).resize((size, size), Image.Resampling.BILINEAR).convert("RGB")
        photo.save(folder / CLASS_NAMES[label] / f"{index:04d}.jpg", quality=95)
    return len(images)


def write_manifests(folder: Path, refs_prefix: str) -> tuple[int, int]:
    """train.manifest and validation.manifest for the photos under `folder`, as Ground Truth writes
    an image classification job's output (JSON Lines); (train lines, validation lines)."""
    import json

    photos = sorted((p for p in folder.rglob("*.jpg")), key=lambda p: p.name)
    parts: dict[str, list[str]] = {"train": [], "validation": []}
    for index, photo in enumerate(photos):
        label = CLASS_NAMES.index(photo.parent.name)
        line = {"source-ref": refs_prefix + photo.relative_to(folder).as_posix(), "label": label,
                "label-metadata": {"class-name": photo.parent.name, "confidence": 0.95,
                                   "type": "groundtruth/image-classification", "job-name": "labeling-job/digits",
                                   "human-annotated": "yes", "creation-date": "2026-11-02T10:11:12.123456"}}
        parts["validation" if index % 10 == 9 else "train"].append(json.dumps(line))
    for part, lines in parts.items():
        (folder / f"{part}.manifest").write_text("".join(line + "\n" for line in lines))
    (folder / "classes.json").write_text(json.dumps(list(CLASS_NAMES)) + "\n")
    return len(parts["train"]), len(parts["validation"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keras_pipe_launch.sample_data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="where the class folders go (new or empty)")
    parser.add_argument("--size", type=int, default=64, help="side of each square JPEG in pixels (default 64)")
    parser.add_argument("--count", type=int, default=None, help="only the first N digits (default: all 1797)")
    parser.add_argument("--manifest", nargs="?", const="", default=None, metavar="REFS_PREFIX",
                        help="also write Ground Truth's output manifests for them (train.manifest, "
                             "validation.manifest), each image's source-ref under REFS_PREFIX (an s3:// prefix where "
                             "the folder will be uploaded; none: paths relative to the folder)")
    args = parser.parse_args(argv)
    if args.manifest and not (args.manifest.startswith("s3://") and args.manifest.endswith("/")):
        parser.error("--manifest: give an s3://bucket/prefix/ ending in '/', or nothing (refs relative to the folder)")
    if not 8 <= args.size <= 1024:
        parser.error("--size must be 8 to 1024 pixels")
    if args.count is not None and args.count < 10:
        parser.error("--count must be at least 10 (every class needs images)")
    if args.folder.exists() and (not args.folder.is_dir() or any(args.folder.iterdir())):
        parser.error(f"{shown(args.folder)} already exists and is not an empty folder")
    written = write_photos(args.folder, args.size, args.count)
    print(f"wrote {written} handwritten digits as {args.size}x{args.size} JPEGs in {len(CLASS_NAMES)} class "
          f"folders under {shown(args.folder)}/")
    if args.manifest is not None:
        train, validation = write_manifests(args.folder, args.manifest)
        print(f"wrote Ground Truth's output manifests for them: {shown(args.folder)}/train.manifest ({train} lines), "
              f"validation.manifest ({validation} lines), and classes.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
