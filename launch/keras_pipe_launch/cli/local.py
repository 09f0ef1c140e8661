"""`keras-pipe local`: its options, and what it says and returns (the runner: local.run)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from keras_pipe_launch.cli.arguments import add_channel_arguments, channels_from
from keras_pipe_launch.cli.job_options import add_hyperparameter_argument, add_tracking_arguments, tracking_environment
from keras_pipe_launch.common import hyperparameters, secrets
from keras_pipe_launch.common.channels import channel_hyperparameters
from keras_pipe_launch.common.engine import Engine, EngineError
from keras_pipe_launch.common.objects import SourceError
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError, key_values
from keras_pipe_launch.local import run as local_run
from keras_pipe_launch.local.job_folder import JOB_FILE, LocalJobFolder
from keras_pipe_launch.local.run import STOPPED_EXIT_CODE, LocalRun

USAGE = """
    keras-pipe local --train ./data/train --validation ./data/val --hp num_classes=10 ...
    keras-pipe local --resume NAME [--hp KEY=VALUE ...]    (a job run before, from its newest checkpoint)
"""

def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("local", help="run a training job here, Pipe mode included",
                                   description=local_run.__doc__ + USAGE,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_channel_arguments(parser)
    add_hyperparameter_argument(parser)
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
    add_tracking_arguments(parser, "MLflow's default")


def run(args: argparse.Namespace) -> int:
    from keras_pipe_train.settings.contract import JOB_NAME
    from keras_pipe_train.settings.errors import UserError

    try:
        if args.resume:
            args = resumed(args)
        name = args.name or time.strftime("local-%Y%m%d-%H%M%S")
        if not JOB_NAME.match(name):  # it names folders and containers: SageMaker's rule keeps it a plain name
            raise UsageError(f"--name {name!r}: 1-63 letters, digits and hyphens, as SageMaker names jobs")
        channels = channels_from(args)
        values = channel_hyperparameters(channels, hyperparameters.parse(args.hp))
        if not args.no_validate:
            hyperparameters.check(values)
        engine = Engine.from_environment(args.engine)
        if args.image:
            engine.require()
        job_dir = args.job_dir or Path("local-jobs") / name
        if args.checkpoint_dir and args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
            raise UsageError(f"--checkpoint-dir {shown(args.checkpoint_dir)} is a file: give a folder")
        # (every option checked before --fresh empties an earlier run's folder)
        environment = {**key_values(args.env, "--env"), **tracking_environment(args, str(job_dir.resolve()))}
        folder = LocalJobFolder(job_dir, name, args.checkpoint_dir)
        resuming = folder.claim(fresh=args.fresh)
        runner = LocalRun(job_dir, channels, values, instance_count=args.instance_count, image=args.image,
                          engine=engine, name=name, checkpoint_dir=args.checkpoint_dir, environment=environment,
                          reuse=True)  # (claimed: new, or an earlier run's folder to go on in)
        if resuming and args.fresh:
            runner.say(f"starting job {name} over in {shown(job_dir)} (--fresh)")
        elif resuming:
            runner.say(f"resuming job {name} from its newest checkpoint in {shown(folder.checkpoint_dir)}")
        runner.prepare()  # (raises before anything is written when a source cannot be staged)
        folder.record(args)
        code = runner.run()
    except (UsageError, SourceError, UserError, EngineError) as err:
        print(f"keras-pipe local: error: {shown(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # (while listing or staging: once the job runs, its supervisor handles it)
        print("\nkeras-pipe local: interrupted before the job started", file=sys.stderr)
        return 130
    return ended(runner, folder, args.job_dir, channels, code)


def ended(runner: LocalRun, folder: LocalJobFolder, job_dir_given: Path | None, channels: list, code: int) -> int:
    """The job's exit code, after what its end calls for: its label check added to its data's
    report, or how to resume it."""
    if code == 0:
        add_label_check(runner, channels, folder.name)
    elif folder.has_checkpoints():
        how = "stopped" if code == STOPPED_EXIT_CODE else "ended"
        runner.say(f"the job {how} with its checkpoints kept; continue it from the newest with: "
                   f"{shown(shlex.join(folder.resume_command(job_dir_given)))}")
    return code


def add_label_check(runner: LocalRun, channels: list, name: str) -> None:
    """The job's label check, if it made one, added to the data report of the prepare output its
    train channel is part of (prepare/label_checks.py); a failure to is said, and the job's status
    kept: the job itself succeeded."""
    from keras_pipe_launch.prepare import label_checks
    from keras_pipe_train.settings.channels import TRAIN, TRAINING

    named = {channel.name: channel.source for channel in channels}
    train = named.get(TRAIN) or named.get(TRAINING)  # (the job reads `training` as train)
    output = runner.host_dir("algo-1") / "output/data"
    try:
        check = label_checks.check_of(output, name, str((output / "report.html").resolve()))
        dataset = label_checks.dataset_of(train) if check and train else None
        if dataset is None:
            return
        added = label_checks.add(check, dataset)
    except Exception as err:  # (S3 refused, a file unreadable: the job's own outputs are whole)
        runner.say(f"the job's label check was not added to the data report beside {shown(train)}: "
                   f"{shown(f'{type(err).__name__}: {err}')}")
        return
    runner.say(f"label check: {added.suspects:,} suspects added to the data report {shown(added.page)}")


def resumed(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments the job `--resume NAME` was last run with, with the --hp and --env given now
    in place of the earlier values of the same names."""
    given = {key: value for key, value in vars(args).items()
             if key not in ("resume", "job_dir", "hp", "env", "run") and value != DEFAULTS.get(key)}
    if given:
        options = ", ".join(f"--{key.replace('_', '-')}" for key in given)
        raise UsageError(f"--resume {shown(args.resume)} takes the job's own arguments from its folder; besides --hp, "
                         f"--env and --job-dir, give none ({options} given)")
    job_dir = args.job_dir or Path("local-jobs") / args.resume
    stored = job_dir / JOB_FILE
    if not stored.is_file():
        raise UsageError(f"--resume {shown(args.resume)}: no job of that name in {shown(job_dir)} (no {JOB_FILE}); "
                         "give its --job-dir if it has another")
    kept = json.loads(stored.read_text())["arguments"]
    previous = argparse.Namespace(**{**DEFAULTS, **kept, "run": args.run, "resume": None, "fresh": False})
    previous.job_dir = Path(kept["job_dir"]) if kept.get("job_dir") else args.job_dir
    previous.checkpoint_dir = Path(kept["checkpoint_dir"]) if kept.get("checkpoint_dir") else None
    hp = {**key_values(kept["hp"], "--hp"), **key_values(args.hp, "--hp")}
    env = {**key_values(kept["env"], "--env"), **key_values(args.env, "--env")}
    hidden = [f"--hp {k}" for k, v in hp.items() if secrets.REDACTED in v]
    hidden += [f"--env {k}" for k, v in env.items() if secrets.REDACTED in v]
    if hidden:
        raise UsageError(f"--resume {shown(args.resume)}: the values of {shown(', '.join(hidden))} were not kept "
                         f"(they look secret): give them again, e.g. {shown(hidden[0])}=...")
    previous.hp = [f"{k}={v}" for k, v in hp.items()]
    previous.env = [f"{k}={v}" for k, v in env.items()]
    return previous


def _defaults() -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return vars(parser.parse_args([]))


DEFAULTS = _defaults()
