"""Each host's /opt/ml for a local run, as SageMaker makes it before the container starts: the
folders (input/config, input/data, model, output/data, checkpoints), the configuration files, and
the File/FastFile channels' objects copied in (with ShardedByS3Key, each host its own share).
Pipe channels get nothing here: their FIFOs are made and fed while the job runs (local.feeder)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from keras_pipe_launch.common import container_config
from keras_pipe_launch.common.channels import ChannelSpec
from keras_pipe_launch.common.objects import StoredObject, case_insensitive, list_objects, stage, staging_plan
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError
from keras_pipe_launch.local.manifest import read_manifest


class JobFolders:
    """The job folder: one /opt/ml per host (job_dir/algo-N), and one checkpoint folder for all.

    Every host's /opt/ml/checkpoints is that one folder, as on SageMaker each host's is synced with
    the same checkpoint_s3_uri; a folder kept between runs lets a job resume, as a restarted spot
    job does. A local process reaches it through a symbolic link; a container has it mounted there
    (a link would point outside the container)."""

    def __init__(self, job_dir: Path, hosts: list[str], checkpoint_dir: Path, *, in_container: bool,
                 reuse: bool = False):
        self.job_dir, self.hosts, self.checkpoint_dir = job_dir, hosts, checkpoint_dir
        self.in_container = in_container
        self.reuse = reuse  # the folder of an earlier run of this job (local.LocalJobFolder claimed it)

    def host_dir(self, host: str) -> Path:
        return self.job_dir / host

    def lay_out(self, channels: list[ChannelSpec], hyperparameters: dict[str, str],
                say: Callable[[str], None]) -> dict[str, list[StoredObject]]:
        """Lists every channel's objects once, checks that File/FastFile objects can all be staged,
        and only then writes each host's /opt/ml. Returns the listings (the Pipe feeders stream them)."""
        if not self.reuse and self.job_dir.exists() and any(self.job_dir.iterdir()):
            raise UsageError(f"job directory {shown(self.job_dir)} is not empty: give a new --job-dir")
        ignore_case = case_insensitive(self.job_dir)
        objects, staging = {}, {}
        for spec in channels:
            if spec.is_manifest:  # (its lines, each the listed attributes: streamed as SageMaker does)
                objects[spec.name] = read_manifest(spec.source, spec.attribute_names)
                say(f"channel {spec.name} ({spec.input_mode}, augmented manifest): {len(objects[spec.name])} lines "
                    f"from {shown(spec.source)}")
                continue
            objects[spec.name] = list_objects(spec.source)
            if spec.input_mode != "Pipe":  # checked before anything is written
                staging[spec.name] = staging_plan(objects[spec.name], ignore_case)
            say(f"channel {spec.name} ({spec.input_mode}): {len(objects[spec.name])} objects from {shown(spec.source)}")
        config_files = {"hyperparameters": hyperparameters,
                        "channels": {spec.name: spec.input_data_config() for spec in channels}}
        if self.reuse:  # the earlier run's hosts' folders go (not its checkpoints): each host starts anew
            for old in self.job_dir.glob("algo-*"):
                shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
        for index, host in enumerate(self.hosts):
            base = self._make_folders(host)
            container_config.write(base / "input/config", **config_files,
                                   resources=container_config.resource_config(host, self.hosts))
            for spec in channels:
                if spec.input_mode != "Pipe":
                    plan = staging[spec.name]
                    if spec.distribution == "ShardedByS3Key":
                        plan = plan[index::len(self.hosts)]
                    stage(plan, base / "input/data" / spec.name)
        return objects

    def _make_folders(self, host: str) -> Path:
        base = self.host_dir(host)
        for folder in ("input/config", "input/data", "model", "output/data"):
            (base / folder).mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        if self.in_container:
            (base / "checkpoints").mkdir()
        else:
            (base / "checkpoints").symlink_to(self.checkpoint_dir, target_is_directory=True)
        return base
