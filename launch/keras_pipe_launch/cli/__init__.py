"""The `keras-pipe` command (also `python -m keras_pipe_launch`): local, submit, tune, prepare, predict,
export, deploy, transform, report, register.

One module per command: its options (add_parser) and run(args), which turns what the user gave into
calls of the launcher's programs below (local, prepare, sagemaker) and returns the exit code."""

import argparse
import os
import sys

from keras_pipe_launch.cli import deploy, export, local, predict, prepare, register, report, submit, transform, tune
from keras_pipe_launch.common.quiet_start import quiet_tensorflow_start
from keras_pipe_train.settings.paused_collector import pause_collector_while_tensorflow_imports
from keras_pipe_train.settings.unneeded_imports import skip_while_keras_imports


def main(argv=None) -> int:
    quiet_tensorflow_start()  # (a command prints its own lines, not TensorFlow's start-up notices)
    # (a command that loads a model starts sooner; the SageMaker SDK's own pandas imports later, as usual)
    skip_while_keras_imports()
    pause_collector_while_tensorflow_imports()
    parser = argparse.ArgumentParser(prog="keras-pipe",
                                     description="Run, submit and prepare Keras training jobs for SageMaker; "
                                                 "predict with their models.")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    local.add_parser(commands)
    submit.add_parser(commands)
    tune.add_parser(commands)
    prepare.add_parser(commands)
    predict.add_parser(commands)
    export.add_parser(commands)
    deploy.add_parser(commands)
    transform.add_parser(commands)
    report.add_parser(commands)
    register.add_parser(commands)
    # (a command's paths may come after its options: `predict MODEL --top-k 3 photos/`; argparse fills
    # an optional positional list before it sees them, so those left over are that list's)
    args, extra = parser.parse_known_args(argv)
    if extra:
        more = getattr(args, "more_paths", None)
        if more is None or any(arg.startswith("-") for arg in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        setattr(args, more, [*getattr(args, more), *extra])
    return args.run(args)


def leave(code: int) -> None:
    """Exits with `code` even when standard output is gone (a closed terminal or pipe): Python
    would otherwise fail flushing it at exit and replace the code with 120."""
    try:
        sys.stdout.flush()
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(code)


def run() -> None:
    """The `keras-pipe` command (the console script of launch/pyproject.toml)."""
    leave(main())
