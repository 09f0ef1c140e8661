"""The metric definitions sent to SageMaker catch the metric lines the job prints."""

import re

import pytest

from keras_pipe_train.metrics import METRIC_DEFINITIONS, format_line, row


@pytest.mark.parametrize("value, text", [(0.2314, "0.2314"), (1e-07, "1e-07"), (12.5, "12.5"), (0.0, "0"),
                                         (float("nan"), "nan"), (float("inf"), "inf")])
def test_each_definition_catches_its_value(value, text):
    """SageMaker reads what the regex catches as a number: "nan" and "inf" included, whole."""
    logs = {"loss": value, "accuracy": 0.5, "top_k_accuracy": 0.75, "val_loss": value, "val_accuracy": 0.25,
            "val_top_k_accuracy": value}
    line = format_line(row(3, "fine_tune", logs))
    assert line.startswith("metrics: epoch=3 phase=fine_tune ")
    caught = {d["Name"]: found.group(1) for d in METRIC_DEFINITIONS if (found := re.search(d["Regex"], line))}
    assert caught == {"train:loss": text, "train:accuracy": "0.5", "validation:loss": text,
                      "validation:accuracy": "0.25", "train:top_k_accuracy": "0.75",
                      "validation:top_k_accuracy": text}
    # without top_k, its definitions catch nothing (and the others still catch theirs)
    plain = format_line(row(3, "head", {"loss": value, "accuracy": 0.5, "val_loss": value, "val_accuracy": 0.25}))
    assert {d["Name"] for d in METRIC_DEFINITIONS if re.search(d["Regex"], plain)} == {
        "train:loss", "train:accuracy", "validation:loss", "validation:accuracy"}


def test_a_multi_label_jobs_metrics_are_each_caught_by_their_own_definition():
    from keras_pipe_train.config import MULTI_LABEL_METRICS

    names = ["loss", *MULTI_LABEL_METRICS]
    logs = {**{name: 0.1 + i / 100 for i, name in enumerate(names)},
            **{f"val_{name}": 0.5 + i / 100 for i, name in enumerate(names)}}
    line = format_line(row(2, "head", logs))
    caught = {d["Name"]: found.group(1) for d in METRIC_DEFINITIONS if (found := re.search(d["Regex"], line))}
    expected = {f"{shown}:{name}": f"{base + i / 100:g}" for shown, base in (("train", 0.1), ("validation", 0.5))
                for i, name in enumerate(names)}
    assert caught == expected


def test_val_loss_is_not_caught_as_train_loss():
    line = format_line(row(1, "head", {"loss": 0.9, "val_loss": 0.1}))
    train = next(d for d in METRIC_DEFINITIONS if d["Name"] == "train:loss")
    assert re.search(train["Regex"], line).group(1) == "0.9"
    assert not any(re.search(d["Regex"], "epoch=1 train_loss=0.9") for d in METRIC_DEFINITIONS)  # prefix required


def test_metrics_json_is_strict_json_even_when_the_loss_is_not_a_number(tmp_path):
    import json

    from keras_pipe_train.metrics import write_json

    rows = [row(1, "head", {"loss": float("nan"), "val_loss": float("inf"), "accuracy": 0.5})]
    write_json(tmp_path / "metrics.json", rows, rows[-1])
    text = (tmp_path / "metrics.json").read_text()
    strict = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert strict["final"] == {"epoch": 1, "phase": "head", "train_loss": None, "val_loss": None,
                               "train_accuracy": 0.5}
