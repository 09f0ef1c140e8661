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
"""

from __future__ import annotations

import pytest

# Test ids (or their beginnings) of the tests that use the image or the Docker Engine: everything in
# tests/image, and the documents that run image commands (tests/docs checks this list is theirs).
ENGINE_TESTS = ("tests/image/", "tests/docs/test_docs.py::test_the_documents_commands_run_as_written[docs/image.md]")


# Modules whose tests share a module or session fixture that runs a training job (the fixture's name)
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
)


def needs_the_engine(nodeid: str) -> bool:
    return nodeid.startswith(ENGINE_TESTS)


def scope_of(nodeid: str) -> str:
    """The unit of work `nodeid` belongs to: the engine's tests, a module of SHARED_TRAINING, or itself."""
    if needs_the_engine(nodeid):
        return "engine"
    module = nodeid.split("::", 1)[0]
    return module if module in SHARED_TRAINING else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class EngineTestsTogether(LoadScopeScheduling):
        """xdist's scope scheduler, a scope being one test, all the engine's tests, or a module of
        SHARED_TRAINING. It hands out the biggest scopes first (the engine's), then the others in
        the order collected: the long end-to-end tests of tests/bench, docs and job before the
        short ones of reader and serve."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return EngineTestsTogether(config, log)
