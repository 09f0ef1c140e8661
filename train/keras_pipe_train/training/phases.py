"""The job's training phases: the head on a frozen backbone (or the whole network from scratch),
then the top of the backbone fine-tuned."""

from __future__ import annotations

import dataclasses

from keras_pipe_train.settings.config import JobConfig


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str  # "scratch" or "head" (phase 1), "fine_tune" (phase 2)
    start: int  # first epoch (0-based)
    end: int
    learning_rate: float


def phases(config: JobConfig, from_scratch: bool) -> list[Phase]:
    first = Phase("scratch" if from_scratch else "head", 0, config.epochs, config.learning_rate)
    second = Phase("fine_tune", config.epochs, config.epochs + config.fine_tune_epochs,
                   config.fine_tune_learning_rate)
    return [p for p in (first, second) if p.end > p.start]
