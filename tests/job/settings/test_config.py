"""Hyperparameters: defaults in one place, every bad value a UserError naming it and what is allowed."""

import json
import subprocess

import pytest

from keras_pipe_train.settings.config import HYPERPARAMETERS, JobConfig
from keras_pipe_train.settings.errors import UserError
from tests.conftest import sdk2_python


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
    # added by SageMaker to every training job of a tuning job
    assert config(_tuning_objective_metric="validation:accuracy").epochs == 5


# Python values as users give them to an SDK; names with a comma and a quote on purpose
GIVEN = {
    "epochs": 2, "batch_size": 8, "learning_rate": 0.003, "dropout": 0.0, "mixed_precision": False,
    "augment": ["crop", "flip"], "class_names": ["cat, tabby", "dog's", "bird"], "num_classes": 3,
    "weights": "none", "image_feature": "image/encoded", "max_image_pixels": 10**6,
}
# How each SageMaker client turns them into hyperparameters.json's strings, computed by the SDKs' own
# code: the v2 Estimator (str()), v2 framework estimators (json.dumps, as with source_dir), and the
# categorical values of a v2 tuning job, plain (Estimator) and JSON-quoted again (framework).
SDK2_FORMS = """
import json, sys
from sagemaker.estimator import EstimatorBase
from sagemaker.parameter import CategoricalParameter
from sagemaker.utils import to_string
given = json.loads(sys.stdin.read())
framework = EstimatorBase._json_encode_hyperparameters(given)
print(json.dumps({
    "v2 Estimator": {k: to_string(v) for k, v in given.items()},
    "v2 Framework": {k: to_string(v) for k, v in framework.items()},
    "v2 tuning categorical": {k: CategoricalParameter([v]).as_tuning_range(k)["Values"][0]
                              for k, v in given.items() if not isinstance(v, list)},
    "v2 tuning categorical, Framework": {k: CategoricalParameter([v]).as_json_range(k)["Values"][0]
                                         for k, v in given.items() if not isinstance(v, list)},
}))
"""


def sdk_forms() -> dict[str, dict[str, str]]:
    from sagemaker.train.utils import safe_serialize  # what v3's ModelTrainer sends

    forms = {"v3 ModelTrainer": {k: safe_serialize(v) for k, v in GIVEN.items()}}
    out = subprocess.run([str(sdk2_python()), "-c", SDK2_FORMS], input=json.dumps(GIVEN), capture_output=True,
                         text=True, check=True)
    forms.update(json.loads(out.stdout.splitlines()[-1]))  # v2 prints a deprecation notice first
    return forms


@pytest.mark.slow
def test_every_form_the_sdks_send_reads_as_the_value_given():
    expected = JobConfig.from_hyperparameters(GIVEN)
    assert expected.class_names == ("cat, tabby", "dog's", "bird") and expected.mixed_precision == "false"
    forms = sdk_forms()
    assert forms["v2 Estimator"]["class_names"] == "['cat, tabby', \"dog's\", 'bird']"
    assert forms["v2 tuning categorical, Framework"]["batch_size"] == '"8"'
    for client, sent in forms.items():
        assert all(isinstance(v, str) for v in sent.values()), client
        if "tuning" in client:  # a categorical range sets one value at a time; the others keep theirs
            for name, value in sent.items():
                assert JobConfig.from_hyperparameters({**GIVEN, name: value}) == expected, (client, name, value)
        else:
            assert sent.keys() == GIVEN.keys()
            assert JobConfig.from_hyperparameters(sent) == expected, client


@pytest.mark.parametrize("sent, read", [
    ({"batch_size": "8.0"}, {"batch_size": 8}),
    ({"batch_size": " 16 "}, {"batch_size": 16}),
    ({"learning_rate": ".5"}, {"learning_rate": 0.5}),
    ({"learning_rate": "1e-4"}, {"learning_rate": 1e-4}),
    ({"mixed_precision": "True"}, {"mixed_precision": "true"}),
    ({"mixed_precision": '"AUTO"'}, {"mixed_precision": "auto"}),
    ({"steps_per_execution": '"Auto"'}, {"steps_per_execution": "auto"}),
    ({"steps_per_execution": "8.0"}, {"steps_per_execution": 8}),
    ({"augment": "False"}, {"augment": ()}),
    ({"augment": "['flip']"}, {"augment": ("flip",)}),
    ({"augment": '["color", "crop"]'}, {"augment": ("color", "crop")}),
    ({"augment": "crop, flip"}, {"augment": ("crop", "flip")}),
    ({"num_classes": "None", "class_names": "a,b"}, {"num_classes": 2}),
    ({"num_classes": "2", "class_names": "None"}, {"class_names": ("0", "1")}),
    ({"num_classes": "null", "class_names": '["x", "y"]'}, {"class_names": ("x", "y")}),
    ({"image_feature": "42"}, {"image_feature": "42"}),
    ({"image_feature": '"jpeg"'}, {"image_feature": "jpeg"}),
])
def test_strings_in_each_form_read_as_their_type(sent, read):
    c = JobConfig.from_hyperparameters({"num_classes": "3", **sent})
    assert {k: getattr(c, k) for k in read} == read


@pytest.mark.parametrize("sent, message", [
    ({"class_names": "['a', 'b'"}, "cannot read \"\\['a', 'b'\" as a list; give a JSON list like"),
    ({"class_names": "[a, b]"}, "give a JSON list like \\[\"cat\", \"dog\"\\]"),
    ({"class_names": "[1, 2]"}, "must list strings"),
    ({"augment": "{'crop': 1}"}, "crop': 1} unknown"),
    ({"batch_size": "eight"}, "batch_size must be an integer, got 'eight'"),
    ({"batch_size": "true"}, "batch_size must be an integer, got 'true'"),
    ({"batch_size": '"8.5"'}, "batch_size must be an integer"),
    ({"learning_rate": "nan"}, "learning_rate must be a finite number, got 'nan'"),
    ({"learning_rate": '"Infinity"'}, "learning_rate must be a finite number"),
])
def test_ambiguous_or_malformed_forms_are_refused_with_the_form_to_use(sent, message):
    with pytest.raises(UserError, match=message):
        JobConfig.from_hyperparameters({"num_classes": "3", **sent})


@pytest.mark.parametrize("hps, message", [
    ({"epochs": -1}, "hyperparameter epochs must be >= 0, got -1"),
    ({"epochs": 2.5}, "hyperparameter epochs must be an integer, got 2.5"),
    ({"epochs": True}, "hyperparameter epochs must be an integer"),
    ({"batch_size": 0}, "hyperparameter batch_size must be >= 1"),
    ({"image_size": 4}, "hyperparameter image_size must be between 8 and 1024"),
    ({"learning_rate": 0}, "hyperparameter learning_rate must be > 0"),
    ({"learning_rate": "fast"}, "hyperparameter learning_rate must be a number, got 'fast'"),
    ({"learning_rate": float("nan")}, "hyperparameter learning_rate must be a finite number, got nan"),
    ({"fine_tune_learning_rate": float("inf")}, "hyperparameter fine_tune_learning_rate must be a finite number, got inf"),
    ({"collective_timeout": float("-inf")}, "hyperparameter collective_timeout must be a finite number"),
    ({"epochs": float("inf")}, "hyperparameter epochs must be an integer, got inf"),
    ({"dropout": 1}, "hyperparameter dropout must be >= 0 and <= 0.99"),
    ({"backbone": "alexnet"}, "hyperparameter backbone must be one of mobilenet_v3_small, mobilenet_v3_large, mobilenet, mobilenet_v2, efficientnet_v2_b0,"),
    ({"backbone": "xception", "image_size": 64}, "hyperparameter image_size must be at least 71 for backbone xception"),
    ({"backbone": "inception_v3", "image_size": 74}, "image_size must be at least 75 for backbone inception_v3"),
    ({"num_layers": 19}, "hyperparameter num_layers must be one of 18, 34, 50, 101, 152, 200, 20, 32, 44, 56, 110"),
    ({"num_layers": 50, "backbone": "resnet50"}, "hyperparameters num_layers and backbone are one setting"),
    ({"weights": "bert"}, "hyperparameter weights must be imagenet, none, pretrained"),
    ({"augment": "crop,twist"}, "twist unknown"),
    ({"augmentation": "true", "augment": "crop"}, "hyperparameters augmentation and augment are one setting"),
    ({"augmentation_random_flip": "diagonal"}, "augmentation_random_flip must be one of horizontal, vertical, horizontal_and_vertical"),
    ({"augmentation_random_rotation": "0.6"}, "augmentation_random_rotation must be >= 0 and <= 0.5"),
    ({"mixed_precision": "maybe"}, "hyperparameter mixed_precision must be one of auto, true, false"),
    ({"steps_per_execution": 0}, "hyperparameter steps_per_execution must be between 1 and 1000, got 0 (or auto)"),
    ({"steps_per_execution": "often"}, "hyperparameter steps_per_execution must be an integer, got 'often' (or auto)"),
    ({"image_feature": ""}, "hyperparameter image_feature must be a non-empty string"),
    ({"label_error_folds": 1}, "hyperparameter label_error_folds must be 0 (the training images not checked) or 2 to 20 folds; got 1"),
    ({"label_error_folds": 21}, "hyperparameter label_error_folds must be 0 (the training images not checked) or 2 to 20 folds; got 21"),
    ({"class_names": ["a", "a", "b"]}, "at least two distinct"),
    ({"class_names": "a,b"}, "num_classes is 3 but class_names lists 2"),
    ({"epochs": 0, "fine_tune_epochs": 0}, "nothing to train"),
    ({"epoch": 3}, "unknown hyperparameter epoch (did you mean epochs"),
    ({"optimiser": "sgd"}, "unknown hyperparameter optimiser (did you mean optimizer"),
    ({"colour": 1}, "unknown hyperparameter colour; the job accepts"),
    ({"Epochs": 3, "lr": 1}, "unknown hyperparameters Epochs (did you mean epochs"),
])
def test_bad_values_name_the_hyperparameter_and_what_is_allowed(hps, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(**hps)


def test_the_augmentations_and_the_tensorflow_algorithms_switch():
    assert config().augment == ("crop", "flip", "color")
    assert config(augment="all").augment == ("crop", "flip", "color", "rotate", "zoom", "aspect", "shear")
    assert config(augment="rotate, Zoom").augment == ("rotate", "zoom")
    # the built-in TensorFlow algorithm's augmentation=True: flips, rotation and zoom, with its defaults
    chosen = config(augmentation="True")
    assert (chosen.augment, chosen.augmentation_random_rotation, chosen.augmentation_random_flip) == (
        ("flip", "rotate", "zoom"), 0.2, "horizontal_and_vertical")
    assert config(augmentation="True", augmentation_random_rotation="0.05").augmentation_random_rotation == 0.05
    assert config(augmentation="False").augment == ()


def test_mxnets_resnet_depth_names_the_backbone():
    assert config(num_layers="101").backbone == "resnet101"
    assert config(num_layers='"152"', image_size=75).backbone == "resnet152"


def test_num_classes_is_required():
    with pytest.raises(UserError, match="num_classes \\(or class_names\\) is required"):
        JobConfig.from_hyperparameters({})


def test_every_hyperparameter_has_help_and_a_valid_default():
    for h in HYPERPARAMETERS.values():
        assert h.help
        if h.default is not None:
            h.parse(h.name, h.default)


@pytest.mark.parametrize(("given", "read"), [
    ({"weights": "ImageNet"}, {"weights": "imagenet"}),
    ({"weights": "None"}, {"weights": "none"}),  # (Keras' weights=None: nothing to start from)
    ({"augment": "None"}, {"augment": ()}),
    ({"image_feature": "None"}, {"image_feature": "image/encoded"}),  # (not set: its default)
    ({"learning_rate": "null"}, {"learning_rate": 0.001}),
    ({"epochs": '"None"'}, {"epochs": 5}),
    ({"calibration": "Yes", "mixed_precision": "1", "reinitialize_top_layer": "off", "label_check": "on"},
     {"calibration": "true", "mixed_precision": "true", "reinitialize_top_layer": "false", "label_check": True}),
    ({"calibration": "no", "mixed_precision": "0", "reinitialize_top_layer": "NO", "label_check": "off"},
     {"calibration": "false", "mixed_precision": "false", "reinitialize_top_layer": "false", "label_check": False}),
    ({"augment": "yes"}, {"augment": ("crop", "flip", "color")}), ({"augment": "off"}, {"augment": ()}),
])
def test_the_value_forms_docs_job_md_promises(given, read):
    """docs/job.md, Hyperparameter values: choices in any case; a flag's words for a choice of
    true, false and more; None or null not set, but where none is a value of its own."""
    config = JobConfig.from_hyperparameters({"num_classes": "3", **given})
    assert {name: getattr(config, name) for name in read} == read


MXNET = {"num_layers": "18", "num_classes": "3", "num_training_samples": "100"}
TENSORFLOW = {"class_names": "a,b", "train_only_top_layer": "True"}


@pytest.mark.parametrize(("given", "read"), [
    # not given: the built-in's defaults, not this job's
    ({**MXNET, "epochs": "None", "learning_rate": "null"}, {"epochs": 30, "learning_rate": 0.1}),
    ({**MXNET, "multi_label": "None", "mini_batch_size": "null"}, {"multi_label": False, "batch_size": 32}),
    ({**TENSORFLOW, "record_format": "None", "label_smoothing": "null"},
     {"record_format": "class_folders", "label_smoothing": 0.1}),
    ({**TENSORFLOW, "augmentation": "None"}, {"augment": ()}),
    # MXNet's weights=null is weights=None: from scratch, as use_pretrained_model=0 trains
    ({**MXNET, "weights": "null"}, {"weights": "none", "epochs": 30, "fine_tune_epochs": 0}),
    ({"num_classes": "3", "lr_schedule": "None", "lr_scheduler_step": "10,20"}, {"lr_schedule": "step"}),
])
def test_a_name_given_none_is_not_given_in_every_dialect(given, read):
    config = JobConfig.from_hyperparameters(given)
    assert {name: getattr(config, name) for name in read} == read


def test_an_empty_weights_is_refused_not_read_as_none():
    with pytest.raises(UserError, match="hyperparameter weights must be imagenet, none, pretrained"):
        JobConfig.from_hyperparameters({"num_classes": "3", "weights": ""})
