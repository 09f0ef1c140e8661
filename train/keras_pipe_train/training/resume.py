"""Where a job goes on: which checkpoints are this job's (the settings a resume may not change), and
the newest readable one restored, to the step."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable

import numpy as np

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.contract import ChannelConfig, ResourceConfig
from keras_pipe_train.training.checkpoints import Checkpoints
from keras_pipe_train.training.phases import Phase

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training starts: the epoch (0-based), the steps of it already trained, the metrics of
    the epochs done, and the phase the model is set up for (None: not set up yet)."""

    epoch: int = 0
    step: int = 0
    history: tuple = ()
    configured: Phase | None = None


def checkpoint_settings(config: JobConfig, channels: dict[str, ChannelConfig], resources: ResourceConfig,
                        mixed_precision: bool) -> dict:
    """What makes checkpoints this job's: they are resumed only by a job with the same settings
    (but for those a resume may change: the resumable hyperparameters, settings/hyperparameters.py)."""
    settings = config.identity()
    settings["channels"] = {name: [c.input_mode, c.distribution, c.record_wrapper]
                            for name, c in sorted(channels.items())}
    settings["hosts"] = len(resources.hosts)
    settings["mixed_precision"] = mixed_precision  # (auto resolves to on or off: the optimizer differs)
    return json.loads(json.dumps(settings))  # as progress.json gives them back: lists, not tuples


def checkpoint_bytes(model, copies: int = 3) -> int:
    """About what one checkpoint takes: the weights, and the optimizer's slots for each (Adam's
    two; all weights train in some phase), and early stopping's copy of the best."""
    return copies * sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights)


def resume(checkpoints: Checkpoints, plan: list[Phase], config: JobConfig, configure: Callable[[Phase], None],
           model, optimizer: Callable[[], object], extra_state: dict) -> Position:
    """Restores the newest readable checkpoint of this job (or, when it has none, of another job
    as other_checkpoints says), and says where training goes on. Each candidate is tried with the
    model set up for its own phase (`configure`, which gives the trainer a new `optimizer()`); a
    damaged one is skipped with a warning and the previous one used. Position() when none."""
    candidates = list(checkpoints.candidates())
    if not checkpoints.complete():
        other = checkpoints.other_to_resume(config.other_checkpoints)
        if other:
            log.info("continuing checkpoint %s of job %r (other_checkpoints=resume)",
                     other.path.relative_to(checkpoints.folder), other.job)
            candidates = [(other.path, other.progress)]
    for path, progress in candidates:
        phase = next((p for p in plan if progress.epoch < p.end), plan[-1])
        configure(phase)
        # a checkpoint from the end of phase 1 restores the weights only: phase 2 has a new optimizer
        same_phase = progress.phase == phase.name
        if not checkpoints.restore(path, model, optimizer() if same_phase else None, extra_state):
            continue
        step = progress.steps
        if progress.global_batch != config.batch_size and step:
            log.warning("checkpoint %s was taken with batch_size %d, now %d: epoch %d restarts from its first record",
                        path.name, progress.global_batch, config.batch_size, progress.epoch + 1)
            step = 0
        log.info("resuming from checkpoint %s: epoch %d of %d, after %d steps (%d records of its pass)",
                 path.name, progress.epoch + 1, plan[-1].end, step, step * config.batch_size)
        return Position(progress.epoch, step, progress.history, phase)
    return Position()
