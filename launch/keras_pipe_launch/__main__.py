"""`python -m keras_pipe_launch COMMAND ...`: the `keras-pipe` command (keras_pipe_launch.cli)."""

from keras_pipe_launch.cli import run

if __name__ == "__main__":
    run()
