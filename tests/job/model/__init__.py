"""The tests of keras_pipe_train.model (train/keras_pipe_train/model/)."""
