"""A request checked against botocore's model of its SageMaker operation before it is sent, or
printed by --dry-run as if it would be accepted.

botocore's own ParamValidator (what boto3 runs before sending) checks types, required members,
enums and *minimum* lengths and values, but not maximums nor patterns: a 42-character tuning job
name (the API allows 32) or 1000 Processing instances pass it and fail only at SageMaker. Those are
checked here from the same model. Patterns written in Java's regex dialect that Python's re cannot
read (\\p{...} classes: tag keys and values, a few ARNs) are left to SageMaker.
"""

from __future__ import annotations

import functools
import re

from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.sagemaker.request import RequestError


class LimitError(RequestError):
    """A request SageMaker would refuse: the message names the member and its limit."""


@functools.cache
def _model():
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


@functools.cache
def _pattern(text: str) -> re.Pattern | None:
    try:
        return re.compile(text)
    except re.error:
        return None


def check(request: dict, operation: str) -> None:
    """Raises LimitError naming the first member of `request` outside the model's limits."""
    from botocore.validate import ParamValidator

    shape = _model().operation_model(operation).input_shape
    report = ParamValidator().validate(request, shape)
    if report.has_errors():
        # (one line: botocore's report has one line per problem, and may echo values of the request)
        problems = "; ".join(shown(line) for line in report.generate_report().splitlines())
        raise LimitError(f"the request does not fit SageMaker's {operation} API: {problems}")
    _walk(request, shape, "", quiet=False)


# the values of these maps may be secrets: an error names the entry and its length, never its value
_QUIET = ("Environment", "HyperParameters", "StaticHyperParameters")


def _walk(value, shape, path: str, quiet: bool) -> None:
    limits = shape.metadata
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                _walk(member, shape.members[name], f"{path}.{name}" if path else name, quiet or name in _QUIET)
        return
    if kind in ("list", "map", "string") and "max" in limits and len(value) > limits["max"]:
        what = {"list": "items", "map": "entries", "string": "characters"}[kind]
        preview = "" if quiet or kind != "string" else f" ({shown(value)[:80]})"
        raise LimitError(f"{path} has {len(value)} {what}{preview}; SageMaker allows at most {limits['max']}")
    if kind in ("integer", "long", "float", "double") and "max" in limits and value > limits["max"]:
        raise LimitError(f"{path} is {value}; SageMaker allows at most {limits['max']}")
    if kind == "string" and "pattern" in limits and (pattern := _pattern(limits["pattern"])):
        if not pattern.fullmatch(value):
            shown_value = f"(a value of {len(value)} characters)" if quiet else repr(shown(value))
            raise LimitError(f"{path} {shown_value} does not match SageMaker's pattern {limits['pattern']}")
    if kind == "list":
        for index, item in enumerate(value):
            _walk(item, shape.member, f"{path}[{index}]", quiet)
    elif kind == "map":
        for key, item in value.items():
            _walk(key, shape.key, f"{path} key", False)
            _walk(item, shape.value, f"{path}[{shown(key)}]", quiet)
