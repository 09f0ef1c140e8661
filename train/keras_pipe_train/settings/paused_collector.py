"""TensorFlow's and Keras' first imports run with Python's cyclic garbage collector paused, and
what they made frozen after.

Their imports make about 450,000 tracked objects that live as long as the process (the job's:
gc.get_freeze_count() after them): modules, classes, functions, op definitions. Python's collector,
counting allocations, ran 658 collections during them, each traversing what its generation held,
finding next to nothing to free; and after them every full collection (a job runs several, while it
traces its functions) traversed them all again. So the collector is paused through the imports, and
what they made is then moved out of its reach (gc.freeze, which Python's documentation offers for
objects that live as long as the process) before it runs again: the job's imports took 2.1 s of CPU
where they took 3.2 s, and a small job's collections 0.65 s where they took 1.37 s, its peak memory
no higher (docs/speed.md, Figures behind the code's choices: The collector paused while TensorFlow
imports). Every job, server worker and launcher command that loads a model starts that much sooner.
The garbage the imports left, if any, stays: a frozen object is never freed.
"""

from __future__ import annotations

import contextlib
import gc

from keras_pipe_train.settings.first_import import around_first_import

# (either may come first: TensorFlow's import imports Keras', and Keras' import imports TensorFlow)
HEAVY_IMPORTS = ("tensorflow", "keras")


@contextlib.contextmanager
def collector_paused():
    """Within: no automatic collection runs. After: every object tracked so far is frozen, and the
    collector runs again, as it did before (within an outer pause, nothing: the imports nest)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.enable()


def pause_collector_while_tensorflow_imports() -> None:
    """From now on, TensorFlow's and Keras' first imports in this process run with the collector
    paused, and what they made is frozen (nothing for one imported already)."""
    for name in HEAVY_IMPORTS:
        around_first_import(name, collector_paused, key=f"keras-pipe: {name} imported with the collector paused")
