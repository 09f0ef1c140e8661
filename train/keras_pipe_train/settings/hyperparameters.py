"""The job's hyperparameters, each defined once: a field of `Hyperparameters` whose metadata holds
its default, parser (and so its type, bounds and tuning range), help text, whether a resume may
change it, and the built-in algorithms' names for it. `HYPERPARAMETERS` (the table the launcher,
the docs and the tuning ranges read), `RESUMABLE` and config.JobConfig all come from these fields;
the checks across fields are typed methods. No TensorFlow here.

Why a dataclass with field metadata (as Hugging Face's TrainingArguments) and not pydantic v2: the
job's parsing is SageMaker's, not a generic coercion (quoted values, the SDKs' str() and JSON forms,
the built-ins' dialects: parsers.py), so pydantic would wrap our parsers in validators and add a
dependency (and its compiled core) to the image and the launcher for what `dataclasses` does here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from keras_pipe_train.settings import parsers
from keras_pipe_train.settings.backbones import BACKBONES as BACKBONE_TABLE
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.settings.parsers import (
    DEFAULT_AUGMENTATIONS,
    RESIZE_ORIGINAL,
    BackboneName,
    Choice,
    Integer,
    Number,
    OrUnset,
    OrWord,
    Parse,
    flag,
)
from keras_pipe_train.settings.presets import PRESETS

# the dialects a request may speak: this job's names, or a SageMaker built-in's (dialects.py reads them)
KERAS_PIPE, MXNET, TENSORFLOW = "keras-pipe", "mxnet", "tensorflow"
DIALECTS = (KERAS_PIPE, MXNET, TENSORFLOW)

DEFAULT_MAX_PIXELS = 100_000_000  # 100 megapixels, 300 MB decoded: above any phone or camera's default
BACKBONES = tuple(BACKBONE_TABLE)  # every Keras application (backbones.py)
FLIPS = ("horizontal", "vertical", "horizontal_and_vertical")
MIXED_PRECISION = ("auto", "true", "false")
OTHER_CHECKPOINTS = ("refuse", "resume", "ignore")  # (training/checkpoints.py says what each does)
OPTIMIZERS = ("adam", "adamw", "sgd", "nesterov", "rmsprop", "adagrad", "adadelta")  # (training/recipe.py builds them)
SCHEDULES = ("constant", "cosine", "step")
LABEL_FORMATS = ("index", "multi_hot")
# what the train and validation channels hold (Ground Truth manifests: attribute_names)
RECORD_FORMATS = ("tfrecord", "class_folders", "recordio", "lst")
# what early stopping may watch (each only where the job reports it: reported_metrics)
EARLY_STOPPING_METRICS = ("val_loss", "val_accuracy", "val_top_k_accuracy", "val_f1_micro", "val_f1_macro",
                          "val_precision_micro", "val_recall_micro", "val_auc")
# the interpolations tf.image.resize offers (the built-in TensorFlow algorithm's image_resize_interpolation)
INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian", "mitchellcubic")
WEIGHT_DECAY_STYLES = ("decoupled", "l2")
EXPORT_EPOCHS = ("last", "best")
CALIBRATION = ("auto", "true", "false")  # (training/calibration.py)
MULTI_LABEL_METRICS = ("accuracy", "exact_match", "precision_micro", "recall_micro", "f1_micro", "precision_macro",
                       "recall_macro", "f1_macro", "auc")


@dataclasses.dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter, as its field of Hyperparameters defines it."""
    name: str
    default: Any  # in a form SageMaker sends: read by `parse` as a given value is ("true" -> all augmentations)
    parse: Parse  # (name, value) -> the field's value, or a UserError
    help: str
    tuning_range: str  # the range a tuning job may give it: Integer, Continuous, or (any) Categorical
    resumable: bool = False  # a job may change it and still resume its checkpoints (training/resume.py)
    names: Mapping[str, str] = dataclasses.field(default_factory=dict)  # dialect -> the built-in's name for it

    @property
    def bounds(self) -> tuple[float, float | None] | None:
        """(minimum, maximum) of a number (maximum None: unbounded); None for any other value."""
        return getattr(self.parse, "bounds", None)

    @property
    def accepts(self) -> str:
        """The values it takes, in words ("an integer >= 0", "adam, sgd, ..."); "" if its parser does not say."""
        return getattr(self.parse, "accepts", "")


_DEFINITION = "keras_pipe_hyperparameter"  # the key of a field's definition in its metadata


def hyperparameter(default, parse: Parse, help: str, *, resumable: bool = False,
                   names: Mapping[str, str] | None = None) -> Any:
    """A field of Hyperparameters: the one definition of the hyperparameter of its name (no dataclass
    default: JobConfig.from_hyperparameters reads `default` as SageMaker would send it)."""
    tuning = getattr(parse, "tuning_range", "Categorical")
    definition = Hyperparameter("", default, parse, help, tuning, resumable, dict(names or {}))
    return dataclasses.field(metadata={_DEFINITION: definition})


def definitions(cls) -> dict[str, Hyperparameter]:
    """The hyperparameters a dataclass defines, by name, in field order (its other fields left out)."""
    return {f.name: dataclasses.replace(f.metadata[_DEFINITION], name=f.name)
            for f in dataclasses.fields(cls) if _DEFINITION in f.metadata}


@dataclasses.dataclass(frozen=True)
class Hyperparameters:
    """Each field is a hyperparameter, typed as its parser returns it (config.JobConfig adds what
    reading a request says besides)."""
    preset: str = hyperparameter(
        "none", Choice(PRESETS), "fast, balanced or best: the job chooses the backbone, image size, schedule and "
        "recipe from the training set's size (counted in a pass of the train channel before training), the classes "
        "and the instance, after BiT-HyperRule; each hyperparameter given keeps its value (docs/job.md, Presets); "
        "none: the defaults below")
    epochs: int = hyperparameter(5, Integer(0), "epochs training the new head on the frozen backbone",
                                 resumable=True)
    fine_tune_epochs: int = hyperparameter(0, Integer(0), "epochs then fine-tuning the top of the backbone too",
                                           resumable=True)
    fine_tune_layers: int = hyperparameter(
        20, Integer(0), "how many top backbone layers phase 2 unfreezes (BatchNorm layers stay frozen, unless "
        "train_batchnorm)")
    train_batchnorm: bool = hyperparameter(
        "false", flag, "a pretrained backbone's BatchNorm layers train in phase 2 (their scale and offset learnt, "
        "their statistics those of each batch, the moving ones updated at momentum 0.9) as MXNet's built-in does; "
        "false keeps them as pretrained (Keras' transfer-learning guide)")
    batch_size: int = hyperparameter(32, Integer(1), "examples per step (global, across all GPUs and hosts)",
                                     resumable=True, names={MXNET: "mini_batch_size"})
    learning_rate: float = hyperparameter(
        1e-3, Number(0, 10), "learning rate of phase 1 (the head; the whole network with weights=none)")
    fine_tune_learning_rate: float = hyperparameter(1e-5, Number(0, 10), "learning rate of phase 2 (fine-tuning)")
    layer_decay: float = hyperparameter(
        1.0, Number(0, 1), "layer-wise learning-rate decay: the backbone's top block trains at the phase's learning "
        "rate x layer_decay, each block below at layer_decay x the one above, the stem lowest, the head at the rate "
        "itself (AutoGluon's 0.9; BEiT's and MAE's 0.65 for a ViT-B, 0.75 for a ViT-L); 1: off")
    backbone: str = hyperparameter(
        "mobilenet_v3_small", BackboneName(BACKBONES), "the backbone fine-tuned: a Keras application in snake case "
        "(mobilenet_v3_small, efficientnet_v2_s, convnext_tiny, resnet50 ...), a keras-hub preset (dinov2_small, "
        "vit_base_patch16_224_imagenet ...), a keras-hub handle (kaggle://, hf://) or a preset folder's absolute "
        "path (docs/job.md, Backbones)")
    weights: str = hyperparameter("imagenet", parsers.weights, "the backbone's weights to start from (pretrained: a "
                                  "weights file in the 'pretrained' channel)")
    image_size: int = hyperparameter(224, Integer(min(b.min_size for b in BACKBONE_TABLE.values()), 1024),
                                     "side of the square images the model sees")
    resize: int | str | None = hyperparameter(  # (str: RESIZE_ORIGINAL)
        None, OrUnset(OrWord(RESIZE_ORIGINAL, Integer(32, 4096))),
        "the images' shorter side is resized to it first, then image_size taken from its centre (at random in "
        "training with augment crop): MXNet's resize; original: image_size taken so from each image at its own "
        "scale (enlarged to image_size first if smaller: MXNet without resize); unset: each whole image is resized "
        "to image_size")
    resize_interpolation: str = hyperparameter("bilinear", Choice(INTERPOLATIONS),
                                               "how images are resized (tf.image.resize's methods)",
                                               names={TENSORFLOW: "image_resize_interpolation"})
    reinitialize_top_layer: str = hyperparameter(
        "auto", Choice(("auto", "true", "false")), "with a 'model' channel (incremental training): auto keeps the "
        "previous classifier when the classes are the same and replaces it otherwise; true always replaces it; "
        "false keeps it")
    # (num_classes and class_names: None only while class folders are still to name the classes, main.py)
    num_classes: int | None = hyperparameter(None, OrUnset(Integer(2)), "number of classes (or give class_names)")
    class_names: tuple[str, ...] | None = hyperparameter(
        None, parsers.class_names, "class names, in label order (implies num_classes); without it, a Ground Truth "
        "manifest's label metadata names the classes")
    record_format: str = hyperparameter(
        "tfrecord", Choice(RECORD_FORMATS), "what the train and validation channels hold: tfrecord "
        "(tf.train.Examples), class_folders (File/FastFile: images in one folder per class, the built-in TensorFlow "
        "algorithm's layout; class_names default to the train channel's folder names, sorted), recordio (MXNet "
        "RecordIO image files, im2rec's .rec, the built-in MXNet algorithm's) or lst (File/FastFile: images listed "
        "by the .lst file of a train_lst and validation_lst channel, the built-in MXNet algorithm's "
        "application/x-image); in the MXNet dialect, the channels' ContentType decides")
    attribute_names: tuple[str, ...] | None = hyperparameter(
        None, parsers.attribute_names, "the train and validation channels are augmented manifests (Ground Truth's "
        "output) streamed in Pipe mode: their AttributeNames, in order, e.g. source-ref,label (the image, its label, "
        "optionally label-metadata); keras-pipe local, submit and tune set it")
    image_feature: str = hyperparameter("image/encoded", parsers.text,
                                        "tf.train.Example feature holding the JPEG/PNG bytes")
    label_feature: str = hyperparameter("image/class/label", parsers.text,
                                        "tf.train.Example int64 feature holding the label")
    augment: tuple[str, ...] = hyperparameter(
        "true", parsers.augment, f"the augmentations in training (true: {','.join(DEFAULT_AUGMENTATIONS)}; all: "
        "every one but the policies; trivial: TrivialAugment Wide, randaugment: RandAugment, each an image's "
        "operations drawn at random)")
    randaugment_ops: int = hyperparameter(2, Integer(1, 14), "augment randaugment: the operations an image")
    randaugment_magnitude: float = hyperparameter(
        9.0, Number(0, 10, open_low=False), "augment randaugment: their strength, out of 10 as timm counts it (9: "
        "the m of timm's rand-m9-n2)")
    augmentation_random_rotation: float = hyperparameter(
        0.03, Number(0, 0.5, open_low=False), "augment rotate: the largest turn either way, as a fraction of a full "
        "turn (Keras' RandomRotation factor; the default is about 11 degrees)")
    augmentation_random_zoom: float = hyperparameter(
        0.1, Number(0, 1, open_low=False), "augment zoom: the largest change of scale, out or in (z: 1 - z to 1 + z)")
    augmentation_random_aspect: float = hyperparameter(
        0.25, Number(0, 1, open_low=False), "augment aspect: the largest stretch of one side against the other (the "
        "default is MXNet's)")
    augmentation_random_shear: float = hyperparameter(
        0.1, Number(0, 1, open_low=False), "augment shear: the largest slant (the default is MXNet's)")
    augmentation_random_flip: str = hyperparameter("horizontal", Choice(FLIPS),
                                                   "augment flip: the directions an image may be flipped in")
    steps_per_execution: int | str = hyperparameter(  # (str: auto)
        "auto", OrWord("auto", Integer(1, 1000)), "training steps per call into TensorFlow (the host reads metrics "
        "once per call): more keeps a fast GPU busy between steps; a stop waits for the call to end; auto: 8 with a "
        "GPU, else 1", resumable=True)
    shuffle_buffer: int = hyperparameter(1024, Integer(0), "records in the shuffle buffer (0: no shuffling)")
    precise_bn_examples: int = hyperparameter(
        1024, Integer(0, 100_000), "a backbone trained from scratch (weights=none) or whose BatchNorm trains "
        "(train_batchnorm): its BatchNorm statistics recomputed after each epoch with the epoch's final weights, on "
        "up to this many of its last training images (kept on the host as uint8, 256 MiB at most; 0: the moving "
        "averages as they are)")
    dropout: float = hyperparameter(0.2, Number(0, 0.99, open_low=False), "dropout before the classifier",
                                    names={TENSORFLOW: "dropout_rate"})
    optimizer: str = hyperparameter("adam", Choice(OPTIMIZERS), "the optimizer (training/recipe.py builds each)")
    momentum: float = hyperparameter(0.9, Number(0, 1, open_low=False), "momentum of sgd, nesterov and rmsprop")
    beta_1: float = hyperparameter(0.9, Number(0, 1, open_low=False), "adam and adamw: decay of the first moment")
    beta_2: float = hyperparameter(0.999, Number(0, 1, open_low=False), "adam and adamw: decay of the second moment")
    epsilon: float = hyperparameter(1e-07, Number(0, 1), "adam, adamw, rmsprop, adagrad and adadelta: added to the "
                                    "denominator", names={MXNET: "eps"})
    rho: float = hyperparameter(0.95, Number(0, 1, open_low=False), "rmsprop and adadelta: decay of the squared "
                                "gradients' mean", names={MXNET: "gamma"})
    initial_accumulator_value: float = hyperparameter(0.0001, Number(0, 1, open_low=False),
                                                      "adagrad: the accumulators' starting value")
    weight_decay: float | None = hyperparameter(
        None, OrUnset(Number(0, 1, open_low=False)), "decoupled weight decay of every trained weight, per step and "
        "scaled by the learning rate (for sgd without momentum the same as MXNet's weight_decay); unset: 0.004 for "
        "adamw, else 0")
    weight_decay_style: str = hyperparameter(
        "decoupled", Choice(WEIGHT_DECAY_STYLES), "decoupled: weight_decay shrinks each weight apart from its "
        "gradient (Keras', AdamW's); l2: weight_decay x the weight is added to each trained weight's gradient, "
        "through the momentum, biases and betas excepted (MXNet's for sgd, nag)")
    regularizers_l2: float = hyperparameter(0.0, Number(0, 1, open_low=False),
                                            "L2 penalty on the classifier's kernel, added to the training loss")
    label_smoothing: float = hyperparameter(
        0.0, Number(0, 0.99, open_low=False), "training loss against labels of 1 - s + s/classes and s/classes "
        "elsewhere")
    ema_decay: float = hyperparameter(
        0.0, Number(0, 0.99999, open_low=False), "an exponential moving average of the weights, updated at every "
        "step, is the model each epoch is validated, kept and exported as (timm's model EMA; its nth update decays by "
        "min(ema_decay, (1 + n) / (10 + n))); 0.999 suits a few thousand steps; 0: off")
    test_time_flip: bool = hyperparameter(
        "false", flag, "test-time augmentation: the served model (the SavedModel, `serve`, keras-pipe predict) "
        "averages the logits of each image and of its mirror image, and the steps after training (calibration, "
        "evaluation.json, the report) judge that model; the epochs' metric lines stay the images' own")
    mixup_alpha: float = hyperparameter(
        0.0, Number(0, 10, open_low=False), "MixUp: each training image blended with another of its batch, in a "
        "share drawn from Beta(alpha, alpha), and the loss taken against both labels in those shares (timm's "
        "ImageNet setting: 0.8); 0: off")
    cutmix_alpha: float = hyperparameter(
        0.0, Number(0, 10, open_low=False), "CutMix: a box of another image of the batch pasted into each training "
        "image, its area drawn from Beta(alpha, alpha), the loss shared by area (timm's ImageNet setting: 1.0); 0: off")
    mixup_prob: float = hyperparameter(
        1.0, Number(0, 1), "the share of training batches mixed when mixup_alpha or cutmix_alpha is set")
    mixup_switch_prob: float = hyperparameter(
        0.5, Number(0, 1, open_low=False), "with both mixup_alpha and cutmix_alpha set: the share of mixed batches "
        "that CutMix (the others MixUp)")
    gradient_clip_norm: float = hyperparameter(
        0.0, Number(0, 1e6, open_low=False), "largest global norm of each step's gradient, summed over replicas (0: "
        "no clipping)")
    lr_schedule: str = hyperparameter(
        "constant", Choice(SCHEDULES), "each phase's learning rate by epoch: constant, cosine (down to 0 after its "
        "last epoch) or step (lr_scheduler_step)")
    lr_scheduler_step: tuple[int, ...] = hyperparameter(
        None, parsers.epochs_list, "lr_schedule=step: the epochs after which the rate is multiplied by "
        "lr_scheduler_factor, e.g. 10,20")
    lr_scheduler_factor: float = hyperparameter(0.1, Number(0, 1), "lr_schedule=step: the factor at each step")
    warmup_steps: int = hyperparameter(0, Integer(0), "optimizer steps at the start of each phase ramping its "
                                       "learning rate up linearly")
    early_stopping: bool = hyperparameter("false", flag, "end a phase when early_stopping_metric stops improving; "
                                          "the phase's best weights are kept")
    early_stopping_metric: str = hyperparameter(
        "val_loss", Choice(EARLY_STOPPING_METRICS), "what early stopping watches: val_loss, val_accuracy, or another "
        "validation metric the job reports (val_top_k_accuracy with top_k; val_f1_micro, val_f1_macro, val_auc ... "
        "with multi_label)")
    early_stopping_patience: int = hyperparameter(5, Integer(1), "epochs without improvement before a phase ends")
    early_stopping_min_delta: float = hyperparameter(0.0, Number(0, 1e6, open_low=False),
                                                     "smallest change that counts as an improvement")
    early_stopping_tolerance: float = hyperparameter(
        0.0, Number(0, 1, open_low=False), "smallest change that counts, relative to the best value so far (MXNet's)")
    early_stopping_min_epochs: int = hyperparameter(1, Integer(1), "epochs of a phase always trained")
    export_epoch: str = hyperparameter(
        "last", Choice(EXPORT_EPOCHS), "the epoch whose model is exported: last, or best by early_stopping_metric "
        "(with a validation channel; early stopping keeps the best in any case)")
    keep_epoch_models: int = hyperparameter(
        0, Integer(0), "every N epochs, that epoch's model is kept in the export's epochs/ folder (0: none), beside "
        "the model exported: the built-in MXNet algorithm's checkpoint_frequency", resumable=True)
    export_formats: tuple[str, ...] = hyperparameter(
        "none", parsers.export_formats, "exports beside the SavedModel, in model/exports/ (so in model.tar.gz): tflite "
        "(float32), tflite_float16 (float16 weights, half the file), tflite_int8 (int8 weights, about a third), "
        "tflite_full_int8 (weights and activations int8, calibrated on training images; float in and out), onnx "
        "(float32, for ONNX Runtime); each "
        "takes decoded, resized images and holds the scaling and calibration, and is checked against the SavedModel "
        "on the validation images (evaluation.json's exports): one that disagrees past its bar is dropped, said",
        resumable=True)
    calibration: str = hyperparameter(
        "auto", Choice(CALIBRATION),
        "calibrate the served probabilities on the validation set, predictions unchanged: a temperature dividing the "
        "logits (multi_label: one per class, with a bias per class where that does better, Platt scaling); true, "
        "false, or auto (with at least 200 validation examples, when it lowers both their cross-fitted NLL and Brier "
        "score, and its ECE is no higher)", resumable=True)
    label_check: bool = hyperparameter(
        "true", flag, "find the validation images whose labels are likely wrong (confident learning, on the exported "
        "model's probabilities: they are out of sample), in output/data/label_errors.csv and .manifest and the "
        "report page; label_error_folds adds the training images; false: no check", resumable=True)
    label_error_folds: int = hyperparameter(
        0, parsers.label_error_folds, "the label check looks at the training images too: their likely label errors "
        "from this many cross-validated heads on the starting backbone's features (0: the validation images alone)",
        resumable=True)
    class_weights: tuple[float, ...] | str | None = hyperparameter(  # (str: "balanced")
        None, parsers.class_weights, "weight of each class in the training loss: a list in label order, {name: "
        "weight}, or balanced (examples / (classes x the class's examples), as counted over the training examples "
        "seen so far)")
    multi_label: bool = hyperparameter(
        "false", flag, "each image has any number of the classes: a sigmoid per class, binary cross-entropy, and "
        "precision, recall, F1 and AUC in the metric lines")
    label_format: str = hyperparameter(
        "index", Choice(LABEL_FORMATS), "multi_label: the label feature holds class ids (index: an int64 list, e.g. "
        "[0, 2]) or one value per class (multi_hot: a float list of num_classes values, 0 or 1)")
    multi_label_threshold: float = hyperparameter(
        0.5, Number(0, 1), "multi_label: the probability from which a class counts as predicted (metrics, serving)")
    use_weighted_loss: bool = hyperparameter(
        "false", flag, "multi_label: weigh each class's positive examples by its negatives / positives, as counted "
        "over the training examples seen so far (MXNet's)")
    top_k: int | None = hyperparameter(
        None, OrUnset(Integer(2)), "also report top_k_accuracy: the share of examples whose label is among the k "
        "most likely")
    mixed_precision: str = hyperparameter("auto", Choice(MIXED_PRECISION),
                                          "float16 compute; auto: on when a GPU is present")
    max_corrupted_records_to_skip: int = hyperparameter(
        0, Integer(0), "corrupt or unusable records (not an image, too large, bad label) tolerated per pass and "
        "channel, each logged", resumable=True)
    max_image_pixels: int = hyperparameter(
        DEFAULT_MAX_PIXELS, Integer(1), "largest image accepted (width x height, read from its header before "
        "decoding); larger ones are unusable records", resumable=True)
    pipe_wait_timeout: float = hyperparameter(600, Number(0, 86400),
                                              "seconds to wait for a Pipe-mode FIFO and its writer", resumable=True)
    collective_timeout: float = hyperparameter(
        600, Number(0, 86400), "several hosts: seconds a step may wait for the others before the job fails (a host "
        "died)", resumable=True)
    seed: int = hyperparameter(0, Integer(0), "seed for shuffling, augmentation and initialisation",
                               names={TENSORFLOW: "random_seed"})
    validation_split_ratio: float = hyperparameter(
        0.0, Number(0, 0.9, open_low=False), "without a validation channel, the share of the train channel's images "
        "kept apart for validation, in each class folder, drawn by seed (record_format=class_folders; the built-in "
        "TensorFlow algorithm's split of its training channel); 0: none")
    dialect: str = hyperparameter(  # keras-pipe, mxnet or tensorflow: the names and defaults the request was read with
        "auto", Choice(("auto", *DIALECTS)), "whose names and defaults the hyperparameters are: keras-pipe (this "
        "job's), mxnet or tensorflow (SageMaker's built-in image classifiers'; docs/migration.md); auto: decided by "
        "the names given")
    other_checkpoints: str = hyperparameter(
        "refuse", Choice(OTHER_CHECKPOINTS), "when the checkpoint folder holds another job's checkpoints: refuse to "
        "start, resume the newest written with the same settings, or ignore them and train afresh", resumable=True)

    def reported_metrics(self, prefix: str) -> list[str]:
        """The metrics the job's lines report with these settings, under `prefix` (train_, val_)."""
        return reported_metrics(self, prefix)

    def check_record_format(self) -> None:
        """The channels' record format goes with the manifests' attribute names and the labels."""
        fmt = self.record_format
        if self.attribute_names and fmt != "tfrecord":
            raise UserError(f"hyperparameter attribute_names makes the channels Ground Truth manifests; record_format="
                            f"{fmt} says they hold something else: give one")
        if fmt == "class_folders" and self.multi_label:
            raise UserError("hyperparameter record_format=class_folders gives each image the one class of its "
                            "folder: for multi_label, prepare a CSV of path,label,label,... (keras-pipe prepare "
                            "--multi-label)")
        if fmt == "recordio" and self.multi_label and self.label_format != "multi_hot":
            raise UserError("hyperparameter record_format=recordio with multi_label: im2rec stores one value per "
                            "class (0 or 1): set label_format=multi_hot")

    def check_training(self, chosen: bool = True) -> None:
        """The training recipe's values, checked together: the schedule, the labels' settings, the metric
        early stopping watches, top_k, the image size for the backbone (and resize, not below it),
        something to train. `chosen` False: a preset is still to choose the image size and the length
        (config.JobConfig.with_preset checks them once it has)."""
        self.check_schedule()
        self.check_multi_label()
        self.check_metrics()
        if chosen:
            self.check_image_size()
            self.check_length()

    def check_schedule(self) -> None:
        if self.lr_schedule == "step" and not self.lr_scheduler_step:
            raise UserError("hyperparameter lr_schedule=step needs lr_scheduler_step: the epochs after which the "
                            "learning rate drops, e.g. 10,20")
        if self.lr_schedule != "step" and self.lr_scheduler_step:
            raise UserError(f"hyperparameter lr_scheduler_step is for lr_schedule=step; lr_schedule is "
                            f"{self.lr_schedule}: give one or the other")

    def check_multi_label(self) -> None:
        """What is for multi-label jobs only, and what for single-label ones."""
        if self.multi_label:
            if self.class_weights == "balanced":
                raise UserError("hyperparameter class_weights=balanced is for single-label jobs; a multi-label job's "
                                "classes are balanced by use_weighted_loss=true")
            if self.top_k is not None:
                raise UserError("hyperparameter top_k is for single-label jobs (the share of examples whose one label "
                                "is among the k most likely); multi_label reports precision, recall, F1 and AUC")
            return
        if self.use_weighted_loss:
            raise UserError("hyperparameter use_weighted_loss weighs a multi_label job's classes; set "
                            "multi_label=true, or class_weights for a single-label job")
        if self.label_format != "index":
            raise UserError(f"hyperparameter label_format={self.label_format} is for multi_label=true: a single-label "
                            "job reads one class id per image")

    def check_metrics(self) -> None:
        """Early stopping watches a metric the job reports; top_k leaves some class out of the top k."""
        watched = self.early_stopping_metric
        if watched not in self.reported_metrics("val_"):
            needs = ("top_k set (single-label)" if "top_k" in watched else "multi_label=true")
            raise UserError(f"hyperparameter early_stopping_metric={watched}: the job reports it only with {needs}; "
                            f"with these settings it reports {', '.join(self.reported_metrics('val_'))}")
        if self.top_k is not None and self.num_classes and self.top_k >= self.num_classes:
            raise UserError(f"hyperparameter top_k must be below the number of classes ({self.num_classes}): the top "
                            f"{self.top_k} hold every class; got {self.top_k}")

    def check_image_size(self) -> None:
        backbone = BACKBONE_TABLE.get(self.backbone)  # (a keras-hub preset's sizes are checked as it loads)
        if backbone and self.image_size < backbone.min_size:
            # (named as the request named it: MXNet's image_shape is image_size here)
            size = "image_shape's height and width" if self.dialect == MXNET else "image_size"
            raise UserError(f"hyperparameter {size} must be at least {backbone.min_size} for backbone "
                            f"{backbone.name} (the smallest input its application takes); got {self.image_size}")
        if self.resize not in (None, RESIZE_ORIGINAL) and self.resize < self.image_size:
            raise UserError(f"hyperparameter resize ({self.resize}) must be at least image_size ({self.image_size}): "
                            "the image_size x image_size crop is taken from the image resized to resize on its "
                            "shorter side")

    def check_length(self) -> None:
        """Something to train, and epoch models to keep among the epochs trained."""
        trained = self.epochs + self.fine_tune_epochs
        if trained == 0:
            raise UserError("hyperparameters epochs and fine_tune_epochs are both 0: nothing to train")
        if self.keep_epoch_models > trained:
            name = "checkpoint_frequency" if self.dialect == MXNET else "keep_epoch_models"
            raise UserError(f"hyperparameter {name} ({self.keep_epoch_models}) must be at most the epochs trained "
                            f"({trained}): it keeps every {name}-th epoch's model")


HYPERPARAMETERS = definitions(Hyperparameters)
RESUMABLE = tuple(name for name, h in HYPERPARAMETERS.items() if h.resumable)


def reported_metrics(values: Hyperparameters | Mapping[str, Any], prefix: str) -> list[str]:
    """The metrics the job's lines report for these settings (a JobConfig, or a hyperparameter name
    -> value mapping), under `prefix` (train_, val_)."""
    if isinstance(values, Mapping):
        multi_label, top_k = values["multi_label"], values["top_k"]
    else:
        multi_label, top_k = values.multi_label, values.top_k
    if multi_label:
        names = ["loss", *MULTI_LABEL_METRICS]
    else:
        names = ["loss", "accuracy"] + (["top_k_accuracy"] if top_k else [])
    return [prefix + name for name in names]
