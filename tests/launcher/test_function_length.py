"""The code's functions stay short enough to read at a glance: none of the three distributions'
functions is longer than 45 lines, its docstring not counted (the mark the code-health issue set).
A function that grows past it is split where a part reads as a step of its own, not to hit the
number: the test names each one and its length."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

ROOTS = [REPO / "launch/keras_pipe_launch", REPO / "train/keras_pipe_train", REPO / "train/keras_pipe_serve",
         REPO / "train/pipemode/pipemode"]
MOST_LINES = 45


def length(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Its lines, from `def` to its last, less its docstring's."""
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def long_functions(roots: list[Path], most: int = MOST_LINES) -> list[str]:
    """'path:name (N lines)' of every function (methods and nested ones too) longer than `most`."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and length(node) > most:
                    found.append(f"{path.relative_to(root.parent)}:{node.name} ({length(node)} lines)")
    return found


def test_no_function_is_longer_than_45_lines_its_docstring_not_counted():
    assert long_functions(ROOTS) == []
