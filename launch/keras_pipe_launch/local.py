"""`keras-pipe local`: a training job on this machine, laid out and fed as SageMaker does it.

SageMaker's own local mode cannot do Pipe mode (it rewrites every channel to File), shard with
ShardedByS3Key, or run without Docker Compose. This runner makes, for each host algo-1..N, the
/opt/ml a SageMaker container gets (input/config/*.json, input/data/, model/, output/,
checkpoints/), copies File/FastFile channels into it, feeds Pipe channels through FIFOs pass
after pass as the job reads them, and runs the job, as a local process (the installed
keras_pipe_train, the program container/train runs) or in a container (--image): logs prefixed
with the host, Ctrl-C forwarded as SIGTERM (SIGKILL after 120 s, as SageMaker does), and the
job's exit status returned, with its failure file shown.

    keras-pipe local --train ./data/train --validation ./data/val --hp num_classes=10 ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from keras_pipe_launch import channels as channel_args
from keras_pipe_launch import container_config, hyperparameters, secrets
from keras_pipe_launch.channels import ChannelSpec
from keras_pipe_launch.cli import UsageError, key_values
from keras_pipe_launch.objects import SourceError, StoredObject, case_insensitive, list_objects, staging_plan

# The feeder (and the Pipe reader's framing it uses) loads only when a job runs: `keras-pipe submit`
# shares this CLI and must work with nothing but boto3 and the SageMaker SDK installed.
if TYPE_CHECKING:
    from keras_pipe_launch.pipe_feeder import PassReport, PipeFeeder

# Without --image the job runs as a process of the installed keras_pipe_train package, the same
# program as the image's `train` (container/train calls the same function).
TRAIN_COMMAND = (sys.executable, "-m", "keras_pipe_train.main")
STOP_GRACE_S = 120  # SageMaker sends SIGKILL 120 s after SIGTERM

# On SageMaker a job gets its execution role's credentials, never its launcher's, and in a
# container here it gets none: a local process would inherit this shell's. These are taken out,
# and the AWS config files pointed away, so that the job sees no credentials either way (give it
# some explicitly with --env; their values are redacted in what is printed).
AWS_CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
)
NO_AWS_CREDENTIALS = {"AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull,
                      "AWS_EC2_METADATA_DISABLED": "true"}


def host_environment() -> dict[str, str]:
    """What a local-process job inherits from this shell: everything but AWS credentials."""
    inherited = {k: v for k, v in os.environ.items() if k not in AWS_CREDENTIAL_VARIABLES}
    return {**inherited, **NO_AWS_CREDENTIALS}


@dataclasses.dataclass(frozen=True)
class Engine:
    """The container engine command and its extra `run` arguments, from LAUNCH_ENGINE (e.g.
    "docker", or "podman --runtime runc": global options go here) and LAUNCH_ENGINE_ARGS
    (e.g. "--ulimit nofile=1024:1024 --network none", placed after `run`)."""

    command: tuple[str, ...] = ("docker",)
    run_args: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls, command: str | None = None) -> Engine:
        return cls(tuple(shlex.split(command or os.environ.get("LAUNCH_ENGINE") or "docker")),
                   tuple(shlex.split(os.environ.get("LAUNCH_ENGINE_ARGS", ""))))


class LocalRun:
    def __init__(self, job_dir: Path, channels: list[ChannelSpec], hyperparameters: dict[str, str], *,
                 instance_count: int = 1, image: str | None = None, engine: Engine | None = None,
                 name: str | None = None, checkpoint_dir: Path | None = None,
                 environment: dict[str, str] | None = None, out=None):
        if instance_count < 1:
            raise UsageError("--instance-count must be >= 1")
        self.job_dir = Path(job_dir).resolve()
        # Every host's /opt/ml/checkpoints is this one folder, as on SageMaker each host's is synced
        # with the same checkpoint_s3_uri; a folder kept between runs lets a job resume, as a
        # restarted spot job does.
        self.checkpoint_dir = Path(checkpoint_dir or self.job_dir / "checkpoints").resolve()
        self.channels = channels
        self.hyperparameters = hyperparameters
        self.environment = dict(environment or {})  # the job's Environment, as SageMaker sets it
        self.hosts = [f"algo-{i}" for i in range(1, instance_count + 1)]
        self.image, self.engine = image, engine or Engine.from_environment()
        self.name = name or self.job_dir.name
        self.out = out or sys.stdout
        self.stop_feeding = threading.Event()
        self.reports: list[PassReport] = []
        self.feed_errors: list[str] = []
        self._lock = threading.Lock()
        self._jobs: dict[str, subprocess.Popen] = {}
        self._stopping = False
        self._output_lost = False
        self._kill_timer: threading.Timer | None = None
        self._objects: dict[str, list[StoredObject]] = {}
        self._staging: dict[str, list] = {}  # File/FastFile channel -> [(object, relative path)]

    # --- layout ------------------------------------------------------------------------------

    def host_dir(self, host: str) -> Path:
        return self.job_dir / host

    def prepare(self) -> None:
        """Lists every channel's objects once, then lays out each host's /opt/ml."""
        if self.job_dir.exists() and any(self.job_dir.iterdir()):
            raise UsageError(f"job directory {self.job_dir} is not empty: give a new --job-dir")
        ignore_case = case_insensitive(self.job_dir)
        for spec in self.channels:
            self._objects[spec.name] = list_objects(spec.source)
            if spec.input_mode != "Pipe":  # checked before anything is written
                self._staging[spec.name] = staging_plan(self._objects[spec.name], ignore_case)
            count = len(self._objects[spec.name])
            self.say(f"channel {spec.name} ({spec.input_mode}): {count} objects from {spec.source}")
        for index, host in enumerate(self.hosts):
            base = self.host_dir(host)
            for folder in ("input/config", "input/data", "model", "output/data"):
                (base / folder).mkdir(parents=True, exist_ok=True)
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            if self.image is None:
                (base / "checkpoints").symlink_to(self.checkpoint_dir, target_is_directory=True)
            else:  # mounted there (a symlink would point outside the container)
                (base / "checkpoints").mkdir()
            container_config.write(base / "input/config", hyperparameters=self.hyperparameters,
                                   channels={spec.name: spec.input_data_config() for spec in self.channels},
                                   resources=container_config.resource_config(host, self.hosts))
            for spec in self.channels:
                if spec.input_mode != "Pipe":
                    self._stage(spec, index, base / "input/data" / spec.name)

    def _stage(self, spec: ChannelSpec, index: int, folder: Path) -> None:
        plan = self._staging[spec.name]
        if spec.distribution == "ShardedByS3Key":
            plan = plan[index::len(self.hosts)]
        folder.mkdir(parents=True, exist_ok=True)
        for obj, relative in plan:
            dest = folder.joinpath(*relative.parts)  # inside `folder`: staging_plan checked every key
            obj.store.download(obj, dest)

    # --- running -----------------------------------------------------------------------------

    def run(self) -> int:
        self.prepare()
        feeders = self._start_feeders()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        # Closing the terminal sends SIGHUP, whose default would kill this runner alone and leave the
        # jobs (in sessions of their own) running unattended: it stops them as Ctrl-C does.
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hangup)
        try:
            for host in self.hosts:
                self._start_job(host)
            codes = self._wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._kill_timer:
                self._kill_timer.cancel()
            self.stop_feeding.set()
            for thread in feeders:
                thread.join(timeout=10)
        return self._finish(codes)

    def _start_feeders(self) -> list[threading.Thread]:
        from keras_pipe_launch.pipe_feeder import PipeFeeder

        threads = []
        for index, host in enumerate(self.hosts):
            for spec in self.channels:
                if spec.input_mode != "Pipe":
                    continue
                feeder = PipeFeeder(str(self.host_dir(host) / "input/data"), spec, self._objects[spec.name],
                                    host=host, host_index=index, host_count=len(self.hosts),
                                    spool_dir=str(self.job_dir), stop=self.stop_feeding, on_report=self._report)
                thread = threading.Thread(target=self._feed, args=(feeder,), daemon=True,
                                          name=f"feeder-{host}-{spec.name}")
                thread.start()
                threads.append(thread)
        return threads

    def _feed(self, feeder: PipeFeeder) -> None:
        try:
            feeder.run()
        except Exception as err:  # any failure: reported, then the job is stopped
            message = f"feeding {feeder.host}/{feeder.spec.name} failed: {err}"
            with self._lock:
                self.feed_errors.append(message)
            self.say(f"ERROR {message}; stopping the job")
            self._signal_jobs(signal.SIGTERM)

    def _report(self, report: PassReport) -> None:
        with self._lock:
            if report not in self.reports:
                self.reports.append(report)
        self.say(f"fed {report.summary()}")

    def command(self, host: str) -> tuple[list[str], dict[str, str]]:
        """The command and environment that run the job for `host`."""
        env = {**self.environment, "TRAINING_JOB_NAME": self.name, "PYTHONUNBUFFERED": "1"}
        if len(self.hosts) > 1:
            # the hosts share this machine: TensorFlow reaches each at its own 127.0.0.1 port
            env["TRAIN_CLUSTER_ADDRESSES"] = json.dumps(self._addresses())
        if self.image is None:
            env = {**host_environment(), **env, "SAGEMAKER_BASE_DIR": str(self.host_dir(host))}
            return list(TRAIN_COMMAND), env
        command = [*self.engine.command, "run", "--rm", "--name", f"{self.name}-{host}",
                   "-v", f"{self.host_dir(host)}:/opt/ml", "-v", f"{self.checkpoint_dir}:/opt/ml/checkpoints",
                   "--hostname", host]
        if len(self.hosts) > 1:  # the hosts reach each other's ports on this machine
            command += ["--network", "host"]
        for key, value in env.items():
            command += ["-e", f"{key}={value}"]
        return [*command, *self.engine.run_args, self.image, "train"], dict(os.environ)

    def _addresses(self) -> dict[str, str]:
        if not hasattr(self, "_ports"):
            self._ports = {host: _free_port() for host in self.hosts}
        return {host: f"127.0.0.1:{port}" for host, port in self._ports.items()}

    def _start_job(self, host: str) -> None:
        command, env = self.command(host)
        self.say(f"starting {host}: {shlex.join(secrets.redacted_command(command))}")
        # a session of its own: a terminal's Ctrl-C reaches only this runner, which forwards it
        # as SageMaker would (SIGTERM, then SIGKILL after the grace period)
        job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True, text=True, errors="replace", bufsize=1)
        self._jobs[host] = job
        threading.Thread(target=self._relay, args=(host, job), daemon=True, name=f"log-{host}").start()

    def _wait(self) -> dict[str, int]:
        """Waits for every host; when one fails, stops the others, as SageMaker does (a host alone
        would wait for its peers until its collectives time out)."""
        codes: dict[str, int] = {}
        while len(codes) < len(self.hosts):
            for host, job in self._jobs.items():
                if host not in codes and job.poll() is not None:
                    codes[host] = _shell_code(job.returncode)
                    if codes[host] and len(codes) < len(self.hosts) and not self._stopping:
                        self._stop_jobs(f"{host} ended with exit code {codes[host]}: stopping the other hosts")
            time.sleep(0.1)
        return {host: codes[host] for host in self.hosts}

    def _relay(self, host: str, job: subprocess.Popen) -> None:
        for line in job.stdout:
            self.write(f"{host} | {line.rstrip()}")

    def _on_signal(self, signum, frame) -> None:
        if self._stopping:
            self.say("second interrupt: killing the job")
            self._signal_jobs(signal.SIGKILL)
            return
        self._stop_jobs(f"stopping: SIGTERM sent to the job (SIGKILL in {STOP_GRACE_S} s; interrupt again to kill now)")

    def _on_hangup(self, signum, frame) -> None:
        if not self._stopping:
            self._stop_jobs(f"the terminal closed (SIGHUP): SIGTERM sent to the job (SIGKILL in {STOP_GRACE_S} s)")

    def _stop_jobs(self, message: str) -> None:
        """What SageMaker does to stop a job: SIGTERM, then SIGKILL after the grace period."""
        self._stopping = True
        self.say(message)
        self._signal_jobs(signal.SIGTERM)
        self._kill_timer = threading.Timer(STOP_GRACE_S, self._signal_jobs, args=(signal.SIGKILL,))
        self._kill_timer.daemon = True  # must not keep the runner alive once the job has stopped
        self._kill_timer.start()

    def _signal_jobs(self, signum: int) -> None:
        for job in list(self._jobs.values()):
            if job.poll() is None:
                try:
                    job.send_signal(signum)
                except ProcessLookupError:
                    pass

    def _finish(self, codes: dict[str, int]) -> int:
        result = 0
        for host, code in codes.items():
            failure = self.host_dir(host) / "output" / "failure"
            if code:
                self.say(f"{host} failed with exit code {code}")
                if failure.exists():
                    self.say(f"{host} failure file {failure}:\n{failure.read_text().strip()}")
                result = result or code
            else:
                model = self.host_dir(host) / "model"
                self.say(f"{host} completed" + (f"; model in {model}" if any(model.iterdir()) else ""))
        if self.feed_errors and not result:
            result = 1
        return result

    def say(self, message: str) -> None:
        self.write(f"launch | {message}")

    def write(self, line: str) -> None:
        """Prints a line; once the output is gone (a closed terminal: EIO, a closed pipe: EPIPE),
        carries on silently, since the jobs' logs must still be drained or they would block."""
        with self._lock:
            if self._output_lost:
                return
            try:
                print(line, file=self.out, flush=True)
            except (OSError, ValueError):
                self._output_lost = True


def _shell_code(returncode: int) -> int:
    """Popen says -N for a process killed by signal N; shells (and SageMaker's logs) say 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("local", help="run a training job here, Pipe mode included",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    channel_args.add_arguments(parser)
    parser.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="a hyperparameter")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable of the job (as submit's --env); the job gets none of "
                             "your AWS credentials otherwise, as on SageMaker")
    parser.add_argument("--instance-count", type=int, default=1, help="hosts algo-1..N, each with its own /opt/ml")
    parser.add_argument("--job-dir", type=Path, default=None,
                        help="where the hosts' /opt/ml folders go (default: ./local-jobs/<name>)")
    parser.add_argument("--name", default=None, help="the job name (TRAINING_JOB_NAME)")
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="every host's /opt/ml/checkpoints (default: <job-dir>/checkpoints); reuse it "
                             "in a later run to resume, as a restarted spot job does")
    parser.add_argument("--image", default=None, help="run in this container image instead of a local process")
    parser.add_argument("--engine", default=None,
                        help='the engine command, e.g. docker or "podman --runtime runc" '
                             "(default: $LAUNCH_ENGINE or docker)")
    parser.add_argument("--no-validate", action="store_true",
                        help="do not check hyperparameters against this project's job (for other images)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from keras_pipe_train.contract import JOB_NAME
    from keras_pipe_train.errors import UserError

    name = args.name or time.strftime("local-%Y%m%d-%H%M%S")
    try:
        if not JOB_NAME.match(name):  # it names folders and containers: SageMaker's rule keeps it a plain name
            raise UsageError(f"--name {name!r}: 1-63 letters, digits and hyphens, as SageMaker names jobs")
        channels = channel_args.from_arguments(args)
        values = hyperparameters.parse(args.hp)
        if not args.no_validate:
            hyperparameters.check(values)
        runner = LocalRun(args.job_dir or Path("local-jobs") / name, channels, values,
                          instance_count=args.instance_count, image=args.image,
                          engine=Engine.from_environment(args.engine), name=name,
                          checkpoint_dir=args.checkpoint_dir, environment=key_values(args.env, "--env"))
        return runner.run()
    except (UsageError, SourceError, UserError) as err:
        print(f"keras-pipe local: error: {err}", file=sys.stderr)
        return 2
