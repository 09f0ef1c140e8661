"""Each epoch's metrics as they come: the metric lines SageMaker's MetricDefinitions catch (this job's,
and the forms the built-in algorithms' users parse), TensorBoard's scalars, MLflow's, and the rows of
metrics.json."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from keras_pipe_train.report import tracking
from keras_pipe_train.settings.contract import Paths
from keras_pipe_train.training import metrics


class EpochLog:
    """The chief writes; every worker has the same numbers. `total`: the job's epochs; `top_k`:
    config's."""

    def __init__(self, layout: Paths | None, is_chief: bool, history: tuple = (), total: int = 0,
                 top_k: int | None = None, tracker: tracking.Tracker | tracking.NoTracker | None = None):
        self.rows: list[dict] = list(history)
        self.tracker = tracker or tracking.NoTracker()
        self.is_chief = is_chief
        self.total, self.top_k = total, top_k
        self.writer = tf.summary.create_file_writer(str(layout.output / "tensorboard")) if is_chief else None

    def resumed(self, history: tuple) -> None:
        """The rows of the epochs a checkpoint says were done (none: a fresh start)."""
        self.rows = list(history)

    def add(self, epoch: int, phase: str, results: dict, seconds: float) -> None:
        values = metrics.row(epoch + 1, phase, results)
        values["seconds"] = round(seconds, 3)
        self.rows.append(values)
        self.print_lines(values)
        self.tracker.epoch(epoch + 1, values)
        if self.writer:
            with self.writer.as_default(step=epoch + 1):
                for name, value in results.items():
                    tf.summary.scalar(name, value)
            self.writer.flush()

    def print_lines(self, values: dict) -> None:
        print("\n".join(metrics.lines(values, self.total, self.top_k)), flush=True)

    def write(self, path: Path, final: dict) -> None:
        metrics.write_json(path, self.rows, final)
