"""Presets that choose (settings/presets.py): BiT-HyperRule's tiers by the training set's size, the
instance's GPUs, and every hyperparameter the request gave kept as given."""

import itertools
import math

import pytest

from keras_pipe_train.settings import presets
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.settings.presets import Situation


def chosen(preset, examples, gpus=0, classes=10, multi_label=False, hosts=1, **given):
    config = JobConfig.from_hyperparameters({"num_classes": classes, "preset": preset, "multi_label": multi_label,
                                             **given})
    return config.with_preset(Situation(examples, classes, multi_label, gpus, hosts, "ml.g5.xlarge"))


@pytest.mark.parametrize("examples, tier", [(1, "small"), (19_999, "small"), (20_000, "medium"),
                                            (499_999, "medium"), (500_000, "large"), (14_000_000, "large")])
def test_the_training_sets_size_sorts_it_into_bits_tiers(examples, tier):
    assert Situation(examples, 10, False, 0).tier[0] == tier


def test_the_schedule_is_bits_examples_seen_shared_by_the_preset_and_capped():
    # balanced: half of BiT's 5,120,000 examples seen on a medium set of 100,000: 26 epochs
    assert chosen("balanced", 100_000, gpus=1).fine_tune_epochs == math.ceil(5_120_000 * 0.5 / 100_000) == 26
    # best: all of BiT's 10,240,000 on ImageNet's 1,281,167 images: 8 epochs
    assert chosen("best", 1_281_167, gpus=8).fine_tune_epochs == 8
    # a small set would need hundreds of epochs: each preset's cap
    assert [chosen(p, 600).fine_tune_epochs for p in ("fast", "balanced", "best")] == [10, 30, 60]
    # a huge one still fine-tunes 2 epochs
    assert chosen("fast", 50_000_000, gpus=8).fine_tune_epochs == 2
    assert chosen("fast", 600).epochs == 2 and chosen("fast", 600_000).epochs == 1


def test_the_backbone_and_batch_follow_the_instance():
    assert (chosen("balanced", 5000, gpus=1).backbone, chosen("balanced", 5000).backbone) == (
        "convnext_tiny", "efficientnet_v2_b0")
    best = chosen("best", 5000, gpus=4, hosts=2)
    assert (best.backbone, best.image_size, best.batch_size, best.layer_decay) == ("dinov2_base", 224, 256, 0.65)
    assert chosen("best", 5000).backbone == "convnext_tiny"
    fast = chosen("fast", 5000, gpus=2)
    assert (fast.backbone, fast.batch_size, fast.fine_tune_layers, fast.ema_decay) == ("mobilenet_v3_large", 128,
                                                                                        20, 0.0)
    # each Keras application at the size its ImageNet weights were trained at
    # (a backbone given: its own size, the image size not given)
    assert chosen("best", 5000, backbone="efficientnet_v2_s").image_size == 384
    assert chosen("balanced", 5000).image_size == 224


def test_every_hyperparameter_given_keeps_its_value_and_the_notes_say_so():
    config = chosen("best", 5000, gpus=1, backbone="resnet50", batch_size=16, augment="crop", epochs=3,
                    label_smoothing=0)
    assert (config.backbone, config.batch_size, config.augment, config.epochs, config.label_smoothing) == (
        "resnet50", 16, ("crop",), 3, 0.0)
    # (test-time flips only where training flips: augment=crop given does not)
    assert config.optimizer == "adamw" and config.lr_schedule == "cosine" and not config.test_time_flip
    assert chosen("best", 5000).test_time_flip and not chosen("best", 5000, augmentation_random_flip="vertical").test_time_flip
    said, tier, instance, kept = config.preset_notes
    # BiT's 256,000 examples seen on a small set, over 5,000: 52 epochs
    assert said.startswith("preset best: image_size=224, fine_tune_epochs=52, ") and "backbone=" not in said
    assert tier.startswith("5,000 training examples: small by BiT-HyperRule") and "(500 examples a class)" in tier
    assert instance == "1 GPU on each of 1 host (ml.g5.xlarge): backbone dinov2_base"
    assert kept == "given, so kept: augment=crop, backbone=resnet50, batch_size=16, epochs=3, label_smoothing=0.0"
    # the steps the schedule counts are the given batch's and epochs': ema and warmup follow them
    steps = 52 * math.ceil(5000 / 16)
    assert config.ema_decay == round(1 - 10 / steps, 5) and config.warmup_steps == 3 * math.ceil(5000 / 16) // 4
    # a given backbone is the one the other choices are for: a ViT's layer decay and learning rate
    vit = chosen("best", 5000, backbone="dinov2_small")
    assert (vit.layer_decay, vit.fine_tune_learning_rate) == (0.65, 5e-5)


def test_mixing_waits_for_medium_sets_and_smoothing_for_single_labels():
    assert chosen("best", 19_999, gpus=1).mixup_alpha == 0.0
    medium = chosen("best", 20_000, gpus=1)
    assert (medium.mixup_alpha, medium.cutmix_alpha) == (0.8, 1.0)
    assert chosen("balanced", 20_000).mixup_alpha == 0.1
    assert chosen("best", 5000, multi_label=True).label_smoothing == 0.0
    assert chosen("best", 5000).label_smoothing == 0.1


def test_keras_hub_backbones_get_their_own_size_and_a_transformers_settings_by_family_or_name():
    vit = chosen("best", 5000, gpus=1, backbone="vit_base_patch16_384_imagenet")
    assert (vit.image_size, vit.layer_decay, vit.batch_size) == (384, 0.65, 32)
    handle = chosen("balanced", 5000, gpus=1, backbone="kaggle://keras/dinov2/keras/dinov2_small/1")
    assert (handle.image_size, handle.layer_decay, handle.fine_tune_learning_rate) == (224, 0.65, 5e-5)
    cnn = chosen("balanced", 5000, gpus=1, backbone="resnet_50_imagenet")
    assert (cnn.image_size, cnn.layer_decay, cnn.fine_tune_learning_rate) == (224, 0.9, 1e-4)
    # a resize given bounds the image size a backbone would take (image_size may not exceed it)
    assert chosen("best", 5000, backbone="efficientnet_v2_s", resize=256).image_size == 256


def test_the_batch_divides_between_replicas_and_leaves_a_small_set_steps_enough():
    assert chosen("fast", 600, gpus=8).batch_size == 32  # (not 512: a pass of 600 images would be 2 steps)
    assert chosen("fast", 1_000_000, hosts=3).batch_size == 96  # (32 a CPU host)
    for examples, gpus, hosts in itertools.product((40, 600, 5000, 10**6), (0, 1, 3, 8), (1, 2, 3)):
        config = chosen("balanced", examples, gpus=gpus, hosts=hosts)
        assert config.batch_size % (max(1, gpus) * hosts) == 0, (examples, gpus, hosts, config.batch_size)


def test_the_length_is_checked_once_the_preset_has_chosen_it():
    # epochs=0 and keep_epoch_models=8 would be refused against the defaults (5 + 0 epochs); the preset's are more
    no_head = chosen("best", 5000, epochs=0, keep_epoch_models=8)
    assert (no_head.epochs, no_head.fine_tune_epochs, no_head.keep_epoch_models) == (0, 52, 8)
    assert no_head.warmup_steps > 0  # (no head phase to bound it: fine-tuning's own twentieth)
    with pytest.raises(UserError, match=r"keep_epoch_models \(90\) must be at most the epochs trained \(54\)"):
        chosen("best", 5000, keep_epoch_models=90)


def test_a_resume_may_change_the_batch_and_epochs_though_the_preset_derives_its_warmup_and_average_from_them():
    first = chosen("balanced", 5000, batch_size=32)
    resumed = chosen("balanced", 5000, batch_size=64, fine_tune_epochs=40)
    assert (first.warmup_steps, first.ema_decay) != (resumed.warmup_steps, resumed.ema_decay)
    assert first.identity() == resumed.identity()
    # given, they are the request's own: part of its identity as without a preset
    assert chosen("balanced", 5000, warmup_steps=10).identity() != chosen("balanced", 5000, warmup_steps=20).identity()
    assert chosen("balanced", 5000).identity() != chosen("balanced", 5000, learning_rate=0.01).identity()


@pytest.mark.parametrize("preset, gpus, multi_label", list(itertools.product(presets.PRESETS[1:], (0, 1, 8),
                                                                                    (False, True))))
def test_every_choice_is_a_valid_job_at_every_size(preset, gpus, multi_label):
    for examples in (10, 19_999, 20_000, 500_000, 5_000_000):
        config = chosen(preset, examples, gpus=gpus, multi_label=multi_label)
        assert config.epochs >= 1 and config.fine_tune_epochs >= 2 and config.warmup_steps <= 500
        assert (0.99 <= config.ema_decay <= 0.9998) if preset != "fast" else config.ema_decay == 0.0
        assert config.batch_size % max(1, gpus) == 0 and config.test_time_flip == (preset == "best")


def test_a_preset_is_refused_in_a_built_in_dialect_and_none_chooses_nothing():
    with pytest.raises(UserError, match="preset=fast chooses among this job's hyperparameters; the request is read "
                                        "in the mxnet dialect"):
        JobConfig.from_hyperparameters({"num_classes": 3, "preset": "fast", "num_layers": 18})
    with pytest.raises(UserError, match="hyperparameter preset must be one of none, fast, balanced, best; got 'quick'"):
        JobConfig.from_hyperparameters({"num_classes": 3, "preset": "quick"})
    # from random weights the job trains one phase from scratch: a fine-tuning recipe would be its head's epochs
    with pytest.raises(UserError, match="preset=best chooses a recipe for fine-tuning pretrained weights; weights=none "
                                        "trains from scratch"):
        JobConfig.from_hyperparameters({"num_classes": 3, "preset": "best", "weights": "none"})
    plain = JobConfig.from_hyperparameters({"num_classes": 3})
    assert plain.preset == "none" and plain.preset_notes == () and plain.given == ("num_classes",)
    assert plain.with_preset(Situation(5000, 3, False, 0)) is plain


def test_the_notes_say_why_a_cpu_gets_another_backbone_only_where_it_does():
    assert chosen("balanced", 5000).preset_notes[2] == ("0 GPUs on each of 1 host (ml.g5.xlarge): backbone "
                                                        "efficientnet_v2_b0 (on CPUs: the GPU choice, convnext_tiny, "
                                                        "costs too much a step)")
    assert chosen("fast", 5000).preset_notes[2] == "0 GPUs on each of 1 host (ml.g5.xlarge): backbone mobilenet_v3_large"


def test_the_log_says_only_the_given_values_before_the_preset_chooses_and_every_value_after():
    """main.py logs the settings before the training set is counted: the defaults a preset will
    replace would mislead there; training/preset.py logs them all once chosen."""
    config = JobConfig.from_hyperparameters({"num_classes": 3, "preset": "fast", "batch_size": 16, "augment": "crop"})
    assert config.settings() == ("preset=fast, batch_size=16, num_classes=3, augment=('crop',) (preset fast chooses "
                                 "the others once the training set is counted)")
    said = config.with_preset(Situation(5000, 3, False, 0)).settings()
    for value in ("backbone=mobilenet_v3_large", "batch_size=16", "augment=('crop',)", "fine_tune_learning_rate=0.0001",
                  "test_time_flip=False", "class_names=('0', '1', '2')"):
        assert f" {value}, " in f" {said}, ", (value, said)
    assert not any(f" {name}=" in f" {said}" for name in ("given", "preset_notes", "dialect_notes")), said
    plain = JobConfig.from_hyperparameters({"num_classes": 3})
    assert "backbone=" in plain.settings() and "preset=none" in plain.settings()
