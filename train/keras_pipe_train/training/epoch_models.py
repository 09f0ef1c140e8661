"""keep_epoch_models (MXNet's checkpoint_frequency): every N-th epoch's model, kept beside the job's
checkpoints (a resumed spot job still has them) until the export copies them into epochs/."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

EPOCH_MODELS = "epoch-models"  # (in the job's own checkpoint folder)


def keep(model, checkpoints: Path, epoch: int, every: int, whole: bool) -> None:
    """The model as it is after `epoch` (0-based), when it is an every-th one: a .keras file, or
    its weights alone when not `whole` (a SavedModel backbone cannot be saved so: export.py)."""
    if not every or (epoch + 1) % every:
        return
    folder = checkpoints / EPOCH_MODELS
    folder.mkdir(parents=True, exist_ok=True)
    for debris in folder.glob(".writing-*"):  # (a write a stop cut short)
        debris.unlink(missing_ok=True)
    name = f"epoch-{epoch + 1:04d}{'.keras' if whole else '.weights.h5'}"
    partial = folder / f".writing-{name}"  # (renamed once whole: a stopped write leaves no file that looks kept)
    (model.save if whole else model.save_weights)(partial)
    partial.replace(folder / name)
    log.info("keep_epoch_models=%d: epoch %d's model kept (%s), to be exported in epochs/", every, epoch + 1, name)


def copy(checkpoints: Path, model_dir: Path) -> None:
    """The models `keep` kept, into the export's epochs/ folder."""
    folder = checkpoints / EPOCH_MODELS
    kept = sorted(p for p in folder.glob("epoch-*") if p.is_file()) if folder.is_dir() else []
    if kept:
        (model_dir / "epochs").mkdir(parents=True, exist_ok=True)
        for path in kept:
            shutil.copyfile(path, model_dir / "epochs" / path.name)
        log.info("exported the models of epochs %s in %s", ", ".join(str(int(p.name[6:10])) for p in kept),
                 model_dir / "epochs")
