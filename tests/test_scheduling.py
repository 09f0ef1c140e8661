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


def test_the_longest_scope_left_is_handed_out_first_and_unknown_tests_count_a_few_seconds():
    queue = scheduling.LongestFirst({"tests/a.py::test_long": 300, "tests/b.py::test_mid": 40})
    for scope, tests in [("tests/c.py::test_new", ["tests/c.py::test_new"]),
                         ("tests/a.py::test_long", ["tests/a.py::test_long"]),
                         ("engine", [f"tests/image/test_{i}.py::test" for i in range(100)]),  # 100 unknown: 500 s
                         ("tests/b.py::test_mid", ["tests/b.py::test_mid"]),
                         ("tests/d.py::test_new", ["tests/d.py::test_new"])]:
        queue[scope] = dict.fromkeys(tests, False)
    order = [queue.popitem(last=False)[0] for _ in range(len(queue))]
    # (equals in the order queued)
    assert order == ["engine", "tests/a.py::test_long", "tests/b.py::test_mid", "tests/c.py::test_new",
                     "tests/d.py::test_new"]


def test_the_durations_file_names_tests_of_this_repository():
    for nodeid, seconds in scheduling.known_seconds().items():
        assert (REPO / nodeid.split("::")[0]).is_file() and seconds > 0, nodeid
