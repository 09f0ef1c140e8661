"""Backbone weights into $KERAS_HOME/models (keras-hub presets into $KERAS_HOME/presets), where the job finds them:

  python -m keras_pipe_train.model --download-imagenet NAME[,NAME...]
      downloads those backbones' ImageNet weights (Keras' applications', or MXNet Gluon's model zoo's,
      converted, for resnet18 and resnet34), or keras-hub presets (names or handles, saved whole):
      the Dockerfile's BAKE_WEIGHTS bakes them so
  python -m keras_pipe_train.model --import-gluon FILE.params
      converts a Gluon resnet18_v1 or resnet34_v1 file you bring (the model zoo's
      resnet18_v1-a0666292.params, copied onto a machine without internet)
"""

from __future__ import annotations

import argparse
import sys

from keras_pipe_train.model.classifier import download_imagenet_weights
from keras_pipe_train.settings.errors import UserError

parser = argparse.ArgumentParser(prog="python -m keras_pipe_train.model",
                                 description="Backbone weights into $KERAS_HOME/models (used by the Dockerfile).")
action = parser.add_mutually_exclusive_group(required=True)
action.add_argument("--download-imagenet", metavar="NAME[,NAME...]")
action.add_argument("--import-gluon", metavar="FILE.params")
arguments = parser.parse_args()
try:
    if arguments.import_gluon:
        from keras_pipe_train.model import gluon_weights

        gluon_weights.import_file(arguments.import_gluon)
    else:
        download_imagenet_weights([n.strip() for n in arguments.download_imagenet.split(",") if n.strip()])
except UserError as err:
    sys.exit(f"error: {err}")
