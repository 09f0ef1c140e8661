"""The tests of keras_pipe_train.report (train/keras_pipe_train/report/)."""
