"""How `make test` shares the tests between its worker processes (pytest-xdist, `-n 2`).

Most tests spend their time in things one core cannot speed up: importing TensorFlow, tracing a
train step, waiting on a writer process, a container or a server: three workers keep CI's two
cores busier than two (docs/speed.md, Figures behind the code's choices: The suite's workers).

Every test is its own unit of work, handed to whichever worker is free, except the tests that
need the training image and the Docker Engine (tests/engine.py): those run one after the other on
one worker. Their session fixtures build the image and start a dockerd of their own; two workers
would each build the image and start a second daemon beside the first. Likewise each module of
SHARED_TRAINING runs on one worker: its tests share a fixture that trains a model, which each
worker would otherwise train again (seen in CI's durations: test_job_e2e's pretrained backbone, 54
s, set up on both workers).

xdist's own way to keep tests together (`--dist loadgroup` and the `xdist_group` mark) does nothing
under pytest 9: xdist 3.8 renames the test's `_nodeid`, which pytest 9 no longer reads. So the
grouping is done here, by test id, through xdist's scheduler hook.

KERAS_PIPE_TEST_ORDER=longest-first hands the scopes out longest first instead (tests/durations.json:
the seconds a whole CI run took on each test; a test it does not name counts UNKNOWN_S), the
classic longest-processing-time rule. Not the default, as measured: on a clean clone, its tests took
2,927 s where the order collected took 2,739-2,768 s (the heavy tests, each a job or a container of
several processes, all at once at the start, rather than beside the light ones), and the order
collected already ends the workers within seconds of each other. At the end of a run with workers,
the summary says how long each worker was busy and which tests ended last, to see where the
run's end went; KERAS_PIPE_TEST_DURATIONS=FILE writes every test's seconds there, in
durations.json's form, to refresh it from a whole run.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict, defaultdict
from pathlib import Path

import pytest

# Test ids (or their beginnings) of the tests that use the image or the Docker Engine: everything in
# tests/image, and the documents that run image commands (tests/docs checks this list is theirs).
ENGINE_TESTS = ("tests/image/", "tests/docs/test_docs.py::test_the_documents_commands_run_as_written[docs/image.md]")


# Modules whose tests share a module or session fixture that runs a training job, or another that costs
# (the fixture's name)
SHARED_TRAINING = (
    "tests/job/test_job_e2e.py",  # pretrained_backbone
    "tests/serve/test_builtin_clients.py",  # served
    "tests/builtin/test_full_training_notebooks.py",  # full_training
    # (CI's durations, 3 workers: `archives` set up on all three, 75, 67 and 52 s; `previous_model` on two)
    "tests/job/model/test_jumpstart.py",  # archives
    "tests/job/model/test_incremental.py",  # previous_model
    # (its MXNet notebooks' tests each start from gluon_resnet18_home, a ResNet-18 built by MXNet and
    # converted, made once on each worker that ran one of them)
    "tests/builtin/test_notebooks.py",  # gluon_resnet18_home, keras_home
    # and modules whose module fixture costs a training, a server or a build: CI's durations (3 workers,
    # 2026-11-30) had test_explain's `trained`, 28-30 s, set up on two workers
    "tests/job/model/test_explain.py",  # trained
    "tests/job/report/test_report_heatmaps.py",  # trained
    "tests/job/model/test_gluon_weights.py",  # gluon: MXNet builds each ResNet's weights
    "tests/job/model/test_imagenet_weights.py",  # keras_home
    "tests/job/model/test_hub.py",  # presets
    "tests/reader/test_sanitizers.py",  # sanitized_reader: the reader built with ASan and UBSan
    "tests/serve/test_door.py",  # server (tests/serve/conftest.py: a module's own, 8-11 s to start under load)
    "tests/serve/test_load.py",  # server
    "tests/serve/test_server.py",  # server
    "tests/serve/test_front.py",  # server
)


def needs_the_engine(nodeid: str) -> bool:
    return nodeid.startswith(ENGINE_TESTS)


def scope_of(nodeid: str) -> str:
    """The unit of work `nodeid` belongs to: the engine's tests, a module of SHARED_TRAINING, or itself."""
    if needs_the_engine(nodeid):
        return "engine"
    module = nodeid.split("::", 1)[0]
    return module if module in SHARED_TRAINING else nodeid


DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_S = 5.0  # a test durations.json does not name: most take a few seconds, the long ones are named


def known_seconds() -> dict[str, float]:
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


class LongestFirst(OrderedDict):
    """xdist's queue of scopes, whose next one (popitem(last=False), as LoadScopeScheduling takes
    them) is the longest left by durations.json; the first queued among equals."""

    def __init__(self, seconds: dict[str, float]):
        super().__init__()
        self.seconds = seconds

    def length(self, scope: str) -> float:
        return sum(self.seconds.get(nodeid, UNKNOWN_S) for nodeid in self[scope])

    def popitem(self, last: bool = True):
        if last or not self:
            return super().popitem(last)
        longest = max(self, key=self.length)  # (max: the first of the longest)
        return longest, self.pop(longest)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class EngineTestsTogether(LoadScopeScheduling):
        """xdist's scope scheduler, a scope being one test, all the engine's tests, or a module of
        SHARED_TRAINING; the biggest scopes first (xdist's own order: the engine's), then the others
        in the order collected, or longest first (KERAS_PIPE_TEST_ORDER)."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            if os.environ.get("KERAS_PIPE_TEST_ORDER") == "longest-first":
                self.workqueue = LongestFirst(known_seconds())

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return EngineTestsTogether(config, log)


class Timeline:
    """On the controller of a run with workers: when each test ended, on which worker, and its
    seconds (its setup, call and teardown)."""

    def __init__(self):
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)
        self.ended: dict[str, tuple[float, str]] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report):
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        if worker is None:
            return
        self.seconds[report.nodeid] += report.duration
        if report.when == "teardown":
            self.ended[report.nodeid] = (time.monotonic() - self.started, worker)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.ended:
            return
        busy, last = defaultdict(float), defaultdict(float)
        for nodeid, (at, worker) in self.ended.items():
            busy[worker] += self.seconds[nodeid]
            last[worker] = max(last[worker], at)
        write = terminalreporter.write_line
        terminalreporter.section("the workers' time (tests/scheduling.py)")
        for worker in sorted(busy):
            write(f"{worker}: busy {busy[worker]:,.0f} s, its last test ended at {last[worker]:,.0f} s")
        write("the tests that ended last (ended at, seconds, worker):")
        for nodeid, (at, worker) in sorted(self.ended.items(), key=lambda kv: kv[1][0])[-8:]:
            write(f"  {at:7,.0f} s {self.seconds[nodeid]:6.1f} s {worker} {nodeid}")
        if os.environ.get("KERAS_PIPE_TEST_DURATIONS"):
            ordered = sorted(self.seconds.items(), key=lambda kv: -kv[1])
            Path(os.environ["KERAS_PIPE_TEST_DURATIONS"]).write_text(
                json.dumps({nodeid: round(s) for nodeid, s in ordered if s >= UNKNOWN_S}, indent=0) + "\n")


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Timeline(), "keras-pipe-timeline")
