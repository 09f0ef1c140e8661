"""TensorFlow's CPU kernels, chosen before TensorFlow is imported: oneDNN's, on every x86-64 CPU,
but for the small MobileNetV3 of tiny images.

TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, at import. Unset, it turns oneDNN on only for CPUs
with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX (tensorflow/core/util/port.cc): an AMD EPYC of
SageMaker's m6a/c6a/r6a families (AVX2 alone) and many CI machines get TensorFlow's own kernels.
Measured side by side (python -m bench.cpu_kernels; docs/speed.md, oneDNN and XLA on CPUs),
oneDNN trains resnet18 at 32 px 13x faster, efficientnet_b0 at 224 px 1.8x, resnet50 1.6x,
mobilenet_v2 1.5x, resnet18 1.25x, mobilenet_v3_small (the job's default backbone) 1.1-1.2x; but
mobilenet_v3_small at 32 px (`make demo`'s, and most tests') 1.85-1.94x slower, at 64 px 1.28x,
and one image at a time predicts 3.1-3.5x slower there: its many small ops on tiny tensors are
where oneDNN's per-op overhead outweighs its kernels. So: on, unless the job is that backbone
at SMALL_IMAGES px or less. Set here, the job runs the same kernels on every x86-64 CPU, whatever
the shell that started it said. The server, which does not know the backbone, keeps oneDNN on: of
the models measured, only that one predicts faster without it. A probability differs by 3.2e-6 at
most either way. XLA is not chosen: it trains slower than oneDNN on CPUs (the same figures). No
TensorFlow here.
"""

from __future__ import annotations

import os
import platform
import sys

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
ON, OFF = "1", "0"
# (oneDNN's x86-64 kernels are what was measured; on Arm, TensorFlow's own choice is kept: its
# oneDNN there goes through the Arm Compute Library, whose speed was not measured here)
MACHINES = ("x86_64", "AMD64")
SMALL_BACKBONES = ("mobilenet_v3_small",)
SMALL_IMAGES = 64  # px: oneDNN trains 0.52-0.54x as fast at 32, 0.78x at 64, 1.1-1.2x at 224 (docs/speed.md)


def choose(environ=os.environ, backbone: str | None = None, image_size: int | None = None) -> str:
    """Sets TF_ENABLE_ONEDNN_OPTS in `environ` for this machine and the job's `backbone` at
    `image_size` (None: the server's choice, not knowing them), before TensorFlow is imported, and
    returns what the log should say of it. A process that imported TensorFlow already keeps what
    it chose then: said so."""
    given = environ.get(VARIABLE)
    if platform.machine() not in MACHINES:
        return (f"CPU kernels: TensorFlow's choice on {platform.machine()} ({VARIABLE}="
                f"{given if given is not None else 'unset'})")
    small = backbone in SMALL_BACKBONES and image_size is not None and image_size <= SMALL_IMAGES
    chosen = OFF if small else ON
    environ[VARIABLE] = chosen
    overridden = f"; {VARIABLE}={given} from the environment overridden" if given not in (None, chosen) else ""
    if "tensorflow" in sys.modules and environ is os.environ:
        return (f"CPU kernels: oneDNN asked {'off' if small else 'on'} too late ({VARIABLE}={chosen}): TensorFlow "
                "was imported first and keeps what it chose then")
    why = (f"off for {backbone} at {image_size} px, whose tiny tensors train faster without it" if small
           else "on every x86-64 CPU")
    return f"CPU kernels: oneDNN {why} ({VARIABLE}={chosen}: docs/speed.md){overridden}"
