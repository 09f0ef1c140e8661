"""`keras-pipe local`: a training job on this machine, laid out and fed as SageMaker does it.

SageMaker's own local mode cannot do Pipe mode (it rewrites every channel to File), shard with
ShardedByS3Key, or run without Docker Compose. This runner makes, for each host algo-1..N, the
/opt/ml a SageMaker container gets (input/config/*.json, input/data/, model/, output/,
checkpoints/), copies File/FastFile channels into it, feeds Pipe channels through FIFOs pass
after pass as the job reads them, and runs the job, as a local process (the installed
keras_pipe_train, the program container/train runs) or in a container (--image): logs prefixed
with the host, Ctrl-C forwarded as SIGTERM (SIGKILL after 120 s, as SageMaker does), and the
job's exit status returned, with its failure file shown.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from keras_pipe_launch.common import secrets, untrusted
from keras_pipe_launch.common.channels import ChannelSpec
from keras_pipe_launch.common.engine import Engine, host_environment
from keras_pipe_launch.common.objects import StoredObject
from keras_pipe_launch.common.processes import Console, Supervisor
from keras_pipe_launch.common.usage import UsageError
from keras_pipe_launch.local.layout import JobFolders

# The feeder (and the Pipe reader's framing it uses) loads only when a job runs: `keras-pipe submit`
# shares the command line and must work with nothing but boto3 and the SageMaker SDK installed.
if TYPE_CHECKING:
    from keras_pipe_launch.local.feeder import PassReport, PipeFeeder

# Without --image the job runs as a process of the installed keras_pipe_train package, the same
# program as the image's `train` (container/train calls the same function).
TRAIN_COMMAND = (sys.executable, "-m", "keras_pipe_train.main")

STOPPED_EXIT_CODE = 143  # the job's exit after SIGTERM, its checkpoint saved (keras_pipe_train.main)


class LocalRun:
    """One local job: its folders laid out, its Pipe channels fed, its hosts run and supervised."""

    def __init__(self, job_dir: Path, channels: list[ChannelSpec], hyperparameters: dict[str, str], *,
                 instance_count: int = 1, image: str | None = None, engine: Engine | None = None,
                 name: str | None = None, checkpoint_dir: Path | None = None,
                 environment: dict[str, str] | None = None, out=None, reuse: bool = False):
        if instance_count < 1:
            raise UsageError("--instance-count must be >= 1")
        job_dir = Path(job_dir).resolve()
        self.hosts = [f"algo-{i}" for i in range(1, instance_count + 1)]
        self.folders = JobFolders(job_dir, self.hosts, Path(checkpoint_dir or job_dir / "checkpoints").resolve(),
                                  in_container=image is not None, reuse=reuse)
        self.channels = channels
        self.hyperparameters = hyperparameters
        self.environment = dict(environment or {})  # the job's Environment, as SageMaker sets it
        self.image, self.engine = image, engine or Engine.from_environment()
        self.name = name or job_dir.name
        self.console = Console(out or sys.stdout)
        self.supervisor = Supervisor(self.console)
        self.stop_feeding = threading.Event()
        self.reports: list[PassReport] = []
        self.feed_errors: list[str] = []
        self._lock = threading.Lock()
        self._objects: dict[str, list[StoredObject]] = {}
        self._laid_out = False
        self._env_files: list[Path] = []
        self._ports = {host: _free_port() for host in self.hosts} if instance_count > 1 else {}

    def host_dir(self, host: str) -> Path:
        return self.folders.host_dir(host)

    def prepare(self) -> None:
        """Lists every channel's objects once, then lays out each host's /opt/ml."""
        self._objects = self.folders.lay_out(self.channels, self.hyperparameters, self.say)
        self._laid_out = True

    def run(self) -> int:
        if not self._laid_out:
            self.prepare()
        feeders = self._start_feeders()
        try:
            with self.supervisor.forwarding_signals():
                for host in self.hosts:
                    command, env = self.command(host)
                    self.say(f"starting {host}: {untrusted.shown(shlex.join(secrets.redacted_command(command)))}")
                    self.supervisor.start(host, command, env)
                codes = self.supervisor.wait()
        finally:
            self.stop_feeding.set()
            for thread in feeders:
                thread.join(timeout=10)
            for path in self._env_files:  # (read by the engine when each container started)
                path.unlink(missing_ok=True)
        return self._finish(codes)

    def command(self, host: str) -> tuple[list[str], dict[str, str]]:
        """The command and environment that run the job for `host`."""
        env = {**self.environment, "TRAINING_JOB_NAME": self.name, "PYTHONUNBUFFERED": "1"}
        if self._ports:
            # the hosts share this machine: TensorFlow reaches each at its own 127.0.0.1 port
            env["TRAIN_CLUSTER_ADDRESSES"] = json.dumps({h: f"127.0.0.1:{port}" for h, port in self._ports.items()})
        if self.image is None:
            env = {**host_environment(), **env, "SAGEMAKER_BASE_DIR": str(self.host_dir(host))}
            return list(TRAIN_COMMAND), env
        command = [*self.engine.command, "run", "--rm", "--name", f"{self.name}-{host}",
                   "-v", f"{self.host_dir(host)}:/opt/ml", "-v", f"{self.folders.checkpoint_dir}:/opt/ml/checkpoints",
                   "--hostname", host]
        if len(self.hosts) > 1:  # the hosts reach each other's ports on this machine
            command += ["--network", "host"]
        # The values go in a file only this user can read, given as --env-file: a command line is
        # readable by anyone on the machine (`ps`), and the engine's own environment is the
        # engine's (a job's PATH or DOCKER_HOST there would change which engine runs, and how).
        command += ["--env-file", str(self._env_file(host, env))]
        return [*command, *self.engine.run_args, self.image, "train"], dict(os.environ)

    def _env_file(self, host: str, env: dict[str, str]) -> Path:
        path = self.folders.job_dir / f".{host}.env"  # (beside the host's /opt/ml, not inside the container)
        bad = [key for key, value in env.items() if "\n" in value or "\r" in value or "=" in key]
        if bad:
            raise UsageError(f"--env {untrusted.shown(', '.join(bad))}: a container's environment file holds one "
                             "NAME=VALUE a line: no line breaks in a value, no '=' in a name")
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(f"{key}={value}\n" for key, value in env.items()))
        self._env_files.append(path)
        return path

    # --- Pipe channels ---------------------------------------------------------------------------

    def _start_feeders(self) -> list[threading.Thread]:
        from keras_pipe_launch.local.feeder import PipeFeeder

        threads = []
        for index, host in enumerate(self.hosts):
            for spec in self.channels:
                if spec.input_mode != "Pipe":
                    continue
                feeder = PipeFeeder(str(self.host_dir(host) / "input/data"), spec, self._objects[spec.name],
                                    host=host, host_index=index, host_count=len(self.hosts),
                                    spool_dir=str(self.folders.job_dir), stop=self.stop_feeding,
                                    on_report=self._report)
                thread = threading.Thread(target=self._feed, args=(feeder,), daemon=True,
                                          name=f"feeder-{host}-{spec.name}")
                thread.start()
                threads.append(thread)
        return threads

    def _feed(self, feeder: PipeFeeder) -> None:
        try:
            feeder.run()
        except Exception as err:  # any failure: reported, then the job is stopped
            message = f"feeding {feeder.host}/{feeder.spec.name} failed: {untrusted.shown(str(err))}"
            with self._lock:
                self.feed_errors.append(message)
            self.say(f"ERROR {message}; stopping the job")
            self.supervisor.signal_all(signal.SIGTERM)

    def _report(self, report: PassReport) -> None:
        with self._lock:
            if report not in self.reports:
                self.reports.append(report)
        self.say(f"fed {report.summary()}")

    # --- the end ---------------------------------------------------------------------------------

    def _finish(self, codes: dict[str, int]) -> int:
        result = 0
        for host, code in codes.items():
            failure = self.host_dir(host) / "output" / "failure"
            if code == STOPPED_EXIT_CODE:
                self.say(f"{host} stopped (exit code {code}): its checkpoint is saved")
                result = result or code
            elif code:
                self.say(f"{host} failed with exit code {code}")
                reason = untrusted.read_text(failure)  # (the job's code may have left anything there)
                if reason is not None:
                    self.say(f"{host} failure file {untrusted.shown(failure)}:\n{reason.strip()}")
                result = result or code
            else:
                model = self.host_dir(host) / "model"
                self.say(f"{host} completed" + (f"; model in {untrusted.shown(model)}" if any(model.iterdir()) else ""))
        if self.feed_errors and not result:
            result = 1
        return result

    def say(self, message: str) -> None:
        self.console.say(message)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
