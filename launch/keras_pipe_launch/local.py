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
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from keras_pipe_launch import channels as channel_args
from keras_pipe_launch import hyperparameters, secrets
from keras_pipe_launch.channels import ChannelSpec
from keras_pipe_launch.cli import UsageError, key_values
from keras_pipe_launch.local_layout import JobFolders
from keras_pipe_launch.local_processes import Console, Supervisor
from keras_pipe_launch.objects import SourceError, StoredObject

# The feeder (and the Pipe reader's framing it uses) loads only when a job runs: `keras-pipe submit`
# shares this CLI and must work with nothing but boto3 and the SageMaker SDK installed.
if TYPE_CHECKING:
    from keras_pipe_launch.pipe_feeder import PassReport, PipeFeeder

# Without --image the job runs as a process of the installed keras_pipe_train package, the same
# program as the image's `train` (container/train calls the same function).
TRAIN_COMMAND = (sys.executable, "-m", "keras_pipe_train.main")

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
                    self.say(f"starting {host}: {shlex.join(secrets.redacted_command(command))}")
                    self.supervisor.start(host, command, env)
                codes = self.supervisor.wait()
        finally:
            self.stop_feeding.set()
            for thread in feeders:
                thread.join(timeout=10)
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
        for key, value in env.items():
            command += ["-e", f"{key}={value}"]
        return [*command, *self.engine.run_args, self.image, "train"], dict(os.environ)

    # --- Pipe channels ---------------------------------------------------------------------------

    def _start_feeders(self) -> list[threading.Thread]:
        from keras_pipe_launch.pipe_feeder import PipeFeeder

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
            message = f"feeding {feeder.host}/{feeder.spec.name} failed: {err}"
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
        self.console.say(message)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("local", help="run a training job here, Pipe mode included",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    channel_args.add_arguments(parser)
    parser.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="a hyperparameter")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable of the job (as submit's --env); the job gets none of "
                             "your AWS credentials otherwise, as on SageMaker")
    parser.add_argument("--instance-count", type=int, default=1, help="hosts algo-1..N, each with its own /opt/ml")
    parser.add_argument("--job-dir", type=Path, default=None,
                        help="where the hosts' /opt/ml folders go (default: ./local-jobs/<name>)")
    parser.add_argument("--name", default=None,
                        help="the job name (TRAINING_JOB_NAME); a job folder of that name already used: the job "
                             "resumes from its newest checkpoint")
    parser.add_argument("--resume", default=None, metavar="NAME",
                        help="rerun the job NAME with the arguments it was started with (and any --hp or --env "
                             "given now), from its newest checkpoint")
    parser.add_argument("--fresh", action="store_true",
                        help="start the job over in its used job folder: its hosts' folders and checkpoints are "
                             "deleted first")
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="every host's /opt/ml/checkpoints (default: <job-dir>/checkpoints); share it with "
                             "another job folder to resume from its checkpoints, as a restarted spot job does")
    parser.add_argument("--image", default=None, help="run in this container image instead of a local process")
    parser.add_argument("--engine", default=None,
                        help='the engine command, e.g. docker or "podman --runtime runc" '
                             "(default: $LAUNCH_ENGINE or docker)")
    parser.add_argument("--no-validate", action="store_true",
                        help="do not check hyperparameters against this project's job (for other images)")


def run(args: argparse.Namespace) -> int:
    from keras_pipe_train.contract import JOB_NAME
    from keras_pipe_train.errors import UserError

    try:
        if args.resume:
            args = resumed(args)
        name = args.name or time.strftime("local-%Y%m%d-%H%M%S")
        if not JOB_NAME.match(name):  # it names folders and containers: SageMaker's rule keeps it a plain name
            raise UsageError(f"--name {name!r}: 1-63 letters, digits and hyphens, as SageMaker names jobs")
        channels = channel_args.from_arguments(args)
        values = hyperparameters.parse(args.hp)
        if not args.no_validate:
            hyperparameters.check(values)
        job_dir = args.job_dir or Path("local-jobs") / name
        folder = LocalJobFolder(job_dir, name, args.checkpoint_dir)
        resuming = folder.claim(fresh=args.fresh)
        runner = LocalRun(job_dir, channels, values, instance_count=args.instance_count, image=args.image,
                          engine=Engine.from_environment(args.engine), name=name,
                          checkpoint_dir=args.checkpoint_dir, environment=key_values(args.env, "--env"),
                          reuse=True)  # (claimed: new, or an earlier run's folder to go on in)
        if resuming and args.fresh:
            runner.say(f"starting job {name} over in {job_dir} (--fresh)")
        elif resuming:
            runner.say(f"resuming job {name} from its newest checkpoint in {folder.checkpoint_dir}")
        runner.prepare()  # (raises before anything is written when a source cannot be staged)
        folder.record(args)
        code = runner.run()
    except (UsageError, SourceError, UserError) as err:
        print(f"keras-pipe local: error: {err}", file=sys.stderr)
        return 2
    if code and folder.has_checkpoints():
        how = "stopped" if code == STOPPED_EXIT_CODE else "ended"
        runner.say(f"the job {how} with its checkpoints kept; continue it from the newest with: "
                   f"{shlex.join(folder.resume_command(args.job_dir))}")
    return code


STOPPED_EXIT_CODE = 143  # the job's exit after SIGTERM, its checkpoint saved (keras_pipe_train.main)
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
            raise UsageError(f"--job-dir {self.job_dir} is a file")
        if not self.job_dir.exists() or not any(self.job_dir.iterdir()):
            return False
        if not (self.job_dir / JOB_FILE).is_file():
            raise UsageError(f"job directory {self.job_dir} is not empty, and no keras-pipe local job's: give a new "
                             "--job-dir (or --name)")
        if fresh:
            self._start_over()
            return True
        if not self.has_checkpoints():
            raise UsageError(f"job directory {self.job_dir} holds an earlier run of {self.name} that left no "
                             f"checkpoint in {self.checkpoint_dir} to resume from: --fresh starts the job over "
                             "there, or give a new --name")
        return True

    def has_checkpoints(self) -> bool:
        return self.checkpoint_dir.is_dir() and any(self.checkpoint_dir.glob("*/ckpt-*/progress.json"))

    def _start_over(self) -> None:
        import shutil

        own = self.checkpoint_dir.resolve() == (self.job_dir / "checkpoints").resolve()
        if not own and self.has_checkpoints():
            raise UsageError(f"--fresh with --checkpoint-dir {self.checkpoint_dir}: the job would resume from the "
                             "checkpoints there; give a new --checkpoint-dir")
        for entry in self.job_dir.iterdir():
            if entry.name.startswith("algo-") or (own and entry.name == "checkpoints"):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()

    def record(self, args: argparse.Namespace) -> None:
        """Keeps the job's arguments for --resume; values of secret-looking --env names are left out."""
        self.job_dir.mkdir(parents=True, exist_ok=True)
        kept = {key: value for key, value in vars(args).items() if key not in ("run", "resume", "fresh")}
        kept["job_dir"] = str(args.job_dir) if args.job_dir else None
        kept["checkpoint_dir"] = str(args.checkpoint_dir) if args.checkpoint_dir else None
        kept["env"] = [f"{k}={secrets.REDACTED if secrets.looks_secret(k) else v}"
                       for k, v in key_values(args.env, "--env").items()]
        kept["name"] = self.name
        (self.job_dir / JOB_FILE).write_text(json.dumps({"name": self.name, "arguments": kept}, indent=2) + "\n")

    def resume_command(self, job_dir_given: Path | None) -> list[str]:
        return ["keras-pipe", "local", "--resume", self.name] + (["--job-dir", str(job_dir_given)] if job_dir_given
                                                                  else [])


def resumed(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments the job `--resume NAME` was last run with, with the --hp and --env given now
    in place of the earlier values of the same names."""
    given = {key: value for key, value in vars(args).items()
             if key not in ("resume", "job_dir", "hp", "env", "run") and value != DEFAULTS.get(key)}
    if given:
        options = ", ".join(f"--{key.replace('_', '-')}" for key in given)
        raise UsageError(f"--resume {args.resume} takes the job's own arguments from its folder; besides --hp, --env "
                         f"and --job-dir, give none ({options} given)")
    job_dir = args.job_dir or Path("local-jobs") / args.resume
    stored = job_dir / JOB_FILE
    if not stored.is_file():
        raise UsageError(f"--resume {args.resume}: no job of that name in {job_dir} (no {JOB_FILE}); give its "
                         "--job-dir if it has another")
    kept = json.loads(stored.read_text())["arguments"]
    previous = argparse.Namespace(**{**DEFAULTS, **kept, "run": args.run, "resume": None, "fresh": False})
    previous.job_dir = Path(kept["job_dir"]) if kept.get("job_dir") else args.job_dir
    previous.checkpoint_dir = Path(kept["checkpoint_dir"]) if kept.get("checkpoint_dir") else None
    previous.hp = [f"{k}={v}" for k, v in {**key_values(kept["hp"], "--hp"), **key_values(args.hp, "--hp")}.items()]
    env = {**key_values(kept["env"], "--env"), **key_values(args.env, "--env")}
    hidden = [k for k, v in env.items() if v == secrets.REDACTED]
    if hidden:
        raise UsageError(f"--resume {args.resume}: the values of {', '.join(hidden)} were not kept (they look secret): "
                         f"give them again, e.g. --env {hidden[0]}=...")
    previous.env = [f"{k}={v}" for k, v in env.items()]
    return previous


def _defaults() -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return vars(parser.parse_args([]))


DEFAULTS = _defaults()
