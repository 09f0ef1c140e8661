"""`python -m keras_pipe_train.model --download-imagenet NAME[,NAME...]`: fetches those backbones'
ImageNet weights into $KERAS_HOME (the Dockerfile's BAKE_WEIGHTS bakes them into the image this way,
for jobs that run without internet access)."""

from __future__ import annotations

import argparse

from keras_pipe_train.model.classifier import download_imagenet_weights

parser = argparse.ArgumentParser(prog="python -m keras_pipe_train.model",
                                 description="Download backbone weights (used by the Dockerfile).")
parser.add_argument("--download-imagenet", required=True, metavar="NAME[,NAME...]")
download_imagenet_weights([n.strip() for n in parser.parse_args().download_imagenet.split(",") if n.strip()])
