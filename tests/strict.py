"""Strict mode (`STRICT_SKIPS=1`, which `.ci/run` sets): a skipped test is a failed one.

A test that skips because something it needs is missing (podman, the local base image, the Docker
Engine, a C compiler and Python's headers, the compiled reader, SDK v2's or the toolkit's
virtualenv) proves nothing, and a suite that lets it skip can pass without testing what the README
promises. So in CI every such skip fails, with its reason. The one exception is a test that is not
for this kind of machine at all (a GPU test on a machine with none, a glibc feature elsewhere):
it skips through `not_for_this_machine`, stays a skip, and pytest's `-ra` summary lists it.

Outside CI (`make test` on a laptop without podman, say), skips stay skips, each with its reason.
"""

from __future__ import annotations

import os

import pytest

ENV = "STRICT_SKIPS"
# the beginning of the reason of every skip strict mode allows
NOT_FOR_THIS_MACHINE = "not for this machine: "


def not_for_this_machine(reason: str) -> None:
    """Skips the test, in strict mode too: it cannot apply here (e.g. "needs a GPU")."""
    # reported at the test's own line, not this one (as pytest's skip marks are)
    raise pytest.skip.Exception(NOT_FOR_THIS_MACHINE + reason, _use_item_location=True)


def strict() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def skip_reason(report) -> str:
    """The reason a skipped report gives (a skip raised in a test or fixture, or a skipif mark)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail_if_forbidden(report) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    if reason.startswith(NOT_FOR_THIS_MACHINE):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped in strict mode ({ENV}=1, as CI runs): {reason}\n"
                       "CI must run every test; install what is missing (.ci/run says what it needs), or, if this "
                       "test cannot apply to this kind of machine, skip it with tests.strict.not_for_this_machine")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if strict():
        _fail_if_forbidden(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped whole (`pytest.skip(allow_module_level=True)`, `importorskip`) too."""
    outcome = yield
    if strict():
        _fail_if_forbidden(outcome.get_result())


def pytest_report_header(config):
    if strict():
        return f"strict mode ({ENV}=1): a skip fails unless its reason begins {NOT_FOR_THIS_MACHINE!r}"
    return None
