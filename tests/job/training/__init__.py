"""The tests of keras_pipe_train.training (train/keras_pipe_train/training/)."""
