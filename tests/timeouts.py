"""Every wait of a test ends before pytest-timeout ends the test (a pytest plugin: tests/conftest.py).

pytest-timeout stops a test that runs past its limit (pyproject.toml's `timeout`, or the test's
`@pytest.mark.timeout(N)`) by ending the whole process: under `make test`'s workers, xdist reports
the test as crashed, and what the test would have said (the output of the process it waited for)
is lost. So a test's own waits must end first, with their own message: a single wait shorter than
the limit is not enough when the test waits several times (a job trained, then its model served).

This plugin notes when each test's waits must have ended: MARGIN_S before pytest-timeout would end
it, counted from the start of its setup (pytest-timeout's clock counts the fixtures too). The tests'
helpers that wait (tests/conftest.py's run_logged and read_until, the launcher's launch_cli ...)
wait `wait_s(their own limit)`: that limit, or what is left of the test's time, whichever is less.
tests/test_timeouts.py checks the literal limits statically.
"""

from __future__ import annotations

import time

import pytest

MARGIN_S = 30  # what the test has left, once its own wait gave up, to say so (and its fixtures to tear down)
_deadline: float | None = None  # time.monotonic() by which the running test's waits must have ended


def limit_s(item: pytest.Item) -> float | None:
    """The test's pytest-timeout limit in seconds (None: none)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        value = marker.args[0] if marker.args else marker.kwargs["timeout"]
    else:
        value = item.config.getoption("timeout", None)
        if value is None:
            try:
                value = item.config.getini("timeout")
            except ValueError:  # (pytest-timeout not installed)
                return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def wait_s(seconds: float) -> float:
    """`seconds`, or what is left of the running test's time (less MARGIN_S) if that is less: at
    least 1 s, so that a wait that comes too late still fails with its own message."""
    if _deadline is None:
        return seconds
    return max(1.0, min(seconds, _deadline - time.monotonic()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _deadline
    limit = limit_s(item)
    _deadline = None if limit is None else time.monotonic() + limit - MARGIN_S
    try:
        yield
    finally:
        _deadline = None
