"""No test waits past its own pytest timeout: checked on the tests' source (tests/timeouts.py says why).

For every test function, from its source (the ast module):

- each wait it makes, in its body or in the helpers of tests/ it calls (a literal `timeout=` or
  `wait_timeout=`, a timeout given to a helper or its default, `time.sleep(N)`, a deadline
  `time.monotonic() + N`), is at least MARGIN_S shorter than the test's limit (its
  `@pytest.mark.timeout(N)`, its class's or module's, else pyproject.toml's `timeout`);
- and so are all of them together, but for those bounded at run time by tests.timeouts.wait_s (what
  is left of the test's time): a wait in a loop counts once per item of a literal sequence or
  range, twice for a loop of unknown length.

What it cannot see: waits whose limit is not a literal (a computed one is taken as bounded), waits in
fixtures, and waits in code outside tests/ (a library's own timeouts).
"""

from __future__ import annotations

import ast
import dataclasses
import tomllib
from pathlib import Path

import pytest

from tests.timeouts import MARGIN_S

TESTS = Path(__file__).resolve().parent
DEFAULT_S = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["timeout"]
WAIT_KEYWORDS = ("timeout", "wait_timeout")


@dataclasses.dataclass(frozen=True)
class Wait:
    seconds: float
    bounded: bool  # by wait_s at run time
    where: str  # file:line (through the helper that makes it)


def number(node) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    return None


def calls_wait_s(node) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "wait_s" for n in ast.walk(node))


class Module:
    def __init__(self, path: Path):
        self.path = path
        self.name = ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)
        self.tree = ast.parse(path.read_text(), str(path))
        self.functions: dict[str, ast.FunctionDef] = {}
        self.imported: dict[str, tuple[str, str]] = {}  # local name -> (tests module, its name)
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests"):
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (node.module, alias.name)

    def at(self, node) -> str:
        return f"{self.path.relative_to(TESTS.parent)}:{node.lineno}"


MODULES = {m.name: m for m in (Module(p) for p in sorted(TESTS.rglob("*.py")))}


def resolve(module: Module, name: str, local: set[str]) -> tuple[Module, ast.FunctionDef] | None:
    """The helper of tests/ that `name` calls in `module` (None: not one, or bound locally)."""
    if name in local:
        return None
    if name in module.functions:
        return module, module.functions[name]
    if name in module.imported:
        source, real = module.imported[name]
        if source in MODULES and real in MODULES[source].functions:
            return MODULES[source], MODULES[source].functions[real]
    return None


def locally_bound(function: ast.FunctionDef) -> set[str]:
    """Names a function binds itself (nested defs, local imports, assignments): not module helpers."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not function:
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def repeats(loop) -> int:
    """How many times a loop's body runs, as far as the source says: a literal sequence's length, a
    literal range's, else 2 (at least twice)."""
    iterable = loop.iter if isinstance(loop, ast.For | ast.comprehension) else None
    if isinstance(iterable, ast.List | ast.Tuple | ast.Set):
        return max(1, len(iterable.elts))
    if (isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id == "range"
            and len(iterable.args) == 1 and number(iterable.args[0]) is not None):
        return max(1, int(number(iterable.args[0])))
    return 2


def waits_in(module: Module, function: ast.FunctionDef, parameters: dict[str, tuple[float, bool]],
             seen: tuple[str, ...] = ()) -> list[tuple[Wait, int]]:
    """(each wait `function` makes, how many times), given its timeout parameters' values."""
    local = locally_bound(function) - set(parameters)
    for node in ast.walk(function):  # (`timeout = wait_s(timeout)`: bounded from there on)
        if isinstance(node, ast.Assign) and calls_wait_s(node.value):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in parameters:
                    parameters = {**parameters, target.id: (parameters[target.id][0], True)}
    found: list[tuple[Wait, int]] = []

    def visit(node, times: int) -> None:
        if isinstance(node, ast.For | ast.While):
            inner = times * (repeats(node) if isinstance(node, ast.For) else 2)
            visit(node.iter if isinstance(node, ast.For) else node.test, times)
            for child in node.body + node.orelse:
                visit(child, inner)
            return
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            inner = times
            for generator in node.generators:
                inner *= repeats(generator)
            for child in ast.iter_child_nodes(node):
                visit(child, inner)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and node is not function:
            return  # (a nested function waits when called: counted where it is a helper of its own)
        if isinstance(node, ast.Call):
            found.extend((wait, times) for wait in call_waits(module, node, parameters, local, seen))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and any(
                isinstance(side, ast.Call) and isinstance(side.func, ast.Attribute) and side.func.attr == "monotonic"
                for side in (node.left, node.right)):
            seconds = number(node.right) if number(node.right) is not None else number(node.left)
            if seconds is not None:  # a deadline: time.monotonic() + N
                found.append((Wait(seconds, False, module.at(node)), times))
        for child in ast.iter_child_nodes(node):
            visit(child, times)

    for statement in function.body:
        visit(statement, 1)
    return found


def value_of(node, parameters: dict[str, tuple[float, bool]]) -> tuple[float, bool] | None:
    """A timeout argument's (seconds, bounded by wait_s), when the source says it."""
    bounded = calls_wait_s(node)
    if bounded and isinstance(node, ast.Call) and node.args:
        node = node.args[0]
    if number(node) is not None:
        return number(node), bounded
    if isinstance(node, ast.Name) and node.id in parameters:
        seconds, was_bounded = parameters[node.id]
        return seconds, bounded or was_bounded
    return None


def call_waits(module: Module, call: ast.Call, parameters, local, seen) -> list[Wait]:
    name = call.func.id if isinstance(call.func, ast.Name) else None
    helper = resolve(module, name, local) if name else None
    if helper and f"{helper[0].name}.{helper[1].name}" not in seen:
        where, function = helper
        arguments = function.args
        names = [a.arg for a in arguments.posonlyargs + arguments.args]
        given = {}
        for keyword in arguments.kwonlyargs:
            given[keyword.arg] = None
        defaults = dict(zip(names[len(names) - len(arguments.defaults):], arguments.defaults))
        defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None})
        passed = dict(zip(names, call.args))
        passed.update({k.arg: k.value for k in call.keywords if k.arg})
        values = {}
        for parameter in set(names) | {a.arg for a in arguments.kwonlyargs}:
            if parameter in WAIT_KEYWORDS or parameter.endswith("_timeout"):
                node = passed.get(parameter, defaults.get(parameter))
                value = value_of(node, parameters) if node is not None else None
                if value is not None:
                    values[parameter] = value
        inner = waits_in(where, function, values, (*seen, f"{where.name}.{function.name}"))
        return [dataclasses.replace(w, where=f"{module.at(call)} -> {w.where}") for w, times in inner
                for _ in range(times)]
    waits = []
    for keyword in call.keywords:
        if keyword.arg in WAIT_KEYWORDS:
            value = value_of(keyword.value, parameters)
            if value is not None:
                waits.append(Wait(*value, module.at(call)))
    if isinstance(call.func, ast.Attribute) and call.func.attr == "sleep" and call.args:
        value = value_of(call.args[0], parameters)
        if value is not None:
            waits.append(Wait(*value, module.at(call)))
    return waits


def mark_limit(decorators) -> float | None:
    for node in decorators:
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "timeout"
                and node.args and number(node.args[0]) is not None):
            return number(node.args[0])
    return None


def limits_of_tests():
    """(module, test function, its limit) for every test function of tests/."""
    for module in MODULES.values():
        if not module.path.name.startswith("test_"):
            continue
        module_limit = None
        for node in module.tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
                marks = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
                module_limit = mark_limit(marks)
        for node in module.tree.body:
            classes = [(node, mark_limit(node.decorator_list))] if isinstance(node, ast.ClassDef) else [(None, None)]
            for cls, class_limit in classes:
                for function in (cls.body if cls else [node]):
                    if isinstance(function, ast.FunctionDef) and function.name.startswith("test_"):
                        limit = mark_limit(function.decorator_list) or class_limit or module_limit or DEFAULT_S
                        yield module, function, limit


def problems() -> list[str]:
    found = []
    for module, function, limit in limits_of_tests():
        waits = waits_in(module, function, {})
        test = f"{module.path.relative_to(TESTS.parent)}::{function.name} (limit {limit:g} s)"
        for wait, _ in waits:
            if wait.seconds > limit - MARGIN_S:
                found.append(f"{test}: a wait of {wait.seconds:g} s at {wait.where}")
        unbounded = [(w, times) for w, times in waits if not w.bounded]
        total = sum(w.seconds * times for w, times in unbounded)
        if total > limit - MARGIN_S and len(unbounded) > 1 or any(times > 1 for _, times in unbounded) and (
                total > limit - MARGIN_S):
            said = ", ".join(f"{w.seconds:g} s{f' x{times}' if times > 1 else ''} at {w.where}" for w, times in unbounded)
            found.append(f"{test}: waits of {total:g} s in all, not bounded by wait_s: {said}")
    return found


def test_no_test_waits_past_its_own_timeout():
    found = problems()
    assert not found, (f"{len(found)} waits may outlast their test's pytest timeout, less {MARGIN_S} s (a hang would "
                       "then end the worker, and the test's own message with it):\n" + "\n".join(found))


@pytest.mark.slow
def test_the_check_sees_waits_in_tests_helpers_and_loops():
    """The check itself, on a module of its own."""
    source = '''
import subprocess, time
import pytest
from tests.timeouts import wait_s

def helper(timeout=200):
    return subprocess.run(["x"], timeout=timeout)

def bounded_helper(timeout=200):
    timeout = wait_s(timeout)
    return subprocess.run(["x"], timeout=timeout)

def test_one_wait_too_long():
    subprocess.run(["x"], timeout=290)

def test_two_waits_too_long_together():
    helper()
    time.sleep(100)

def test_bounded_waits_may_add_up():
    bounded_helper()
    bounded_helper(timeout=250)

def test_a_loop_of_unknown_length():
    for process in processes:
        process.communicate(timeout=150)

def test_a_deadline():
    deadline = time.monotonic() + 400

@pytest.mark.timeout(1000)
def test_a_mark_raises_the_limit():
    helper(timeout=900)
'''
    path = TESTS / "test_zz_timeouts_example.py"
    module = Module.__new__(Module)
    module.path, module.name, module.tree = path, "tests.test_zz_timeouts_example", ast.parse(source)
    module.functions = {n.name: n for n in module.tree.body if isinstance(n, ast.FunctionDef)}
    module.imported = {}
    results = {}
    for node in module.tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            limit = mark_limit(node.decorator_list) or DEFAULT_S
            waits = waits_in(module, node, {})
            results[node.name] = (limit, [(w.seconds, w.bounded, times) for w, times in waits])
    assert results["test_one_wait_too_long"] == (300, [(290, False, 1)])
    assert results["test_two_waits_too_long_together"] == (300, [(200, False, 1), (100, False, 1)])
    assert results["test_bounded_waits_may_add_up"] == (300, [(200, True, 1), (250, True, 1)])
    assert results["test_a_loop_of_unknown_length"] == (300, [(150, False, 2)])
    assert results["test_a_deadline"] == (300, [(400, False, 1)])
    assert results["test_a_mark_raises_the_limit"] == (1000, [(900, False, 1)])
