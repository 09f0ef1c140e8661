"""python -m launch <command>: local, submit, prepare."""

import argparse
import sys

from launch import local, prepare, submit


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch",
                                     description="Run, submit and prepare Keras training jobs for SageMaker.")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    local.add_parser(commands)
    submit.add_parser(commands)
    prepare.add_parser(commands)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
