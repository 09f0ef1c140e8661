"""What the steps after training read, and their shares of the chief's time."""

from __future__ import annotations

import dataclasses

import keras

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.contract import Paths
from keras_pipe_train.sources import datasets, manifest
from keras_pipe_train.training import distribute
from keras_pipe_train.training.loop import Trainer

# Shares of collective_timeout, on several hosts, of the chief's work after training (the other
# hosts wait for it at most that long): one pass (calibration's) takes PASS_SHARE; after the
# evaluation, one clock: the exports (their conversions and their pass) EXPORT_SHARE, the
# gallery's pass PASS_SHARE less what they spent, the label check LABEL_CHECK_SHARE less all of it
# and the time kept for the mistakes' heatmaps, the heatmaps what is left of LABEL_CHECK_SHARE.
PASS_SHARE = 0.5
EXPORT_SHARE = 0.2
LABEL_CHECK_SHARE = 0.8


@dataclasses.dataclass(frozen=True)
class Trained:
    """The model as trained, with its settings (the class names settled on every host), where its
    examples came from, and each epoch's metrics."""

    config: JobConfig
    layout: Paths
    model: keras.Model
    backbone: keras.Model
    trainer: Trainer  # (its task, its stop flag, its evaluation in detail)
    cluster: distribute.Cluster
    train_source: datasets.Source
    validation: datasets.Source | None
    seen: manifest.ClassNames  # the class names a manifest's lines gave
    rows: list[dict]  # each epoch's metrics, as metrics.json has them
    # the backbone's weights as the job started, for the label check (None: use the trained ones)
    start_weights: list | None

    @property
    def stop(self):
        return self.trainer.stop

    def examples(self, source: datasets.Source, **options):
        """The evaluation input (a function of an InputContext) of `source`'s examples."""
        return datasets.evaluation_input(source.channel, self.layout, self.config, self.trainer.stop, self.seen,
                                         side=source.side, **options)

    def budget(self, share: float, spent: float = 0.0) -> float | None:
        """Seconds the chief's work after training may still take: on several hosts `share` of
        collective_timeout (which the others wait for it at most) less the `spent` seconds already
        counted against it. None, no bound, alone or with collective_timeout 0 (TensorFlow's "no
        timeout")."""
        if not (self.cluster.multi_worker and self.config.collective_timeout):
            return None
        return max(0.0, share * self.config.collective_timeout - spent)
