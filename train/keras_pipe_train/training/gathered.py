"""One pass over a channel that keeps, for each example, what a function of its image gives (the
logits a temperature is fitted on, the features label-error heads are fitted on), its label, and
on an examined pass (datasets.EpochInput's `examined`) its fingerprint, thumbnail and source: at most
`limit` examples, the first ones (`cut` says when the pass ended before the channel did: at the
limit, a stop request or its time budget)."""

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

    def __len__(self) -> int:
        return len(self.labels)


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


def gather(function, dataset, width: int, limit: int, stop=None, budget_s: float | None = None,
           dtype=np.float32) -> Gathered:
    """`function`: images -> [batch, width]; `stop`: a threading.Event that ends the pass; `dtype`:
    how the outputs are kept (float16 ones saturate at its largest value)."""
    outputs, labels, fingerprints, thumbnails, sources, kept = [], [], [], [], [], 0
    batches = Within(dataset, stop, budget_s)
    for batch in batches:
        images, batch_labels = batch[:2]
        room = limit - kept
        values = tf.cast(function(images), tf.float32).numpy()[:room]
        if np.dtype(dtype).itemsize < 4:  # (float16: a feature above 65504 saturates there, not at inf)
            values = np.clip(values, np.finfo(dtype).min, np.finfo(dtype).max)
        outputs.append(values.astype(dtype))
        labels.append(batch_labels.numpy()[:room])
        if len(batch) == 5:
            fingerprints += [bytes(row).hex() for row in batch[2].numpy()[:room]]
            thumbnails += list(batch[3].numpy()[:room])
            # (a file name that is not UTF-8 keeps its bytes, escaped: it can be found again)
            sources += [source.decode("utf-8", "backslashreplace") for source in batch[4].numpy()[:room]]
        kept += len(outputs[-1])
        if kept >= limit:
            batches.end()
            break
    if not outputs:
        return Gathered(np.zeros((0, width), dtype), np.zeros((0,), np.int64), cut=batches.cut)
    return Gathered(np.concatenate(outputs), np.concatenate(labels), tuple(fingerprints), tuple(thumbnails),
                    tuple(sources), batches.cut)
