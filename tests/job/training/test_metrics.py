"""The metric definitions sent to SageMaker catch the metric lines the job prints."""

import re

import pytest

from keras_pipe_train.training.metrics import METRIC_DEFINITIONS, REPORTED, format_line, lines, row


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
    from keras_pipe_train.settings.config import MULTI_LABEL_METRICS

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

    from keras_pipe_train.training.metrics import write_json

    rows = [row(1, "head", {"loss": float("nan"), "val_loss": float("inf"), "accuracy": 0.5})]
    write_json(tmp_path / "metrics.json", rows, rows[-1])
    text = (tmp_path / "metrics.json").read_text()
    strict = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert strict["final"] == {"epoch": 1, "phase": "head", "train_loss": None, "val_loss": None,
                               "train_accuracy": 0.5}


# --- the built-in algorithms' users' forms -------------------------------------------------------

# What AWS's sample notebooks give SageMaker for the built-in TensorFlow algorithm (JumpStart's
# Amazon_TensorFlow_Image_Classification and ..._Benchmarking: /work/builtin-ic-spec.md, B0 and B3),
# and what a user of the built-in MXNet algorithm would write for its Module.fit lines
NOTEBOOK_DEFINITIONS = {
    "val_accuracy": "val_accuracy: ([0-9\\.]+)", "val_loss": "val_loss: ([0-9\\.]+)",
    "train_accuracy": "- accuracy: ([0-9\\.]+)", "train_loss": "- loss: ([0-9\\.]+)",
    # the benchmarking notebook's, for the metrics a single-label job has
    "benchmark_val_accuracy": "- val_accuracy: ([0-9\\.]+)", "benchmark_val_loss": "- val_loss: ([0-9\\.]+)",
    "train_top_5_accuracy": "- top_5_accuracy: ([0-9\\.]+)", "val_top_5_accuracy": "- val_top_5_accuracy: ([0-9\\.]+)",
    "mxnet_train_accuracy": "Train-accuracy=([0-9\\.]+)", "mxnet_validation_accuracy": "Validation-accuracy=([0-9\\.]+)",
}
# the row key each of them must read
READS = {"val_accuracy": "val_accuracy", "val_loss": "val_loss", "train_accuracy": "train_accuracy",
         "train_loss": "train_loss", "benchmark_val_accuracy": "val_accuracy", "benchmark_val_loss": "val_loss",
         "train_top_5_accuracy": "train_top_k_accuracy", "val_top_5_accuracy": "val_top_k_accuracy",
         "mxnet_train_accuracy": "train_accuracy", "mxnet_validation_accuracy": "val_accuracy"}


def ground_truth_demo_errors(log: str) -> list[float]:
    """The Ground Truth demo's parser of the built-in MXNet algorithm's log (builtin-ic-spec.md, A10,
    cell 26): every line holding Validation-accuracy, the number after it to the line's end."""
    errors = []
    for msg in log.splitlines():
        if "Validation-accuracy" in msg:
            errors.append(float(msg.split("Validation-accuracy=")[1]))
    return errors


def caught(log: str, regex: str) -> list[str]:
    """What SageMaker reads with `regex`: each line's first match (and no line holds two)."""
    found = []
    for line in log.splitlines():
        assert len(re.findall(regex, line)) <= 1, (regex, line)
        if match := re.search(regex, line):
            found.append(match.group(1))
    return found


def check_log(log: str, rows: list[dict], top_k: bool = True) -> None:
    """Every definition (the notebooks' and the launcher's) reads each row's value, in order, and
    nothing else: one line per epoch (and the rows given again, as a job's final one is)."""
    for name, regex in NOTEBOOK_DEFINITIONS.items():
        if "top_5" in name and not top_k:
            assert caught(log, regex) == [], name
            continue
        expected = [row[READS[name]] for row in rows]
        assert [float(v) for v in caught(log, regex)] == pytest.approx(expected, abs=5e-7), name
    for definition in METRIC_DEFINITIONS:
        key = next(k for k, shown in REPORTED.items() if shown == definition["Name"])
        expected = [row[key] for row in rows if key in row]
        assert [float(v) for v in caught(log, definition["Regex"])] == pytest.approx(expected, rel=1e-5), key
    assert ground_truth_demo_errors(log) == pytest.approx([row["val_accuracy"] for row in rows], abs=5e-7)


def test_each_epochs_lines_give_every_regex_its_own_value_and_no_other():
    """Three epochs, every value distinct: the Keras form's `- loss: ` is not read inside
    `- val_loss: `, nor `val_accuracy: ` inside `val_top_5_accuracy: `, and the launcher's
    definitions read only the `metrics:` line."""
    rows = []
    for epoch in (1, 2, 3):
        values = row(epoch, "head", {"loss": 1.5 / epoch, "accuracy": 0.5 + epoch / 100,
                                     "top_k_accuracy": 0.7 + epoch / 100, "val_loss": 2.5 / epoch,
                                     "val_accuracy": 0.4 + epoch / 100, "val_top_k_accuracy": 0.6 + epoch / 100})
        values["seconds"] = 10.0 + epoch
        rows.append(values)
    log = "\n".join(line for values in rows for line in lines(values, 3, top_k=5))
    check_log(log, rows)
    assert lines(rows[1], 3, top_k=5) == [
        "metrics: epoch=2 phase=head train_loss=0.75 train_accuracy=0.52 train_top_k_accuracy=0.72 val_loss=1.25 "
        "val_accuracy=0.42 val_top_k_accuracy=0.62 seconds=12",
        "Epoch 2/3 - accuracy: 0.520000 - loss: 0.750000 - top_5_accuracy: 0.720000 - val_accuracy: 0.420000 - "
        "val_loss: 1.250000 - val_top_5_accuracy: 0.620000",
        "Epoch[1] Train-accuracy=0.520000", "Epoch[1] Train-loss=0.750000", "Epoch[1] Train-top_k_accuracy_5=0.720000",
        "Epoch[1] Time cost=12.000", "Epoch[1] Validation-accuracy=0.420000", "Epoch[1] Validation-loss=1.250000",
        "Epoch[1] Validation-top_k_accuracy_5=0.620000"]


@pytest.mark.parametrize("value", [1e-07, 12345678.9, 0.0, -0.0])
def test_the_built_in_forms_write_numbers_the_regexes_read_whole(value):
    """[0-9\\.]+ stops at an exponent or a sign: six decimals, never 1e-07 (which it would read as 1)."""
    values = row(1, "head", {"loss": value, "accuracy": 0.5, "val_loss": value, "val_accuracy": 0.25})
    log = "\n".join(lines(values, 1))
    for regex in (NOTEBOOK_DEFINITIONS["train_loss"], NOTEBOOK_DEFINITIONS["val_loss"], "Train-loss=([0-9\\.]+)$"):
        assert [float(v) for v in caught(log, regex)] == pytest.approx([abs(value)], abs=5e-7), regex


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_loss_that_is_not_a_number_is_read_by_no_built_in_regex(bad):
    """Printed nan, inf or -inf, which no [0-9\\.]+ regex reads any number from: that epoch has no
    loss for them (the launcher's definitions read the words, which SageMaker takes as such)."""
    values = row(1, "head", {"loss": bad, "accuracy": 0.5, "val_loss": bad, "val_accuracy": 0.25})
    log = "\n".join(lines(values, 2))
    for name in ("train_loss", "val_loss", "benchmark_val_loss"):
        assert caught(log, NOTEBOOK_DEFINITIONS[name]) == [], name
    assert not any(re.search("loss[:=] ?[0-9]", line) for line in log.splitlines() if not line.startswith("metrics:"))
    assert caught(log, NOTEBOOK_DEFINITIONS["val_accuracy"]) == ["0.250000"]
    assert caught(log, NOTEBOOK_DEFINITIONS["mxnet_train_accuracy"]) == ["0.500000"]
    assert ground_truth_demo_errors(log) == [0.25]
    launcher = {d["Name"]: caught(log, d["Regex"]) for d in METRIC_DEFINITIONS if caught(log, d["Regex"])}
    assert launcher == {"train:loss": [str(bad)], "validation:loss": [str(bad)], "train:accuracy": ["0.5"],
                        "validation:accuracy": ["0.25"]}


def test_a_multi_label_jobs_metrics_are_in_the_built_in_forms_too():
    from keras_pipe_train.settings.config import MULTI_LABEL_METRICS

    names = ["loss", *MULTI_LABEL_METRICS]
    values = row(1, "head", {**{name: 0.1 + i / 100 for i, name in enumerate(names)},
                             **{f"val_{name}": 0.5 + i / 100 for i, name in enumerate(names)}})
    keras_form, *mxnet_form = lines(values, 1)[1:]
    for i, name in enumerate(names):
        assert caught(keras_form, f"- {name}: ([0-9\\.]+)") == [f"{0.1 + i / 100:.6f}"], name
        assert caught(keras_form, f"- val_{name}: ([0-9\\.]+)") == [f"{0.5 + i / 100:.6f}"], name
        assert f"Epoch[0] Validation-{name}={0.5 + i / 100:f}" in mxnet_form
