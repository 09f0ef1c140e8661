"""Run by MXNet's own Python (.venv-mxnet: MXNet 1.9.1, the last release, beside the numpy it
needs), never by the tests' own: Gluon's model zoo ResNet v1 of a depth, with random weights and
random BatchNorm statistics, saved in both of Gluon's name forms, and its features (after the global
pooling) and logits for the same images the Keras side gets, in an .npz.

  python gluon_reference.py DEPTH SIZE OUT_DIR [plain]

`plain` leaves the BatchNorm layers as Gluon initialises them (statistics 0 and 1, scale 1, offset 0):
the "pretrained" network of the notebooks' tests, fine-tuned as a pretrained one is.

Gluon's ResNets take RGB as its model zoo documents: /255, minus the ImageNet mean, over its
deviation (gluon/model_zoo/vision/__init__.py); the images are also saved raw, in [0, 255], for the
Keras model, which holds its own scaling."""

import sys
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet.gluon.model_zoo import vision

depth, size, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
mx.random.seed(depth)
rng = np.random.default_rng(depth)
net = getattr(vision, f"resnet{depth}_v1")()
net.initialize(mx.init.Xavier(magnitude=2.0))
net(mx.nd.zeros((1, 3, size, size)))  # shapes are inferred on the first call
plain = sys.argv[4:] == ["plain"]
for name, param in net.collect_params().items() if not plain else ():
    shape = param.shape
    if name.endswith(("gamma", "running_var")):
        param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, shape)))
    elif name.endswith(("beta", "running_mean")):
        param.set_data(mx.nd.array(rng.normal(0, 0.2, shape)))
images = rng.uniform(0, 255, (4, size, size, 3)).astype(np.float32)
mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
scaled = ((images / 255 - mean) / std).transpose(0, 3, 1, 2).astype(np.float32)
features = net.features(mx.nd.array(scaled)).asnumpy().reshape(len(images), -1)
logits = net(mx.nd.array(scaled)).asnumpy()
net.save_parameters(str(out / f"resnet{depth}_v1.params"))  # features.4.0.body.0.weight ...
net.collect_params().save(str(out / f"resnet{depth}_v1_legacy.params"), strip_prefix=net.prefix)  # stage1_conv0_weight
np.savez(out / f"resnet{depth}_v1.npz", images=images, features=features, logits=logits)
print(f"resnet{depth}_v1: features {features.shape}, logits {logits.shape}")
