"""Checkpoints in /opt/ml/checkpoints: SageMaker syncs that folder to checkpoint_s3_uri during the job
and restores it when a spot job restarts, so the job can resume where it stopped, to the record.

Whose checkpoints are they? A checkpoint_s3_uri can be reused by mistake, or shared by two jobs at
once. So each job writes into a subfolder of its own, named after the job (TRAINING_JOB_NAME stays
the same across spot restarts) and a digest of its settings (the hyperparameters that shape the
model and its training, the channels, the hosts):

    /opt/ml/checkpoints/<job>-<settings digest>/ckpt-NNNNNN/   state.* (model, optimizer), progress.json

A job resumes from its own subfolder. Checkpoints of other jobs are refused with an explanation
(other_checkpoints=refuse, the default), resumed only if written with the same settings
(other_checkpoints=resume: continue a stopped job in a new one), or left alone
(other_checkpoints=ignore). A job writes and deletes only in its own subfolder.

Each checkpoint is written under a hidden temporary name and renamed once complete, so a
half-written checkpoint is never picked up; one that is unreadable anyway (a truncated upload) is
skipped with a warning, and the previous one is used.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import tensorflow as tf

from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.training.metrics import to_json

log = logging.getLogger(__name__)
KEEP = 3


def random_states(model) -> tf.Module:
    """The states of the model's random generators (Dropout's): a checkpoint keeps them, so a job
    resumed mid-epoch draws the same dropout masks as one never stopped. tf.train.Checkpoint does not
    find them through the model (Keras 3 keeps its SeedGenerators outside TensorFlow's tracking)."""
    holder = tf.Module()
    holder.states = [getattr(v, "value", v) for v in model.variables if "seed_generator_state" in v.path]
    return holder


class CheckpointError(UserError):
    """The checkpoint folder cannot be used: not writable, full, or holding another job's work."""


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


@dataclasses.dataclass(frozen=True)
class Found:
    """A complete checkpoint in the folder."""

    path: Path
    job: str  # the job that wrote it ("?" for a checkpoint from before subfolders)
    settings: dict
    progress: Progress | None  # None: its progress.json cannot be read
    written: float = 0.0


def settings_digest(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


class Checkpoints:
    def __init__(self, folder: Path, is_chief: bool, job: str = "local", settings: dict | None = None):
        self.folder = Path(folder)
        self.is_chief = is_chief
        self.job, self.settings = job, dict(settings or {})
        self.own = self.folder / f"{job}-{settings_digest(self.settings)}"

    # --- before training -------------------------------------------------------------------------

    def check_writable(self, checkpoint_bytes: int) -> None:
        """Fails now, not after an epoch, when checkpoints could not be written: the folder is not
        writable, or has less room than one checkpoint needs. Clears debris of this job's own
        interrupted writes."""
        try:
            self.own.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.own, prefix=".probe-") as probe:
                probe.write(b"\0" * 4096)
                probe.flush()
                os.fsync(probe.fileno())
            free = shutil.disk_usage(self.own).free
        except OSError as err:
            raise CheckpointError(f"the checkpoint folder {self.folder} cannot be written ({_why(err)}): "
                                  f"{_hint(err)}") from err
        if free < checkpoint_bytes:
            raise CheckpointError(
                f"the checkpoint folder {self.folder} has {free / 1e6:.0f} MB free, and a checkpoint of this model "
                f"and its optimizer takes about {checkpoint_bytes / 1e6:.0f} MB: {_hint(errno.ENOSPC)}")
        if self.is_chief:
            for debris in self.own.glob(".writing-*"):
                shutil.rmtree(debris, ignore_errors=True)

    # --- writing ----------------------------------------------------------------------------------

    def save(self, model, optimizer, progress: Progress, extra: dict | None = None) -> Path | None:
        """Writes a checkpoint (with `extra`'s trackable objects, such as early stopping's best
        weights). Every worker must call this (saving reads variables that other replicas hold);
        only the chief's copy is kept, the others write theirs to a temporary folder outside the
        checkpoint folder (SageMaker would upload it)."""
        temporary = self.own / f".writing-{uuid.uuid4().hex}" if self.is_chief else Path(tempfile.mkdtemp())
        try:
            tf.train.Checkpoint(model=model, optimizer=optimizer, rng=random_states(model), **(extra or {})).write(
                str(temporary / "state"))
            if not self.is_chief:
                return None
            (temporary / "progress.json").write_text(to_json({
                **dataclasses.asdict(progress), "time": time.time(), "job": self.job, "settings": self.settings}))
            final = self._publish(temporary)
        except (OSError, tf.errors.OpError) as err:
            raise CheckpointError(f"could not write a checkpoint to {self.own} ({_why(err)}): {_hint(err)}") from err
        finally:
            shutil.rmtree(temporary, ignore_errors=True)  # gone once renamed; debris after a failure
        for old in self._complete(self.own)[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("checkpoint %s: %s epoch %d, %d steps (%d records) into it",
                 final.name, progress.phase, progress.epoch + 1, progress.steps, progress.records)
        return final

    def _publish(self, temporary: Path) -> Path:
        """Renames the finished checkpoint to the next free number. A lock keeps two writers of the
        same job (the same job started twice on one folder) from taking the same number."""
        with open(self.own / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            existing = self._complete(self.own)
            number = int(existing[0].name.split("-")[1]) + 1 if existing else 1
            while True:
                final = self.own / f"ckpt-{number:06d}"
                try:
                    os.rename(temporary, final)  # atomic: a checkpoint exists whole or not at all
                    return final
                except OSError as err:  # a folder of that name exists (written without the lock)
                    if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise
                    number += 1

    # --- reading ----------------------------------------------------------------------------------

    @staticmethod
    def _complete(folder: Path) -> list[Path]:
        """Complete checkpoints in `folder`, newest first."""
        if not folder.is_dir():
            return []
        found = [p for p in folder.glob("ckpt-*") if (p / "progress.json").is_file()]
        return sorted(found, key=lambda p: p.name, reverse=True)

    def complete(self) -> list[Path]:
        """This job's complete checkpoints, newest first."""
        return self._complete(self.own)

    def candidates(self):
        """(folder, progress) of each of this job's complete checkpoints, newest first, skipping
        (with a warning) those whose progress.json cannot be read."""
        for found in map(self._read, self.complete()):
            if found.progress is None:
                log.warning("checkpoint %s has an unreadable progress.json; using the previous one", found.path.name)
            else:
                yield found.path, found.progress

    def others(self) -> list[Found]:
        """The newest checkpoint of every other job in the folder (of an earlier layout too)."""
        if not self.folder.is_dir():
            return []
        groups = [p for p in self.folder.iterdir() if p.is_dir() and p != self.own and not p.name.startswith(".")]
        newest = [self._complete(group)[:1] for group in groups] + [self._complete(self.folder)[:1]]
        return sorted((self._read(path) for [path] in filter(None, newest)), key=lambda f: f.written, reverse=True)

    @staticmethod
    def _read(path: Path) -> Found:
        try:
            raw = json.loads((path / "progress.json").read_text())
            progress = Progress(raw["phase"], raw["epoch"], raw["steps"], raw["global_batch"],
                                tuple(raw.get("history", ())))
            return Found(path, raw.get("job", "?"), raw.get("settings") or {}, progress, raw.get("time", 0.0))
        except (OSError, ValueError, KeyError, TypeError):
            return Found(path, "?", {}, None)

    def restore(self, path: Path, model, optimizer=None, extra: dict | None = None) -> bool:
        """Loads the checkpoint's state (the model only when `optimizer` is None; `extra` with the
        optimizer). False, with a warning, when it cannot be read: the caller then tries an older one."""
        objects = {"model": model} if optimizer is None else {"model": model, "optimizer": optimizer,
                                                              "rng": random_states(model), **(extra or {})}
        try:
            status = tf.train.Checkpoint(**objects).read(str(path / "state"))
            status.expect_partial() if optimizer is None else status.assert_existing_objects_matched()
        except AssertionError:  # written before checkpoints held the random states: all but those
            log.warning("checkpoint %s holds no random states (an older version wrote it): dropout's random "
                        "draws start again from the seed", path.name)
            return self.restore(path, model, None) if optimizer is None else self._restore_without_rng(
                path, model, optimizer, extra)
        except Exception as err:  # truncated or damaged: IndexError, DataLossError, ...
            log.warning("checkpoint %s is unreadable (%s: %s); using the previous one",
                        path.name, type(err).__name__, str(err)[:200])
            return False
        return True

    def _restore_without_rng(self, path: Path, model, optimizer, extra: dict | None = None) -> bool:
        try:
            tf.train.Checkpoint(model=model, optimizer=optimizer, **(extra or {})).read(
                str(path / "state")).assert_existing_objects_matched()
        except Exception as err:
            log.warning("checkpoint %s is unreadable (%s: %s); using the previous one",
                        path.name, type(err).__name__, str(err)[:200])
            return False
        return True

    # --- other jobs' checkpoints ------------------------------------------------------------------

    def other_to_resume(self, policy: str) -> Found | None:
        """What to do when this job has no checkpoint of its own but the folder holds others':
        the other job's newest checkpoint to continue (policy "resume", same settings only), None
        to start afresh (no others, or policy "ignore"), or a CheckpointError that explains."""
        others = self.others()
        if not others:
            return None
        if policy == "ignore":
            log.warning("the checkpoint folder holds checkpoints of %s: left alone, this job starts afresh "
                        "(other_checkpoints=ignore)", ", ".join(sorted({f.job for f in others})))
            return None
        same = [f for f in others if f.progress is not None and f.settings == self.settings]
        if policy == "resume" and same:
            return same[0]
        listed = "; ".join(self._describe(f) for f in others[:3]) + ("; ..." if len(others) > 3 else "")
        if policy == "resume":
            raise CheckpointError(
                f"the checkpoint folder {self.folder} holds no checkpoint written with this job's settings, so "
                f"other_checkpoints=resume has nothing to continue: {listed}. Use a new checkpoint location, or "
                "other_checkpoints=ignore to train afresh beside them")
        raise CheckpointError(
            f"the checkpoint folder {self.folder} holds checkpoints of another job: {listed}. Resuming would continue "
            "that job rather than start this one. Use a new checkpoint location (checkpoint_s3_uri), or set "
            "hyperparameter other_checkpoints=resume to continue one written with the same settings, or "
            "other_checkpoints=ignore to train afresh beside them")

    def _describe(self, found: Found) -> str:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(found.written)) if found.written else "unknown time"
        epoch = f"epoch {found.progress.epoch + 1}" if found.progress else "unreadable progress"
        changed = sorted(k for k in set(found.settings) | set(self.settings)
                         if found.settings.get(k) != self.settings.get(k))
        differs = ", ".join(f"{k} {found.settings.get(k)!r} -> {self.settings.get(k)!r}" for k in changed[:4])
        more = ", ..." if len(changed) > 4 else ""
        same = f"other settings ({differs}{more})" if changed else "the same settings"
        return f"job {found.job!r} ({found.path.relative_to(self.folder)}, {epoch}, {when}) with {same}"


def _why(err) -> str:
    if isinstance(err, OSError):
        return err.strerror or str(err)
    # TensorFlow's: "{{function_node ...}} /path/of/the/file; File too large [Op:SaveV2]"
    text = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]", "", getattr(err, "message", None) or str(err))
    return text.splitlines()[0].rsplit("; ", 1)[-1][:200]


def _hint(err) -> str:
    """What to do about a failed write, from its errno or, for TensorFlow's errors, its message."""
    code = err if isinstance(err, int) else getattr(err, "errno", None)
    text = "" if isinstance(err, int) else str(err)
    if code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in text or "quota" in text.lower():
        return ("the disk is full; raise the volume size (keras-pipe submit --volume-size, SageMaker's VolumeSizeInGB) "
                "or free space there")
    if code in (errno.EACCES, errno.EPERM, errno.EROFS) or "ermission denied" in text or "Read-only" in text:
        return "the folder is not writable by the job; fix its permissions or choose another"
    if code == errno.EFBIG or "File too large" in text:
        return "a file grew past the size limit of this system (ulimit -f)"
    return "check the folder and the disk it is on"
