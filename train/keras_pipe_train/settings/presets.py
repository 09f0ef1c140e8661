"""Presets that choose (hyperparameter preset): fast, balanced or best picks the backbone, the image
size, the schedule's length and the recipe from the training set's size, the classes and the
instance, so that a user need not know which of 158 backbones, how many epochs or which
augmentations. Each hyperparameter the request gives keeps its value; the preset fills the others.
docs/job.md (Presets) writes the rule out with its sources; the job logs what it chose and why, and
the report page shows it. No TensorFlow here.

The rule follows BiT-HyperRule (Kolesnikov et al., "Big Transfer", ECCV 2020, section 3.3): the
training set's size sorts it into small (< 20,000 examples), medium (< 500,000) or large, and the
tier sets the schedule's length, counted in examples seen (BiT's 500, 10,000 or 20,000 steps of 512),
and whether MixUp is used (not on small sets). BiT's own resolution rule (by the images' sizes) is
not applied: the backbone's own size is used. Where BiT fine-tunes everything with SGD, the presets
first train the head on the frozen backbone, then fine-tune (LP-FT: Kumar et al., ICLR 2022, which
finds it better in and out of distribution), with the recipe's newer elements as the literature
sets them (EMA, layer-wise decay, TrivialAugment, MixUp); docs/speed.md says what they gave on this
project's own small task, whose backbone was not pretrained on ImageNet.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from keras_pipe_train.settings import parsers
from keras_pipe_train.settings.backbones import BACKBONES, HUB_PRESETS, is_hub

PRESETS = ("none", "fast", "balanced", "best")

# BiT-HyperRule's tiers and schedules: (fewer examples than, examples seen in fine-tuning = steps x 512)
TIERS = (("small", 20_000, 500 * 512), ("medium", 500_000, 10_000 * 512), ("large", None, 20_000 * 512))


@dataclasses.dataclass(frozen=True)
class Situation:
    """What a preset chooses from."""
    examples: int  # the training set's examples, all hosts together
    classes: int
    multi_label: bool
    gpus: int  # on each host
    hosts: int = 1
    instance: str | None = None  # resourceconfig.json's instance type (None: a run outside SageMaker)

    @property
    def tier(self) -> tuple[str, int]:
        """(BiT's name for the training set's size, the examples its fine-tuning sees)."""
        return next((name, seen) for name, below, seen in TIERS if below is None or self.examples < below)


@dataclasses.dataclass(frozen=True)
class Preset:
    """One preset's choices, apart from those made by the training set's size."""
    name: str
    backbones: tuple[str, str]  # (on a GPU, on CPUs only)
    schedule_share: float  # the share of BiT's examples seen that fine-tuning trains on
    max_fine_tune_epochs: int
    fine_tune_layers: int  # (a number above any backbone's layers: all of them)
    augment: str
    ema: bool
    layer_decay: tuple[float, float]  # (a transformer's, a convolutional network's)
    test_time_flip: bool
    mixup: tuple[float, float]  # (mixup_alpha, cutmix_alpha) on medium and large sets (BiT: none on small)


# Backbones, by ImageNet top-1 for their cost: MobileNetV3-Large 75.6 % (Keras' MobileNetV3 docs), EfficientNetV2-B0
# 78.7 % at 0.72 GFLOPs an image (google/automl's efficientnetv2 README), ConvNeXt-T 82.1 % at 4.5 GFLOPs (Liu et
# al., CVPR 2022), DINOv2 ViT-B/14 84.5 % by a linear probe of its frozen features alone (facebookresearch/dinov2's
# README; self-supervised on LVD-142M, so not a like-for-like comparison). The GPU's choice costs too much a
# step on CPUs.
PRESET_TABLE = {p.name: p for p in (
    Preset("fast", ("mobilenet_v3_large", "mobilenet_v3_large"), 0.25, 10, 20, "true", False, (1.0, 1.0), False,
           (0.0, 0.0)),
    # AutoGluon's image predictor: layer-wise decay 0.9 and TrivialAugment among its default transforms; here
    # after a random crop and a flip, as timm's and torchvision's training transforms put it
    Preset("balanced", ("convnext_tiny", "efficientnet_v2_b0"), 0.5, 30, 10_000, "crop,flip,trivial", True,
           (0.65, 0.9), False, (0.1, 0.0)),
    # BiT's whole schedule; DeiT's recipe (Touvron et al., on timm) mixes with MixUp 0.8 and CutMix 1.0; BEiT and
    # MAE fine-tune a ViT-B at a layer decay of 0.65 (0.75 for a ViT-L)
    Preset("best", ("dinov2_base", "convnext_tiny"), 1.0, 60, 10_000, "crop,flip,trivial", True, (0.65, 0.9), True,
           (0.8, 1.0)),
)}
TRANSFORMER_FAMILIES = ("ViT", "DeiT", "DINOv2", "DINOv3", "SigLIP", "Swin")
# (a handle or a preset folder names no family: its name's words then, as keras-hub's own names spell them)
TRANSFORMER_WORDS = re.compile(r"(dinov\d|vit|deit|siglip|swin)", re.I)
HUB_SIZE = re.compile(r"_(224|256|384|448|512|518)(?:_|$)")  # a keras-hub preset's image size, where it names one


def is_transformer(backbone: str) -> bool:
    family = HUB_PRESETS.get(backbone)
    return family in TRANSFORMER_FAMILIES if family else is_hub(backbone) and bool(TRANSFORMER_WORDS.search(backbone))


def image_size(backbone: str) -> int:
    """The size `backbone` was pretrained at: a Keras application's own, the one a keras-hub preset's name
    says, else 224."""
    if backbone in BACKBONES:
        return BACKBONES[backbone].default_size
    named = HUB_SIZE.search(backbone) if is_hub(backbone) else None
    return int(named.group(1)) if named else 224


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a preset chose: each hyperparameter's value as SageMaker would send it, and why."""
    values: dict[str, str]
    reasons: tuple[str, ...]


def choose(name: str, situation: Situation, given: Mapping[str, Any]) -> Choice:
    """The values preset `name` gives in `situation`. `given`: the hyperparameters the request gave,
    by name, as parsed: the backbone, batch, epochs, resize and augmentations given are the ones the
    other choices are made for (a transformer's layer decay, the steps warmup and EMA count, an
    image size within resize, test-time flips only where training flips)."""
    preset, s = PRESET_TABLE[name], situation
    tier, seen = s.tier
    on_gpu, on_cpu = preset.backbones
    backbone = given.get("backbone") or (on_gpu if s.gpus else on_cpu)
    transformer = is_transformer(backbone)
    batch = given.get("batch_size") or _batch(s, transformer)
    head = given.get("epochs", 2 if tier == "small" else 1)  # (epochs of the head alone: LP-FT's linear probe)
    epochs_seen = math.ceil(seen * preset.schedule_share / s.examples)
    fine_tune = given.get("fine_tune_epochs", min(preset.max_fine_tune_epochs, max(2, epochs_seen)))
    steps_per_epoch = math.ceil(s.examples / batch)
    steps = max(1, fine_tune * steps_per_epoch)
    # warmup (each phase's): a twentieth of fine-tuning's steps, 500 at most, and at most a quarter of the
    # head's phase where there is one
    warmup = min(500, steps // 20, *([head * steps_per_epoch // 4] if head else []))
    flips = "flip" in given.get("augment", parsers.augment("augment", preset.augment))
    resize = given.get("resize")
    size = image_size(backbone)
    values = {"backbone": backbone, "image_size": str(min(size, resize) if isinstance(resize, int) else size),
              "batch_size": str(batch), "epochs": str(head), "fine_tune_epochs": str(fine_tune),
              "fine_tune_layers": str(preset.fine_tune_layers), "optimizer": "adamw", "learning_rate": "0.001",
              "fine_tune_learning_rate": "5e-05" if transformer else "0.0001",
              "lr_schedule": "cosine", "warmup_steps": str(warmup), "augment": preset.augment,
              "layer_decay": str(preset.layer_decay[0 if transformer else 1]),
              "test_time_flip": str(preset.test_time_flip and flips
                                    and "horizontal" in given.get("augmentation_random_flip", "horizontal")).lower()}
    if not s.multi_label:
        values["label_smoothing"] = "0.1"
    if preset.ema:  # an average over about the last tenth of fine-tuning's steps, timm's 0.9998 at most
        values["ema_decay"] = str(round(min(0.9998, max(0.99, 1 - 10 / steps)), 5))
    if tier != "small" and any(preset.mixup):
        values["mixup_alpha"], values["cutmix_alpha"] = (str(a) for a in preset.mixup)
    cpu_note = f" (on CPUs: the GPU choice, {on_gpu}, costs too much a step)" if not s.gpus and on_gpu != on_cpu else ""
    reasons = (f"{s.examples:,} training examples: {tier} by BiT-HyperRule (small below 20,000, large from 500,000), "
               f"whose fine-tuning sees {seen:,} examples; {name} trains on {preset.schedule_share:.0%} of them, "
               f"{preset.max_fine_tune_epochs} epochs at most ({s.examples / s.classes:,.0f} examples a class)",
               f"{s.gpus} GPU{'s' if s.gpus != 1 else ''} on each of {s.hosts} host{'s' if s.hosts > 1 else ''}"
               f"{f' ({s.instance})' if s.instance else ''}: backbone {on_gpu if s.gpus else on_cpu}{cpu_note}")
    return Choice(values, reasons)


def _batch(s: Situation, transformer: bool) -> int:
    """The global batch: 64 a GPU (32 for a transformer), 32 a CPU host; on a small set at most a sixteenth
    of it, so that an epoch still takes 16 steps, and always a multiple of the replicas."""
    replicas = max(1, s.gpus) * s.hosts
    per_replica = (32 if transformer else 64) if s.gpus else 32
    batch = min(per_replica * replicas, max(8, s.examples // 16))
    return max(replicas, batch // replicas * replicas)
