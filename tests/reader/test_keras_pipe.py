"""Keras on Pipe channels: fit + validation + evaluate must neither hang nor lose passes, and
nothing of the reader may end up in the exported model (AWS's PipeModeDataset bugs #46, #135, #55)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from pipemode import PipeModeDataset

keras = tf.keras
FEATURES = {"x": tf.io.FixedLenFeature([4], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}


def examples(count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        x = rng.normal(size=4).astype(np.float32)
        y = int(x[0] + x[1] > 0)
        out.append(tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y])),
        })).SerializeToString())
    return out


def pipe_input(channel: str, batch_size: int) -> tf.data.Dataset:
    def parse(batch):
        parsed = tf.io.parse_example(batch, FEATURES)
        return parsed["x"], parsed["y"]

    ds = PipeModeDataset(channel, "TFRecord", batch_size=batch_size, wait_timeout=60)
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


class SamplesSeen(keras.metrics.Metric):
    """Counts the examples of an epoch (reset by Keras at every epoch and evaluation)."""

    def __init__(self, name="samples", **kwargs):
        super().__init__(name=name, **kwargs)
        self.count = self.add_weight(name="count", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.count.assign_add(tf.cast(tf.shape(y_true)[0], tf.float32))

    def result(self):
        # a copy: Keras keeps the returned value in the epoch logs and reads it only after
        # validation has reset and reused this metric
        return tf.identity(self.count)


def small_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy", SamplesSeen()])
    return model


@pytest.fixture
def two_channels(job):
    train, val = examples(300, 1), examples(70, 2)
    job.stream("train", train)
    job.stream("validation", val)
    return len(train), len(val)


@pytest.mark.slow
def test_fit_with_validation_then_evaluate_sees_every_pass_whole(job, two_channels):
    n_train, n_val = two_channels
    model = small_model()
    history = model.fit(pipe_input("train", 32), validation_data=pipe_input("validation", 32),
                        epochs=4, verbose=0)
    assert history.history["samples"] == [n_train] * 4
    assert history.history["val_samples"] == [n_val] * 4
    results = model.evaluate(pipe_input("validation", 32), verbose=0, return_dict=True)
    assert results["samples"] == n_val
    # and once more: a dataset made after fit picks up the following passes
    assert model.evaluate(pipe_input("validation", 50), verbose=0, return_dict=True)["samples"] == n_val
    # No pass was wasted: Keras creates an iterator at the end of each epoch that it never uses,
    # but a pass is claimed only when data is first pulled. (The feeder makes <channel>_N only
    # once pass N-1 is over, so _5 exists only if passes 0-4 were all opened.)
    assert not (job.data_dir / "train_5").exists()
    assert not (job.data_dir / "validation_7").exists()


@pytest.mark.slow
def test_exported_model_holds_nothing_of_the_reader(two_channels, tmp_path):
    model = small_model()
    model.fit(pipe_input("train", 64), epochs=1, verbose=0)
    export_dir = tmp_path / "export"
    model.export(str(export_dir), verbose=False)
    graph_ops = set()
    loaded = tf.saved_model.load(str(export_dir))
    for function in loaded.signatures.values():
        graph_ops |= {op.type for op in function.graph.get_operations()}
        for f in function.graph.as_graph_def().library.function:
            graph_ops |= {node.op for node in f.node_def}
    assert not graph_ops & {"PyFunc", "EagerPyFunc", "PyFuncStateless", "GeneratorDataset"}
    # and it loads and serves in a fresh process that cannot import this project
    script = (
        "import sys, numpy as np, tensorflow as tf\n"
        "assert not {'keras_pipe_train', 'pipemode'} & set(sys.modules)\n"
        "m = tf.saved_model.load(sys.argv[1])\n"
        "print(m.serve(np.zeros((2, 4), np.float32)).shape)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", script, str(export_dir)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("(2, 2)")
