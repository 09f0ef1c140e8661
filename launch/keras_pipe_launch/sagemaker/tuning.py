"""A hyperparameter tuning job over this image's training job: its ranges, checked against the job's
own schema, and its CreateHyperParameterTuningJob request, checked against botocore's model of the
API. Every training job of it is the one `keras-pipe submit` would start, with the ranged
hyperparameters chosen by SageMaker."""

from __future__ import annotations

import dataclasses
import itertools
import time

from keras_pipe_launch.common import hyperparameters
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError
from keras_pipe_launch.sagemaker.request import JobSpec, RequestError, create_training_job_request, validate
from keras_pipe_train.settings.channels import VALIDATION

STRATEGIES = ("Bayesian", "Random", "Grid")  # (Hyperband needs the job to report resources per epoch)
SCALES = {"auto": "Auto", "linear": "Linear", "log": "Logarithmic", "reverse-log": "ReverseLogarithmic"}
MAX_RANGES = 30  # SageMaker's limit on tuned hyperparameters (and on the values of one categorical)



@dataclasses.dataclass(frozen=True)
class Range:
    name: str
    kind: str  # Integer, Continuous or Categorical: the key of its list in ParameterRanges
    values: tuple[str, ...]  # (MIN, MAX) or the categorical values, as SageMaker gets them
    scale: str = "Auto"

    def request(self) -> dict:
        if self.kind == "Categorical":
            return {"Name": self.name, "Values": list(self.values)}
        return {"Name": self.name, "MinValue": self.values[0], "MaxValue": self.values[1], "ScalingType": self.scale}


@dataclasses.dataclass(frozen=True)
class TuningSpec:
    job: JobSpec  # the training jobs; job.hyperparameters are the static ones
    ranges: tuple[Range, ...]
    objective: str = "validation:accuracy"
    objective_type: str = "Maximize"
    max_jobs: int = 10
    max_parallel_jobs: int = 2
    strategy: str = "Bayesian"
    early_stopping: str = "Off"

    def name(self) -> str:
        # a tuning job's name has at most 32 characters; its training jobs are named after it
        return f"{self.job.base_job_name}-{time.strftime('%y%m%d-%H%M%S')}"


def _schema(name: str):
    """The job's Hyperparameter typing `name`'s values: its own, or the one a built-in algorithm's
    number stands for (mini_batch_size, eps ...); None for any other name."""
    from keras_pipe_train.settings.config import HYPERPARAMETERS
    from keras_pipe_train.settings.dialects import NUMBERS_AS

    return HYPERPARAMETERS.get(NUMBERS_AS.get(name, name))


def parse_range(text: str) -> Range:
    """NAME=MIN:MAX[:SCALE] (Integer or Continuous, as the job's schema types NAME) or NAME=A,B,..."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise UsageError(f"--range {text!r}: expected NAME=MIN:MAX[:SCALE] or NAME=A,B,...")
    if ":" not in value:
        values = tuple(v.strip() for v in value.split(","))
        if len(values) > MAX_RANGES or "" in values:
            raise UsageError(f"--range {text!r}: 1 to {MAX_RANGES} non-empty values, separated by commas")
        return Range(name, "Categorical", values)
    parts = [p.strip() for p in value.split(":")]
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in SCALES):
        raise UsageError(f"--range {text!r}: expected NAME=MIN:MAX or NAME=MIN:MAX:SCALE, "
                         f"SCALE one of {', '.join(SCALES)}")
    schema = _schema(name)
    if schema is not None:
        kind = schema.tuning_range
        if kind == "Categorical":
            raise UsageError(f"--range {text!r}: {name} is not a number; list the values to try: {name}=A,B,...")
    else:  # (another image's, with --no-validate; else refused in validate_tuning)
        kind = "Integer" if all(p.lstrip("-").isdigit() for p in parts[:2]) else "Continuous"
    return Range(name, kind, (parts[0], parts[1]), SCALES[parts[2] if len(parts) == 3 else "auto"])


def validate_tuning(spec: TuningSpec, check_hyperparameters: bool = True) -> list[str]:
    """Raises RequestError (or keras_pipe_train.settings.errors.UserError) for what would make the tuning job
    fail; returns warnings."""
    warnings = validate(spec.job)
    static = dict(spec.job.hyperparameters)
    names = [r.name for r in spec.ranges]
    if not spec.ranges:
        raise RequestError("give at least one --range: the hyperparameters to tune")
    if spec.job.tensorboard_s3_uri:
        raise RequestError("--tensorboard-s3-uri: tuning jobs have no TensorBoard output (SageMaker's API has no "
                           "place for it); each training job's metrics are in its own description and logs")
    if len(names) > MAX_RANGES:
        raise RequestError(f"{len(names)} ranges: SageMaker tunes at most {MAX_RANGES} hyperparameters")
    repeated = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(static)))
    if repeated:
        raise RequestError(f"{shown(', '.join(repeated))}: give each hyperparameter once, as --range or as --hp")
    if not 1 <= spec.max_parallel_jobs <= spec.max_jobs:
        raise RequestError(f"--max-parallel-jobs ({spec.max_parallel_jobs}) must be 1 to --max-jobs ({spec.max_jobs})")
    if spec.strategy == "Grid" and any(r.kind != "Categorical" for r in spec.ranges):
        raise RequestError("--strategy Grid tries every combination: give each --range as a list of values (A,B,...)")
    if spec.objective.startswith("validation:") and VALIDATION not in [c.name for c in spec.job.channels]:
        raise RequestError(f"--objective {spec.objective} is measured on the validation channel: give --validation "
                           "(or tune on a train: metric, which rewards overfitting)")
    if "top_k" in spec.objective and "top_k" not in static and "top_k" not in names:
        raise RequestError(f"--objective {spec.objective}: the job reports it only with hyperparameter top_k set "
                           "(--hp top_k=5)")
    from keras_pipe_train.settings.config import MULTI_LABEL_METRICS

    metric = spec.objective.split(":", 1)[-1]
    if metric in MULTI_LABEL_METRICS and metric != "accuracy" and "multi_label" not in names \
            and not _flag_set(static.get("multi_label")):
        raise RequestError(f"--objective {spec.objective}: the job reports it only with hyperparameter "
                           "multi_label=true (--hp multi_label=true)")
    if spec.job.spot and spec.job.checkpoint_s3_uri:
        warnings.append("each training job starts with a copy of the whole --checkpoint-s3-uri prefix, its own "
                        "checkpoints and those of the jobs before it (each in its own subfolder)")
    if check_hyperparameters:
        _check_against_schema(spec, static)
    return warnings


def _flag_set(value) -> bool:
    """Whether a true/false hyperparameter's value, as given, is true (one the job refuses is not)."""
    from keras_pipe_train.settings.config import HYPERPARAMETERS
    from keras_pipe_train.settings.errors import UserError

    try:
        return value is not None and HYPERPARAMETERS["multi_label"].parse("multi_label", value)
    except UserError:
        return False


def _check_against_schema(spec: TuningSpec, static: dict[str, str]) -> None:
    """Every bound and categorical value is one the job accepts, alone and with the static ones."""
    from keras_pipe_train.settings.config import HYPERPARAMETERS
    from keras_pipe_train.settings.dialects import MXNET_NAMES, TENSORFLOW_NAMES
    from keras_pipe_train.settings.errors import UserError

    for r in spec.ranges:
        schema = _schema(r.name)
        builtin = r.name not in HYPERPARAMETERS and r.name in {**MXNET_NAMES, **TENSORFLOW_NAMES}
        if schema is None and not builtin:
            tunable = [h.name for h in HYPERPARAMETERS.values() if h.tuning_range != "Categorical"]
            raise RequestError(f"--range {shown(r.name)}: not a hyperparameter of the job; numbers to tune: "
                               f"{', '.join(tunable)} (any other as a list of values)")
        try:
            if builtin:  # (a built-in's name: each value, or bound, read as the job reads that built-in's)
                for value in r.values:
                    hyperparameters.check({**static, r.name: value})
                if schema is None:
                    continue
            parsed = [schema.parse(r.name, v) for v in r.values]
        except UserError as err:
            raise RequestError(f"--range {r.name}: {err}") from None
        if r.kind != "Categorical":
            low, high = parsed
            if not all(isinstance(v, (int, float)) for v in parsed):  # (resize's `original`)
                raise RequestError(f"--range {r.name}: MIN:MAX takes numbers; give other values as a list "
                                   f"({r.name}=A,B,C)")
            if low >= high:
                raise RequestError(f"--range {r.name}: MIN ({r.values[0]}) must be below MAX ({r.values[1]})")
            if r.scale in ("Logarithmic", "ReverseLogarithmic") and low <= 0:
                raise RequestError(f"--range {r.name}: a logarithmic scale needs MIN > 0")
            if r.scale == "ReverseLogarithmic" and (r.kind != "Continuous" or high >= 1):
                raise RequestError(f"--range {r.name}: reverse-log is for numbers in [0, 1), not {r.kind.lower()}s")
    for trial, which in corners(spec.ranges):
        try:
            hyperparameters.check({**static, **trial})
        except UserError as err:
            raise RequestError(f"a trial these ranges allow would fail ({shown(which)}): {err}") from None


def corners(ranges: list) -> list[tuple[dict, str]]:
    """The trials checked before a tuning job is sent, each with what sets it apart: every range
    at its low end (a categorical at its first value), then at its high end (last); with the
    others there, each categorical's other values, and each pair of ranges at their ends'
    other combinations. The job's rules across fields bind two at a time (epochs against
    keep_epoch_models, image_size against resize, early_stopping_metric against multi_label):
    a pair whose rule fails only at opposite ends is found. (All 2^n combinations would be 10^9
    with SageMaker's 30 ranges; these are at most about 4,400, under a second.)"""
    ends = [(r.values[0], r.values[-1]) for r in ranges]
    trials = []
    for side, word in ((0, "low"), (1, "high")):
        base = {r.name: e[side] for r, e in zip(ranges, ends)}
        rest = f", the others at their {word} ends" if len(ranges) > 2 else ""
        trials.append((base, f"every range at its {word} end"))
        for r in ranges:
            if r.kind == "Categorical":
                trials += [({**base, r.name: value}, f"{r.name}={value}" + (rest if len(ranges) > 1 else ""))
                           for value in r.values[1:-1]]
        for i, j in itertools.combinations(range(len(ranges)), 2):
            for a, b in itertools.product((0, 1), repeat=2):
                if a == b == side:
                    continue  # (the trial of every range at this end)
                first, second = ranges[i].name, ranges[j].name
                trials.append(({**base, first: ends[i][a], second: ends[j][b]},
                               f"{first}={ends[i][a]}, {second}={ends[j][b]}{rest}"))
    return trials


def create_tuning_job_request(spec: TuningSpec, name: str | None = None) -> dict:
    """The CreateHyperParameterTuningJob request for `spec`, field for field as the SDKs send it."""
    training = create_training_job_request(spec.job, "unused")
    definition = {
        "StaticHyperParameters": training["HyperParameters"],
        "AlgorithmSpecification": training["AlgorithmSpecification"],
        "RoleArn": training["RoleArn"],
        "InputDataConfig": training["InputDataConfig"],
        "OutputDataConfig": training["OutputDataConfig"],
        "ResourceConfig": training["ResourceConfig"],
        "StoppingCondition": training["StoppingCondition"],
    }
    for optional in ("EnableManagedSpotTraining", "CheckpointConfig", "EnableNetworkIsolation", "Environment"):
        if optional in training:
            definition[optional] = training[optional]
    ranges = {f"{kind}ParameterRanges": [r.request() for r in spec.ranges if r.kind == kind]
              for kind in ("Integer", "Continuous", "Categorical")}
    request = {
        "HyperParameterTuningJobName": name or spec.name(),
        "HyperParameterTuningJobConfig": {
            "Strategy": spec.strategy,
            "HyperParameterTuningJobObjective": {"Type": spec.objective_type, "MetricName": spec.objective},
            "ResourceLimits": {"MaxNumberOfTrainingJobs": spec.max_jobs,
                               "MaxParallelTrainingJobs": spec.max_parallel_jobs},
            "ParameterRanges": ranges,
            "TrainingJobEarlyStoppingType": spec.early_stopping,
        },
        "TrainingJobDefinition": definition,
    }
    if "Tags" in training:
        request["Tags"] = training["Tags"]
    return request


def check_request(request: dict) -> None:
    """Validates `request` against botocore's model of CreateHyperParameterTuningJob (types, required
    fields, lengths, patterns, enums, maximums), as SageMaker would when it is sent."""
    from keras_pipe_launch.sagemaker import api_limits

    api_limits.check(request, "CreateHyperParameterTuningJob")
