"""The tests of keras_pipe_train.settings (train/keras_pipe_train/settings/)."""
