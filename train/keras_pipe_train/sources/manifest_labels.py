"""The labels of a Ground Truth manifest line, read the same way by the job (manifest.py, from the
streamed attributes) and by `keras-pipe prepare` (from the manifest itself). No TensorFlow here.

A label is a class id (3), or its text ("3", "3.0"); a multi-label one a list of them (Ground
Truth's [0, 2]: kept sorted, as prepare writes them), or with label_format=multi_hot one 0 or 1 per
class (the built-in MXNet algorithm's [1, 0, 1]). The metadata's class-name (class-map for a
multi-label job) names the classes.
"""

from __future__ import annotations

import json
import math
import re

MAX_CLASS_ID = (1 << 31) - 1


def short(value) -> str:
    """A value as it may be quoted in a message: JSON, at most 60 characters."""
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


# The text of a number as JSON (or a CSV) writes it, around spaces: ASCII digits only. Python's float()
# reads more (digits of any script, "1_0", "nan", "infinity"), none of which is a class id's text.
NUMBER_TEXT = re.compile(r"[ \t\r\n]*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t\r\n]*")


def class_id(value, name: str) -> int:
    """A class id from an integer, an integral float, or the text of one; ValueError otherwise."""
    number = value
    if isinstance(value, str) and NUMBER_TEXT.fullmatch(value):
        number = float(value)  # ("1e400" is inf, 5,000 digits too: refused below)
    if isinstance(number, float) and math.isfinite(number) and number.is_integer():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= MAX_CLASS_ID:
        raise ValueError(f"label attribute {name!r} holds {short(value)}, not a class id (an integer from 0, or its "
                         "text)")
    return number


def class_ids(value, name: str, multi_label: bool) -> int | list[int]:
    """One class id; or for multi_label, the sorted class ids (one alone is a list of one)."""
    if not multi_label:
        if isinstance(value, list):
            raise ValueError(f"label attribute {name!r} holds a list ({short(value)}): a multi-label manifest needs "
                             "hyperparameter multi_label=true")
        return class_id(value, name)
    ids = sorted(class_id(item, name) for item in (value if isinstance(value, list) else [value]))
    if len(set(ids)) < len(ids):
        raise ValueError(f"label attribute {name!r} lists a class id twice ({short(value)})")
    return ids


def multi_hot(value, name: str, num_classes: int) -> list[float]:
    """label_format=multi_hot: one 0 or 1 per class."""
    if not isinstance(value, list) or len(value) != num_classes:
        raise ValueError(f"label attribute {name!r} holds {short(value)}; label_format=multi_hot needs a list of "
                         f"{num_classes} values (one 0 or 1 per class)")
    return [float(class_id(item, name)) for item in value]


def metadata_names(value, name: str, labels) -> dict[int, str]:
    """{class id: name} from Ground Truth's metadata: class-name (single-label), class-map
    (multi-label: {"0": "cat", ...}); {} when it names none."""
    if not isinstance(value, dict):
        raise ValueError(f"attribute {name!r} holds {short(value)}, not Ground Truth's metadata (a JSON object)")
    if "class-map" in value:
        mapping = value["class-map"]
        if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
            raise ValueError(f"the class-map of attribute {name!r} is {short(mapping)}, not an object of class id to "
                             "name")
        return {class_id(key, f"{name} class-map"): text for key, text in mapping.items()}
    if "class-name" in value and not isinstance(labels, list):
        if not isinstance(value["class-name"], str):
            raise ValueError(f"the class-name of attribute {name!r} is {short(value['class-name'])}, not a name")
        return {labels: value["class-name"]}
    return {}
