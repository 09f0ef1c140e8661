"""keras-hub's image backbones as the job's backbone: ViT, DeiT, DINOv2 and v3, SigLIP's vision tower,
Swin, and timm's EfficientNets, MobileNets and ResNets (settings/backbones.py lists their presets).

Where the preset comes from, first found:
  1. the `pretrained` channel, holding a preset folder (config.json, metadata.json, model.weights.h5,
     image_converter.json: what `save_to_preset` writes), as files or as one .tar.gz. It is used whatever
     handle `backbone` names: the way to train without internet access (network isolation);
  2. a folder in the image: `backbone` as its absolute path, or a preset baked into the image
     (docker build --build-arg BAKE_WEIGHTS=<preset or handle>: $KERAS_HOME/presets, baked_folder);
  3. keras-hub's download of the preset or handle (Kaggle, Hugging Face, ModelScope), cached in
     KAGGLEHUB_CACHE / HF_HOME.

What the job takes from it: the backbone (the vision tower of a two-tower model such as SigLIP), its
weights unless weights=none (or a .h5 file's: a previous job's backbone.weights.h5, weights=pretrained),
and its image converter's scale and offset, which the classifier holds as a fixed 1x1 convolution
(model/classifier.py), so training, validation, the exported SavedModel and serving all scale as the
preset does. The converter's resizing is not used: the input pipeline resizes (resize,
resize_interpolation), as for every backbone.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

import keras
import numpy as np

from keras_pipe_train.model.archives import unpack
from keras_pipe_train.model.weights_file import load_backbone_weights
from keras_pipe_train.settings.backbones import HUB_PRESETS, is_hub
from keras_pipe_train.settings.channels import PRETRAINED
from keras_pipe_train.settings.errors import UserError

log = logging.getLogger(__name__)

PRESET_FILES = ("config.json", "metadata.json")  # (what keras-hub's loader needs of a preset folder)
SCALING_LAYER = "preset_preprocessing"  # (model/classifier.py's input_scaling names it so for a preset's)
NAME = "hub"  # the classifier's name: "hub_classifier" (a handle holds characters Keras refuses in names)


@functools.cache  # (an archive is unpacked once: the weights' resolution and the build both ask)
def classifier_prefix(backbone: str) -> str:
    """The name a classifier of backbone `backbone` is given before "_classifier": the backbone's, or
    NAME for any keras-hub one (a handle holds characters Keras refuses in names)."""
    return NAME if is_hub(backbone) else backbone


def channel_preset(folder: Path) -> Path | None:
    """The preset folder in the `pretrained` channel's `folder`: its files, or one .tar.gz of them
    (unpacked into a temporary folder, removed at exit). None when it holds neither (a .h5 file)."""
    if not folder.is_dir():
        return None
    found = _preset_folders(folder)
    if len(found) > 1:
        raise UserError(f"channel '{PRETRAINED}' holds {len(found)} keras-hub presets "
                        f"({', '.join(str(f.relative_to(folder)) or '.' for f in found)}): give it one")
    if found:
        return found[0]
    archives = sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith((".tar.gz", ".tgz")))
    if not archives:
        return None
    if len(archives) > 1:
        raise UserError(f"channel '{PRETRAINED}' holds {len(archives)} archives "
                        f"({', '.join(p.name for p in archives)}): give it one keras-hub preset")
    work = Path(tempfile.mkdtemp(prefix="hub-preset-"))
    _removed_at_exit(work)
    unpack(archives[0], work, PRETRAINED)
    found = _preset_folders(work)
    if len(found) != 1:
        raise UserError(f"channel '{PRETRAINED}': {archives[0].name} must hold one keras-hub preset (a folder with "
                        f"{' and '.join(PRESET_FILES)}, as save_to_preset writes); it holds {len(found)}")
    return found[0]


def _preset_folders(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob(PRESET_FILES[0])
                  if all((p.parent / name).is_file() for name in PRESET_FILES))


def _removed_at_exit(folder: Path) -> None:
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


def build_backbone(name: str, image_size: int, weights: str | None,
                   channel: Path | None = None) -> tuple[keras.Model, tuple[tuple[float, ...], tuple[float, ...]]]:
    """(the backbone: images in its own scaling -> features, its scaling from [0, 255] RGB as
    (scale, offset) per channel). `weights`: "imagenet" or "pretrained" (the preset's own), None
    (its architecture, randomly initialised) or a .h5 file; `channel`: the `pretrained` channel's folder.

    The classifier calls it in inference mode (classifier.py), its dropout and stochastic depth off,
    as every pretrained backbone here. (keras-hub 0.32's DINOv2 and DINOv3 stochastic depth cannot
    run in training anyway: their DropPath adds its uniform draw to the keep probability without
    flooring it, so it scales instead of dropping, and builds its noise shape from the static batch
    size, None in a model, which fails.)"""
    keras_hub = _keras_hub()
    preset = channel_preset(channel) if channel is not None else None
    if weights == "pretrained" and preset is None:
        raise UserError(f"hyperparameter weights=pretrained with backbone {name}: channel '{PRETRAINED}' must hold "
                        "its keras-hub preset (a folder, or a .tar.gz, with config.json, metadata.json and "
                        "model.weights.h5) or one .h5 weights file of it")
    baked = baked_folder(name)
    source = str(preset) if preset else str(baked) if baked.is_dir() else name
    if preset:
        log.info("backbone %s: the keras-hub preset in channel '%s' (%s), in place of downloading it", name,
                 PRETRAINED, preset.name)
    elif baked.is_dir():
        log.info("backbone %s: the keras-hub preset baked into the image (%s), in place of downloading it", name,
                 baked)
    elif name.startswith("/") and not Path(name).is_dir():
        raise UserError(f"hyperparameter backbone={name}: no such folder in the image (a keras-hub preset folder, "
                        f"with {' and '.join(PRESET_FILES)})")
    from_file = weights not in (None, "imagenet", "pretrained")
    load_weights = weights is not None and not from_file
    backbone = _vision(_loaded(keras_hub, source, name, load_weights, **_sized_from_its_config(source, image_size)))
    overrides = _overrides(backbone, name, image_size)
    if overrides:  # (built again as asked: the preset's config, these values in place of its own)
        backbone = _vision(_loaded(keras_hub, source, name, load_weights, **overrides))
    backbone = _sized(backbone, name, image_size)
    if from_file:
        load_backbone_weights(backbone, Path(weights), name)
    return backbone, _scaling(keras_hub, source, name)


def baked_folder(name: str) -> Path:
    """Where the image keeps a preset baked in (docker build --build-arg BAKE_WEIGHTS=NAME):
    $KERAS_HOME/presets/<the name, its / and : as _>, beside the applications' ImageNet files."""
    home = Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras")
    return home / "presets" / re.sub(r"[^A-Za-z0-9_.-]", "_", name.strip("/"))


def bake(name: str) -> Path:
    """Downloads the preset `name` (a preset name, a handle, or a folder) and saves it, its image
    converter beside it, where the job finds it first (baked_folder)."""
    keras_hub = _keras_hub()
    folder = baked_folder(name)
    backbone = _loaded(keras_hub, name, name, load_weights=True)
    scale, offset = _scaling(keras_hub, name, name)  # (its converter's, or its checkpoint's preprocessing)
    folder.mkdir(parents=True, exist_ok=True)
    backbone.save_to_preset(str(folder))
    keras_hub.layers.ImageConverter(scale=list(scale), offset=list(offset)).save_to_preset(str(folder))
    return folder


def _keras_hub():
    try:
        import keras_hub
    except ImportError as err:  # (a launcher-only install: the job's image has it)
        raise UserError(f"a keras-hub backbone needs the keras-hub package, which is not installed here ({err})"
                        ) from err
    return keras_hub


def _loaded(keras_hub, source: str, name: str, load_weights: bool, **overrides) -> keras.Model:
    # (a preset's config names its dtype, float32, which would keep it out of the job's mixed precision:
    # the job's policy, set before the model is built, is passed in its place)
    policy = keras.config.dtype_policy().name
    try:
        return keras_hub.models.Backbone.from_preset(source, load_weights=load_weights, dtype=policy, **overrides)
    except Exception as err:  # keras-hub raises ValueError, FileNotFoundError or network errors
        raise UserError(_unreachable(name, source, err)) from err


def _unreachable(name: str, source: str, err: Exception) -> str:
    said = f"{type(err).__name__}: {str(err)[:400]}"
    if isinstance(err, ImportError):  # (not the network: this checkpoint's format needs a package)
        return (f"backbone {name}: keras-hub needs a package this installation lacks to load it ({said}); "
                "keras-hub's Keras presets and timm's and transformers' checkpoints of the architectures it converts "
                "load with what the image has")
    if source != name:
        return f"backbone {name}: the keras-hub preset at {source} could not be loaded ({said})"
    known = "" if name in HUB_PRESETS or "://" in name or name.startswith("/") else " (not a preset keras-hub lists)"
    return (f"backbone {name}{known}: keras-hub could not load it ({said}). Without internet access (network "
            f"isolation), or to pin it, put its preset in a '{PRETRAINED}' channel: the folder (or a .tar.gz of it) "
            "that keras_hub.models.Backbone.from_preset(...).save_to_preset(folder) writes, with the image "
            f"converter's beside it; or bake it into the image (docker build --build-arg BAKE_WEIGHTS={name}: it "
            f"is kept in {baked_folder(name).parent}, where the job looks first). Kaggle handles may also need "
            "KAGGLE_USERNAME and KAGGLE_KEY, and gated Hugging Face models HF_TOKEN")


def _vision(backbone: keras.Model) -> keras.Model:
    """A two-tower model's image tower (SigLIP, CLIP), else the backbone itself. The tower keeps the
    dtype its saved config names (keras-hub passes the one asked for to the towers only where their
    config has none, and a saved preset's has): it is built again under the job's dtype policy."""
    tower = getattr(backbone, "vision_encoder", None)
    if tower is None:
        return backbone
    policy = keras.config.dtype_policy().name
    if tower.dtype_policy.name != policy:
        rebuilt = type(tower).from_config({**tower.get_config(), "dtype": policy})
        rebuilt.set_weights(tower.get_weights())
        tower = rebuilt
    return tower


def _sized_from_its_config(source: str, image_size: int) -> dict:
    """For a preset in a folder (the channel's, a baked one) whose image size can be the job's
    (_resizable: DINOv2's 518 px, DINOv3's 224, a convolutional one's, fixed or none), its image
    size set from its config.json before it loads, so that it loads once, not twice (_overrides)."""
    try:
        saved = json.loads((Path(source) / PRESET_FILES[0]).read_text())
        key = _shape_key(saved["config"])
        shape = saved["config"][key]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    resizable = _resizable(saved.get("class_name", ""), saved["config"])
    return {key: (image_size, image_size, 3)} if resizable and shape[0] != image_size else {}


def _shape_key(config: dict) -> str:
    """The config's name for the backbone's input shape: image_shape, or EfficientNet's input_shape."""
    return "input_shape" if "input_shape" in config and "image_shape" not in config else "image_shape"


def _resizable(class_name: str, config: dict) -> bool:
    """Whether a backbone takes images of other sizes than its preset's: a convolutional one (no
    patches: its weights are its kernels', whatever the picture's size; a preset may still fix its
    image_shape, as HGNetV2's built at one size does); of the transformers, DINOv2, which
    interpolates its position embeddings (position_embedding_shape), and DINOv3, whose are rotary
    (RoPE): any multiple of its patch."""
    return ("position_embedding_shape" in config or class_name.startswith("DINOV3")
            or "patch_size" not in json.dumps(config, default=str))  # (nested: SigLIP's vision tower)


def _overrides(backbone: keras.Model, name: str, image_size: int) -> dict:
    """What the preset's config must say otherwise for this job: its image size. Convolutional
    backbones take any, and are built at the job's, whether the preset fixed another or none: a
    backbone whose maps have a known size is one Grad-CAM can read (model/explain.py: Integrated
    Gradients instead costs 33 passes an image and a class); a transformer's position embeddings
    are for its preset's grid: DINOv2 interpolates them and DINOv3's are rotary (each built at the
    job's size), the others take their preset's size only."""
    shape = _image_shape(backbone)
    resizable = _resizable(type(backbone).__name__, backbone.get_config())
    if shape[0] == image_size or (shape[0] is None and not resizable):
        return {}
    if not resizable:
        raise UserError(f"backbone {name} takes {shape[0]} x {shape[1]} images only (its position embeddings are "
                        f"for that grid of patches): set hyperparameter image_size={shape[0]}; got {image_size}")
    return {_shape_key(backbone.get_config()): (image_size, image_size, 3)}


def _sized(backbone: keras.Model, name: str, image_size: int) -> keras.Model:
    """`backbone`, built again at `image_size`, as asked: a size it kept otherwise (a config that
    names its input's shape in a way the rebuild did not reach: Keras drops an argument a model
    does not know, silently) is a UserError, not a model of another size."""
    shape = _image_shape(backbone)
    if shape[0] not in (None, image_size):
        raise UserError(f"backbone {name} was built again at {image_size} x {image_size} pixels (hyperparameter "
                        f"image_size) and still takes {shape[0]} x {shape[1]} images: set image_size={shape[0]}")
    return backbone


def _image_shape(backbone: keras.Model) -> tuple:
    inputs = backbone.input
    tensor = next(iter(inputs.values())) if isinstance(inputs, dict) else inputs
    return tuple(tensor.shape[1:3])


def image_size_of(backbone: keras.Model) -> int | None:
    """The side of the images the backbone takes; None when any size will do."""
    return _image_shape(backbone)[0]


def _scaling(keras_hub, source: str, name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The preset's input scaling (scale, offset per channel): its image converter's, or, where
    keras-hub gives none (it converts a transformers checkpoint's weights but, for most families,
    not its preprocessing), the checkpoint's own preprocessor_config.json."""
    why = "keras-hub gives none for it"
    try:
        converter = keras_hub.layers.ImageConverter.from_preset(source)
    except Exception as err:  # (no image_converter.json: keras-hub raises FileNotFoundError or ValueError)
        converter, why = None, f"{type(err).__name__}: {str(err)[:300]}"
    if converter is not None:
        scale, offset = _per_channel(converter.scale, 1.0), _per_channel(converter.offset, 0.0)
    else:
        found = _transformers_preprocessing(source)
        if found is None:
            raise UserError(f"backbone {name}: its preset says nothing of how it scales its input: no image converter "
                            f"(image_converter.json: {why}) and no preprocessor_config.json; save the preset with its "
                            "converter (ImageConverter.save_to_preset into the same folder)")
        scale, offset = found
    log.info("backbone %s scales its input as its preset does: x * %s + %s", name,
             [round(v, 6) for v in scale], [round(v, 6) for v in offset])
    return scale, offset


def _per_channel(value, default: float) -> tuple[float, ...]:
    array = np.broadcast_to(np.asarray(default if value is None else value, np.float64).reshape(-1), (3,))
    return tuple(float(v) for v in array)


def _transformers_preprocessing(source: str):
    """(scale, offset) from a transformers checkpoint's preprocessor_config.json (do_rescale with
    rescale_factor, then do_normalize with image_mean and image_std), in a folder or on Hugging
    Face; None without one."""
    try:
        if source.startswith("hf://"):
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(source.removeprefix("hf://").strip("/"), "preprocessor_config.json"))
        else:
            path = Path(source) / "preprocessor_config.json"
        config = json.loads(path.read_text())
    except Exception:  # (none there, or unreadable: the caller says what is missing)
        return None
    rescale = float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else 1.0
    normalize = config.get("do_normalize", True)
    mean = _per_channel(config.get("image_mean") if normalize else None, 0.0)
    std = _per_channel(config.get("image_std") if normalize else None, 1.0)
    return tuple(rescale / s for s in std), tuple(-m / s for m, s in zip(mean, std))


def pooled(backbone: keras.Model, features):
    """Any backbone's features as one vector an image, as keras-hub's own classifiers pool them: a
    feature map averaged; a transformer's tokens by their class token where it has one (ViT, DeiT,
    DINOv2/v3: the first), else averaged; a vector (SigLIP's attention-pooled head, a SavedModel's
    pooled features) as it is. Plain Keras layers, so a saved .keras model loads without this project."""
    if len(features.shape) == 4:
        return keras.layers.GlobalAveragePooling2D(name="pool")(features)
    if len(features.shape) == 3:
        if _has_class_token(backbone):
            tokens = features.shape[1]
            first = keras.layers.Cropping1D((0, tokens - 1), name="class_token")(features)
            return keras.layers.Flatten(name="pool")(first)
        return keras.layers.GlobalAveragePooling1D(name="pool")(features)
    return features


def _has_class_token(backbone: keras.Model) -> bool:
    config = backbone.get_config()
    if "use_class_token" in config:
        return bool(config["use_class_token"])
    # (DeiT's first token is its class token, the second its distillation token: the first is read,
    # as keras-hub's DeiTImageClassifier reads it; CLIP's and MetaCLIP 2's towers put theirs first too)
    return type(backbone).__name__.startswith(("DINO", "DeiT", "CLIP", "MetaCLIP"))


def call(backbone: keras.Model, images, **kwargs):
    """The backbone's features of `images`. Some take them by name in a dict (SigLIP's vision tower:
    "images"; DINOv3: "pixel_values"); some give a dict of their stages' feature maps (HGNetV2), of
    which keras-hub's own classifier reads the last stage's, as here."""
    inputs = backbone.input
    features = backbone({next(iter(inputs)): images} if isinstance(inputs, dict) else images, **kwargs)
    if isinstance(features, dict):
        stages = getattr(backbone, "stage_names", None) or list(features)
        features = features[stages[-1]]
    return features


def rebuilt(model: keras.Model, image_size: int) -> tuple[keras.Model, tuple[tuple[float, ...], tuple[float, ...]]]:
    """The keras-hub backbone of a previous job's model (incremental training), rebuilt from its own
    config (no preset needed: its weights are copied in after, incremental.continue_from), and the
    scaling that model holds."""
    previous = next(layer for layer in model.layers if isinstance(layer, keras.Model))
    name = f"{previous.name} (the previous model's, in channel 'model')"
    overrides = _overrides(previous, name, image_size)
    backbone = _sized(type(previous).from_config({**previous.get_config(), "dtype": keras.config.dtype_policy().name,
                                                  **overrides}), name, image_size)
    kernel, offset = model.get_layer(SCALING_LAYER).get_weights()
    return backbone, (tuple(float(v) for v in np.diag(kernel[0, 0])), tuple(float(v) for v in offset))


def load_keras_file(model_file: Path) -> keras.Model:
    """A saved .keras model (a job's model.keras), uncompiled, in Keras' safe mode, keras-hub imported
    first where it names its classes; Keras' own exception where it cannot be loaded (ValueError,
    TypeError, zipfile's and h5py's: each caller says which file, in its own words)."""
    register_if_named(model_file)
    return keras.saving.load_model(model_file, compile=False, safe_mode=True)


def register_if_named(model_file: Path) -> None:
    """Imports keras-hub before a saved .keras model that names its classes is loaded (Keras finds
    them only once they are registered), and only then: it takes seconds to import."""
    try:
        with zipfile.ZipFile(model_file) as archive:
            named = b"keras_hub" in archive.read("config.json")
    except (OSError, KeyError, zipfile.BadZipFile):
        return  # (Keras' own load says what is wrong with the file)
    if named:
        _keras_hub()
