"""Layer-wise learning-rate decay (layer_decay): which block each weight of real backbones belongs
to, and that each weight's step is the optimizer's own step at its scaled learning rate, the
decoupled weight decay included, and through the job's loop."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.settings.config import OPTIMIZERS, JobConfig
from keras_pipe_train.training import layer_decay
from keras_pipe_train.training.distribute import Cluster
from keras_pipe_train.training.loop import Trainer
from keras_pipe_train.training.recipe import make_optimizer


@pytest.mark.parametrize(("path", "block"), [
    ("vit_encoder/transformer_block_1/mlp/dense_2/bias", "vit_encoder/transformer_block_1"),  # keras-hub ViT
    ("encoder/layers_0/layer_scale2/lambda1", "encoder/layers_0"),  # DINOv2 (layer_scale2 names no layer)
    ("encoder_block_3/self_attn/query/kernel", "encoder_block_3"),  # SigLIP's tower
    ("conv2_block2_3_bn/gamma", "conv2_block2"),  # Keras' ResNets, DenseNets
    ("stack0_block0_1_conv/kernel", "stack0_block0"),  # keras-hub's ResNets
    ("block1a_expand_conv/kernel", "block1a"),  # EfficientNet (V2)
    ("expanded_conv_4_squeeze_excite_conv/kernel", "expanded_conv_4"),  # Keras' MobileNetV3
    ("block_2_0/block_2_0_conv1/kernel", "block_2_0"),  # keras-hub's MobileNet: a stage's block
    ("convnext_tiny_stage_0_block_2_depthwise_conv/kernel", "convnext_tiny_stage_0_block_2"),
    ("encoder/encoder_stage_0/encoder_stage_0_block_1/encoder_stage_0_block_1_conv_block_0/"
     "encoder_stage_0_block_1_conv_block_0_bn/gamma", "encoder/encoder_stage_0/encoder_stage_0_block_1"),  # HGNetV2
    ("block35_4_conv/kernel", "block35_4"),  # InceptionResNetV2's units (block35: their type)
    ("expanded_conv_depthwise/kernel", "expanded_conv"),  # the MobileNets' first block, of no number
    ("reduction_A_block_stem_1/block_1/separable_conv_1/kernel", "reduction_A_block_stem_1"),  # NASNet's cells
    # a stage's downsampling names no block: it belongs to the next (layers)
    ("encoder/encoder_stage_1/encoder_stage_1_downsample/encoder_stage_1_downsample_bn/gamma", None),
    ("convnext_tiny_downsampling_block_0/convnext_tiny_downsampling_layernorm_0/gamma", None),
    ("conv1_conv/kernel", None), ("top_conv/kernel", None), ("conv2d_57/kernel", None), ("layer_norm/gamma", None),
])
def test_a_weights_block_is_read_from_the_layers_its_path_names(path, block):
    assert layer_decay.block_of(path) == block


def test_a_resnets_sixteen_blocks_number_its_layers_from_the_stem_to_the_top():
    backbone = keras.applications.ResNet50(weights=None, include_top=False, input_shape=(32, 32, 3))
    numbers, count, how = layer_decay.layers(backbone)
    assert count == 16 and "conv2_block1 ... conv5_block3" in how
    by_path = {w.path: numbers[id(w)] for w in backbone.weights}
    assert by_path["conv1_conv/kernel"] == 0 and by_path["conv2_block1_0_conv/kernel"] == 1
    assert by_path["conv4_block6_3_bn/moving_mean"] == 13 and by_path["conv5_block3_3_conv/kernel"] == 16
    assert sorted(set(by_path.values())) == list(range(17))
    scales, line = layer_decay.scales(backbone, 0.5)
    assert scales[id(backbone.get_layer("conv5_block3_3_conv").kernel)] == 0.5
    assert scales[id(backbone.get_layer("conv1_conv").kernel)] == 0.5 ** 17
    assert "the head at 1 x" in line


@pytest.mark.parametrize(("application", "size", "count", "first", "last"), [
    ("ConvNeXtTiny", 32, 18, "convnext_tiny_stage_0_block_0", "convnext_tiny_stage_3_block_2"),
    ("MobileNetV3Small", 32, 11, "expanded_conv", "expanded_conv_10"),
    ("InceptionResNetV2", 75, 40, "block35_1", "block8_10"),
])
def test_between_blocks_a_layer_belongs_to_the_next_and_after_the_last_to_the_last(application, size, count, first,
                                                                                   last):
    """As timm groups them: ConvNeXt's downsamplings with the next stage's first block, an Inception
    unit's branches (unnamed convolutions before its named one) with their unit, the layers after
    the last block (a head convolution, a final norm) with the last block."""
    backbone = getattr(keras.applications, application)(weights=None, include_top=False,
                                                        input_shape=(size, size, 3))
    numbers, found, how = layer_decay.layers(backbone)
    assert found == count and f"({first} ... {last})" in how, how
    number = {w.path: numbers[id(w)] for w in backbone.weights}
    if application == "ConvNeXtTiny":
        assert number["convnext_tiny_downsampling_block_0/convnext_tiny_downsampling_layernorm_0/gamma"] == \
            number["convnext_tiny_stage_1_block_0_depthwise_conv/kernel"] == 4
        # (the final norm, after the last block; its name, layer_normalization_N, depends on the layers made
        # before in the process)
        final = [layer for layer in backbone.layers if isinstance(layer, keras.layers.LayerNormalization)][-1]
        assert "stage" not in final.name and numbers[id(final.gamma)] == 18
    elif application == "MobileNetV3Small":
        assert number["conv/kernel"] == 0 and number["expanded_conv_depthwise/kernel"] == 1
        assert number["conv_1/kernel"] == 11  # (the 1x1 convolution after the last block)
    else:
        unit = [w.path for w in backbone.weights if number[w.path] == 2]
        assert unit[0].startswith("conv2d_") and "block35_2_conv/kernel" in unit, unit
        # (the stem, mixed_5b too: its first convolution's name depends on the layers made before in the process)
        assert number["conv_7b/kernel"] == 40 and numbers[id(backbone.weights[0])] == 0


def test_named_blocks_of_very_uneven_sizes_are_not_trusted():
    inputs = keras.Input((8, 8, 3))
    x = inputs
    for name in ["block1_conv", "block2_conv", "block3_conv", *[f"block4_conv{i}" for i in range(20)]]:
        x = keras.layers.Conv2D(2, 1, name=name)(x)
    numbers, count, how = layer_decay.layers(keras.Model(inputs, x))
    assert count == 12 and how.startswith("the blocks its weights' paths name are uneven (20 weighted layers in the "
                                          "largest, 1 in the median): 23 weighted layers in 12 groups"), how
    assert sorted(set(numbers.values())) == list(range(1, 13))


def test_a_backbone_naming_no_blocks_is_cut_into_groups_in_order():
    inputs = keras.Input((8, 8, 3))
    x = inputs
    for index in range(24):
        x = keras.layers.Conv2D(2, 1, name=f"conv2d_{index}")(x)
    x = keras.layers.LayerNormalization(name="layer_norm")(x)  # (after the last conv: in the last group)
    numbers, count, how = layer_decay.layers(keras.Model(inputs, x))
    assert count == layer_decay.FALLBACK_GROUPS == 12 and "25 weighted layers in 12 groups" in how
    assert sorted(set(numbers.values())) == list(range(1, 13))


def model_with_a_backbone() -> tuple[keras.Model, keras.Model]:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 4, 3))
    x = keras.layers.Conv2D(4, 1, name="stem_conv")(inputs)
    x = keras.layers.Conv2D(4, 1, name="block1_conv")(x)
    x = keras.layers.Conv2D(4, 1, name="block2_conv")(x)
    backbone = keras.Model(inputs, x, name="backbone")
    outputs = keras.layers.Dense(3, activation="softmax", name="classifier")(
        keras.layers.GlobalAveragePooling2D()(backbone(inputs)))
    return keras.Model(inputs, outputs), backbone


def steps_taken(name: str, decay: float | None, weight_decay: float = 0.0) -> list[np.ndarray]:
    """Each weight's change after three steps of the job's loop with the job's optimizer."""
    model, backbone = model_with_a_backbone()
    config = JobConfig.from_hyperparameters({"num_classes": 3, "optimizer": name, "momentum": 0.9,
                                             "weight_decay": weight_decay})
    scales = layer_decay.scales(backbone, decay)[0] if decay else None
    trainer = Trainer(model, Cluster(tf.distribute.get_strategy(), 1, 0, True), mixed_precision=False,
                      make_optimizer=lambda rate: make_optimizer(config, rate, scales))
    trainer.start_phase(0.01)
    before = [w.numpy() for w in model.trainable_variables]
    rng = np.random.default_rng(0)
    images, labels = rng.random((12, 4, 4, 3)).astype(np.float32), np.arange(12) % 3
    trainer.train_epoch(tf.data.Dataset.from_tensor_slices((images, labels)).batch(4), 0, 0, 4)
    return [w.numpy() - b for w, b in zip(model.trainable_variables, before, strict=True)]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_weights_step_is_the_optimizers_at_its_scaled_learning_rate(name):
    """stem 0.5 ** 3, block1 0.5 ** 2, block2 0.5, the head 1. A step at a rate scaled by s moves
    each weight by s x the step at the rate (for Adam, scaling the gradient would not): compared on
    the first step of each weight, whose state (momentum, moments) starts alike. The decoupled
    weight decay is scaled alike."""
    model, backbone = model_with_a_backbone()
    scales = layer_decay.scales(backbone, 0.5)[0]
    expected = [scales.get(id(w), 1.0) for w in model.trainable_variables]
    assert expected == [0.125] * 2 + [0.25] * 2 + [0.5] * 2 + [1.0] * 2
    # (a decoupled weight decay too, large enough to be seen: scaled with the step, as timm's groups do)
    config = JobConfig.from_hyperparameters({"num_classes": 3, "optimizer": name, "weight_decay": 0.1})
    rng = np.random.default_rng(1)
    gradients = [tf.constant(rng.normal(size=w.shape), tf.float32) for w in model.trainable_variables]
    moved = []
    for scaled in (None, scales):
        weights = [tf.Variable(w.numpy()) for w in model.trainable_variables]
        optimizer = make_optimizer(config, 0.01, scaled and {id(v): scales[id(w)]
                                                             for v, w in zip(weights, model.trainable_variables)
                                                             if id(w) in scales})
        optimizer.build(weights)
        before = [w.numpy() for w in weights]
        optimizer.apply(gradients, weights)
        moved.append([w.numpy() - b for w, b in zip(weights, before)])
    for plain, decayed, scale in zip(*moved, expected, strict=True):
        np.testing.assert_allclose(decayed, plain * scale, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_through_the_loop_a_decay_of_one_changes_nothing_and_lower_blocks_move_less(name):
    """Three steps of the job's loop: layer_decay=1 trains as without it, weight for weight; with
    0.5 each block's kernel moves less than the one above it."""
    plain, same = steps_taken(name, None, 0.01), steps_taken(name, 1.0, 0.01)
    for a, b in zip(plain, same, strict=True):
        np.testing.assert_array_equal(a, b)
    moves = [float(np.abs(d).mean()) for d in steps_taken(name, 0.5, 0.01)]
    assert moves[0] < moves[2] < moves[4], moves  # (the kernels of the stem, block1, block2)
