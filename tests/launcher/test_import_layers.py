"""The code's shape, read from its imports (every import: at the top, inside functions, for type
checking; relative imports, which it would not see, are refused by ruff: pyproject.toml's TID252):
no import circle anywhere in train/ and launch/; the packages depend one way (the reader on nothing
of ours, the job on the reader, the model's server on both, the launcher on all); and the job's parts
and the launcher's programs sit in their subpackages, floors whose imports point down only, never
to a subpackage on the same floor (keras_pipe_train/__init__.py and keras_pipe_launch/__init__.py
draw them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = {"pipemode": REPO / "train/pipemode/pipemode", "keras_pipe_train": REPO / "train/keras_pipe_train",
            "keras_pipe_serve": REPO / "train/keras_pipe_serve", "keras_pipe_launch": REPO / "launch/keras_pipe_launch"}
# which packages each may import
DEPENDS_ON = {"pipemode": set(), "keras_pipe_train": {"pipemode"}, "keras_pipe_serve": {"pipemode", "keras_pipe_train"},
              "keras_pipe_launch": {"pipemode", "keras_pipe_train", "keras_pipe_serve"}}
# Each package's floors: a subpackage imports only from lower ones (and within itself); the modules
# on top (TOP) may import any of them
LAYERS = {
    "keras_pipe_launch": {"common": 0, "sample_data": 1, "local": 1, "sagemaker": 1, "prepare": 2, "demo": 2, "cli": 3},
    "keras_pipe_train": {"settings": 0, "sources": 1, "model": 2, "training": 2, "report": 3, "after_training": 4},
}
TOP = {"keras_pipe_launch": {"keras_pipe_launch", "keras_pipe_launch.__main__"},
       "keras_pipe_train": {"keras_pipe_train", "keras_pipe_train.main", "keras_pipe_train.job"}}


def module_name(path: Path) -> str:
    package = next(name for name, root in PACKAGES.items() if path.is_relative_to(root))
    parts = [package, *path.relative_to(PACKAGES[package]).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for root in PACKAGES.values() for p in sorted(root.rglob("*.py"))}


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules `path` imports (`from pkg import module` is that module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [submodule(node.module, alias.name, known) for alias in node.names]
        else:
            continue
        found |= {name for name in names if name.split(".")[0] in PACKAGES}
    return found


def submodule(package: str, name: str, known: dict[str, Path]) -> str:
    """What `from package import name` imports: the module package.name, or the package itself.
    A compiled submodule (pipemode._framing, from a .c file) imports nothing of ours."""
    if f"{package}.{name}" in known:
        return f"{package}.{name}"
    folder = known.get(package)
    if folder is not None and folder.name == "__init__.py" and any(folder.parent.glob(f"{name}.*")):
        return f"{package}.{name}"
    return package


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_packages_depend_one_way():
    wrong = [(module, target) for module, targets in graph().items() for target in targets
             if target.split(".")[0] != module.split(".")[0]
             and target.split(".")[0] not in DEPENDS_ON[module.split(".")[0]]]
    assert wrong == []


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def floor(module: str) -> int | None:
    """Which floor of its package `module` is on (None: on top, or in no floor)."""
    return LAYERS.get(module.split(".")[0], {}).get(layer(module))


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_module_sits_in_its_parts_subpackage_or_on_top(package):
    loose = [m for m in graph() if m.split(".")[0] == package and layer(m) not in LAYERS[package]
             and m not in TOP[package]]
    assert loose == []


def upward(edges: dict[str, set[str]], package: str) -> list[tuple[str, str]]:
    """The imports of `package`'s floors that point up, or to another subpackage on the same floor."""
    return [(module, target) for module, targets in sorted(edges.items())
            if module.split(".")[0] == package and floor(module) is not None for target in sorted(targets)
            if target.split(".")[0] == package and layer(target) != layer(module)
            and (floor(target) is None or floor(target) >= floor(module))]


@pytest.mark.slow
@pytest.mark.parametrize("package", sorted(LAYERS))
def test_imports_point_down_only(package):
    assert upward(graph(), package) == []


def test_the_floor_rule_finds_an_import_upward_one_beside_and_one_to_the_top():
    edges = {"keras_pipe_train.sources.datasets": {"keras_pipe_train.training.loop"},
             "keras_pipe_train.model.export": {"keras_pipe_train.training.tasks", "keras_pipe_train.sources.images"},
             "keras_pipe_train.training.loop": {"keras_pipe_train.settings.config", "keras_pipe_train.job"}}
    assert upward(edges, "keras_pipe_train") == [
        ("keras_pipe_train.model.export", "keras_pipe_train.training.tasks"),
        ("keras_pipe_train.sources.datasets", "keras_pipe_train.training.loop"),
        ("keras_pipe_train.training.loop", "keras_pipe_train.job")]
