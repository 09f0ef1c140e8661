"""The job's tests (keras_pipe_train): its fake /opt/ml's hyperparameters and File channels, the
job run as SageMaker runs it, and the audit that shows which records each step trained on."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

from tests.conftest import REPO, FakeJob, run_logged

# the job's exit codes (keras_pipe_train.settings.failure.EXIT_CODES): a bad configuration, bad data, a bug
CONFIG, DATA, INTERNAL = 2, 3, 1


def failed(job: FakeJob, out, code: int, first_line: str) -> str:
    """The job ended with exit `code` and a failure file whose reason (its first line, the part
    SageMaker shows) starts with `first_line`, the traceback after it; its text."""
    assert out.returncode == code, out.stdout[-2000:] + out.stderr[-2000:]
    text = (job.base / "output" / "failure").read_text()
    assert text.splitlines()[0].startswith(first_line), text[:1000]
    assert "Traceback" in text  # after the reason
    assert len(text.splitlines()[0]) < 1024  # what SageMaker shows as FailureReason
    return text


def write_hyperparameters(job: FakeJob, **values) -> None:
    """As SageMaker writes them: every value a string."""
    job.write_config(hyperparameters={k: v if isinstance(v, str) else json.dumps(v) for k, v in values.items()})


def start_train(job: FakeJob, **env: str) -> subprocess.Popen:
    """container/train on `job`'s fake /opt/ml, in a subprocess whose output (stdout and stderr)
    reads line by line as it comes; `env`: more environment variables."""
    return subprocess.Popen([sys.executable, str(REPO / "container" / "train")], cwd=job.base,
                            env={**os.environ, "SAGEMAKER_BASE_DIR": str(job.base), "PYTHONUNBUFFERED": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def file_channel(fake_job: FakeJob, name: str, records: list[bytes], shards: int = 2) -> None:
    from pipemode import tfrecord

    fake_job.add_channel(name, mode="File")
    (fake_job.data_dir / name).mkdir()
    for i in range(shards):
        (fake_job.data_dir / name / f"part-{i:05d}.tfrecord").write_bytes(tfrecord.encode(records[i::shards]))


def run_train(fake_job: FakeJob, timeout: int = 270, **env: str) -> subprocess.CompletedProcess:
    """Runs `train` on the fake job (`env`: more environment variables). The time limit stays under
    pytest's (300 s, less a margin: tests/timeouts.py) so that a job that hangs fails with its own
    output shown rather than a bare pytest timeout."""
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(fake_job.base), **env}
    return run_logged([sys.executable, str(REPO / "container" / "train")], timeout, env=env, cwd=fake_job.base)


def audited(audit_file):
    """{run pid: {epoch: {"batches": {index: digests}, "trained": steps, "validated": digests}}}
    ("validated": the records of the epoch's validation batches)"""
    runs = collections.defaultdict(lambda: collections.defaultdict(
        lambda: {"batches": {}, "trained": 0, "validated": []}))
    for entry in map(json.loads, audit_file.read_text().splitlines()):
        epoch = runs[entry["pid"]][entry["epoch"]]
        if "trained_steps" in entry:
            epoch["trained"] = max(epoch["trained"], entry["trained_steps"])
        elif entry.get("validation"):
            epoch["validated"] += entry["records"]
        else:
            epoch["batches"][entry["batch"]] = entry["records"]
    return runs


def trained_records(epoch) -> list[str]:
    """The records of the batches this run trained on (prefetched batches beyond are not)."""
    return [d for index, digests in epoch["batches"].items() if index < epoch["trained"] for d in digests]


def served_probabilities(model_dir, validation_file, size: int = 32, flip: bool = False) -> tuple:
    """(the exported SavedModel's probabilities, model.keras' own) on the validation JPEGs at `size` px;
    `flip`: model.keras' own averaged with the mirror images' (test_time_flip), computed here from
    its classifier's logits."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_pipe_train.sources import preprocess

    serve = tf.saved_model.load(str(model_dir / "1")).signatures["serving_default"]
    model = keras.saving.load_model(model_dir / "model.keras")
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    served, own = [], []
    for batch in tf.data.TFRecordDataset(str(validation_file)).batch(100):
        encoded = tf.io.parse_example(batch, features)["image/encoded"]
        served.append(serve(image_bytes=encoded)["probabilities"].numpy())
        images = preprocess.batch_of(lambda x: preprocess.for_eval(x, size, None, "bilinear"), encoded, size)
        own.append(flipped(model, images.numpy()) if flip else model(images, training=False).numpy())
    return np.concatenate(served), np.concatenate(own)


def flipped(model, images):
    """A classifier's probabilities for `images` (NHWC), from the mean of their logits and their
    mirror images' (test_time_flip), in numpy from the head's kernel and bias."""
    import keras
    import numpy as np

    head = model.get_layer("classifier")
    features = keras.Model(model.input, head.input)
    kernel, bias = (np.asarray(w, np.float64) for w in head.get_weights())
    logits = sum(np.asarray(features(x, training=False), np.float64) @ kernel + bias
                 for x in (images, images[:, :, ::-1])) / 2
    if head.activation is keras.activations.sigmoid:
        return 1 / (1 + np.exp(-logits))
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
