"""The tests of keras_pipe_train.sources (train/keras_pipe_train/sources/)."""
