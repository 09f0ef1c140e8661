"""The training job: data, model, the two training phases, metrics and export."""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import keras
import tensorflow as tf

from train import input as inputs
from train import metrics
from train.config import JobConfig
from train.contract import ChannelConfig, Paths, ResourceConfig
from train.errors import UserError
from train.export import export
from train.model import build_backbone, build_classifier, freeze, prepare_from_scratch, unfreeze_top

log = logging.getLogger(__name__)

CHANNELS = {"train": "required", "validation": "optional", "pretrained": "optional: backbone weights"}

# Keras warns at the end of every epoch over a dataset of unknown length (every Pipe and
# generator dataset), as if data were missing, and about ignoring `shuffle`, which we never set.
warnings.filterwarnings("ignore", message="Your input ran out of data")
warnings.filterwarnings("ignore", message="`shuffle=True` was passed")


def run(config: JobConfig, layout: Paths, channels: dict[str, ChannelConfig], resources: ResourceConfig) -> dict:
    """Trains and exports; returns the final metrics."""
    check_channels(channels)
    keras.utils.set_random_seed(config.seed)
    use_mixed_precision(config.mixed_precision)

    weights = resolve_weights(config, channels, layout)
    backbone = build_backbone(config.backbone, config.image_size, weights)
    from_scratch = weights is None
    model = build_classifier(config.backbone, backbone, config.num_classes, config.dropout,
                             pretrained=not from_scratch)
    train = inputs.training_dataset(channels["train"], layout, config)
    validation = (inputs.evaluation_dataset(channels["validation"], layout, config)
                  if "validation" in channels else None)
    logger = MetricsLogger()
    callbacks = [logger, keras.callbacks.TensorBoard(log_dir=str(layout.output / "tensorboard"))]

    if config.epochs:
        logger.phase = "scratch" if from_scratch else "head"
        if from_scratch:
            prepare_from_scratch(backbone)
            log.info("phase 1: no pretrained weights (weights=none): training the whole network "
                     "from scratch for %d epochs", config.epochs)
        else:
            freeze(backbone)
            log.info("phase 1: training the new head for %d epochs, backbone frozen", config.epochs)
        compile_model(model, config.learning_rate)
        model.fit(train, validation_data=validation, epochs=config.epochs, callbacks=callbacks, verbose=2)
    if config.fine_tune_epochs:
        logger.phase = "fine_tune"
        if from_scratch:
            prepare_from_scratch(backbone)  # everything keeps training, at the lower rate
            log.info("phase 2: training the whole network on, for %d epochs", config.fine_tune_epochs)
        else:
            layers = unfreeze_top(backbone, config.fine_tune_layers)
            log.info("phase 2: fine-tuning %d backbone layers (%s ... %s) for %d epochs",
                     len(layers), layers[0] if layers else "-", layers[-1] if layers else "-",
                     config.fine_tune_epochs)
        compile_model(model, config.fine_tune_learning_rate)  # trainable changes need a recompile
        model.fit(train, validation_data=validation, initial_epoch=config.epochs,
                  epochs=config.epochs + config.fine_tune_epochs, callbacks=callbacks, verbose=2)

    final = logger.rows[-1] if logger.rows else {}
    if resources.is_chief:
        serving_dir = export(model, config.class_names, config.image_size, layout.model)
        metrics.write_json(layout.output_data / "metrics.json", logger.rows, final)
        log.info("exported the model to %s (serving) and %s", serving_dir, layout.model / "model.keras")
    return final


def check_channels(channels: dict[str, ChannelConfig]) -> None:
    unknown = sorted(set(channels) - set(CHANNELS))
    if "train" not in channels or unknown:
        got = ", ".join(sorted(channels)) or "none"
        hint = (" (the SageMaker SDK names a single input 'training': name it 'train')"
                if "training" in channels else "")
        raise UserError(
            f"the job reads channels {', '.join(f'{k} ({v})' for k, v in CHANNELS.items())}; "
            f"it got: {got}{hint}"
        )
    if "pretrained" in channels and channels["pretrained"].input_mode == "Pipe":
        raise UserError("channel 'pretrained' holds a weights file: use File or FastFile mode, not Pipe")


def resolve_weights(config: JobConfig, channels: dict[str, ChannelConfig], layout: Paths) -> str | None:
    """The backbone weights to load: "imagenet", None (random) or a file path."""
    if config.weights == "none":
        return None
    if config.weights != "pretrained":
        return config.weights
    if "pretrained" not in channels:
        raise UserError("hyperparameter weights=pretrained needs a 'pretrained' channel holding the weights file")
    folder = layout.input_data / "pretrained"
    found = sorted(str(p) for p in Path(folder).rglob("*.h5")) if folder.is_dir() else []
    if len(found) != 1:
        raise UserError(
            f"channel 'pretrained' must hold exactly one .h5 weights file; {folder} holds "
            f"{len(found)}{': ' + ', '.join(found) if found else ''}"
        )
    return found[0]


def use_mixed_precision(setting: str) -> None:
    gpus = tf.config.list_physical_devices("GPU")
    on = setting == "true" or (setting == "auto" and bool(gpus))
    keras.mixed_precision.set_dtype_policy("mixed_float16" if on else "float32")
    log.info("mixed precision %s (%d GPU%s)", "on" if on else "off", len(gpus), "" if len(gpus) == 1 else "s")


def compile_model(model: keras.Model, learning_rate: float) -> None:
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )


class MetricsLogger(keras.callbacks.Callback):
    """Prints each epoch's metric line (for SageMaker's MetricDefinitions) and keeps the rows."""

    def __init__(self):
        super().__init__()
        self.rows: list[dict] = []
        self.phase = "head"
        self._started = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        values = metrics.row(epoch + 1, self.phase, logs or {})
        values["seconds"] = round(time.perf_counter() - self._started, 3)
        self.rows.append(values)
        print(metrics.format_line(values), flush=True)
