"""One pass over a channel that keeps, for each example, what a function of its image gives (the
logits a temperature is fitted on, the features label-error heads are fitted on), its label, and
on an examined pass (datasets.EpochInput's `examined`) its fingerprint, thumbnail and source: at most
`limit` examples, a seeded uniform sample of those the pass read (`Reservoir`). A channel's files
are read in order, and image folders are written class by class: the first examples would be the
first classes alone (with 1,000 classes and 2^23 logits kept, about the first 170). `cut` says when
the pass ended before the channel did: at a stop request or its time budget; `read`, how many
examples it read, of which the sample was drawn."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Gathered:
    outputs: np.ndarray  # [examples, width], as `dtype`
    labels: np.ndarray  # class ids, or multi-hot rows
    fingerprints: tuple[str, ...] = ()  # hex, an examined pass's
    thumbnails: tuple[bytes, ...] = ()  # JPEGs, an examined pass's
    sources: tuple[str, ...] = ()  # where each image came from ("" unknown), an examined pass's
    cut: bool = False
    read: int | None = None  # examples the pass read (None: those kept, all of them)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def sampled(self) -> bool:
        """Whether these are a sample of more examples read."""
        return self.read is not None and self.read > len(self)


class Within:
    """A pass over `dataset`'s batches that ends at `stop` (a threading.Event, checked before each
    batch) or once `budget_s` seconds are gone (checked after each), or when the caller says
    (`end`); `cut` then says whether batches were left."""

    def __init__(self, dataset, stop=None, budget_s: float | None = None):
        self._batches = iter(dataset)
        self.stop, self.cut = stop, False
        self.deadline = None if budget_s is None else time.monotonic() + budget_s

    def __iter__(self):
        for batch in self._batches:
            if self.stop is not None and self.stop.is_set():
                self.cut = True
                return
            yield batch
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.end()
                return

    def end(self) -> None:
        """The pass ends here: cut if a batch was left."""
        self.cut = next(self._batches, None) is not None


class Reservoir:
    """Where each item offered goes in a uniform sample of at most `size` of them, drawn in one pass
    whose length is not known (Vitter's algorithm R), seeded: the i-th item (from 0) fills slot i
    while there is room, then replaces a slot drawn from 0..i when that is below `size`."""

    def __init__(self, size: int, seed: int = 0):
        self.size, self.offered = size, 0
        self._rng = np.random.default_rng(seed)

    def places(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """For the next `count` items: the positions (among them) of those kept and the slot each
        goes to, one item a slot (of two drawn to the same slot, the later, as one by one)."""
        index = self.offered + np.arange(count)
        self.offered += count
        slot = np.where(index < self.size, index, self._rng.integers(0, index + 1))
        positions = np.flatnonzero(slot < self.size)
        last = len(positions) - 1 - np.unique(slot[positions][::-1], return_index=True)[1]
        positions = np.sort(positions[last])
        return positions, slot[positions]


class _Rows:
    """An array of at most `size` rows, grown as slots are filled (a pass over a small channel
    never holds `size` rows)."""

    def __init__(self, size: int):
        self.size, self.filled, self.rows = size, 0, None

    def put(self, slots: np.ndarray, values: np.ndarray) -> None:
        if not len(slots):
            return
        needed = int(slots.max()) + 1
        if self.rows is None or needed > len(self.rows):
            grown = np.empty((min(self.size, max(needed, 2 * (0 if self.rows is None else len(self.rows)), 256)),
                              *values.shape[1:]), values.dtype)
            if self.rows is not None:
                grown[: self.filled] = self.rows[: self.filled]
            self.rows = grown
        self.rows[slots] = values
        self.filled = max(self.filled, needed)

    def array(self, empty_shape: tuple, dtype) -> np.ndarray:
        return np.zeros(empty_shape, dtype) if self.rows is None else self.rows[: self.filled]


def _placed(kept: list, slots: np.ndarray, values) -> None:
    for slot, value in zip(slots.tolist(), values):
        if slot == len(kept):
            kept.append(value)
        else:
            kept[slot] = value


def gather(function, dataset, width: int, limit: int, stop=None, budget_s: float | None = None,
           dtype=np.float32, seed: int = 0) -> Gathered:
    """`function`: images -> [batch, width], called on the examples kept alone (past the first
    `limit`, fewer and fewer of each batch); `stop`: a threading.Event that ends the pass; `dtype`:
    how the outputs are kept (float16 ones saturate at its largest value); `seed`: the sample's."""
    reservoir, outputs, labels = Reservoir(limit, seed), _Rows(limit), _Rows(limit)
    fingerprints, thumbnails, sources = [], [], []
    batches = Within(dataset, stop, budget_s)
    for batch in batches:
        images, batch_labels = batch[:2]
        positions, slots = reservoir.places(int(tf.shape(batch_labels)[0]))
        if not len(positions):
            continue
        chosen = images if len(positions) == len(batch_labels) else tf.gather(images, positions)
        values = tf.cast(function(chosen), tf.float32).numpy()
        if np.dtype(dtype).itemsize < 4:  # (float16: a feature above 65504 saturates there, not at inf)
            values = np.clip(values, np.finfo(dtype).min, np.finfo(dtype).max)
        outputs.put(slots, values.astype(dtype))
        labels.put(slots, batch_labels.numpy()[positions])
        if len(batch) == 5:
            _placed(fingerprints, slots, [bytes(row).hex() for row in batch[2].numpy()[positions]])
            _placed(thumbnails, slots, list(batch[3].numpy()[positions]))
            # (a file name that is not UTF-8 keeps its bytes, escaped: it can be found again)
            _placed(sources, slots, [source.decode("utf-8", "backslashreplace")
                                     for source in batch[4].numpy()[positions]])
    return Gathered(outputs.array((0, width), dtype), labels.array((0,), np.int64), tuple(fingerprints),
                    tuple(thumbnails), tuple(sources), batches.cut, reservoir.offered)
