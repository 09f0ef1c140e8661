"""keras-hub's image backbones: a job fine-tunes a preset from the `pretrained` channel (files or a
.tar.gz, whatever handle `backbone` names) or from a folder in the image, starts from the preset's
own weights, scales its input as the preset's image converter does, and its exported SavedModel
answers as the job's own model does. The presets are small ones with random weights, made here
(tests/job/model/hub_presets.py); no test reaches the internet (a download would fail at once:
the proxy goes nowhere)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from keras_pipe_train.settings.backbones import HUB_FAMILIES, HUB_PRESETS
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.settings.hyperparameters import HYPERPARAMETERS
from tests.conftest import FakeJob, model_tar_gz
from tests.job.conftest import failed, file_channel, run_train, served_probabilities, write_hyperparameters
from tests.job.model import hub_presets
from tests.timeouts import wait_s

NO_ROUTE = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}

# keras-hub's image presets this job does not offer, and why
NOT_OFFERED = {
    "vgg_": "VGG: Keras' applications have it (vgg16, vgg19)",
    "xception_": "Xception: Keras' applications have it",
    "mit_": "SegFormer's MiT encoders: segmentation presets",
    "mobilenetv5_": "Gemma 3n's MobileNetV5 encoder: a language model's tower",
}


def make_preset(family: str, folder) -> None:
    hub_presets.make(family, str(folder))


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    root = tmp_path_factory.mktemp("presets")
    for family in ("vit", "mobilenet_v3", "resnet"):
        make_preset(family, root / family)
    return root


def test_the_presets_offered_are_keras_hubs_image_presets():
    import keras_hub

    registered = keras_hub.models.Backbone.presets
    assert set(HUB_PRESETS) <= set(registered), set(HUB_PRESETS) - set(registered)
    classifiers = set(keras_hub.models.ImageClassifier.presets)
    missing = {name for name in classifiers - set(HUB_PRESETS) if not name.startswith(tuple(NOT_OFFERED))}
    assert not missing, missing
    for prefix in ("dinov2_", "dinov3_", "siglip", "medsiglip"):  # (backbones only: no classifier presets)
        family = {name for name in registered if name.startswith(prefix)}
        assert family and family <= set(HUB_PRESETS), family - set(HUB_PRESETS)
    assert len(HUB_FAMILIES) >= 10


@pytest.mark.parametrize("given, kept", [
    ("DINOv2_Small", "dinov2_small"), ("hf://timm/vit_small_patch16_224.augreg_in21k", None),
    ("kaggle://keras/dinov2/keras/dinov2_small", None), ("/opt/presets/My_ViT", None),
    ("ResNet50", "resnet50")])
def test_the_backbone_takes_a_preset_a_handle_or_a_folder_as_written(given, kept):
    assert HYPERPARAMETERS["backbone"].parse("backbone", given) == (kept or given)


@pytest.mark.parametrize("given, said", [
    ("mobilenet_v3_smal", "keras-hub image preset"), ("hf://", "names no model"), ("opt/presets", "absolute path")])
def test_a_backbone_that_is_none_of_them_is_refused_naming_the_ways(given, said):
    with pytest.raises(UserError, match=said):
        HYPERPARAMETERS["backbone"].parse("backbone", given)


def keras_hub_weights(preset):
    """The preset's image tower's weights, as keras-hub loads them."""
    import keras_hub

    backbone = keras_hub.models.Backbone.from_preset(str(preset))
    return [np.asarray(w) for w in getattr(backbone, "vision_encoder", backbone).weights]


def preset_weights(preset):
    import keras_hub

    return [np.asarray(w) for w in keras_hub.models.Backbone.from_preset(str(preset)).weights]


# (family, how the job gets it, the backbone hyperparameter)
WAYS = [
    ("vit", "channel files", "kaggle://keras/vit/keras/vit_base_patch16_224_imagenet"),
    ("mobilenet_v3", "channel .tar.gz", "mobilenet_v3_small_100_imagenet"),
    ("resnet", "baked into the image", "hf://timm/resnet18.a1_in1k"),
    ("vit", "image folder", None),
]


def bake(preset, keras_home, name: str, monkeypatch):
    """As the Dockerfile's BAKE_WEIGHTS does, for a preset named `name`: the command saves it (here
    from a folder: the tests have no internet) where the job looks for `name` first."""
    from keras_pipe_train.model import hub

    monkeypatch.setenv("KERAS_HOME", str(keras_home))
    env = {**os.environ, **NO_ROUTE}
    baked = subprocess.run([sys.executable, "-m", "keras_pipe_train.model", "--download-imagenet", str(preset)],
                           capture_output=True, text=True, timeout=wait_s(120), env=env)
    assert baked.returncode == 0, baked.stderr[-3000:]
    saved = hub.baked_folder(str(preset))
    assert saved.parent == keras_home / "presets"
    assert f"saved the keras-hub preset {preset} in {saved}" in baked.stdout
    assert {"config.json", "model.weights.h5", "image_converter.json"} <= {p.name for p in saved.iterdir()}
    saved.rename(hub.baked_folder(name))


@pytest.mark.slow
@pytest.mark.parametrize("family, way, backbone", WAYS)
def test_a_job_fine_tunes_a_preset_from_its_own_weights_and_serves_as_it_trained(tmp_path, presets, digit_records,
                                                                                 monkeypatch, family, way, backbone):
    import keras
    import keras_hub

    examples, _ = digit_records
    job = FakeJob(tmp_path / "opt_ml")
    file_channel(job, "train", examples[:160])
    file_channel(job, "validation", examples[160:260], shards=1)
    preset = presets / family
    env = dict(NO_ROUTE)
    if way == "channel files":
        job.add_channel("pretrained", mode="File")
        (job.data_dir / "pretrained").mkdir()
        for path in preset.iterdir():
            (job.data_dir / "pretrained" / path.name).write_bytes(path.read_bytes())
    elif way == "channel .tar.gz":
        job.add_channel("pretrained", mode="File")
        (job.data_dir / "pretrained").mkdir()
        with tarfile.open(job.data_dir / "pretrained" / "preset.tar.gz", "w:gz") as tar:
            tar.add(preset, arcname=family)
    elif way == "baked into the image":
        bake(preset, tmp_path / "keras", backbone, monkeypatch)
        env["KERAS_HOME"] = str(tmp_path / "keras")
    else:
        backbone = str(preset)
    # (the steps after training too: calibration, the label check on the training images as well, the report)
    # (and MixUp and CutMix, TrivialAugment and RandAugment, in whole jobs)
    more = ({"weights": "pretrained", "mixup_alpha": 0.8, "cutmix_alpha": 1.0} if way == "channel .tar.gz" else
            {"calibration": "true", "label_error_folds": 2} if way == "channel files" else
            {"augment": "crop,flip,trivial", "test_time_flip": "true"} if way == "baked into the image" else
            {"augment": "flip,randaugment"})
    write_hyperparameters(job, backbone=backbone, num_classes=10, image_size=hub_presets.SIZE, epochs=1,
                          batch_size=32, **more)
    out = run_train(job, **env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    if way != "image folder":
        assert "in place of downloading it" in out.stdout + out.stderr
    model_dir = job.base / "model"
    # the head alone trained (fine_tune_epochs 0): the backbone saved is the preset's, as it was
    model = keras.saving.load_model(model_dir / "model.keras")
    saved = keras_hub.models.Backbone.from_preset(str(preset), load_weights=False)
    saved.load_weights(model_dir / "backbone.weights.h5")
    for expected, got in zip(preset_weights(preset), saved.weights, strict=True):
        np.testing.assert_array_equal(expected, np.asarray(got))
    # the input scaled as the preset's converter says, per channel
    scaling = model.get_layer("preset_preprocessing").get_weights()
    converter = json.loads((preset / "image_converter.json").read_text())["config"]
    np.testing.assert_allclose(np.diag(scaling[0][0, 0]), np.broadcast_to(converter["scale"], (3,)), rtol=1e-6)
    np.testing.assert_allclose(scaling[1], np.broadcast_to(converter["offset"], (3,)), rtol=1e-6)
    # (test_time_flip: served, each image's logits averaged with its mirror image's)
    served, own = served_probabilities(model_dir, job.data_dir / "validation" / "part-00000.tfrecord",
                                       hub_presets.SIZE, flip=way == "baked into the image")
    assert served.shape == (100, 10)
    if way == "baked into the image":  # (and evaluation.json judged that model, the epoch's own kept beside)
        evaluated = json.loads((job.base / "output" / "data" / "evaluation.json").read_text())
        truth = np.array(digit_records[1][160:260])
        served_loss = float(-np.log(served[np.arange(len(truth)), truth]).mean())  # (uncalibrated: no validation
        assert evaluated["metrics"]["val_loss"] == pytest.approx(served_loss, rel=2e-5), evaluated  # of 200)
        assert evaluated["metrics"]["val_accuracy"] == pytest.approx((served.argmax(axis=1) == truth).mean(),
                                                                     abs=0.011), evaluated
        final = json.loads((job.base / "output" / "data" / "metrics.json").read_text())["final"]
        without = evaluated["test_time_flip"]["without_flip"]
        assert without["val_loss"] == pytest.approx(final["val_loss"]) and without["val_loss"] != pytest.approx(
            served_loss, rel=2e-5), evaluated  # (the epoch's own: the model alone)
        assert "test_time_flip: the exported model, each image's logits averaged" in out.stdout + out.stderr
    if way == "channel files":  # (served calibrated: the model's own probabilities over the temperature)
        temperature = json.loads((model_dir / "serving.json").read_text())["calibration"]["temperature"]
        own = np.exp(np.log(np.maximum(own, 1e-30)) / temperature)
        own /= own.sum(axis=1, keepdims=True)
        checked = json.loads((job.base / "output" / "data" / "label_errors.json").read_text())
        assert checked["folds"] == 2 and checked["train_features"] == "starting backbone", checked
        assert checked["sets"]["train"]["examined"] == 160, checked
    np.testing.assert_allclose(served, own, atol=1e-5)
    assert (job.base / "output" / "data" / "report.html").is_file()
    if way == "image folder":
        continue_the_model(tmp_path, model_dir, examples, saved)


def continue_the_model(tmp_path, model_dir, examples, first_backbone):
    """A second job continues the first's model from the `model` channel (incremental training): its
    backbone rebuilt from that model, so no preset is needed, whatever handle `backbone` names."""
    import keras

    job = FakeJob(tmp_path / "second" / "opt_ml")
    file_channel(job, "train", examples[:96])
    job.add_channel("model", mode="File")
    (job.data_dir / "model").mkdir()
    model_tar_gz(model_dir, job.data_dir / "model" / "model.tar.gz")
    # (and a phase 2 with layer-wise learning-rate decay: the ViT's blocks read from its weights' paths)
    write_hyperparameters(job, backbone="hf://google/vit-base-patch16-224", num_classes=10,
                          image_size=hub_presets.SIZE, epochs=1, batch_size=32, learning_rate=1e-9,
                          fine_tune_epochs=1, fine_tune_learning_rate=1e-9, fine_tune_layers=1000, layer_decay=0.75)
    out = run_train(job, **NO_ROUTE)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "incremental training: continuing model.tar.gz" in out.stdout + out.stderr
    assert ("layer_decay=0.75: the backbone's 2 blocks named in its weights' paths (vit_encoder/transformer_block_1 "
            "... vit_encoder/transformer_block_2); its stem at 0.422 x") in out.stdout + out.stderr
    scaled = re.search(r"layer_decay: (\d+) of the (\d+) weights this phase trains at a lower rate", out.stdout + out.stderr)
    assert scaled and 0 < int(scaled[1]) < int(scaled[2]), out.stdout[-3000:]  # (the head's, at the rate itself)
    # (at a learning rate of 1e-9 the model stays the first's, backbone and head)
    first = keras.saving.load_model(model_dir / "model.keras")
    second = keras.saving.load_model(job.base / "model" / "model.keras")
    for a, b in zip(first.weights, second.weights, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    assert len(first_backbone.weights) < len(second.weights)



@pytest.mark.slow
def test_an_unreachable_handle_fails_before_training_naming_the_ways_to_provide_it(tmp_path, digit_records):
    examples, _ = digit_records
    job = FakeJob(tmp_path / "opt_ml")
    file_channel(job, "train", examples[:64])
    write_hyperparameters(job, backbone="hf://nobody/no-such-vit", num_classes=10, image_size=32, epochs=1)
    out = run_train(job, **NO_ROUTE)
    text = failed(job, out, 2, "Configuration error: backbone hf://nobody/no-such-vit: keras-hub could not load it")
    reason = text.splitlines()[0]
    assert "'pretrained' channel" in reason and "BAKE_WEIGHTS" in reason, reason
    assert "train_loss" not in out.stdout + out.stderr  # (no epoch's metric line: it failed before training)


def test_a_transformer_takes_its_presets_size_only_and_dinov2_any(tmp_path):
    from keras_pipe_train.model import hub

    for family in ("vit", "dinov2", "dinov3"):
        make_preset(family, tmp_path / family)
    with pytest.raises(UserError, match=f"set hyperparameter image_size={hub_presets.SIZE}; got 48"):
        hub.build_backbone(str(tmp_path / "vit"), 48, "imagenet")
    backbone, _ = hub.build_backbone(str(tmp_path / "dinov2"), 48, "imagenet")
    assert backbone.input_shape[1:3] == (48, 48)
    backbone, _ = hub.build_backbone(str(tmp_path / "dinov3"), 64, "imagenet")  # (rotary: any multiple of 16)
    assert hub.image_size_of(backbone) == 64


def test_each_kind_of_features_is_pooled_as_keras_hubs_classifiers_do(tmp_path):
    """A feature map averaged, a ViT's or DINOv2's class token taken (the first), SigLIP's
    attention-pooled vector as it is: one vector an image, the same with the backbone called alone."""
    from keras_pipe_train.model import explain, hub
    from keras_pipe_train.model.classifier import build_classifier, logits_of

    images = np.random.default_rng(0).uniform(0, 255, (2, hub_presets.SIZE, hub_presets.SIZE, 3)).astype("float32")
    for family, pooling in (("dinov2", "Flatten"), ("dinov3", "Flatten"), ("siglip", None),
                            ("mobilenet_v3", "GlobalAveragePooling2D"), ("hgnetv2", "GlobalAveragePooling2D")):
        make_preset(family, tmp_path / family)
        backbone, scaling = hub.build_backbone(str(tmp_path / family), hub_presets.SIZE, "imagenet")
        model = build_classifier(str(tmp_path / family), backbone, 3, 0.0, scaling=scaling,
                                 image_size=hub_presets.SIZE)
        pooled = [layer for layer in model.layers if layer.name == "pool"]
        assert [type(layer).__name__ for layer in pooled] == ([pooling] if pooling else []), family
        scaled = images * np.asarray(scaling[0], "float32") + np.asarray(scaling[1], "float32")
        features = np.asarray(hub.call(backbone, scaled, training=False))
        vector = (features[:, 0] if family.startswith("dino") else features.mean(axis=(1, 2)) if features.ndim == 4
                  else features)
        head = model.get_layer("classifier")
        expected = vector @ np.asarray(head.kernel) + np.asarray(head.bias)
        np.testing.assert_allclose(np.asarray(logits_of(model)(images)), expected, rtol=1e-4, atol=1e-4)
        # and its heatmaps (model/explain.py), two classes of each picture: Integrated Gradients on a
        # transformer's tokens; Grad-CAM on the convolutional presets, built at the job's size whatever
        # theirs (the MobileNet's none): a 4 x 4 map of the MobileNet, HGNetV2's last stage, 4 x 4
        explainer = explain.explainer(model)
        cam = {"mobilenet_v3": "block_1_0 (4 x 4)", "hgnetv2": "stage2 (4 x 4)"}  # (after the backbone's name)
        assert (explainer.method, explainer.where) == (("Grad-CAM", f"{backbone.name}/{cam[family]}") if family in cam
                                                       else ("Integrated Gradients", "the pixels")), (family, explainer)
        np.testing.assert_allclose(np.asarray(explainer.logits(images)), expected, rtol=1e-4, atol=1e-4)
        heat = explainer.heatmaps(images, [0, 1, 2, 0], [0, 0, 1, 1])
        assert len(heat) == 4 and np.isfinite(heat).all() and heat.max() == 1.0, family


def test_a_convolutional_preset_fixed_at_one_size_takes_another_and_its_stages_maps_are_explained_by_grad_cam(
        tmp_path):
    """HGNetV2's preset here fixes 32 px (its config's image_shape), as a preset built at one size
    does: a convolutional backbone is built again at the job's size, its weights the same. Its
    stages' maps come out of one layer (its encoder), which no cut splits: Grad-CAM is at its last
    stage's map, the backbone's own output (8 x 8 at 64 px), and answers as the model does."""
    from keras_pipe_train.model import explain, hub
    from keras_pipe_train.model.classifier import build_classifier, logits_of

    make_preset("hgnetv2", tmp_path / "hgnetv2")
    at_32, _ = hub.build_backbone(str(tmp_path / "hgnetv2"), hub_presets.SIZE, "imagenet")
    backbone, scaling = hub.build_backbone(str(tmp_path / "hgnetv2"), 64, "imagenet")
    assert backbone.input_shape[1:3] == (64, 64) and at_32.input_shape[1:3] == (hub_presets.SIZE,) * 2
    for ours, preset in zip(backbone.get_weights(), at_32.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, preset)
    model = build_classifier(str(tmp_path / "hgnetv2"), backbone, 3, 0.0, scaling=scaling, image_size=64)
    explainer = explain.explainer(model)
    assert (explainer.method, explainer.where) == ("Grad-CAM", f"{backbone.name}/stage2 (8 x 8)"), explainer
    images = np.random.default_rng(0).uniform(0, 255, (2, 64, 64, 3)).astype("float32")
    np.testing.assert_allclose(np.asarray(explainer.logits(images)), np.asarray(logits_of(model)(images)),
                               rtol=1e-4, atol=1e-4)
    heat = explainer.heatmaps(images, [0, 1, 2, 0], [0, 0, 1, 1])
    assert heat.shape == (4, 8, 8) and np.isfinite(heat).all() and heat.max() == 1.0
    assert len({row.tobytes() for row in heat}) > 1  # (the heatmaps of other pictures or classes differ)


def test_under_mixed_precision_a_preset_computes_in_float16_and_its_weights_stay_float32(tmp_path):
    """A preset's config says float32: the job's policy, mixed_float16 with a GPU, is the one used."""
    import keras

    from keras_pipe_train.model import hub

    for family in ("vit", "siglip"):  # (SigLIP: its image tower's own saved dtype replaced too)
        make_preset(family, tmp_path / family)
        keras.config.set_dtype_policy("mixed_float16")
        try:
            backbone, _ = hub.build_backbone(str(tmp_path / family), hub_presets.SIZE, "imagenet")
        finally:
            keras.config.set_dtype_policy("float32")
        assert backbone.compute_dtype == "float16", family
        assert {w.dtype for w in backbone.weights if "float" in w.dtype} == {"float32"}, family
        assert all(layer.compute_dtype == "float16" for layer in backbone.layers[1:]), family
        expected = keras_hub_weights(tmp_path / family)
        for a, b in zip(expected, backbone.weights, strict=True):
            np.testing.assert_array_equal(a, np.asarray(b))


def test_without_an_image_converter_the_checkpoints_own_preprocessing_is_used_or_the_job_says_what_is_missing(
        tmp_path):
    """keras-hub converts a transformers checkpoint's weights but, for most families, not its
    preprocessing: the checkpoint's preprocessor_config.json says it (rescale, then mean and
    deviation). Without either, a clear error. The packages keras-hub's converters import are here."""
    import importlib

    from keras_pipe_train.model import hub

    make_preset("vit", tmp_path / "vit")
    (tmp_path / "vit" / "image_converter.json").unlink()
    with pytest.raises(UserError, match="says nothing of how it scales its input"):
        hub.build_backbone(str(tmp_path / "vit"), hub_presets.SIZE, "imagenet")
    (tmp_path / "vit" / "preprocessor_config.json").write_text(json.dumps(
        {"do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.4, 0.3],
         "image_std": [0.2, 0.25, 0.5]}))
    _, (scale, offset) = hub.build_backbone(str(tmp_path / "vit"), hub_presets.SIZE, "imagenet")
    np.testing.assert_allclose(scale, [1 / 51, 1 / 63.75, 1 / 127.5])
    np.testing.assert_allclose(offset, [-2.5, -1.6, -0.6])
    for module in ("safetensors", "keras_hub.src.utils.transformers.preset_loader",
                   "keras_hub.src.utils.timm.preset_loader"):
        importlib.import_module(module)
