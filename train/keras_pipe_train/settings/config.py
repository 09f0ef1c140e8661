"""The training job's config: SageMaker's hyperparameters read into one typed, validated JobConfig.

Each hyperparameter is defined once, in hyperparameters.py; `HYPERPARAMETERS` is the table made
from those definitions. The launcher checks a job's hyperparameters with it before submitting (so
there is one source of truth), and `JobConfig.from_hyperparameters` turns SageMaker's hyperparameters
(strings, in whichever form the client that set them used: parsers.unquoted), in this job's names
or a built-in algorithm's (dialects.py), into a JobConfig, or raises a UserError naming the
hyperparameter and what is allowed. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import difflib

from keras_pipe_train.settings import dialects, presets
from keras_pipe_train.settings.errors import UserError

# (what the job, the launcher and the tests import from here, defined where it belongs)
from keras_pipe_train.settings.hyperparameters import (  # noqa: F401
    BACKBONES,
    CALIBRATION,
    DEFAULT_MAX_PIXELS,
    EARLY_STOPPING_METRICS,
    EXPORT_EPOCHS,
    FLIPS,
    HYPERPARAMETERS,
    INTERPOLATIONS,
    LABEL_FORMATS,
    MIXED_PRECISION,
    MULTI_LABEL_METRICS,
    OPTIMIZERS,
    OTHER_CHECKPOINTS,
    RECORD_FORMATS,
    RESUMABLE,
    SCHEDULES,
    WEIGHT_DECAY_STYLES,
    Hyperparameter,
    Hyperparameters,
    reported_metrics,
)
from keras_pipe_train.settings.parsers import (  # noqa: F401
    AUGMENTATIONS,
    DEFAULT_AUGMENTATIONS,
    MAX_LABEL_ERROR_FOLDS,
    RESIZE_ORIGINAL,
    WEIGHT_SOURCES,
    ManifestRoles,
    is_none,
    manifest_roles,
)

# Set by SageMaker or its SDKs, not by the user: accepted and ignored. A tuning job adds
# _tuning_objective_metric to each of its training jobs; the SDKs add sagemaker_* and model_dir.
_PLATFORM_PREFIXES = ("sagemaker_", "_tuning_")
_PLATFORM_NAMES = ("model_dir",)


@dataclasses.dataclass(frozen=True)
class JobConfig(Hyperparameters):
    """The hyperparameters of one request, and what the log says of how they were read."""
    dialect_notes: tuple[str, ...] = ()  # what the log says of the built-in's names (dialects.py)
    given: tuple[str, ...] = ()  # the hyperparameters the request gave (in this job's names): a preset keeps them
    preset_notes: tuple[str, ...] = ()  # what the preset chose, and why (presets.py)

    @classmethod
    def from_hyperparameters(cls, raw: dict, hosts: int = 1) -> JobConfig:
        """`hosts`: how many train (the built-in MXNet algorithm's batch size is per host)."""
        translation = dialects.translate(raw, hosts)
        raw = dict(translation.hyperparameters)
        # MXNet's step schedule has no switch: its steps alone turn it on
        if "lr_scheduler_step" in raw and "lr_schedule" not in raw and not is_none(raw["lr_scheduler_step"]):
            raw["lr_schedule"] = "step"
        _check_known(raw)
        # defaults go through the same parsing as given values ("true" -> all augmentations); a name
        # given None or null is not given (dialects.without_unset, in translate)
        values = {name: h.parse(name, raw.get(name, h.default)) for name, h in HYPERPARAMETERS.items()}
        # class folders name their classes: the job reads them from the train channel (main.py),
        # the launcher checks the rest without them
        deferred = values["record_format"] == "class_folders" and values["class_names"] is None
        if not deferred or values["num_classes"] is not None:
            values["num_classes"], values["class_names"] = _classes(values["num_classes"], values["class_names"])
        given = tuple(sorted(name for name in raw if name in HYPERPARAMETERS and name != "dialect"))
        config = cls(**values, dialect_notes=translation.notes, given=given)
        config.check_record_format()
        config = dataclasses.replace(config, class_weights=_weights_per_label(config.class_weights,
                                                                              config.class_names))
        config.check_preset()
        config.check_training(chosen=config.preset == "none")
        return config

    def check_preset(self) -> None:
        if self.preset != "none" and self.dialect != dialects.KERAS_PIPE:
            raise UserError(f"hyperparameter preset={self.preset} chooses among this job's hyperparameters; the "
                            f"request is read in the {self.dialect} dialect, whose defaults are the built-in "
                            "algorithm's: give this job's names (docs/migration.md), or leave preset out")
        if self.preset != "none" and self.weights == "none":
            # a preset's recipe is fine-tuning's (a head on pretrained features, then the backbone at
            # a tenth of its rate): from random weights the job trains one phase from scratch, and
            # the preset's two head epochs would be all of it
            raise UserError(f"hyperparameter preset={self.preset} chooses a recipe for fine-tuning pretrained "
                            "weights; weights=none trains from scratch, which no preset chooses for: leave weights "
                            "unset (ImageNet's), give a weights file or the 'pretrained' channel, or leave preset "
                            "out and give epochs and learning_rate")

    def with_preset(self, situation: presets.Situation) -> JobConfig:
        """The config with what its preset chooses in `situation` for each hyperparameter the request
        did not give (each parsed as if given), checked again; its notes say what and why."""
        if self.preset == "none":
            return self
        choice = presets.choose(self.preset, situation, {name: getattr(self, name) for name in self.given})
        chosen = {name: HYPERPARAMETERS[name].parse(name, value) for name, value in choice.values.items()
                  if name not in self.given}
        kept = sorted(name for name in choice.values if name in self.given)
        said = ", ".join(f"{name}={value}" for name, value in choice.values.items() if name in chosen)
        notes = (f"preset {self.preset}: {said}", *choice.reasons,
                 *([f"given, so kept: {', '.join(f'{n}={_shown(getattr(self, n))}' for n in kept)}"] if kept else []))
        config = dataclasses.replace(self, **chosen, preset_notes=notes)
        config.check_training()
        return config

    def settings(self) -> str:
        """The hyperparameters' values as the log says them. Before a preset has chosen, only those
        given: the defaults it will replace would mislead."""
        waiting = self.preset != "none" and not self.preset_notes
        values = {name: value for name, value in dataclasses.asdict(self).items()
                  if name not in READING_NOTES and (not waiting or name in self.given or name == "preset")}
        said = ", ".join(f"{name}={value}" for name, value in values.items())  # (as it always was: Python's forms)
        return f"{said} (preset {self.preset} chooses the others once the training set is counted)" if waiting else said

    def identity(self) -> dict:
        """The settings a resume may not change, by name: checkpoints are resumed only by a job
        whose identity is theirs (training/resume.py)."""
        derived = () if self.preset == "none" else tuple(n for n in PRESET_DERIVED if n not in self.given)
        return {name: value for name, value in dataclasses.asdict(self).items()
                if name not in RESUMABLE_CHANGES and name not in derived}


# JobConfig's fields that say how the request was read, not hyperparameters (the report and MLflow leave them out)
READING_NOTES = ("dialect_notes", "given", "preset_notes")
# The fields a job may change and still resume its checkpoints: the resumable hyperparameters (train
# longer or shorter, with another global batch, other time limits), and what the log said of the request
RESUMABLE_CHANGES = (*RESUMABLE, *READING_NOTES)
# What a preset derives from resumable hyperparameters (the batch, the epochs): a resume that changes those
# changes these with them, unless the request gave them
PRESET_DERIVED = ("warmup_steps", "ema_decay")


def _shown(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value).lower() if isinstance(
        value, bool) else str(value)


def _check_known(raw: dict) -> None:
    """Every hyperparameter given is the job's, one of the built-in algorithms' names for one, or
    SageMaker's own; else a UserError naming the unknown ones (with what they may have meant)."""
    unknown = sorted(
        name for name in raw
        if name not in HYPERPARAMETERS
        and name not in _PLATFORM_NAMES
        and not name.startswith(_PLATFORM_PREFIXES)
    )
    if unknown:
        # (the names it takes are too many to list in a failure reason SageMaker cuts at 1 KB)
        # (a name the job and a built-in share is offered once)
        known = list(dict.fromkeys([*HYPERPARAMETERS, *dialects.MXNET_NAMES, *dialects.TENSORFLOW_NAMES]))
        guesses = [f"{name} (did you mean {', '.join(close)}?)" if (close := difflib.get_close_matches(
            name.lower(), known, n=2, cutoff=0.75)) else name for name in unknown]
        raise UserError(
            f"unknown hyperparameter{'s' if len(unknown) > 1 else ''} {', '.join(guesses)}; the job accepts "
            f"{len(HYPERPARAMETERS)} (docs/job.md, Hyperparameters), or the built-in MXNet or TensorFlow image "
            "classifier's (docs/migration.md)"
        )


def _weights_per_label(weights, class_names: tuple[str, ...] | None) -> tuple[float, ...] | str | None:
    if weights is None or weights == "balanced" or class_names is None:
        return weights
    if weights and isinstance(weights[0], tuple):  # {name or label: weight}
        given = dict(weights)
        labels = {name: str(label) for label, name in enumerate(class_names)}
        unknown = [key for key in given if key not in labels and key not in labels.values()]
        if unknown:
            raise UserError(f"hyperparameter class_weights names {', '.join(map(repr, unknown))}, not a class of the "
                            f"job ({', '.join(class_names[:10])}{', ...' if len(class_names) > 10 else ''})")
        return tuple(given.get(name, given.get(str(label), 1.0)) for label, name in enumerate(class_names))
    if len(weights) != len(class_names):
        raise UserError(f"hyperparameter class_weights lists {len(weights)} weights for {len(class_names)} classes")
    return tuple(weights)


def _classes(num_classes: int | None, class_names: tuple[str, ...] | None) -> tuple[int, tuple[str, ...]]:
    if class_names is None and num_classes is None:
        raise UserError("hyperparameter num_classes (or class_names) is required")
    if class_names is None:
        return num_classes, tuple(str(i) for i in range(num_classes))
    if num_classes is not None and num_classes != len(class_names):
        raise UserError(
            f"hyperparameters disagree: num_classes is {num_classes} but class_names lists {len(class_names)}"
        )
    return len(class_names), class_names
