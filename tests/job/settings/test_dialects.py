"""The built-in image classifiers' hyperparameters, read with their meanings and defaults
(keras_pipe_train.settings.dialects): AWS's sample notebooks' requests as they send them, each setting
checked against what that built-in does with it."""

from __future__ import annotations

import json

import pytest

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.dialects import ALL_LAYERS, MXNET_NAMES, MXNET_ONLY, TENSORFLOW_NAMES, TENSORFLOW_ONLY
from keras_pipe_train.settings.errors import UserError
from tests.builtin import notebooks


def test_the_mxnet_full_training_notebook_trains_a_resnet18_from_scratch_with_sgd():
    config = JobConfig.from_hyperparameters(notebooks.mxnet_full_training(10, 1000))
    assert config.dialect == "mxnet"
    assert (config.backbone, config.weights, config.image_size) == ("resnet18", "none", 224)
    # from scratch, every epoch trains the whole network (phase 1 does, with weights=none)
    assert (config.epochs, config.fine_tune_epochs) == (2, 0)
    assert (config.optimizer, config.learning_rate, config.momentum) == ("sgd", 0.01, 0.9)
    assert (config.weight_decay, config.weight_decay_style) == (0.0001, "l2")  # MXNet's default, in the gradient
    assert config.batch_size == 64 and config.augment == ()  # no augmentation unless augmentation_type says
    assert (config.export_epoch, config.early_stopping, config.early_stopping_metric) == ("best", False, "val_accuracy")
    assert config.mixed_precision == "false" and config.num_classes == 10
    assert config.dialect_notes[0].startswith("dialect mxnet: the hyperparameters are read with the built-in MXNet")
    assert "num_training_samples=1000: accepted, not needed" in config.dialect_notes[1]


def test_mxnet_mini_batch_size_is_per_host():
    assert JobConfig.from_hyperparameters(notebooks.mxnet_full_training(10, 1000), hosts=3).batch_size == 192


def test_use_pretrained_model_needs_a_depth_with_imagenet_weights_unless_weights_says_where_they_come_from():
    with pytest.raises(UserError, match=r"use_pretrained_model=1 needs a depth with ImageNet weights: num_layers 18, "
                                        r"34, 50, 101, 152; ResNet-200 has none here"):
        JobConfig.from_hyperparameters({**notebooks.mxnet_lst_format(10, 1000), "num_layers": "200"})
    config = JobConfig.from_hyperparameters({**notebooks.mxnet_lst_format(10, 1000), "weights": "none"})
    assert (config.backbone, config.weights, config.image_size, config.resize) == ("resnet18", "none", 206, 256)
    assert config.top_k == 5 and not config.train_batchnorm
    for depth in ("18", "34", "50"):
        pretrained = JobConfig.from_hyperparameters({**notebooks.mxnet_lst_format(10, 1000), "num_layers": depth})
        # every layer trained from the first epoch, BatchNorm included, at the one learning rate
        assert (pretrained.weights, pretrained.epochs, pretrained.fine_tune_epochs) == ("imagenet", 0, 6)
        assert (pretrained.fine_tune_layers, pretrained.fine_tune_learning_rate) == (ALL_LAYERS, 0.01)
        assert pretrained.train_batchnorm
    # this job's own name beside the built-in's: BatchNorm kept as pretrained
    kept = JobConfig.from_hyperparameters({**notebooks.mxnet_lst_format(10, 1000), "train_batchnorm": "false"})
    assert not kept.train_batchnorm


def test_the_multi_label_notebook_keeps_its_augmentation_weighted_loss_and_precision():
    config = JobConfig.from_hyperparameters({**notebooks.mxnet_multi_label(5, 2500), "weights": "none"})
    assert config.multi_label and config.use_weighted_loss
    assert config.augment == ("crop", "flip", "color", "rotate", "shear", "aspect")
    assert config.mixed_precision == "false" and config.learning_rate == 0.001


def test_the_ground_truth_notebook_steps_its_learning_rate():
    config = JobConfig.from_hyperparameters({**notebooks.mxnet_ground_truth(3, 80), "weights": "none"})
    assert (config.lr_schedule, config.lr_scheduler_step, config.lr_scheduler_factor) == ("step", (10, 20), 0.1)
    assert (config.epochs, config.batch_size, config.resize) == (30, 32, 224)


@pytest.mark.parametrize(("depth", "backbone"), [(18, "resnet18"), (34, "resnet34"), (50, "resnet50"),
                                                 (200, "resnet200"), (20, "resnet20"), (110, "resnet110")])
def test_every_mxnet_depth_is_a_resnet_of_that_depth(depth, backbone):
    config = JobConfig.from_hyperparameters({"num_classes": "3", "num_layers": str(depth), "image_shape": "3,64,64"})
    assert config.backbone == backbone


@pytest.mark.parametrize(("given", "message"), [
    ({"num_layers": "19"}, "num_layers must be one of 18, 34, 50, 101, 152, 200, 20, 32, 44, 56, 110"),
    ({"image_shape": "3,224,160"}, "the job's images are square; got 224x160: use 3,224,224"),
    ({"image_shape": "1,28,28"}, "3 channels; got 1"),
    ({"optimizer": "adamw"}, "optimizer must be one of sgd, adam, rmsprop, nag"),
    ({"precision_dtype": "bfloat16"}, "precision_dtype must be one of float32, float16"),
    ({"augmentation_type": "crop_color_transformation"}, "augmentation_type must be one of crop, crop_color"),
    ({"train_only_top_layer": "True"}, "mix the built-in MXNet algorithm's names (num_training_samples) with the "
                                       "built-in TensorFlow algorithm's (train_only_top_layer)"),
])
def test_mxnet_values_it_does_not_take_are_refused_naming_what_it_takes(given, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        JobConfig.from_hyperparameters({"num_classes": "3", "num_training_samples": "100", **given})


def test_nag_weight_decay_is_mxnets_and_adam_ignores_it_as_mxnet_does():
    nag = JobConfig.from_hyperparameters({"num_classes": "3", "num_layers": "20", "optimizer": "nag",
                                          "weight_decay": "0.0005", "image_shape": "3,32,32"})
    assert (nag.optimizer, nag.weight_decay, nag.weight_decay_style) == ("nesterov", 0.0005, "l2")
    adam = JobConfig.from_hyperparameters({"num_classes": "3", "num_layers": "20", "optimizer": "adam",
                                           "weight_decay": "0.0005", "image_shape": "3,32,32"})
    assert adam.weight_decay == 0


def test_jumpstarts_tensorflow_defaults_sent_whole():
    config = JobConfig.from_hyperparameters({**notebooks.tensorflow_jumpstart_defaults(), "class_names": "a,b,c"})
    assert config.dialect == "tensorflow" and config.record_format == "class_folders"
    assert (config.backbone, config.image_size) == ("mobilenet_v2", 224)  # the notebook's model's
    assert (config.epochs, config.fine_tune_epochs) == (5, 0)  # train_only_top_layer=True: the head alone
    assert (config.optimizer, config.learning_rate, config.batch_size) == ("adam", 0.001, 32)
    assert (config.dropout, config.regularizers_l2, config.label_smoothing) == (0.2, 0.0001, 0.1)
    assert (config.seed, config.validation_split_ratio, config.resize_interpolation) == (123, 0.2, "bilinear")
    assert config.augment == () and config.early_stopping is False
    assert (config.initial_accumulator_value, config.reinitialize_top_layer) == (0.1, "auto")


def test_tensorflow_train_only_top_layer_false_trains_every_layer_and_augmentation_is_its_three():
    config = JobConfig.from_hyperparameters({**notebooks.tensorflow_jumpstart_defaults(), "class_names": "a,b",
                                             "train_only_top_layer": "False", "augmentation": "True",
                                             "augmentation_random_rotation": "-0.1"})
    assert (config.epochs, config.fine_tune_epochs, config.fine_tune_layers) == (0, 5, ALL_LAYERS)
    assert config.augment == ("flip", "rotate", "zoom")
    assert (config.augmentation_random_flip, config.augmentation_random_rotation) == ("horizontal_and_vertical", 0.1)
    # AWS's page spells it train_only_on_top_layer, default False
    spelled = JobConfig.from_hyperparameters({"class_names": "a,b", "train_only_on_top_layer": "True"})
    assert (spelled.dialect, spelled.epochs, spelled.fine_tune_epochs) == ("tensorflow", 3, 0)


@pytest.mark.parametrize(("given", "message"), [
    ({"binary_mode": "True"}, "binary_mode=True (a single probability for the positive class) has no equivalent"),
    ({"eval_metric": "auc"}, "eval_metric=auc: only accuracy"),
    ({"train_only_top_layer": "True", "train_only_on_top_layer": "True"}, "are one setting"),
])
def test_tensorflow_settings_with_no_equivalent_are_refused_naming_the_closest(given, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        JobConfig.from_hyperparameters({"class_names": "a,b", "random_seed": "1", **given})


def test_this_jobs_own_names_keep_this_jobs_defaults():
    config = JobConfig.from_hyperparameters({"num_classes": "3"})
    assert (config.dialect, config.optimizer, config.epochs, config.augment) == \
        ("keras-pipe", "adam", 5, ("crop", "flip", "color"))
    assert (config.export_epoch, config.weight_decay_style, config.validation_split_ratio) == ("last", "decoupled", 0)


def test_the_dialect_hyperparameter_decides_and_refuses_another_dialects_names():
    forced = JobConfig.from_hyperparameters({"num_classes": "3", "dialect": "mxnet", "image_shape": "3,32,32",
                                             "num_layers": "20"})
    assert (forced.dialect, forced.optimizer, forced.epochs) == ("mxnet", "sgd", 30)
    with pytest.raises(UserError, match="dialect=keras-pipe, but num_layers is another dialect's"):
        JobConfig.from_hyperparameters({"num_classes": "3", "dialect": "keras-pipe", "num_layers": "50"})
    with pytest.raises(UserError, match="hyperparameter dialect must be auto, keras-pipe, mxnet, tensorflow"):
        JobConfig.from_hyperparameters({"num_classes": "3", "dialect": "caffe"})


def test_every_name_of_both_built_ins_is_in_the_tables():
    """AWS's IC-Hyperparameter and IC-TF-Hyperparameter pages' names (and JumpStart's spelling)."""
    assert set(MXNET_NAMES) == {
        "num_classes", "num_training_samples", "augmentation_type", "beta_1", "beta_2", "checkpoint_frequency",
        "early_stopping", "early_stopping_min_epochs", "early_stopping_patience", "early_stopping_tolerance", "epochs",
        "eps", "gamma", "image_shape", "kv_store", "learning_rate", "lr_scheduler_factor", "lr_scheduler_step",
        "mini_batch_size", "momentum", "multi_label", "num_layers", "optimizer", "precision_dtype", "resize", "top_k",
        "use_pretrained_model", "use_weighted_loss", "weight_decay"}
    assert set(TENSORFLOW_NAMES) == {*notebooks.tensorflow_jumpstart_defaults(), "train_only_on_top_layer"}
    assert not set(MXNET_ONLY) & set(TENSORFLOW_ONLY)


def test_mxnet_momentum_is_sgds_and_nags_alone_as_aws_documents_it():
    """AWS's IC-Hyperparameter page: momentum "for sgd and nag, ignored for other optimizers"; Keras'
    RMSprop would apply it."""
    for optimizer, momentum in (("sgd", 0.9), ("nag", 0.9), ("rmsprop", 0.0), ("adam", 0.0)):
        config = JobConfig.from_hyperparameters({**notebooks.mxnet_full_training(10, 1000), "optimizer": optimizer,
                                                 "momentum": "0.9"})
        assert config.momentum == momentum, optimizer


def test_the_mxnet_dialect_adds_no_dropout_the_builtins_resnet_lacks():
    assert JobConfig.from_hyperparameters(notebooks.mxnet_full_training(10, 1000)).dropout == 0.0
    # this job's own name beside the built-in's still sets it
    assert JobConfig.from_hyperparameters({**notebooks.mxnet_full_training(10, 1000), "dropout": "0.3"}).dropout == 0.3


def test_mxnet_image_shape_of_28_pixels_is_taken_and_a_refusal_names_image_shape():
    """MXNet's ResNets take MNIST-sized images (3,28,28), its small-image ones any size up to 28;
    those built here do too (the CIFAR ones from 8). Keras' ResNet50 takes 32 at least: the refusal
    names the request's own hyperparameter."""
    for depth, size in (("18", 28), ("20", 28), ("20", 16), ("110", 8)):
        config = JobConfig.from_hyperparameters({**notebooks.mxnet_full_training(10, 1000), "num_layers": depth,
                                                 "image_shape": f"3,{size},{size}"})
        assert config.image_size == size
    with pytest.raises(UserError, match=r"hyperparameter image_shape's height and width must be at least 32 for "
                                        r"backbone resnet50 .* got 28"):
        JobConfig.from_hyperparameters({**notebooks.mxnet_full_training(10, 1000), "num_layers": "50",
                                        "image_shape": "3,28,28"})
    with pytest.raises(UserError, match=r"hyperparameter image_size must be at least 32 for backbone mobilenet_v2"):
        JobConfig.from_hyperparameters({"num_classes": "3", "backbone": "mobilenet_v2", "image_size": "28"})


def test_the_tensorflow_dialect_watches_val_accuracy_keeps_the_best_epoch_and_reports_top_5_past_5_classes():
    """JumpStart's transfer_learning.py: EarlyStopping and its ModelSelectionCallback on val_accuracy,
    the best epoch's weights restored at the end with or without early stopping; top-5 accuracy when
    there are more than 5 classes; every layer fine-tuned, BatchNorm in training mode."""
    for early in ("False", "True"):
        config = JobConfig.from_hyperparameters({**notebooks.tensorflow_jumpstart_defaults(), "class_names": "a,b,c",
                                                 "early_stopping": early})
        assert (config.early_stopping_metric, config.export_epoch) == ("val_accuracy", "best")
        assert config.top_k is None and not config.train_batchnorm
    six = JobConfig.from_hyperparameters({**notebooks.tensorflow_jumpstart_defaults(),
                                          "class_names": json.dumps(list("abcdef")), "train_only_top_layer": "False"})
    assert six.top_k == 5 and six.train_batchnorm
    assert JobConfig.from_hyperparameters({"class_names": "a,b,c,d,e", "train_only_top_layer": "True"}).top_k is None


def test_the_tensorflow_dialects_top_5_is_not_forced_on_a_multi_label_job():
    config = JobConfig.from_hyperparameters({**notebooks.tensorflow_jumpstart_defaults(), "multi_label": "true",
                                             "record_format": "tfrecord",
                                             "class_names": json.dumps(list("abcdef"))})
    assert config.multi_label and config.top_k is None


def test_the_built_ins_dialects_serve_their_own_probabilities_unless_calibration_is_asked_for():
    mxnet = {"num_classes": "3", "num_layers": "18"}
    tensorflow = {"num_classes": "3", "train_only_top_layer": "True"}
    assert JobConfig.from_hyperparameters({"num_classes": "3"}).calibration == "auto"
    for request in (mxnet, tensorflow):
        assert JobConfig.from_hyperparameters(request).calibration == "false"
        for given, read in (("true", "true"), ("1", "true"), ("on", "true"), ("auto", "auto"), ("Off", "false")):
            assert JobConfig.from_hyperparameters({**request, "calibration": given}).calibration == read
    with pytest.raises(UserError, match="hyperparameter calibration must be one of auto, true, false; got 'maybe'"):
        JobConfig.from_hyperparameters({"num_classes": "3", "calibration": "maybe"})


@pytest.mark.parametrize("yes", ["1", "true", "True", "yes", '"yes"'])
def test_the_built_ins_flags_take_every_form_this_jobs_own_flags_take(yes):
    """A flag a dialect reads for itself is read as this job's flags are: MXNet's multi_label=yes is
    multi-hot labels as multi_label=1 is; TensorFlow's train_only_top_layer and augmentation take
    yes as its early_stopping does; a TensorFlow multi_label=no is one class per image (top-5)."""
    mxnet = JobConfig.from_hyperparameters({"num_layers": "18", "multi_label": yes, "record_format": "recordio",
                                            "num_classes": "3", "num_training_samples": "100"})
    assert mxnet.multi_label and mxnet.label_format == "multi_hot"
    tensorflow = JobConfig.from_hyperparameters({**notebooks.tensorflow_jumpstart_defaults(), "class_names": "a,b",
                                                 "train_only_top_layer": yes, "augmentation": yes})
    assert (tensorflow.epochs, tensorflow.fine_tune_epochs) == (5, 0) and tensorflow.augment
    no = {"1": "0", "true": "false", "True": "False", "yes": "no", '"yes"': '"no"'}[yes]
    single = JobConfig.from_hyperparameters({**notebooks.tensorflow_jumpstart_defaults(), "multi_label": no,
                                             "class_names": json.dumps(list("abcdef"))})
    assert not single.multi_label and single.top_k == 5


@pytest.mark.parametrize("classes", [{"class_names": str(list("abcdef"))}, {"class_names": json.dumps(list("abcdef"))},
                                     {"class_names": "a,b,c,d,e,f"}, {"num_classes": "6.0"}, {"num_classes": "6"}])
def test_the_tensorflow_dialect_counts_classes_in_every_form_the_sdks_send(classes):
    """Python's repr of a list (the v2 Estimator's str()), JSON, commas; "6.0" (a tuning job's
    integer): six classes, so top-5, as in JumpStart."""
    config = JobConfig.from_hyperparameters({**notebooks.tensorflow_jumpstart_defaults(), **classes,
                                             "record_format": "tfrecord"})
    assert config.top_k == 5
