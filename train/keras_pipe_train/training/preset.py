"""A preset's choices made in the job (settings/presets.py says the rule): the training set counted
in a pass of the train channel, the counts of every host gathered, the GPUs found, then the config
completed with what the preset chooses for the hyperparameters the request did not give, each said
in the log. Every host makes the same choice: from the same gathered count."""

from __future__ import annotations

import logging
import threading
import time

import tensorflow as tf

from keras_pipe_train.settings import presets
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.contract import ChannelConfig, Paths, ResourceConfig
from keras_pipe_train.settings.errors import DataError
from keras_pipe_train.sources import datasets
from keras_pipe_train.training.distribute import Cluster
from keras_pipe_train.training.loop import Stopped

log = logging.getLogger(__name__)


def chosen(config: JobConfig, layout: Paths, channels: dict[str, ChannelConfig], cluster: Cluster,
           resources: ResourceConfig, stop: threading.Event | None = None) -> JobConfig:
    """`config` with its preset's choices (as it is with preset=none)."""
    if config.preset == "none":
        return config
    train_source, _ = datasets.sources(config, layout, channels)
    started = time.monotonic()
    own = datasets.count(train_source, layout, config, stop)
    if stop is not None and stop.is_set():
        raise Stopped(f"stopped by request while preset {config.preset} counted the training examples: nothing "
                      "trained yet, nothing to checkpoint")
    counts = [int(text) for text in cluster.all_texts(str(own))]  # (every host's, in host order)
    # (ShardedByS3Key: each host streams its share of the objects; else each has them all)
    sharded = train_source.channel.distribution == "ShardedByS3Key"
    examples = sum(counts) if sharded else max(counts)
    log.info("preset %s: %s training examples%s, counted in %.1f s (a pass of channel %r, read but not decoded)",
             config.preset, f"{examples:,}", f" ({' + '.join(f'{n:,}' for n in counts)} on the hosts' shares)"
             if sharded and len(counts) > 1 else "", time.monotonic() - started, train_source.channel.name)
    if not examples:
        raise DataError(f"preset {config.preset}: channel {train_source.channel.name!r} gave no training example to "
                        "count: is it empty, or are its records of another format (record_format)?")
    situation = presets.Situation(examples, config.num_classes, config.multi_label,
                                  len(tf.config.list_physical_devices("GPU")), len(resources.hosts),
                                  resources.instance_type)
    config = config.with_preset(situation)
    for note in config.preset_notes:
        log.info("%s", note)
    log.info("the job's settings, with preset %s's choices: %s", config.preset, config.settings())
    return config
