"""Duplicate images in a dataset, found before it is split: the same file twice (its SHA-256), or
the same picture saved again, resized or recompressed (a perceptual hash within DISTANCE bits).

Why before the split: a photo in both train and validation is scored on what the model has already
learned, and inflates the accuracy a user reports; prepare keeps each group in one part (dataset.split).
A group whose images carry different labels is a label conflict: listed, never resolved here.

The perceptual hash is ImageHash's phash (JohannesBuchner/imagehash: the 8x8 lowest frequencies of
a 32x32 greyscale DCT, 64 bits), robust to resizing, JPEG recompression and small colour changes.
Near pairs are found without comparing every pair: two hashes within DISTANCE bits agree exactly
on at least one of DISTANCE + 1 bands of their bits (pigeonhole), so only images sharing a band's
value are compared ("multi-index hashing"). One image costs a read and a draft decode (a JPEG at
1/8 scale: docs/speed.md, Figures behind the code's choices: Duplicates); memory holds ~100 bytes
per image.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import io
import warnings
from collections.abc import Callable, Iterable, Sequence

import numpy as np

DISTANCE = 4  # bits of 64: at most this far apart, two pictures are near-duplicates
MAX_DISTANCE = 32  # half the bits: beyond, any two pictures would be alike
HASH_SIDE = 32  # phash's own input size: a JPEG is decoded at no less than this


@dataclasses.dataclass(frozen=True, slots=True)
class Fingerprint:
    digest: bytes  # SHA-256 of the file
    phash: int | None  # 64 bits; None where Pillow cannot decode it (prepare's check says why)
    width: int | None = None
    height: int | None = None


def fingerprint(data: bytes, max_pixels: int) -> Fingerprint:
    """The file's fingerprint: its digest always; its perceptual hash and size when Pillow reads
    it (an image over max_pixels is not decoded: prepare rejects it anyway)."""
    import imagehash
    from PIL import Image

    digest = hashlib.sha256(data).digest()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Pillow's DecompressionBombWarning: the size is checked below)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                return Fingerprint(digest, None, width, height)
            image.draft("L", (HASH_SIDE, HASH_SIDE))  # (a JPEG decoded at the smallest scale that keeps 32 px)
            return Fingerprint(digest, int(str(imagehash.phash(image)), 16), width, height)
    except Exception:  # (Pillow raises many kinds for a damaged file: prepare's own check names the problem)
        return Fingerprint(digest, None)


@dataclasses.dataclass(frozen=True)
class Group:
    """Images (indices into the listing) that are one picture: "exact" when all are the same file."""

    members: tuple[int, ...]
    kind: str


def groups(prints: Sequence[Fingerprint | None], distance: int = DISTANCE) -> list[Group]:
    """The groups of two or more images that are the same file or, with distance >= 0, within
    `distance` bits of each other's perceptual hash (transitively: a chain of near pairs is one
    group). In the listing's order; None (unread), or a file with no perceptual hash (which
    prepare rejects), is in none."""
    parent = list(range(len(prints)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int) -> None:
        a, b = root(i), root(j)
        if a != b:
            parent[max(a, b)] = min(a, b)

    by_digest: dict[bytes, int] = {}
    for index, found in enumerate(prints):
        if found is not None and found.phash is not None:  # (files that are no picture: rejected anyway)
            first = by_digest.setdefault(found.digest, index)
            if first != index:
                join(first, index)
    if distance >= 0:
        for i, j in near_pairs(prints, distance):
            join(i, j)
    members: dict[int, list[int]] = collections.defaultdict(list)
    for index in range(len(prints)):
        members[root(index)].append(index)
    found = []
    for group in sorted((m for m in members.values() if len(m) > 1), key=lambda m: m[0]):
        exact = len({prints[i].digest for i in group}) == 1
        found.append(Group(tuple(group), "exact" if exact else "near"))
    return found


def near_pairs(prints: Sequence[Fingerprint | None], distance: int) -> Iterable[tuple[int, int]]:
    """The pairs (i < j) of images whose perceptual hashes differ in at most `distance` bits."""
    indices = np.array([i for i, p in enumerate(prints) if p is not None and p.phash is not None], np.int64)
    if len(indices) < 2:
        return
    hashes = np.array([prints[i].phash for i in indices], np.uint64)
    bands = np.array_split(np.arange(64), distance + 1)
    seen: set[tuple[int, int]] = set()
    for band in bands:
        mask = np.uint64(((1 << len(band)) - 1) << int(band[0]))
        keys = hashes & mask
        order = np.argsort(keys, kind="stable")
        starts = np.flatnonzero(np.r_[True, keys[order][1:] != keys[order][:-1], True])
        for start, end in zip(starts[:-1], starts[1:]):
            if end - start < 2:
                continue
            bucket = order[start:end]
            for position, a in enumerate(bucket[:-1]):
                others = bucket[position + 1:]
                bits = _popcount(hashes[others] ^ hashes[a])
                for b in others[bits <= distance]:
                    pair = (int(min(indices[a], indices[b])), int(max(indices[a], indices[b])))
                    if pair not in seen:
                        seen.add(pair)
                        yield pair


def _popcount(values: np.ndarray) -> np.ndarray:
    return np.unpackbits(values.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)


def same_objects(locations: Sequence, etags: dict[str, str]) -> list[list[int]]:
    """Indices of the objects that share an S3 ETag and size: the same bytes, known from the
    listing alone (an ETag is the MD5 of a plain upload's bytes, or of its parts'; an object
    encrypted with KMS or a customer's key has one of its own, and is in no such group). A prepare
    at scale splits with these, before any instance reads an image: copies uploaded alike stay whole."""
    by_etag: dict[str, list[int]] = collections.defaultdict(list)
    for index, location in enumerate(locations):
        etag = etags.get(str(location))
        if etag:
            by_etag[etag].append(index)
    return [indices for indices in by_etag.values() if len(indices) > 1]


def fingerprints(locations: Sequence, read: Callable[[object], bytes], max_pixels: int,
                 mapped: Callable) -> list[Fingerprint | None]:
    """Each location's fingerprint (None: unreadable), `mapped(function, items)` running the reads
    (dataset.in_order's threads)."""
    def one(location) -> Fingerprint | None:
        try:
            return fingerprint(read(location), max_pixels)
        except Exception:  # (an unreadable file: prepare's check rejects it, naming why)
            return None

    return list(mapped(one, locations))
