"""Hyperparameters: defaults in one place, every bad value a UserError naming it and what is allowed."""

import pytest

from train.config import HYPERPARAMETERS, JobConfig
from train.errors import UserError


def config(**hps):
    return JobConfig.from_hyperparameters({"num_classes": 3, **hps})


def test_defaults_and_decoded_values():
    c = config(epochs=2, learning_rate=0.01, augment="crop,flip", class_names=["a", "b", "c"])
    assert (c.epochs, c.learning_rate, c.augment, c.class_names) == (2, 0.01, ("crop", "flip"), ("a", "b", "c"))
    assert c.backbone == HYPERPARAMETERS["backbone"].default
    assert config().augment == ("crop", "flip", "color")
    assert config(augment=False).augment == ()
    assert config().class_names == ("0", "1", "2")
    assert JobConfig.from_hyperparameters({"class_names": "cat,dog"}).num_classes == 2
    assert config(epochs=3.0).epochs == 3


def test_platform_hyperparameters_are_ignored():
    assert config(sagemaker_program="x", sagemaker_region="us-east-1", model_dir="s3://b/m").epochs == 5


@pytest.mark.parametrize("hps, message", [
    ({"epochs": -1}, "hyperparameter epochs must be >= 0, got -1"),
    ({"epochs": 2.5}, "hyperparameter epochs must be an integer, got 2.5"),
    ({"epochs": True}, "hyperparameter epochs must be an integer"),
    ({"batch_size": 0}, "hyperparameter batch_size must be >= 1"),
    ({"image_size": 16}, "hyperparameter image_size must be between 32 and 1024"),
    ({"learning_rate": 0}, "hyperparameter learning_rate must be > 0"),
    ({"learning_rate": "fast"}, "hyperparameter learning_rate must be a number, got 'fast'"),
    ({"learning_rate": float("nan")}, "hyperparameter learning_rate must be a finite number, got nan"),
    ({"fine_tune_learning_rate": float("inf")}, "hyperparameter fine_tune_learning_rate must be a finite number, got inf"),
    ({"collective_timeout": float("-inf")}, "hyperparameter collective_timeout must be a finite number"),
    ({"epochs": float("inf")}, "hyperparameter epochs must be an integer, got inf"),
    ({"dropout": 1}, "hyperparameter dropout must be >= 0 and <= 0.99"),
    ({"backbone": "vgg16"}, "hyperparameter backbone must be one of mobilenet_v3_small, mobilenet_v3_large, efficientnet_v2_b0, resnet50; got 'vgg16'"),
    ({"weights": "bert"}, "hyperparameter weights must be imagenet, none, pretrained"),
    ({"augment": "crop,rotate"}, "rotate unknown"),
    ({"mixed_precision": "maybe"}, "hyperparameter mixed_precision must be one of auto, true, false"),
    ({"image_feature": ""}, "hyperparameter image_feature must be a non-empty string"),
    ({"class_names": ["a", "a", "b"]}, "at least two distinct"),
    ({"class_names": "a,b"}, "num_classes is 3 but class_names lists 2"),
    ({"epochs": 0, "fine_tune_epochs": 0}, "nothing to train"),
    ({"epoch": 3}, "unknown hyperparameter epoch; the job accepts: epochs,"),
    ({"Epochs": 3, "lr": 1}, "unknown hyperparameters Epochs, lr"),
])
def test_bad_values_name_the_hyperparameter_and_what_is_allowed(hps, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(**hps)


def test_num_classes_is_required():
    with pytest.raises(UserError, match="num_classes \\(or class_names\\) is required"):
        JobConfig.from_hyperparameters({})


def test_every_hyperparameter_has_help_and_a_valid_default():
    for h in HYPERPARAMETERS.values():
        assert h.help
        if h.default is not None:
            h.parse(h.name, h.default)
