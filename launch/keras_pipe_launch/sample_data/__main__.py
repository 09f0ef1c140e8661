"""Sample photos to follow the README with, when you have none at hand:

    python -m keras_pipe_launch.sample_data photos

writes the 1,797 built-in handwritten digits as JPEG files in one folder per class (photos/zero/,
photos/one/ ... photos/nine/), the layout `keras-pipe prepare` reads. They are small (64x64 by
default): a job on them trains in a minute on a laptop's CPU.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keras_pipe_launch.sample_data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="where the class folders go (new or empty)")
    parser.add_argument("--size", type=int, default=64, help="side of each square JPEG in pixels (default 64)")
    parser.add_argument("--count", type=int, default=None, help="only the first N digits (default: all 1797)")
    args = parser.parse_args(argv)
    if not 8 <= args.size <= 1024:
        parser.error("--size must be 8 to 1024 pixels")
    if args.count is not None and args.count < 10:
        parser.error("--count must be at least 10 (every class needs images)")
    if args.folder.exists() and (not args.folder.is_dir() or any(args.folder.iterdir())):
        parser.error(f"{shown(args.folder)} already exists and is not an empty folder")
    written = write_photos(args.folder, args.size, args.count)
    print(f"wrote {written} handwritten digits as {args.size}x{args.size} JPEGs in {len(CLASS_NAMES)} class "
          f"folders under {shown(args.folder)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
