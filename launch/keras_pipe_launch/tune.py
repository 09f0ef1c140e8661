"""`keras-pipe tune`: a hyperparameter tuning job over this image's training job.

    keras-pipe tune --image-uri 123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train \\
        --role arn:aws:iam::123456789012:role/SageMakerRole \\
        --train s3://bucket/data/train/ --validation s3://bucket/data/validation/ \\
        --output-path s3://bucket/tuning/ --instance-type ml.g5.xlarge --spot \\
        --hp num_classes=10 --hp epochs=5 \\
        --range learning_rate=1e-4:1e-2:log --range batch_size=32,64,128 --range dropout=0:0.5 \\
        --objective validation:accuracy --max-jobs 12 --max-parallel-jobs 3 --wait

Every training job of the tuning job is the one `keras-pipe submit` would start (same options), with the
--range hyperparameters chosen by SageMaker. A range is MIN:MAX[:SCALE] for an integer or number
hyperparameter (SCALE: auto, linear, log, reverse-log) or a comma-separated list of the values to
try, for any hyperparameter. Ranges are checked against the job's own schema: every bound and value
must be one the job accepts. --dry-run prints the CreateHyperParameterTuningJob request, checked
against botocore's model of the API, and contacts nothing; the installed SageMaker SDK (v3 or v2)
sends that same request.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from keras_pipe_launch import hyperparameters
from keras_pipe_launch.cli import UsageError
from keras_pipe_launch.job_request import JobSpec, RequestError, create_training_job_request, validate
from keras_pipe_launch.submit import add_job_arguments, dry_run_or_send, spec_from, use_region
from keras_pipe_train.metrics import METRIC_DEFINITIONS

STRATEGIES = ("Bayesian", "Random", "Grid")  # (Hyperband needs the job to report resources per epoch)
SCALES = {"auto": "Auto", "linear": "Linear", "log": "Logarithmic", "reverse-log": "ReverseLogarithmic"}
MAX_RANGES = 30  # SageMaker's limit on tuned hyperparameters (and on the values of one categorical)
POLL_S = float(os.environ.get("LAUNCH_POLL_SECONDS", "30"))


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


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("tune", help="start a hyperparameter tuning job on SageMaker",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_arguments(parser, what="tuning job")
    parser.add_argument("--range", action="append", default=[], metavar="NAME=MIN:MAX[:SCALE] or NAME=A,B,...",
                        help="a hyperparameter to tune (repeat for each)")
    parser.add_argument("--objective", default="validation:accuracy", choices=[d["Name"] for d in METRIC_DEFINITIONS],
                        help="the metric to optimise (default: validation:accuracy)")
    parser.add_argument("--objective-type", choices=("Maximize", "Minimize"), default=None,
                        help="default: Minimize for a loss, Maximize for an accuracy")
    parser.add_argument("--max-jobs", type=int, default=10, help="training jobs in all (default 10)")
    parser.add_argument("--max-parallel-jobs", type=int, default=2, help="training jobs at once (default 2)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="Bayesian")
    parser.add_argument("--early-stopping", choices=("Off", "Auto"), default="Off",
                        help="Auto: SageMaker stops training jobs that are unlikely to beat the best so far")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the CreateHyperParameterTuningJob request; contact nothing")
    parser.add_argument("--wait", action="store_true", help="follow the tuning job until it ends; print the best job")
    parser.set_defaults(run=run)


def tuning_spec_from(args: argparse.Namespace) -> TuningSpec:
    job = spec_from(args)
    static = dict(job.hyperparameters)
    if job.checkpoint_s3_uri and "other_checkpoints" not in static:
        # The training jobs share the checkpoint prefix, each in its own subfolder
        # (train/keras_pipe_train/checkpoints.py): a job must resume its own checkpoints (spot)
        # and leave the other jobs' alone.
        static["other_checkpoints"] = "ignore"
    objective_type = args.objective_type or ("Minimize" if args.objective.endswith("loss") else "Maximize")
    return TuningSpec(
        job=dataclasses.replace(job, hyperparameters=tuple(static.items())),
        ranges=tuple(parse_range(text) for text in args.range), objective=args.objective,
        objective_type=objective_type, max_jobs=args.max_jobs, max_parallel_jobs=args.max_parallel_jobs,
        strategy=args.strategy, early_stopping=args.early_stopping)


def parse_range(text: str) -> Range:
    """NAME=MIN:MAX[:SCALE] (Integer or Continuous, as the job's schema types NAME) or NAME=A,B,..."""
    from keras_pipe_train.config import HYPERPARAMETERS

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
    if name in HYPERPARAMETERS:
        kind = HYPERPARAMETERS[name].tuning_range
        if kind == "Categorical":
            raise UsageError(f"--range {text!r}: {name} is not a number; list the values to try: {name}=A,B,...")
    else:  # (another image's, with --no-validate; else refused in validate_tuning)
        kind = "Integer" if all(p.lstrip("-").isdigit() for p in parts[:2]) else "Continuous"
    return Range(name, kind, (parts[0], parts[1]), SCALES[parts[2] if len(parts) == 3 else "auto"])


def validate_tuning(spec: TuningSpec, check_hyperparameters: bool = True) -> list[str]:
    """Raises RequestError (or keras_pipe_train.errors.UserError) for what would make the tuning job
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
        raise RequestError(f"{', '.join(repeated)}: give each hyperparameter once, as --range or as --hp")
    if not 1 <= spec.max_parallel_jobs <= spec.max_jobs:
        raise RequestError(f"--max-parallel-jobs ({spec.max_parallel_jobs}) must be 1 to --max-jobs ({spec.max_jobs})")
    if spec.strategy == "Grid" and any(r.kind != "Categorical" for r in spec.ranges):
        raise RequestError("--strategy Grid tries every combination: give each --range as a list of values (A,B,...)")
    if spec.objective.startswith("validation:") and "validation" not in [c.name for c in spec.job.channels]:
        raise RequestError(f"--objective {spec.objective} is measured on the validation channel: give --validation "
                           "(or tune on a train: metric, which rewards overfitting)")
    if spec.job.spot and spec.job.checkpoint_s3_uri:
        warnings.append("each training job starts with a copy of the whole --checkpoint-s3-uri prefix, its own "
                        "checkpoints and those of the jobs before it (each in its own subfolder)")
    if check_hyperparameters:
        _check_against_schema(spec, static)
    return warnings


def _check_against_schema(spec: TuningSpec, static: dict[str, str]) -> None:
    """Every bound and categorical value is one the job accepts, alone and with the static ones."""
    from keras_pipe_train.config import HYPERPARAMETERS
    from keras_pipe_train.errors import UserError

    for r in spec.ranges:
        if r.name not in HYPERPARAMETERS:
            tunable = [h.name for h in HYPERPARAMETERS.values() if h.tuning_range != "Categorical"]
            raise RequestError(f"--range {r.name}: not a hyperparameter of the job; numbers to tune: "
                               f"{', '.join(tunable)} (any other as a list of values)")
        parse = HYPERPARAMETERS[r.name].parse
        try:
            parsed = [parse(r.name, v) for v in r.values]
        except UserError as err:
            raise RequestError(f"--range {r.name}: {err}") from None
        if r.kind != "Categorical":
            low, high = parsed
            if low >= high:
                raise RequestError(f"--range {r.name}: MIN ({r.values[0]}) must be below MAX ({r.values[1]})")
            if r.scale in ("Logarithmic", "ReverseLogarithmic") and low <= 0:
                raise RequestError(f"--range {r.name}: a logarithmic scale needs MIN > 0")
            if r.scale == "ReverseLogarithmic" and (r.kind != "Continuous" or high >= 1):
                raise RequestError(f"--range {r.name}: reverse-log is for numbers in [0, 1), not {r.kind.lower()}s")
    # the trials' corners: all lows, all highs (and each categorical's first and last)
    for end in (0, -1):
        hyperparameters.check({**static, **{r.name: r.values[end] for r in spec.ranges}})


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
    fields, lengths, enums), as boto3 would before sending it."""
    import botocore.session
    from botocore.validate import ParamValidator

    model = botocore.session.get_session().get_service_model("sagemaker")
    report = ParamValidator().validate(request, model.operation_model("CreateHyperParameterTuningJob").input_shape)
    if report.has_errors():
        raise RequestError(f"the request does not fit SageMaker's API: {report.generate_report()}")


def run(args: argparse.Namespace) -> int:
    from keras_pipe_train.errors import UserError

    try:
        spec = tuning_spec_from(args)
        warnings = validate_tuning(spec, check_hyperparameters=not args.no_validate)
        use_region(args)
        name = spec.name()
        request = create_tuning_job_request(spec, name)
        check_request(request)
    except (UsageError, RequestError, UserError) as err:
        print(f"keras-pipe tune: error: {err}", file=sys.stderr)
        return 2
    return dry_run_or_send("tune", "tuning job", args, warnings, request,
                           request["TrainingJobDefinition"].get("Environment"), lambda: _tune_with_sdk(spec, name),
                           follow)


def _tune_with_sdk(spec: TuningSpec, name: str) -> str:
    from keras_pipe_launch.sdk import tune

    tune(spec, name)
    return name


def follow(name: str) -> int:
    """Prints the tuning job's progress (its training jobs by status) until it ends, then the best
    training job; 0 if the tuning job completed."""
    import boto3

    sagemaker = boto3.client("sagemaker")
    shown = None
    while True:
        job = sagemaker.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
        status = job["HyperParameterTuningJobStatus"]
        counters = job.get("TrainingJobStatusCounters", {})
        best = job.get("BestTrainingJob", {})
        line = (f"{status}: training jobs " + ", ".join(f"{k.lower()} {v}" for k, v in counters.items() if v)
                + (f"; best so far {best['TrainingJobName']} "
                   f"{_metric(best)}" if best else ""))
        if line != shown:
            print(f"keras-pipe tune: {name}: {line}", file=sys.stderr)
            shown = line
        if status in ("Completed", "Failed", "Stopped"):
            break
        time.sleep(POLL_S)
    if best:
        print(f"keras-pipe tune: best training job {best['TrainingJobName']}: {_metric(best)}; hyperparameters "
              f"{json.dumps(best.get('TunedHyperParameters', {}))}", file=sys.stderr)
        print(best["TrainingJobName"])
    if status == "Completed":
        return 0
    print(f"keras-pipe tune: {name} {status.lower()}: {job.get('FailureReason', 'no reason given')}", file=sys.stderr)
    return 1


def _metric(best: dict) -> str:
    final = best.get("FinalHyperParameterTuningJobObjectiveMetric") or {}
    return f"{final.get('MetricName', '?')}={final.get('Value', '?')}"
