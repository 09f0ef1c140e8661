"""The one thing pyproject.toml cannot say: pipemode's optional compiled part.

pipemode/_framing.c frames TFRecords and checks their CRCs a chunk at a time, in C (the pure-Python
decoder's loop was the slowest step of a pipeline fed small records). optional=True: where it
cannot be built (no C compiler or no Python headers, as in slim images) the install goes on with a
warning, and the reader runs the same decoder in pure Python, with the same results, only slower
at small records.

Built, it makes the wheel specific to this platform and Python version (cp311 linux_x86_64, say).
PIPEMODE_PURE_PYTHON=1 builds a pure py3-none-any wheel instead, which installs anywhere: the one
to put in a SageMaker source_dir when it is built on another kind of machine than the image's.
"""

import os

from setuptools import Extension, setup

# The test of pipemode.tfrecord.compiled_framing(), repeated: the package (numpy, google-crc32c)
# cannot be imported while it is being built.
pure = os.environ.get("PIPEMODE_PURE_PYTHON", "") not in ("", "0")
setup(ext_modules=[] if pure else [Extension("pipemode._framing", ["pipemode/_framing.c"], optional=True)])
