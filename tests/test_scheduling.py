"""tests/scheduling.py's units of work name tests that exist."""

from pathlib import Path

from tests import scheduling

REPO = Path(__file__).resolve().parent.parent


def test_each_module_kept_on_one_worker_exists_and_is_one_unit():
    for module in scheduling.SHARED_TRAINING:
        assert (REPO / module).is_file(), module
        assert scheduling.scope_of(f"{module}::test_a") == scheduling.scope_of(f"{module}::test_b[x]") == module


def test_other_tests_are_their_own_unit_and_the_engines_are_one():
    assert scheduling.scope_of("tests/reader/test_x.py::test_a") == "tests/reader/test_x.py::test_a"
    assert scheduling.scope_of("tests/image/test_container.py::test_a") == "engine"
