"""Layer-wise learning-rate decay (layer_decay): the backbone's lower blocks fine-tune at smaller
learning rates than its top, as BEiT (Bao et al., ICLR 2022), MAE and DINOv2's fine-tuning do and
AutoGluon's image predictor does by default (0.9, through timm's param_groups_layer_decay).

As timm and BEiT number them: the backbone's stem (what comes before its first block) is layer 0,
its blocks 1 to n in the order they compute, what comes after its last block (a final norm) n + 1;
a weight of layer i trains at the phase's learning rate x decay ** (n + 1 - i). The head trains
at the learning rate itself; so does a final norm.

A block is read from the weights' paths, which name the layers that hold them: the last segment
naming a block, stage or layer with its number (`transformer_block_3`, `encoder/layers_3`,
`conv4_block2`, `block2a`, `expanded_conv_7`, `stage_1_block_2`, keras-hub MobileNet's `block_2_0`).
A layer between two blocks (a downsampling) belongs to the block before it. A backbone whose
weights name fewer than two blocks (Inception's `conv2d_57`) is cut into FALLBACK_GROUPS groups of
as many weighted layers each, in order.

Keras' optimizers take one learning rate; each variable's update step is given it (update_step's
`learning_rate` argument), so the scale is applied there: for every optimizer the step is then
exactly the one at the scaled rate (for Adam, scaling the gradient instead would change nothing).
The decoupled weight decay is scaled alike, as timm's parameter groups scale it (Keras applies it
apart, at the optimizer's one rate)."""

from __future__ import annotations

import functools
import re

import keras


# a block's name: a word then its number (`block_2_0`, a stage's block, keeps its second number);
# a stage's (`stage_1`, `stack2`) names the block where no finer name is given
def _named(words: str) -> re.Pattern:
    return re.compile(rf"(?:^|_)(?:{words})(?:\d+[a-z]?(?![a-z])|_\d+(?:_\d+(?![a-z\d]))?)")


_BLOCK, _STAGE = _named("blocks|block|layers|layer|expanded_conv|cell|mixed"), _named("stages|stage|stack")
FALLBACK_GROUPS = 12


def block_of(path: str) -> str | None:
    """The block a weight's path names, as the path up to the block's name (the outermost layer
    naming a block, else a stage); None where it names neither."""
    segments = path.split("/")[:-1]  # (the last segment is the weight's own name: kernel, gamma ...)
    for pattern in (_BLOCK, _STAGE):
        for index, segment in enumerate(segments):
            found = list(pattern.finditer(segment))
            if found:
                return "/".join([*segments[:index], segment[:found[-1].end()]])
    return None


def layers(backbone: keras.Model) -> tuple[dict[int, int], int, str]:
    """({id(weight): its layer number, 0 to n + 1}, n, how the blocks were found) for every weight
    of the backbone, trainable or not (phases change which train)."""
    weights = backbone.weights
    blocks = [block_of(w.path) for w in weights]
    order = list(dict.fromkeys(b for b in blocks if b is not None))
    if len(order) >= 2:
        number = {block: index + 1 for index, block in enumerate(order)}
        last = max(index for index, block in enumerate(blocks) if block is not None)
        numbers, current = {}, 0
        for index, (weight, block) in enumerate(zip(weights, blocks)):
            if block is not None:
                current = number[block]
            numbers[id(weight)] = len(order) + 1 if index > last else current
        return numbers, len(order), f"{len(order)} blocks named in its weights' paths ({order[0]} ... {order[-1]})"
    owners = list(dict.fromkeys(w.path.rsplit("/", 1)[0] for w in weights))  # (the weighted layers, in order)
    group = {owner: 1 + index * FALLBACK_GROUPS // len(owners) for index, owner in enumerate(owners)}
    return ({id(w): group[w.path.rsplit("/", 1)[0]] for w in weights}, FALLBACK_GROUPS,
            f"no blocks named in its weights' paths: {len(owners)} weighted layers in {FALLBACK_GROUPS} groups")


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
