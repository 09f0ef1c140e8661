"""Each hyperparameter is defined once (keras_pipe_train/settings/hyperparameters.py), and every place
that shows or reads one agrees with its definition: JobConfig's fields and their types, docs/job.md's
table, the launcher's --hp help as a user reads it, the ranges a tuning job may give it, the
built-in algorithms' names for it, and whether a resume may change it."""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import types
import typing
from pathlib import Path

import pytest

from keras_pipe_launch.common.channels import ChannelSpec
from keras_pipe_launch.common.usage import UsageError
from keras_pipe_launch.sagemaker import tuning
from keras_pipe_launch.sagemaker.request import JobSpec, RequestError
from keras_pipe_train.settings import dialects
from keras_pipe_train.settings.config import HYPERPARAMETERS, RESUMABLE_CHANGES, Hyperparameter, JobConfig
from keras_pipe_train.settings.parsers import Integer, Number, OrUnset, OrWord
from tests.conftest import REPO, run_logged

KERAS_PIPE = Path(sys.executable).parent / "keras-pipe"  # the console script, as users type it
NOT_HYPERPARAMETERS = ("dialect_notes", "given", "preset_notes")  # JobConfig's fields that say how a request was read


def docs_table() -> dict[str, tuple[str, str, str]]:
    """docs/job.md's table of hyperparameters: name -> (default, values, what)."""
    section = (REPO / "docs/job.md").read_text().split("\n## Hyperparameters\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \| (.*?) \| (.*?) \|$", section, re.M)
    return {name: cells for name, *cells in rows}


@functools.cache
def help_of(command: str) -> str:
    done = run_logged([str(KERAS_PIPE), command, "--help"], 120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def listed_in_help(command: str) -> dict[str, tuple[str | None, str]]:
    """The hyperparameters `keras-pipe COMMAND --help` lists: name -> (default or None, values)."""
    listing = help_of(command).split("the job's hyperparameters (--hp NAME=VALUE)", 1)[1].split(":\n", 1)[1]
    lines = [re.fullmatch(r"  (\w+)(?:=(\S+))?(?: +(.*))?", line) for line in listing.splitlines()]
    assert all(lines), listing
    return {m[1]: (m[2], m[3] or "") for m in lines}


def numeric(parse) -> Integer | Number | None:
    """The typed number a parser reads, through its "or unset" and "or a word"; None for others."""
    while isinstance(parse, (OrUnset, OrWord)):
        parse = parse.parse
    return parse if isinstance(parse, (Integer, Number)) else None


# settings besides the range under which any value within a hyperparameter's bounds is accepted
# (resnet20 takes the smallest image_size; image_size 32 the smallest resize; something trains)
STATIC = {"num_classes": "10", "fine_tune_epochs": "1", "backbone": "resnet20", "weights": "none", "image_size": "32"}


def tuned(name: str, low, high) -> tuning.Range:
    """The range `--range NAME=LOW:HIGH` as `keras-pipe tune` reads and checks it (RequestError
    when it refuses it, UsageError when it is not a number's)."""
    job = JobSpec(image_uri="123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:1",
                  role="arn:aws:iam::123456789012:role/SageMakerRole", output_path="s3://data/tuning/",
                  channels=(ChannelSpec("train", "s3://data/train/"), ChannelSpec("validation", "s3://data/val/")),
                  hyperparameters=tuple((k, v) for k, v in STATIC.items() if k != name))
    chosen = tuning.parse_range(f"{name}={low}:{high}")
    tuning.validate_tuning(tuning.TuningSpec(job, (chosen,)))
    return chosen


def check_tuning(h: Hyperparameter) -> None:
    """A tuning job ranges a number over exactly its bounds, typed as the definition says."""
    number = numeric(h.parse)
    if number is None:
        assert h.tuning_range == "Categorical", h.name
        with pytest.raises(UsageError, match=f"{h.name} is not a number"):
            tuning.parse_range(f"{h.name}=1:2")
        return
    assert h.tuning_range == number.tuning_range and h.bounds == number.bounds, h.name
    low, high = h.bounds
    if isinstance(number, Integer):
        inside, below, above = (low, low + 1), (low - 1, low + 1), (low, high + 1) if high is not None else None
    else:
        step = (high - low) / 1000
        inside = (low + step if number.open_low else low, high)
        below, above = (low if number.open_low else low - step, high), (low + step, high + step)
    assert tuned(h.name, *inside).kind == h.tuning_range, h.name
    for outside in (below, above):
        if outside is not None:
            with pytest.raises(RequestError, match=f"--range {h.name}: hyperparameter {h.name} must be"):
                tuned(h.name, *outside)


@pytest.mark.slow
def test_jobconfig_the_docs_the_launchers_help_and_tuning_agree_with_each_definition():
    fields = {f.name: f for f in dataclasses.fields(JobConfig)}
    docs = docs_table()
    helped = listed_in_help("local")
    assert list(fields) == [*HYPERPARAMETERS, *NOT_HYPERPARAMETERS]
    assert list(docs) == list(helped) == list(HYPERPARAMETERS)
    for name, h in HYPERPARAMETERS.items():
        assert fields[name].default is dataclasses.MISSING, name  # (its default is read as a given value is)
        default, values, what = docs[name]
        assert (values, what) == (h.accepts, h.help), name
        if h.default is not None:
            assert default == f"`{h.default}`", name
        else:  # (said in words, "unset" or "required", never as a value)
            assert not default.startswith("`"), name
        assert helped[name] == (None if h.default is None else str(h.default), h.accepts), name
        check_tuning(h)


@pytest.mark.parametrize("command", ["submit", "tune"])
def test_submit_and_tune_list_the_hyperparameters_as_local_does(command):
    assert listed_in_help(command) == listed_in_help("local")


# requests whose values, between them, leave no field at its default
REQUESTS = [
    {"num_classes": 3},
    {"class_names": "a,b,c", "multi_label": "true", "label_format": "multi_hot", "use_weighted_loss": "1",
     "weight_decay": "0.01", "resize": "original", "steps_per_execution": "4", "lr_schedule": "step",
     "lr_scheduler_step": "2,4", "augment": "all", "early_stopping_metric": "val_auc", "attribute_names": "a-ref,b"},
    {"num_classes": 10, "top_k": 3, "resize": 256, "class_weights": "balanced", "label_error_folds": 5, "preset": "best"},
    {"class_names": '["x", "y"]', "class_weights": '{"x": 2}', "record_format": "class_folders"},
    {"record_format": "class_folders"},  # (its classes named later, by its train channel's folders)
]


def conforms(value, hint) -> bool:
    """Whether `value` is of the type `hint` (unions, tuple[X, ...], None)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(conforms(value, arg) for arg in args)
    if origin is tuple:
        return isinstance(value, tuple) and all(conforms(item, args[0]) for item in value)
    if hint is type(None):
        return value is None
    return isinstance(value, hint) and not (hint is int and isinstance(value, bool))


@pytest.mark.parametrize("request_", REQUESTS)
def test_each_field_is_typed_as_its_parser_reads_it(request_):
    hints = typing.get_type_hints(JobConfig)
    config = JobConfig.from_hyperparameters(request_)
    for name, value in dataclasses.asdict(config).items():
        assert conforms(getattr(config, name), hints[name]), (name, value, hints[name])


def test_a_resume_may_change_the_resumable_hyperparameters_and_how_the_request_was_read_only():
    resumable = [name for name, h in HYPERPARAMETERS.items() if h.resumable]
    assert RESUMABLE_CHANGES == (*resumable, *NOT_HYPERPARAMETERS)
    config = JobConfig.from_hyperparameters({"num_classes": 3})
    assert list(config.identity()) == [name for name in HYPERPARAMETERS if name not in resumable]
    longer = JobConfig.from_hyperparameters({"num_classes": 3, "epochs": 9, "batch_size": 8, "calibration": "false"})
    assert longer.identity() == config.identity()
    other = JobConfig.from_hyperparameters({"num_classes": 3, "learning_rate": 0.1})
    assert other.identity() != config.identity()
    # docs/job.md's Checkpoints says which may change, by name
    said = (REPO / "docs/job.md").read_text().split("A restarted job (same name, same settings;", 1)[1]
    said = said.split(") resumes its own", 1)[0]
    assert re.findall(r"`(\w+)`", said) == resumable, said


def example(h: Hyperparameter):
    """A value of `h` other than its default (and other than a built-in's default for it)."""
    number = numeric(h.parse)
    if isinstance(number, Integer):
        return number.minimum + 7
    if isinstance(number, Number):
        return number.minimum + (number.maximum - number.minimum) * 0.37
    return h.parse.options[-1]


def test_a_built_in_name_for_one_of_ours_reads_as_ours_in_its_dialect_and_is_tuned_as_ours():
    tables = {dialects.MXNET: dialects.MXNET_NAMES, dialects.TENSORFLOW: dialects.TENSORFLOW_NAMES}
    renamed = [(dialect, theirs, name) for name, h in HYPERPARAMETERS.items() for dialect, theirs in h.names.items()]
    assert renamed, "no definition names a built-in's name"
    for dialect, theirs, name in renamed:
        assert theirs in tables[dialect] and theirs not in HYPERPARAMETERS, theirs
        assert dialects.SAME_SETTING[theirs] == name
        h = HYPERPARAMETERS[name]
        value = example(h)
        assert h.parse(name, value) != h.parse(name, h.default), name
        read = JobConfig.from_hyperparameters({"num_classes": 3, theirs: value, "dialect": dialect})
        assert getattr(read, name) == h.parse(name, value), theirs
        if h.tuning_range != "Categorical":
            assert dialects.NUMBERS_AS[theirs] == name
            low, high = (1, 2) if h.tuning_range == "Integer" else (0.1, 0.2)
            assert tuning.parse_range(f"{theirs}={low}:{high}").kind == h.tuning_range
    assert set(dialects.NUMBERS_AS) == {theirs for _, theirs, name in renamed
                                        if HYPERPARAMETERS[name].tuning_range != "Categorical"}


def test_the_names_that_make_a_request_a_built_ins_are_its_names_the_job_does_not_define():
    assert set(dialects.MXNET_ONLY) == set(dialects.MXNET_NAMES) - set(HYPERPARAMETERS)
    assert set(dialects.TENSORFLOW_ONLY) == set(dialects.TENSORFLOW_NAMES) - set(HYPERPARAMETERS)
