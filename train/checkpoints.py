"""Checkpoints in /opt/ml/checkpoints: SageMaker syncs that folder to checkpoint_s3_uri during the job
and restores it when a spot job restarts, so the job can resume where it stopped, to the record.

Each checkpoint is a folder ckpt-NNNNNN holding the model and optimizer state (tf.train.Checkpoint)
and progress.json (phase, epoch, steps done in that epoch). It is written under a hidden temporary
name and renamed once complete, so a half-written checkpoint is never picked up; one that is
unreadable anyway (a truncated upload) is skipped with a warning, and the previous one is used.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import tensorflow as tf

from train.metrics import to_json

log = logging.getLogger(__name__)
KEEP = 3


@dataclasses.dataclass(frozen=True)
class Progress:
    phase: str  # "head", "fine_tune" or "scratch"
    epoch: int  # 0-based epoch in progress (all before it are done)
    steps: int  # steps of that epoch already trained
    global_batch: int
    history: tuple = ()  # the metric rows of the epochs done, so metrics.json survives restarts

    @property
    def records(self) -> int:
        """Records of the current epoch's pass already trained on (by all workers together)."""
        return self.steps * self.global_batch


class Checkpoints:
    def __init__(self, folder: Path, is_chief: bool):
        self.folder = Path(folder)
        self.is_chief = is_chief

    def save(self, model, optimizer, progress: Progress) -> Path | None:
        """Writes a checkpoint. Every worker must call this (saving reads variables that other
        replicas hold); only the chief's copy is kept."""
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.folder / f".writing-{uuid.uuid4().hex}"
        tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(temporary / "state"))
        if not self.is_chief:
            shutil.rmtree(temporary, ignore_errors=True)
            return None
        (temporary / "progress.json").write_text(to_json({**dataclasses.asdict(progress), "time": time.time()}))
        final = self.folder / f"ckpt-{self._next_number():06d}"
        os.rename(temporary, final)  # atomic: a checkpoint exists whole or not at all
        for old in self.complete()[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint %s: %s epoch %d, %d steps (%d records) into it",
                 final.name, progress.phase, progress.epoch + 1, progress.steps, progress.records)
        return final

    def complete(self) -> list[Path]:
        """Complete checkpoints, newest first."""
        if not self.folder.is_dir():
            return []
        found = [p for p in self.folder.glob("ckpt-*") if (p / "progress.json").is_file()]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def _next_number(self) -> int:
        existing = self.complete()
        return int(existing[0].name.split("-")[1]) + 1 if existing else 1

    def candidates(self):
        """(folder, progress) of each complete checkpoint, newest first, skipping (with a warning)
        those whose progress.json cannot be read."""
        for path in self.complete():
            try:
                raw = json.loads((path / "progress.json").read_text())
                yield path, Progress(raw["phase"], raw["epoch"], raw["steps"], raw["global_batch"],
                                     tuple(raw.get("history", ())))
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.warning("checkpoint %s has an unreadable progress.json (%s); using the previous one", path.name, err)

    def restore(self, path: Path, model, optimizer=None) -> bool:
        """Loads the checkpoint's state (the model only when `optimizer` is None). False, with a
        warning, when it cannot be read: the caller then tries an older one."""
        objects = {"model": model} if optimizer is None else {"model": model, "optimizer": optimizer}
        try:
            status = tf.train.Checkpoint(**objects).read(str(path / "state"))
            status.expect_partial() if optimizer is None else status.assert_existing_objects_matched()
        except Exception as err:  # noqa: BLE001 - truncated or damaged: IndexError, DataLossError, ...
            log.warning("checkpoint %s is unreadable (%s: %s); using the previous one",
                        path.name, type(err).__name__, str(err)[:200])
            return False
        return True
