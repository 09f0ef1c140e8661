"""The training recipe, each option for what it changes: the optimizers and their settings, the
learning rate at chosen steps, label smoothing, class weights, the L2 penalty, gradient clipping
(of the gradient summed over replicas), top-k accuracy, and early stopping on crafted curves."""

import math
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.settings.config import OPTIMIZERS, JobConfig
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.training.distribute import Cluster
from keras_pipe_train.training.early_stopping import BestWeights, Rule
from keras_pipe_train.training.loop import Trainer
from keras_pipe_train.training.recipe import Loss, epoch_factor, make_optimizer
from tests.conftest import REPO


def config(**values) -> JobConfig:
    return JobConfig.from_hyperparameters({"num_classes": 3, **values})


def tiny_model(seed=0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(),
                             keras.layers.Dense(3, activation="softmax", name="classifier")])


def trainer_for(model=None, learning_rate=0.1, warmup_steps=0, loss=None, make=keras.optimizers.SGD) -> Trainer:
    trainer = Trainer(model or tiny_model(), Cluster(tf.distribute.get_strategy(), 1, 0, True), mixed_precision=False,
                      loss=loss, make_optimizer=make)
    trainer.start_phase(learning_rate, warmup_steps)
    return trainer


def data(count=12, seed=0):
    rng = np.random.default_rng(seed)
    images, labels = rng.random((count, 4, 4, 3)).astype(np.float32), (np.arange(count) % 3).astype(np.int64)
    return images, labels


def batches(images, labels, size=4) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(size)


# --- optimizers ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_optimizer_is_the_one_named_with_its_settings_and_it_trains(name):
    chosen = config(optimizer=name, momentum=0.5, beta_1=0.8, beta_2=0.99, epsilon=1e-6, rho=0.7,
                    initial_accumulator_value=0.2)
    optimizer = make_optimizer(chosen, 0.1)
    expected = {"adam": keras.optimizers.Adam, "adamw": keras.optimizers.AdamW, "sgd": keras.optimizers.SGD,
                "nesterov": keras.optimizers.SGD, "rmsprop": keras.optimizers.RMSprop,
                "adagrad": keras.optimizers.Adagrad, "adadelta": keras.optimizers.Adadelta}[name]
    assert type(optimizer) is expected
    settings = optimizer.get_config()
    given = {"beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-6, "momentum": 0.5, "rho": 0.7,
             "initial_accumulator_value": 0.2, "nesterov": name == "nesterov"}
    for key, value in given.items():
        if key in settings:
            assert settings[key] == pytest.approx(value), key
    assert settings["weight_decay"] == (0.004 if name == "adamw" else None)
    # and a few epochs with it lower the loss on these examples (at a rate that suits it)
    rate = {"adadelta": 1.0, "adagrad": 0.1, "sgd": 0.5, "nesterov": 0.5}.get(name, 0.02)
    trainer = trainer_for(make=lambda rate: make_optimizer(chosen, rate), learning_rate=rate)
    images, labels = data()
    before = trainer.evaluate(batches(images, labels))[0]["val_loss"]
    for epoch in range(3):
        trainer.train_epoch(batches(images, labels), epoch, 0, 4)
    assert trainer.evaluate(batches(images, labels))[0]["val_loss"] < before


@pytest.mark.parametrize("decay, expected", [(None, 0.004), ("0", 0.0), ("0.01", 0.01)])
def test_adamw_takes_any_decay_zero_included(decay, expected):
    chosen = config(optimizer="adamw", **({} if decay is None else {"weight_decay": decay}))
    assert make_optimizer(chosen, 0.1).get_config()["weight_decay"] == expected


def test_weight_decay_shrinks_the_weights_by_rate_times_decay_each_step():
    model = tiny_model()
    kernel = model.get_layer("classifier").kernel
    kernel.assign(np.ones(kernel.shape, np.float32))
    trainer = trainer_for(model, learning_rate=0.1, make=lambda rate: make_optimizer(
        config(optimizer="sgd", momentum=0, weight_decay=0.5), rate))
    images, labels = data(4)
    gradient_only = trainer_for(tiny_model(), learning_rate=0.1, make=lambda rate: make_optimizer(
        config(optimizer="sgd", momentum=0), rate))
    gradient_only.model.get_layer("classifier").kernel.assign(np.ones(kernel.shape, np.float32))
    for t in (trainer, gradient_only):
        t.train_epoch(batches(images, labels), 0, 0, 4)
    decayed = model.get_layer("classifier").kernel.numpy()
    plain = gradient_only.model.get_layer("classifier").kernel.numpy()
    # Keras applies the decay before the gradient: w - lr*wd*w - lr*g
    np.testing.assert_allclose(decayed, plain - 0.1 * 0.5 * 1.0, rtol=1e-5, atol=1e-6)


def two_steps(style: str, mixed_precision: bool = False) -> tuple[Trainer, list[np.ndarray], list[np.ndarray]]:
    """Two sgd steps (rate 0.1, momentum 0.9, weight_decay 0.5) of a 1-input, 2-class softmax whose
    kernel and bias start at 1: the first on x=1, label 0 (logits 2, 2: probabilities 0.5, 0.5, so
    the examples' gradient is (-0.5, 0.5) for the kernel's row and the bias alike), the second on
    x=0, where the kernel's gradient is the decay's alone. Returns the trainer, the kernel after
    each step and the kernel's momentum after the first."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2, activation="softmax", name="classifier")])
    layer = model.get_layer("classifier")
    layer.kernel.assign(np.ones((1, 2), np.float32))
    layer.bias.assign(np.ones(2, np.float32))
    chosen = config(optimizer="sgd", momentum=0.9, weight_decay=0.5, weight_decay_style=style)
    trainer = Trainer(model, Cluster(tf.distribute.get_strategy(), 1, 0, True), mixed_precision=mixed_precision,
                      loss=Loss.of(chosen), make_optimizer=lambda rate: make_optimizer(chosen, rate))
    trainer.start_phase(0.1)
    sgd = trainer.optimizer.inner_optimizer if mixed_precision else trainer.optimizer
    kernels, momentum = [], None
    for x in (1.0, 0.0):
        trainer.train_epoch(batches(np.array([[x]], np.float32), np.array([0])), 0, 0, 1)
        kernels.append(layer.kernel.numpy())
        momentum = sgd.momentums[sgd._get_variable_index(layer.kernel)].numpy() if momentum is None else momentum
    return trainer, kernels, momentum


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_l2_weight_decay_is_in_the_gradient_and_goes_through_the_momentum(mixed_precision):
    """weight_decay_style=l2 (MXNet's sgd): g + wd*w, then m = 0.9 m - lr g, w += m. Decoupled
    (Keras'): w -= lr*wd*w apart from the gradient, which alone goes into the momentum. After the
    first step both give the same weights; the momentum differs, and so does the second step.
    Under mixed precision (a scaled loss, its gradient divided back by the loss-scale optimizer) the
    same numbers."""
    _, (l2_first, l2_second), l2_momentum = two_steps("l2", mixed_precision)
    # step 1: g = (-0.5, 0.5) + 0.5 * (1, 1) = (0, 1); m = (0, -0.1); w = (1, 0.9)
    np.testing.assert_allclose(l2_momentum, [[0.0, -0.1]], atol=1e-6)
    np.testing.assert_allclose(l2_first, [[1.0, 0.9]], atol=1e-6)
    # step 2: g = 0.5 * (1, 0.9) = (0.5, 0.45); m = 0.9 * (0, -0.1) - 0.1 * g = (-0.05, -0.135)
    np.testing.assert_allclose(l2_second, [[0.95, 0.765]], atol=1e-6)
    if mixed_precision:
        return
    _, (first, second), momentum = two_steps("decoupled")
    # step 1: w = 0.95 * (1, 1) - 0.1 * (-0.5, 0.5) = (1, 0.9); m = (0.05, -0.05): the gradient's alone
    np.testing.assert_allclose(momentum, [[0.05, -0.05]], atol=1e-6)
    np.testing.assert_allclose(first, [[1.0, 0.9]], atol=1e-6)
    # step 2: w = 0.95 * (1, 0.9) + 0.9 * (0.05, -0.05)
    np.testing.assert_allclose(second, [[0.995, 0.81]], atol=1e-6)


def test_l2_weight_decay_leaves_biases_alone_and_the_optimizer_decays_nothing():
    """MXNet decays weights and BatchNorm gammas, not biases or betas (recipe.L2_EXEMPT)."""
    from keras_pipe_train.training.recipe import l2_decayed

    chosen = config(optimizer="sgd", weight_decay=0.5, weight_decay_style="l2")
    assert make_optimizer(chosen, 0.1).get_config()["weight_decay"] is None and Loss.of(chosen).l2_decay == 0.5
    adamw = config(optimizer="adamw", weight_decay_style="l2")  # (its default decay, moved into the gradient)
    assert make_optimizer(adamw, 0.1).get_config()["weight_decay"] == 0.0 and Loss.of(adamw).l2_decay == 0.004
    assert Loss.of(config(optimizer="sgd", weight_decay=0.5)).l2_decay == 0.0  # (decoupled: the optimizer's)
    trainer, _, _ = two_steps("l2")
    bias = trainer.model.get_layer("classifier").bias.numpy()
    # step 1: g = (-0.5, 0.5), no decay: b = (1.05, 0.95), m = (0.05, -0.05); step 2 (x=0): the
    # logits are the bias, g = softmax(b) - (1, 0)
    after_first = np.array([1.05, 0.95])
    g = np.exp(after_first) / np.exp(after_first).sum() - [1.0, 0.0]
    np.testing.assert_allclose(bias, after_first + 0.9 * np.array([0.05, -0.05]) - 0.1 * g, atol=1e-6)
    # (named: Keras numbers unnamed layers per process, and other tests build layers first)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 3, name="conv2d"),
                              keras.layers.BatchNormalization(name="batch_normalization"),
                              keras.layers.SeparableConv2D(2, 1, name="separable_conv2d"), keras.layers.Flatten(),
                              keras.layers.Dense(2, name="dense")])
    assert {w.path.split("/", 1)[1]: l2_decayed(w) for w in model.trainable_variables} == {
        "conv2d/kernel": True, "conv2d/bias": False, "batch_normalization/gamma": True,
        "batch_normalization/beta": False, "separable_conv2d/depthwise_kernel": True,
        "separable_conv2d/pointwise_kernel": True, "separable_conv2d/bias": False, "dense/kernel": True,
        "dense/bias": False}


# --- the learning rate ---------------------------------------------------------------------------

def test_the_learning_rate_by_epoch_for_each_schedule():
    steps = {"step": {"lr_scheduler_step": "2,4,9", "lr_scheduler_factor": 0.5}}
    factors = {schedule: [epoch_factor(config(lr_schedule=schedule, **steps.get(schedule, {})), 0, 5, e)
                          for e in range(5)]
               for schedule in ("constant", "cosine", "step")}
    assert factors["constant"] == [1.0] * 5
    assert factors["cosine"] == pytest.approx([0.5 * (1 + math.cos(math.pi * e / 5)) for e in range(5)])
    assert factors["cosine"][0] == 1.0 and 0 < factors["cosine"][-1] < 0.1  # the last epoch still learns
    # MXNet's meaning: "2" lowers the rate after the 2nd epoch, from the 3rd (0-based 2) on
    assert factors["step"] == [1.0, 1.0, 0.5, 0.5, 0.25]
    # phase 2 (epochs 5-9 of the job) counts only the steps inside it: 9 (after its 4th epoch)
    assert [epoch_factor(config(lr_schedule="step", lr_scheduler_step="2,4,9"), 5, 10, e) for e in range(5, 10)] == \
        pytest.approx([1, 1, 1, 1, 0.1])
    assert [epoch_factor(config(lr_schedule="cosine"), 5, 7, e) for e in (5, 6)] == pytest.approx([1.0, 0.5])


def test_warmup_ramps_the_rate_over_its_steps_and_the_epoch_factor_scales_it():
    trainer = trainer_for(learning_rate=0.2, warmup_steps=4)
    images, labels = data(24)
    rates = []
    trainer.train_epoch(batches(images, labels), 0, 0, 4,
                        on_step=lambda steps: rates.append(float(trainer.optimizer.learning_rate)))
    # after step k the next step trains at 0.2 * (k + 1) / 4, full from step 4 on
    assert rates == pytest.approx([0.1, 0.15, 0.2, 0.2, 0.2, 0.2])
    trainer.set_epoch_factor(0.25)
    assert float(trainer.optimizer.learning_rate) == pytest.approx(0.05)


def test_the_step_applied_is_the_scheduled_rate_times_the_gradient():
    """What the optimizer applies, not only what it reports: SGD without momentum moves each weight
    by rate x gradient, so half the factor is half the move."""
    images, labels = data(4)
    moves = []
    for factor in (1.0, 0.5):
        trainer = trainer_for(learning_rate=0.2)
        trainer.set_epoch_factor(factor)
        before = trainer.model.get_weights()
        trainer.train_epoch(batches(images, labels), 0, 0, 4)
        moves.append([a - b for a, b in zip(trainer.model.get_weights(), before)])
    for full, half in zip(*moves):
        np.testing.assert_allclose(half, full / 2, rtol=1e-4, atol=1e-7)


# --- what the loss adds up -----------------------------------------------------------------------

def cross_entropy(model, images, labels) -> np.ndarray:
    probabilities = model(images, training=False).numpy()
    return -np.log(probabilities[np.arange(len(labels)), labels])


def test_class_weights_weigh_each_example_loss_by_its_class():
    images, labels = data(12)
    plain = cross_entropy(tiny_model(), images, labels)
    weights = (2.0, 0.0, 0.5)
    trainer = trainer_for(learning_rate=1e-12, loss=Loss(class_weights=weights))
    results, _, _ = trainer.train_epoch(batches(images, labels, 12), 0, 0, 12)
    expected = np.mean(plain * np.array(weights)[labels])
    assert results["train_loss"] == pytest.approx(expected, rel=1e-4)
    assert expected != pytest.approx(plain.mean(), rel=1e-2)  # (they move the loss)
    # validation's loss is the plain one
    assert trainer.evaluate(batches(images, labels))[0]["val_loss"] == pytest.approx(plain.mean(), rel=1e-4)


def test_balanced_class_weights_follow_the_counts_of_the_labels_seen_so_far():
    """class_weights=balanced: examples / (classes x the class's examples), counted as training
    sees the labels (before each step's loss): after 8 examples of labels 0,0,0,1 | 0,1,1,0, class
    0 has 5, class 1 has 3, class 2 none yet."""
    images, _ = data(8)
    labels = np.array([0, 0, 0, 1, 0, 1, 1, 0], np.int64)
    plain = cross_entropy(tiny_model(), images, labels)
    trainer = trainer_for(learning_rate=1e-12, loss=Loss(class_weights="balanced"))
    first, _, _ = trainer.train_epoch(batches(images[:4], labels[:4], 4), 0, 0, 4)
    assert first["train_loss"] == pytest.approx(np.mean(plain[:4] * np.array([4 / 9, 4 / 3])[labels[:4]]), rel=1e-4)
    second, _, _ = trainer.train_epoch(batches(images[4:], labels[4:], 4), 1, 0, 4)
    assert second["train_loss"] == pytest.approx(np.mean(plain[4:] * np.array([8 / 15, 8 / 9])[labels[4:]]), rel=1e-4)
    assert trainer.task.state.seen.numpy().tolist() == [5, 3, 0, 8]
    assert config(class_weights="Balanced").class_weights == "balanced"
    with pytest.raises(UserError, match="class_weights=balanced is for single-label jobs"):
        config(class_weights="balanced", multi_label="true")


def test_label_smoothing_trains_against_smoothed_labels_and_validates_against_plain_ones():
    images, labels = data(12)
    model = tiny_model()
    probabilities = model(images, training=False).numpy()
    targets = np.full((12, 3), 0.1 / 3)
    targets[np.arange(12), labels] += 0.9
    smoothed = -(targets * np.log(probabilities)).sum(axis=1).mean()
    trainer = trainer_for(model, learning_rate=1e-12, loss=Loss(label_smoothing=0.1))
    results, _, _ = trainer.train_epoch(batches(images, labels, 12), 0, 0, 12)
    assert results["train_loss"] == pytest.approx(smoothed, rel=1e-4)
    val = trainer.evaluate(batches(images, labels))[0]["val_loss"]
    assert val == pytest.approx(cross_entropy(model, images, labels).mean(), rel=1e-4)


def test_the_l2_penalty_on_the_classifier_pulls_its_kernel_towards_zero():
    from keras_pipe_train.model.classifier import build_classifier

    images, labels = data(12)
    norms = {}
    for l2 in (0.0, 0.5):
        keras.utils.set_random_seed(0)
        backbone = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Conv2D(4, 1)], name="backbone")
        model = build_classifier("mobilenet_v3_small", backbone, 3, 0.0, l2=l2)
        trainer = trainer_for(model, learning_rate=0.5)
        for epoch in range(5):
            trainer.train_epoch(batches(images, labels), epoch, 0, 4)
        norms[l2] = np.linalg.norm(model.get_layer("classifier").kernel.numpy())
    assert norms[0.5] < 0.5 * norms[0.0], norms


def test_gradient_clipping_bounds_the_step():
    images, labels = data(4)
    moves = {}
    for clip in (0.0, 0.01):
        trainer = trainer_for(learning_rate=1.0, loss=Loss(clip_norm=clip))
        before = trainer.model.get_weights()
        trainer.train_epoch(batches(images, labels), 0, 0, 4)
        moves[clip] = math.sqrt(sum(float(np.sum((a - b) ** 2)) for a, b in zip(trainer.model.get_weights(), before)))
    assert moves[0.0] > 0.05 and moves[0.01] == pytest.approx(0.01, rel=1e-3)


CLIPPED_ON_TWO_REPLICAS = textwrap.dedent("""
    import json, sys
    import numpy as np, tensorflow as tf
    replicas = int(sys.argv[1])
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    from keras_pipe_train.training.distribute import Cluster
    from keras_pipe_train.training.loop import Trainer
    from keras_pipe_train.training.recipe import Loss
    devices = [f"/cpu:{i}" for i in range(replicas)]
    strategy = tf.distribute.MirroredStrategy(devices) if replicas > 1 else tf.distribute.get_strategy()
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")])
    trainer = Trainer(model, Cluster(strategy, 1, 0, True), False, loss=Loss(clip_norm=0.01),
                      make_optimizer=keras.optimizers.SGD)
    trainer.start_phase(1.0)
    rng = np.random.default_rng(0)
    images, labels = rng.random((8, 4, 4, 3)).astype(np.float32), (np.arange(8) % 3).astype(np.int64)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)
    trainer.train_epoch(strategy.experimental_distribute_dataset(data), 0, 0, 8)
    print("WEIGHTS", json.dumps([w.tolist() for w in model.get_weights()]))
""")


@pytest.mark.slow
def test_clipping_bounds_the_gradient_summed_over_replicas_not_each_replicas_share():
    """With two replicas (two logical CPUs), the step is the one replica's: Keras' own clipnorm
    would clip each half of the batch's gradient separately, and move the weights up to twice as far."""
    import json

    moved = {}
    for replicas in (1, 2):
        out = subprocess.run([sys.executable, "-c", CLIPPED_ON_TWO_REPLICAS, str(replicas)], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        line = next(line for line in out.stdout.splitlines() if line.startswith("WEIGHTS "))
        moved[replicas] = [np.array(w) for w in json.loads(line[len("WEIGHTS "):])]
    for one, two in zip(moved[1], moved[2]):
        np.testing.assert_allclose(one, two, rtol=1e-4, atol=1e-6)


def test_top_k_accuracy_counts_the_labels_among_the_k_most_likely():
    model = tiny_model()
    classifier = model.get_layer("classifier")
    classifier.kernel.assign(np.zeros(classifier.kernel.shape, np.float32))
    classifier.bias.assign(np.array([3.0, 2.0, 1.0], np.float32))  # always ranks 0, then 1, then 2
    images = np.zeros((4, 4, 4, 3), np.float32)
    labels = np.array([0, 1, 2, 2], np.int64)
    scores, examples = trainer_for(model, loss=Loss(top_k=2)).evaluate(batches(images, labels))
    assert examples == 4
    assert scores["val_accuracy"] == 0.25 and scores["val_top_k_accuracy"] == 0.5
    assert "val_top_k_accuracy" not in trainer_for(model).evaluate(batches(images, labels))[0]


# --- early stopping ------------------------------------------------------------------------------

def rows(values, phase="head", metric="val_loss", first=1):
    return [{"epoch": first + i, "phase": phase, metric: v} for i, v in enumerate(values)]


def rule(**settings) -> Rule:
    return Rule.of(config(early_stopping=True, **settings))


def stop_epoch(rule_, values, **options):
    """The 1-based epoch after which the phase stops (None: it never does) and the best epoch then."""
    history = rows(values, **options)
    for i in range(1, len(history) + 1):
        verdict = rule_.verdict(history[:i], options.get("phase", "head"))
        if verdict.stop:
            return i, verdict.best_epoch
    return None, rule_.verdict(history, options.get("phase", "head")).best_epoch


def test_early_stopping_on_crafted_validation_curves():
    curve = [1.0, 0.8, 0.7, 0.71, 0.69, 0.72, 0.73, 0.74]
    assert stop_epoch(rule(early_stopping_patience=2), curve) == (7, 5)
    assert stop_epoch(rule(early_stopping_patience=5), curve) == (None, 5)
    # 0.69 improves on 0.7 by less than min_delta: epoch 3 stays the best
    assert stop_epoch(rule(early_stopping_patience=2, early_stopping_min_delta=0.05), curve) == (5, 3)
    # relative: 0.7 -> 0.69 is 1.4 %, below a 2 % tolerance; 0.8 -> 0.7 is 12.5 %
    assert stop_epoch(rule(early_stopping_patience=2, early_stopping_tolerance=0.02), curve) == (5, 3)
    # at least min_epochs of the phase are trained, whatever the curve
    assert stop_epoch(rule(early_stopping_patience=1, early_stopping_min_epochs=6), [1, 2, 3, 4, 5, 6, 7]) == (6, 1)
    # accuracy: higher is better
    accuracy = rule(early_stopping_patience=2, early_stopping_metric="val_accuracy")
    assert stop_epoch(accuracy, [0.5, 0.6, 0.55, 0.58, 0.7], metric="val_accuracy") == (4, 2)
    # a diverged evaluation (NaN, null in metrics.json) is never an improvement
    assert stop_epoch(rule(early_stopping_patience=2), [0.5, float("nan"), None, 0.4]) == (3, 1)


def test_each_phase_stops_on_its_own_curve():
    history = rows([0.5, 0.4, 0.45, 0.46]) + rows([0.9, 0.8], phase="fine_tune", first=5)
    verdict = rule(early_stopping_patience=2).verdict(history, "head")
    assert verdict.stop and verdict.best_epoch == 2
    verdict = rule(early_stopping_patience=2).verdict(history, "fine_tune")
    assert not verdict.stop and verdict.improved and verdict.best_epoch == 6  # not against head's 0.4


def test_the_best_weights_are_kept_restored_and_checkpointed(tmp_path):
    from keras_pipe_train.training.checkpoints import Checkpoints, Progress

    model = tiny_model()
    best = BestWeights(model)
    kept = model.get_weights()
    best.keep(model)
    model.set_weights([w + 1 for w in kept])
    checkpoints = Checkpoints(tmp_path, is_chief=True)
    trainer = trainer_for(model)
    saved = checkpoints.save(model, trainer.optimizer, Progress("head", 1, 0, 4), {"best": best})
    # a fresh process's objects, restored from the checkpoint, then the best put back
    other = tiny_model(seed=5)
    other_best = BestWeights(other)
    assert checkpoints.restore(saved, other, trainer_for(other).optimizer, {"best": other_best})
    for a, b in zip(other.get_weights(), kept):
        np.testing.assert_array_equal(a, b + 1)
    other_best.restore(other)
    for a, b in zip(other.get_weights(), kept):
        np.testing.assert_array_equal(a, b)


# --- the settings as users give them ---------------------------------------------------------------

def test_the_built_in_algorithms_names_and_values_are_accepted():
    mxnet = config(optimizer="nag", mini_batch_size="64", eps="1e-8", gamma="0.8", lr_scheduler_step="10, 20",
                   lr_schedule="step", weight_decay="0.0001", image_shape="3,32,32", num_layers="20")
    assert (mxnet.optimizer, mxnet.batch_size, mxnet.epsilon, mxnet.rho) == ("nesterov", 64, 1e-8, 0.8)
    assert mxnet.lr_scheduler_step == (10, 20) and mxnet.weight_decay == 0.0001
    assert config(dropout_rate="0.3").dropout == 0.3  # (the TensorFlow algorithm's name)
    # MXNet has no schedule switch: its steps alone make it a step schedule
    assert config(lr_scheduler_step="10, 20").lr_schedule == "step"
    assert config(early_stopping="True").early_stopping is True and config().early_stopping is False


@pytest.mark.parametrize("values, message", [
    ({"dropout_rate": "0.3", "dropout": "0.2"}, "hyperparameters dropout_rate and dropout are one setting"),
    ({"optimizer": "lbfgs"}, "optimizer must be one of adam, adamw, sgd, nesterov"),
    ({"lr_schedule": "step"}, "lr_schedule=step needs lr_scheduler_step"),
    ({"lr_scheduler_step": "ten"}, "lr_scheduler_step must list epoch numbers"),
    ({"lr_scheduler_step": "3", "lr_schedule": "cosine"}, "lr_scheduler_step is for lr_schedule=step; lr_schedule is "
                                                          "cosine"),
    ({"top_k": "3"}, r"top_k must be below the number of classes \(3\)"),
    ({"top_k": "1"}, "top_k must be >= 2"),
    ({"class_weights": "[1, 2]"}, "class_weights lists 2 weights for 3 classes"),
    ({"class_weights": '{"cat": 2}'}, "class_weights names 'cat', not a class of the job"),
    ({"class_weights": "[1, -1, 1]"}, "each a number >= 0"),
    ({"early_stopping": "maybe"}, "early_stopping must be true or false"),
    ({"label_smoothing": "1"}, "label_smoothing must be >= 0 and <= 0.99"),
])
def test_a_bad_recipe_is_refused_naming_the_setting(values, message):
    with pytest.raises(UserError, match=message):
        config(**values)


def test_class_weights_by_name_or_label_and_the_others_weigh_one():
    named = JobConfig.from_hyperparameters({"class_names": '["cat", "dog", "emu"]', "class_weights": '{"emu": 3}'})
    assert named.class_weights == (1.0, 1.0, 3.0)
    assert config(class_weights='{"1": 0.5}').class_weights == (1.0, 0.5, 1.0)
    assert config(class_weights="2,1,1").class_weights == (2.0, 1.0, 1.0)
    # str() of a dict or a list, as the v2 Estimator sends them
    assert config(class_weights="{'2': 4.0}").class_weights == (1.0, 1.0, 4.0)
    assert config(class_weights="[1.0, 2.0, 3.0]").class_weights == (1.0, 2.0, 3.0)
