"""`make demo` (`python -m keras_pipe_launch.demo`): see __main__.py."""
