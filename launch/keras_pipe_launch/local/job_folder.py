"""A job folder of `keras-pipe local` (./local-jobs/NAME by default): each host's /opt/ml, the
checkpoints, and local-job.json, the job's name and the arguments it was started with. A job run
again in its folder goes on from its newest checkpoint, as a restarted spot job does."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from keras_pipe_launch.common import secrets
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError, key_values

JOB_FILE = "local-job.json"  # in the job folder: the job's name and the arguments it was started with


class LocalJobFolder:
    """A job folder of `keras-pipe local` (local-jobs/NAME): new, or the folder of an earlier run of
    the same job, which is resumed from its newest checkpoint, never started over unless asked
    (--fresh). A folder that is not one of ours is never used, nor deleted."""

    def __init__(self, job_dir: Path, name: str, checkpoint_dir: Path | None):
        self.job_dir, self.name = job_dir, name
        self.checkpoint_dir = checkpoint_dir or job_dir / "checkpoints"

    def claim(self, fresh: bool) -> bool:
        """Whether the job resumes in its used folder; raises UsageError when it cannot go on there."""
        if self.job_dir.exists() and not self.job_dir.is_dir():
            raise UsageError(f"--job-dir {shown(self.job_dir)} is a file")
        if not self.job_dir.exists() or not any(self.job_dir.iterdir()):
            return False
        if not (self.job_dir / JOB_FILE).is_file():
            raise UsageError(f"job directory {shown(self.job_dir)} is not empty, and no keras-pipe local job's: give a "
                             "new --job-dir (or --name)")
        if fresh:
            self._start_over()
            return True
        if not self.has_checkpoints():
            raise UsageError(f"job directory {shown(self.job_dir)} holds an earlier run of {self.name} that left no "
                             f"checkpoint in {shown(self.checkpoint_dir)} to resume from: --fresh starts the job over "
                             "there, or give a new --name")
        return True

    def has_checkpoints(self) -> bool:
        return self.checkpoint_dir.is_dir() and any(self.checkpoint_dir.glob("*/ckpt-*/progress.json"))

    def _start_over(self) -> None:
        own = self.checkpoint_dir.resolve() == (self.job_dir / "checkpoints").resolve()
        if not own and self.has_checkpoints():
            raise UsageError(f"--fresh with --checkpoint-dir {shown(self.checkpoint_dir)}: the job would resume from "
                             "the checkpoints there; give a new --checkpoint-dir")
        for entry in self.job_dir.iterdir():
            if entry.name.startswith("algo-") or (own and entry.name == "checkpoints"):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()

    def record(self, args: argparse.Namespace) -> None:
        """Keeps the job's arguments for --resume; values of secret-looking --env names are left out."""
        self.job_dir.mkdir(parents=True, exist_ok=True)
        kept = {key: value for key, value in vars(args).items() if key not in ("run", "resume", "fresh")}
        kept["job_dir"] = str(args.job_dir) if args.job_dir else None
        kept["checkpoint_dir"] = str(args.checkpoint_dir) if args.checkpoint_dir else None
        kept["env"] = [f"{k}={v}" for k, v in secrets.redacted(key_values(args.env, "--env")).items()]
        kept["hp"] = [f"{k}={v}" for k, v in secrets.redacted(key_values(args.hp, "--hp")).items()]
        kept["name"] = self.name
        (self.job_dir / JOB_FILE).write_text(json.dumps({"name": self.name, "arguments": kept}, indent=2) + "\n")

    def resume_command(self, job_dir_given: Path | None) -> list[str]:
        return ["keras-pipe", "local", "--resume", self.name] + (["--job-dir", str(job_dir_given)] if job_dir_given
                                                                  else [])
