"""Layer-wise learning-rate decay (layer_decay): the backbone's lower blocks fine-tune at smaller
learning rates than its top, as BEiT's (Bao et al., ICLR 2022) and MAE's fine-tuning do (0.65 for a
ViT-B, 0.75 for a ViT-L) and AutoGluon's image predictor does by default (0.9, through timm's
param_groups_layer_decay).

Numbered as timm's param_groups_layer_decay numbers them (layers()): the stem is layer 0, the
blocks 1 to n; a weight of layer i trains at the phase's learning rate x decay ** (n + 1 - i), so
the top block (and what follows it: a final norm, a head convolution) at rate x decay, and the new
head at the rate itself. (BEiT's own code puts the final norm with the head, at the rate.)

A block is read from the weights' paths, which name the layers that hold them: the outermost layer
naming a block, stage or layer with its number (`transformer_block_3`, `encoder/layers_3`,
`conv4_block2`, `block2a`, `expanded_conv_7`, `stage_1_block_2`, keras-hub MobileNet's `block_2_0`,
InceptionResNetV2's `block35_4`). A backbone whose weights name fewer than two blocks (InceptionV3's
`conv2d_57`), or blocks of very uneven sizes (NASNet's cells), is cut into FALLBACK_GROUPS groups of
as many weighted layers each, in order.

Keras' optimizers take one learning rate; each variable's update step is given it (update_step's
`learning_rate` argument), so the scale is applied there: for every optimizer the step is then
exactly the one at the scaled rate (for Adam, scaling the gradient instead would change nothing).
The decoupled weight decay is scaled alike, as timm's parameter groups scale it (Keras applies it
apart, at the optimizer's one rate)."""

from __future__ import annotations

import collections
import functools
import logging
import re
import statistics

import keras

log = logging.getLogger(__name__)


# a block's name: a word then its number (`block_2_0`, a stage's block, keeps its second number);
# a stage's (`stage_1`, `stack2`) names the block where no finer name is given
def _named(words: str) -> re.Pattern:
    return re.compile(rf"(?:^|_)(?:{words})(?:\d+[a-z]?(?![a-z])|_\d+(?:_\d+(?![a-z\d]))?)")


_BLOCK = _named("blocks|block_stem|block_reduce|block|layers|layer|expanded_conv|cell|mixed")  # (NASNet's cells too)
_STAGE = _named("stages|stage|stack")
# named whole, before the others: InceptionResNetV2's units (block35_1: the 1st of type 35), and the
# MobileNets' first inverted residual block, the one of no number (expanded_conv_depthwise ...)
_WHOLE = re.compile(r"^block\d+_\d+(?=_|$)|^expanded_conv(?=_[a-z])")
_DOWNSAMPLING = "downsampl"  # a stage's downsampling belongs to the next block, as timm groups it
FALLBACK_GROUPS = 12
UNEVEN = 4  # named blocks whose largest holds more than this x the median's weighted layers: not used


def block_of(path: str) -> str | None:
    """The block a weight's path names, as the path up to the block's name (the outermost layer
    naming a block, else a stage); None where it names neither, or names a downsampling."""
    segments = path.split("/")[:-1]  # (the last segment is the weight's own name: kernel, gamma ...)
    if any(_DOWNSAMPLING in segment for segment in segments):
        return None
    for index, segment in enumerate(segments):
        whole = _WHOLE.match(segment)
        if whole:
            return "/".join([*segments[:index], whole.group()])
    for pattern in (_BLOCK, _STAGE):
        for index, segment in enumerate(segments):
            found = list(pattern.finditer(segment))
            if found:
                return "/".join([*segments[:index], segment[:found[-1].end()]])
    return None


def layers(backbone: keras.Model) -> tuple[dict[int, int], int, str]:
    """({id(weight): its layer number, 0 to n}, n, how the blocks were found) for every weight of
    the backbone, trainable or not (phases change which train). As timm's param_groups_layer_decay
    numbers them: the stem (what comes before the first block) 0, the blocks 1 to n in the order
    they compute; a layer between two blocks (a downsampling, a shortcut's projection, an
    Inception unit's branches) belongs to the block after it, and what follows the last block (a
    final norm, a head convolution) to the last block (timm's MATCH_PREV_GROUP)."""
    weights = backbone.weights
    blocks = [block_of(w.path) for w in weights]
    order = list(dict.fromkeys(b for b in blocks if b is not None))
    owners = [w.path.rsplit("/", 1)[0] for w in weights]  # (the layer each weight is of)
    if len(order) >= 2:
        number = {block: index + 1 for index, block in enumerate(order)}
        numbers, upcoming = {}, len(order)  # (after the last block: the last)
        for index in range(len(weights) - 1, -1, -1):  # (backwards: a weight of no block takes the next one's)
            if blocks[index] is not None:
                upcoming = number[blocks[index]]
            numbers[index] = upcoming
        first = next(index for index, block in enumerate(blocks) if block is not None)
        numbers.update(dict.fromkeys(range(first), 0))  # (before the first block: the stem)
        held = collections.Counter(number for number, _ in {(numbers[i], owners[i]) for i in numbers})
        sizes = [held[n] for n in range(1, len(order) + 1)]  # (each block's weighted layers)
        if max(sizes) <= UNEVEN * statistics.median(sizes):
            return ({id(w): numbers[i] for i, w in enumerate(weights)}, len(order),
                    f"{len(order)} blocks named in its weights' paths ({order[0]} ... {order[-1]})")
        how = (f"the blocks its weights' paths name are uneven ({max(sizes)} weighted layers in the largest, "
               f"{statistics.median(sizes):g} in the median): ")
    else:
        how = "no blocks named in its weights' paths: "
    ordered = list(dict.fromkeys(owners))  # (the weighted layers, in order)
    group = {owner: 1 + index * FALLBACK_GROUPS // len(ordered) for index, owner in enumerate(ordered)}
    return ({id(w): group[owner] for w, owner in zip(weights, owners)}, FALLBACK_GROUPS,
            f"{how}{len(ordered)} weighted layers in {FALLBACK_GROUPS} groups, in order")


def scales(backbone: keras.Model, decay: float) -> tuple[dict[int, float], str]:
    """({id(weight): its learning rate's scale} for the backbone's weights, a line saying how)."""
    numbers, count, how = layers(backbone)
    by_weight = {key: decay ** (count + 1 - number) for key, number in numbers.items()}
    return by_weight, (f"layer_decay={decay:g}: the backbone's {how}; its stem at {decay ** (count + 1):.3g} x the "
                       f"phase's learning rate, its top block at {decay:g} x, the head at 1 x")


@functools.cache
def decayed(optimizer_class: type) -> type:
    """`optimizer_class` whose every variable's step takes the learning rate x its scale
    (`layer_scales`, {id(variable): scale}; 1 for a variable not in it: the head)."""

    class LayerDecayed(optimizer_class):
        layer_scales: dict[int, float] = {}

        def build(self, variables):
            # in the order of the variables given: _get_variable_index's
            self._scale_of_index = [self.layer_scales.get(id(v), 1.0) for v in variables]
            log.info("layer_decay: %d of the %d weights this phase trains at a lower rate than the head's",
                     sum(scale < 1 for scale in self._scale_of_index), len(variables))
            super().build(variables)

        def _apply_weight_decay(self, variables):
            pass  # (in update_step: at each variable's own rate)

        def update_step(self, gradient, variable, learning_rate):
            scale = self._scale_of_index[self._get_variable_index(variable)]
            if scale != 1.0:
                learning_rate = learning_rate * scale
            if self.weight_decay is not None and self._use_weight_decay(variable):
                decay = keras.ops.cast(self.weight_decay, variable.dtype)
                variable.assign(variable - variable * decay * keras.ops.cast(learning_rate, variable.dtype))
            super().update_step(gradient, variable, learning_rate)

    LayerDecayed.__name__ = LayerDecayed.__qualname__ = f"LayerDecayed{optimizer_class.__name__}"
    return LayerDecayed
