"""What the model starts from: a previous job's model to continue, JumpStart's pretrained model as
the backbone, or the backbone's weights (ImageNet's, a file, the `pretrained` channel's, none)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from keras_pipe_train.model import classifier, hub, incremental, jumpstart
from keras_pipe_train.settings.backbones import is_hub
from keras_pipe_train.settings.channels import MODEL, PRETRAINED
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.contract import ChannelConfig, Paths
from keras_pipe_train.settings.errors import UserError

log = logging.getLogger(__name__)


def starting_point(config: JobConfig, layout: Paths, channels: dict[str, ChannelConfig]):
    """(the job's settings, a previous model to continue, a pretrained SavedModel as its backbone,
    the backbone's weights). With a pretrained SavedModel (JumpStart's, model/jumpstart.py), the
    settings' backbone is that, at the image size it takes."""
    previous = incremental.load(layout.input_data / MODEL) if MODEL in channels else None
    pretrained = previous if isinstance(previous, jumpstart.Pretrained) else None
    if pretrained:
        previous = None
        if config.reinitialize_top_layer == "false":  # (JumpStart refuses it too: there is no top layer to keep)
            raise UserError(f"hyperparameter reinitialize_top_layer=false keeps the classifier of the model in channel "
                            f"'{MODEL}', and {pretrained.source} is a pretrained feature extractor without one: set "
                            "reinitialize_top_layer=auto (or true)")
        config = dataclasses.replace(config, backbone=jumpstart.NAME,
                                     image_size=pretrained.image_size_for(config.image_size))
        if isinstance(config.resize, int) and config.resize < config.image_size:
            raise UserError(f"hyperparameter resize ({config.resize}) must be at least the image size of the model in "
                            f"channel '{MODEL}' ({config.image_size}, its {jumpstart.MODEL_INFO}'s)")
    weights = resolve_weights(config, channels, layout)
    if previous or pretrained:
        log.info("the backbone's weights come from channel '%s' (hyperparameter weights=%s is not used)", MODEL,
                 config.weights)
        weights = None
    return config, previous, pretrained, weights


def build_backbone(config: JobConfig, previous: incremental.Previous | None, pretrained: jumpstart.Pretrained | None,
                   weights: str | None, batchnorm_trains: bool, layout: Paths, channels: dict[str, ChannelConfig]):
    """(the backbone the job fine-tunes, its input scaling in place of its name's: None, or
    classifier.input_scaling's mode): JumpStart's SavedModel, a keras-hub preset (or the previous
    model's, continued), or a Keras application."""
    if pretrained:
        return jumpstart.build_backbone(pretrained, config.image_size, batchnorm_trains), pretrained.scaling
    if is_hub(config.backbone) and previous is not None and previous.backbone_name == hub.NAME:
        return hub.rebuilt(previous.model, config.image_size)
    if is_hub(config.backbone):
        channel = layout.input_data / PRETRAINED if PRETRAINED in channels else None
        return hub.build_backbone(config.backbone, config.image_size, weights, channel)
    return classifier.build_backbone(config.backbone, config.image_size, weights), None


def resolve_weights(config: JobConfig, channels: dict[str, ChannelConfig], layout: Paths) -> str | None:
    """The backbone weights to load: "imagenet", None (random) or a file path."""
    if MODEL in channels and config.weights not in ("imagenet", "none"):
        raise UserError(f"hyperparameter weights={config.weights} and channel '{MODEL}' both give the backbone's "
                        "weights: leave weights unset to continue the model in the channel")
    if config.weights == "none":
        return None
    if config.weights != PRETRAINED:
        return config.weights
    if PRETRAINED not in channels:
        raise UserError(f"hyperparameter weights=pretrained needs a '{PRETRAINED}' channel holding the weights file"
                        f"{' or the keras-hub preset' if is_hub(config.backbone) else ''}")
    folder = layout.input_data / PRETRAINED
    if is_hub(config.backbone) and hub.channel_preset(folder):
        return PRETRAINED  # (the preset's own weights: model/hub.py)
    found = sorted(str(p) for p in Path(folder).rglob("*.h5")) if folder.is_dir() else []
    if len(found) != 1:
        raise UserError(
            f"channel '{PRETRAINED}' must hold exactly one .h5 weights file; {folder} holds "
            f"{len(found)}{': ' + ', '.join(found) if found else ''}"
        )
    return found[0]
