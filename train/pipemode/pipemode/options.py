"""The reader's numeric options, checked once, where a reader is made, with one message whatever
path reads the stream later: the compiled framing and the Python code then accept the same values,
where each path's own checks would refuse different ones."""

from __future__ import annotations

import operator

from pipemode.errors import PipeConfigError


def whole_number(name: str, value, minimum: int) -> int:
    """`value` as an int (a Python or numpy integer; not a bool, a float or text), at least `minimum`."""
    if isinstance(value, bool):
        raise PipeConfigError(f"{name} must be a whole number, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise PipeConfigError(f"{name} must be a whole number, got {value!r}") from None
    if number < minimum:
        raise PipeConfigError(f"{name} must be >= {minimum}, got {number}")
    return number


def max_record_bytes(value) -> int:
    return whole_number("max_record_bytes", value, 1)


def chunk_bytes(value) -> int:
    return whole_number("chunk_bytes", value, 1)


def max_corrupted_records_to_skip(value) -> int:
    return whole_number("max_corrupted_records_to_skip", value, 0)
