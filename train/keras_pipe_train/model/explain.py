"""Where a classifier built by model/classifier.py looked: a heatmap an image and a class, over the
picture the model saw.

- **Grad-CAM** (Selvaraju et al., ICCV 2017) for a convolutional backbone: the feature map's
  channels weighted by the mean gradient of the class's logit over them, the positive part kept.
  The map is the backbone's last one with at least MIN_SIDE cells a side through which all it
  computes passes (_map_layer): its output at 224 pixels (7 x 7), an earlier stage's where the
  output is coarser (the demo's 32-pixel MobileNetV3 ends at 1 x 1, whose map says nothing of
  where: a 4 x 4 layer of its third stage is taken), as the Grad-CAM paper's own layer study
  allows. The layers below the map run once a picture, those above it forward and back once a
  picture and a class asked of it.
- **Integrated Gradients** (Sundararajan et al., ICML 2017) where Grad-CAM does not fit: a
  transformer's tokens (ViT, DeiT, DINOv2, SigLIP), a JumpStart SavedModel backbone, a backbone
  with no such map but its stem's. The gradients of the class's logit along IG_STEPS images from black
  to the picture, times the picture, summed over the colours, the positive part kept: IG_STEPS + 1
  images through the model and back, an image and a class.

The logit, not the probability: the softmax couples the classes, and a calibration's temperature
scales every logit alike (the heatmap is the same). A test-time flip's mirror image is not
explained: the heatmap is of the picture as given. Adebayo et al.'s sanity check (NeurIPS 2018:
heatmaps of a model whose top layers are re-initialised must differ from the trained model's) is
`randomised`, with `spearman` (tests/job/model/test_explain.py; docs/speed.md has the figure).
"""

from __future__ import annotations

import dataclasses
import time

import keras
import numpy as np
import tensorflow as tf

MIN_SIDE = 4  # cells a side of the map Grad-CAM reads (fewer: where in the picture cannot be told)
# pixels a Grad-CAM call takes, over its rows (a picture and a class each): 24 rows of 224 x 224, 12
# pictures with two classes each (the layers above the map, kept for the backward pass, a row each; those
# below run once a picture and are let go); the demo's 32-pixel pictures all in one call. Its eager calls
# cost most, not the pictures (docs/speed.md, Heatmaps); the budget is checked between them.
GRAD_CAM_PIXELS = 24 * 224 * 224
IG_STEPS = 32  # images along Integrated Gradients' path (its paper: 20 to 300; the heatmap, not the sum, matters here)
OPACITY = 0.5  # of the heatmap over the picture
QUALITY = 85


@dataclasses.dataclass(frozen=True)
class Explainer:
    """heatmaps(images, classes) of one classifier, by Grad-CAM or Integrated Gradients (`method`):
    the model cut in two, `to_map` (images -> the map Grad-CAM reads; Integrated Gradients': the
    images themselves) and `to_logits` (that map -> the logits), of which only the second is
    followed back: Grad-CAM's backward pass runs from the logits to the map, not through the layers
    below it, and a picture asked about two classes goes through them once."""

    method: str  # "Grad-CAM" or "Integrated Gradients"
    to_map: object
    to_logits: object
    where: str  # what the heatmap is of: the layer Grad-CAM reads, or the pixels

    def heatmaps(self, images, classes, rows=None) -> np.ndarray:
        """One heatmap a row (rows x height x width, 0-1, 1 where the class's evidence is highest),
        of the class `classes[i]` of the picture images[rows[i]] (0-255 pictures, as the model
        takes them; `rows` None: a row an image, in order)."""
        images = tf.convert_to_tensor(np.asarray(images, np.float32))
        rows = tf.range(len(classes)) if rows is None else tf.constant(np.asarray(rows, np.int32))
        classes = tf.constant(np.asarray(classes, np.int32))
        if self.method == "Grad-CAM":
            features = tf.gather(self.to_map(images), rows)
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(features)
                chosen = tf.gather(self.to_logits(features), classes, axis=1, batch_dims=1)
            # (the map as computed, float16 under mixed precision: a cast of it is off the logits' path)
            gradients = tf.cast(tape.gradient(chosen, features), tf.float32)
            weights = tf.reduce_mean(gradients, axis=(1, 2), keepdims=True)
            heat = tf.nn.relu(tf.reduce_sum(weights * tf.cast(features, tf.float32), axis=-1))
        else:
            heat = tf.stack([self._integrated(images[row], label) for row, label in zip(rows, classes)])
        heat = heat.numpy().astype(np.float64)
        top = heat.reshape(len(heat), -1).max(axis=1).reshape(-1, 1, 1)
        return np.divide(heat, top, out=np.zeros_like(heat), where=top > 0)

    def logits(self, images):
        return self.to_logits(self.to_map(images))

    def _integrated(self, image, label):
        path = tf.linspace(0.0, 1.0, IG_STEPS + 1)[:, None, None, None] * image[None]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(path)
            chosen = self.logits(path)[:, label]
        gradients = tape.gradient(chosen, path)
        averaged = tf.reduce_mean((gradients[1:] + gradients[:-1]) / 2, axis=0)  # (the trapezoid rule)
        return tf.nn.relu(tf.reduce_sum(averaged * image, axis=-1))  # (image - black: the image itself)


def explainer(model: keras.Model) -> Explainer:
    """Grad-CAM for `model` (a classifier of build_classifier: an optional scaling, the backbone,
    the pooling and the head, in a chain) where its backbone has a map MIN_SIDE cells a side, else
    Integrated Gradients."""
    head = model.get_layer("classifier")
    backbone = next((layer for layer in model.layers if isinstance(layer, keras.Model)), None)
    found = _map_layer(backbone) if backbone is not None else None
    if found is not None:
        try:
            grad_cam = _grad_cam(model, backbone, found, head)
        except ValueError:  # (Keras cannot take the map out of this backbone's graph)
            grad_cam = None
        if grad_cam is not None and _answers_as(model, grad_cam):
            return grad_cam
    return _integrated_gradients(model, head)


def _integrated_gradients(model: keras.Model, head) -> Explainer:
    features = keras.Model(model.input, head.input)
    return Explainer("Integrated Gradients", lambda images: images,
                     lambda images: _logits(features(images, training=False), head), "the pixels")


def _grad_cam(model: keras.Model, backbone: keras.Model, found, head) -> Explainer:
    """The model's layers called in turn, cut at the backbone's map (build_classifier's model is a
    chain: an optional scaling, the backbone, the pooling, the dropout, the head); `found` the
    backbone itself: at its last stage's map, its output (_map_layer)."""
    layers = model.layers[1:]
    position = layers.index(backbone)
    output = _last_map(backbone.output, backbone)
    if found is backbone:
        below, above = lambda x, training=False: _last_map(backbone(x, training=training), backbone), _chain([])
        where, side = _last_stage(backbone.output, backbone), output.shape[1:3]
    elif isinstance(backbone, keras.Sequential):  # (a chain itself: its graph is rebuilt at each build)
        cut = backbone.layers.index(found) + 1
        below, above = _chain(backbone.layers[:cut]), _chain(backbone.layers[cut:])
        where, side = found.name, found.output.shape[1:3]
    else:  # (a cut: _map_layer made sure everything the output says comes through the map)
        below = keras.Model(backbone.input, found.output)
        above = _chain([]) if found.output is output else keras.Model(found.output, output)
        where, side = found.name, found.output.shape[1:3]

    def to_map(images):
        x = _chain(layers[:position])(images)
        return below({next(iter(backbone.input)): x} if isinstance(backbone.input, dict) else x, training=False)

    def to_logits(feature_map):
        x = _last_map(above(feature_map, training=False), backbone)
        return _logits(_chain(layers[position + 1:-1])(x), head)

    return Explainer("Grad-CAM", to_map, to_logits, f"{backbone.name}/{where} ({side[0]} x {side[1]})")


def _last_map(output, backbone):
    """A backbone's output; a keras-hub backbone's that gives each stage's map (HGNetV2): the last
    stage's, as hub.call reads it."""
    if isinstance(output, dict):
        return output[_last_stage(output, backbone)]
    return output


def _last_stage(output: dict, backbone) -> str:
    """The name of the last stage's map in a backbone's dict of them (hub.call reads the same)."""
    return (getattr(backbone, "stage_names", None) or list(output))[-1]


def _chain(layers):
    """The layers called in turn, in inference mode."""
    def call(x, training=False):
        for layer in layers:
            x = layer(x, training=training)
        return x

    return call


def _answers_as(model: keras.Model, explainer: Explainer) -> bool:
    """Whether the chain of layers answers as the model, on random pictures (a model of another
    shape, which Grad-CAM's pass would not compute right, does not)."""
    images = np.random.default_rng(0).uniform(0, 255, (2, *model.input_shape[1:])).astype(np.float32)
    try:
        logits = explainer.logits(tf.constant(images))
    except Exception:  # (a layer that cannot be called so: Integrated Gradients needs none of this)
        return False
    ours = model.get_layer("classifier").activation(logits).numpy()
    return bool(np.allclose(ours, keras.ops.convert_to_numpy(model(images, training=False)), atol=1e-3))


def _logits(features, head):
    return tf.matmul(tf.cast(features, tf.float32), tf.cast(head.kernel, tf.float32)) + tf.cast(head.bias, tf.float32)


def _map_layer(backbone: keras.Model):
    """The backbone's last layer (in Keras' order: by depth) whose output is a map MIN_SIDE cells a
    side or more and a cut of the backbone (everything its output says comes through it:
    keras.Model(that map, the output) builds; a layer inside a residual or an Inception branch is
    not one); a backbone giving its stages' maps (keras-hub's HGNetV2) is read at its last stage's.
    None for a transformer (its output is tokens, Grad-CAM's map is not theirs), a backbone whose
    output is pooled already, or one whose only such cut is its picture or its stem."""
    output = _last_map(backbone.output, backbone)
    if len(output.shape) != 4:
        return None
    if isinstance(backbone.output, dict) and min(output.shape[1] or 0, output.shape[2] or 0) >= MIN_SIDE:
        # (its stages' maps come out of one layer, HGNetV2's encoder, which no cut can split: the last
        # stage's map is the backbone's own output, the deepest map there is)
        return backbone
    layers = backbone.layers
    first = next((i for i, layer in enumerate(layers) if layer.weights), len(layers))
    for position in range(len(layers) - 1, first, -1):  # (at or before the first weights: the picture, the stem)
        layer = layers[position]
        if isinstance(layer, keras.layers.ZeroPadding2D):  # (its border is no part of the picture)
            continue
        try:
            shape = layer.output.shape
        except (AttributeError, ValueError):  # (a layer called more than once, or giving several outputs)
            continue
        if len(shape) != 4 or not (shape[1] and shape[2]) or min(shape[1], shape[2]) < MIN_SIDE:
            continue
        if layer.output is output or _is_cut(layer.output, output):
            return layer
    return None


def _is_cut(tensor, output) -> bool:
    try:
        keras.Model(tensor, output)
    except ValueError:  # ("not connected": the output has inputs beside this map)
        return False
    return True


def drawn(explainer: Explainer, pictures: np.ndarray, asked: list[list[tuple[str, int]]], size: int,
          budget_s: float | None = None, stop=None) -> list[tuple[tuple[str, int, bytes], ...]]:
    """For each of `pictures` (0-255), the overlays (`size` pixels) of the classes `asked` of it
    ((what, class) pairs: ("predicted", 3), ("label", 5)), as (what, class, JPEG); until
    `budget_s` seconds are gone (None: no bound) or `stop` (a threading.Event) is set, the pictures
    after getting none. Grad-CAM takes as many pictures a call as GRAD_CAM_PIXELS allows, every
    class asked of them in the same call (its eager calls cost most, not the images); Integrated
    Gradients one picture at a time (IG_STEPS + 1 images a class). The budget is checked before
    each: a call already begun ends (Integrated Gradients on a large model: a picture's time past
    the budget)."""
    started = time.monotonic()
    found: list[tuple] = [() for _ in pictures]
    rows = max((len(classes) for classes in asked), default=1) or 1
    step = max(1, GRAD_CAM_PIXELS // (rows * int(np.prod(pictures.shape[1:3])))) \
        if explainer.method == "Grad-CAM" else 1
    for start in range(0, len(pictures), step):
        if (budget_s is not None and time.monotonic() - started > budget_s) or (stop is not None and stop.is_set()):
            break
        chosen = [(i, what, label) for i in range(start, min(start + step, len(pictures))) for what, label in asked[i]]
        if not chosen:
            continue
        heat = explainer.heatmaps(pictures[start:start + step], [label for _, _, label in chosen],
                                  [i - start for i, _, _ in chosen])
        for row, (i, what, label) in zip(heat, chosen):
            found[i] += ((what, label, overlay(pictures[i], row, size)),)
    return found


def overlay(image: np.ndarray, heat: np.ndarray, size: int | None = None) -> bytes:
    """`heat` (0-1, any size) over `image` (0-255, height x width x 3), both resized to `size`
    pixels on the longer side (None: the image's), as a JPEG: blue where the class's evidence is
    none, through green and yellow, red where it is highest."""
    height, width = image.shape[:2]
    if size:
        scale = size / max(height, width)
        height, width = max(1, round(height * scale)), max(1, round(width * scale))
    picture = tf.image.resize(np.asarray(image, np.float32), (height, width), antialias=True)
    heat = tf.image.resize(np.asarray(heat, np.float32)[..., None], (height, width), method="bilinear")[..., 0]
    blended = (1 - OPACITY) * picture + OPACITY * _colours(tf.clip_by_value(heat, 0.0, 1.0))
    return tf.io.encode_jpeg(tf.cast(tf.clip_by_value(tf.round(blended), 0, 255), tf.uint8), quality=QUALITY).numpy()


# blue, cyan, green, yellow, red at 0, 0.25, 0.5, 0.75, 1 (a jet-like ramp: the heatmaps' convention)
_RAMP = np.array([[0, 0, 255], [0, 255, 255], [0, 255, 0], [255, 255, 0], [255, 0, 0]], np.float32)


def _colours(heat):
    position = heat * (len(_RAMP) - 1)
    low = tf.clip_by_value(tf.cast(tf.floor(position), tf.int32), 0, len(_RAMP) - 2)
    share = (position - tf.cast(low, tf.float32))[..., None]
    return (1 - share) * tf.gather(_RAMP, low) + share * tf.gather(_RAMP, low + 1)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two heatmaps' cells (ties ranked by their mean); 0 where
    either is constant."""
    ranks = [_ranks(np.asarray(x, np.float64).ravel()) for x in (a, b)]
    if any(np.ptp(r) == 0 for r in ranks):
        return 0.0
    return float(np.corrcoef(*ranks)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def randomised(model: keras.Model, count: int, seed: int = 0) -> keras.Model:
    """A copy of `model` whose head and the top `count` of its backbone's layers with weights (the
    innermost: a block of layers counts each of its own) are re-initialised by their own
    initializers (Adebayo et al.'s cascading randomisation), the rest as trained."""
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    backbone = next((layer for layer in copy.layers if isinstance(layer, keras.Model)), None)
    chosen = [copy.get_layer("classifier")]
    if backbone is not None:
        chosen += [layer for layer in reversed(list(_leaves(backbone))) if layer.weights][:count]
    for number, layer in enumerate(chosen):
        for variable in layer.weights:
            initializer = _initializer(layer, variable)
            if hasattr(initializer, "seed"):  # (seeded: the same copy each time)
                initializer = type(initializer).from_config({**initializer.get_config(), "seed": seed + number})
            variable.assign(initializer(variable.shape, dtype=variable.dtype))
    return copy


def _leaves(layer):
    """The layers inside `layer`, in order, a model's or a block's own layers in place of it."""
    inner = getattr(layer, "layers", None)
    if not inner:
        yield layer
        return
    for each in inner:
        yield from _leaves(each)


# a variable's initializer, by its name, where the layer's attribute is not "<name>_initializer"
_INITIALIZERS = {"depthwise_kernel": "depthwise_initializer", "pointwise_kernel": "pointwise_initializer"}


def _initializer(layer, variable):
    """The layer's own initializer of `variable` (Keras 3 names DepthwiseConv2D's "kernel", its
    initializer depthwise_initializer); glorot_uniform or zeros where the layer has none to say
    (a layer of keras-hub's own), ones for a scale or a variance."""
    name = variable.name.split("/")[-1]
    names = [_INITIALIZERS.get(name, f"{name}_initializer")]
    if isinstance(layer, keras.layers.DepthwiseConv2D) and name == "kernel":
        names.insert(0, "depthwise_initializer")
    for attribute in names:
        found = getattr(layer, attribute, None)
        if found is not None:
            return keras.initializers.get(found)
    if len(variable.shape) > 1:
        return keras.initializers.GlorotUniform()
    return keras.initializers.Ones() if name in ("gamma", "scale", "moving_variance") else keras.initializers.Zeros()
