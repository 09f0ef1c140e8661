"""How the job's functions are traced into TensorFlow graphs: as written, without AutoGraph.

AutoGraph, on by default in tf.function and in tf.data's map, rewrites a function's Python `if`,
`for` and `while` over tensors into graph control flow: at each first trace it transpiles the
function, and every function of this project it calls, to Python source again. This project's
traced functions branch only on Python values (their settings) and say tf.cond, tf.while_loop or
tf.range where a tensor decides, so the transpiling is all cost: 5 s of CPU of the 38 a small job
took (docs/speed.md, Figures behind the code's choices: AutoGraph off). So they are traced as written;
the one that needs AutoGraph (training/loop.py's steps' loop) asks for it. Keras' and TensorFlow's
own functions are never transpiled either way (AutoGraph's own configuration leaves them out).

TensorFlow is imported when these are called, not when this module is: settings/ is read before
TensorFlow loads.
"""

from __future__ import annotations


def traced(function, **options):
    """tf.function(function, **options), traced as written."""
    import tensorflow as tf

    return tf.function(function, autograph=False, **options)


def as_written(function):
    """`function` for tf.data's map, which then traces it as written."""
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert(function)
