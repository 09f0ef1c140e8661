"""A module's first import, run within a context of the caller's choosing: how the launcher drops
TensorFlow's start-up notices (keras_pipe_launch/common/quiet_start.py) and how Keras imports
without its optional integrations (unneeded_imports.py)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading


def around_first_import(name: str, around, key: str) -> None:
    """From now on, the first import of the top-level module `name` runs within `around()` (a
    context manager). Nothing when `name` is imported already, or when a wrapper of the same `key`
    is in place (the first one's `around` stays)."""
    if name in sys.modules or any(isinstance(f, FirstImport) and f.key == key for f in sys.meta_path):
        return
    sys.meta_path.insert(0, FirstImport(name, around, key))


class FirstImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `name` as the other finders do, and runs its import (once) within `around()`. It
    stays in place until that import: a look-up alone (importlib.util.find_spec, as TensorFlow's
    import does for Keras before it imports it) is answered, and changes nothing."""

    def __init__(self, name: str, around, key: str):
        self.name, self.around, self.key = name, around, key
        self.searching = threading.local()  # (a thread's own search: another thread's import is still found)

    def find_spec(self, name, path=None, target=None):
        if name != self.name or getattr(self.searching, "now", False):
            return None
        self.searching.now = True  # (the search below, through the other finders)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.searching.now = False
        if spec is None or spec.loader is None:
            return spec
        self.loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        if self in sys.meta_path:  # (any later import as usual)
            sys.meta_path.remove(self)
        # (the module's loader is its own again before its code runs: importlib.resources and the like
        # find it there)
        module.__loader__ = module.__spec__.loader = self.loader
        with self.around():
            self.loader.exec_module(module)
