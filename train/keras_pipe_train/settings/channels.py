"""The job's channels: their names, what each holds, and which input modes each takes.

The one place the channels' names are written: the job checks the channels it is given against it
(`check`), the input pipeline and the .lst reader take their names from it, and the launcher's
options, SageMaker requests and local layout name channels by it. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses

from keras_pipe_train.settings.errors import UserError

TRAIN, VALIDATION, PRETRAINED, MODEL = "train", "validation", "pretrained", "model"
TRAIN_LST, VALIDATION_LST = "train_lst", "validation_lst"
# the built-in TensorFlow image classifier's name for its train channel (its notebooks call
# fit({"training": ...})): read as `train` by a job that has none (contract.channels_by_role)
TRAINING = "training"


@dataclasses.dataclass(frozen=True)
class Channel:
    name: str
    role: str  # required, optional, or what it holds (the job's error messages say it)
    required: bool = False
    # a file every host needs whole (File or FastFile mode, FullyReplicated): a Pipe stream has the
    # objects' bytes in sequence, not a file the job can open by name
    whole_file: bool = False


CHANNELS = {c.name: c for c in (
    Channel(TRAIN, "required", required=True),
    Channel(VALIDATION, "optional"),
    Channel(PRETRAINED, "optional: backbone weights", whole_file=True),
    Channel(MODEL, "optional: a previous job's model, continued; or JumpStart's pretrained model, the backbone",
            whole_file=True),
    Channel(TRAIN_LST, "record_format=lst: the .lst listing the train channel's images"),
    Channel(VALIDATION_LST, "record_format=lst: the .lst listing the validation channel's images"),
)}
EXAMPLES = (TRAIN, VALIDATION)  # the channels of examples (a Ground Truth manifest's, a .lst's images)
WHOLE_FILES = tuple(c.name for c in CHANNELS.values() if c.whole_file)
LST_OF = {TRAIN: TRAIN_LST, VALIDATION: VALIDATION_LST}  # the built-in MXNet algorithm's names


def check(channels) -> None:
    """The channels (by role: `training` already read as `train`) are the job's, `train` among
    them, and the whole-file ones not in Pipe mode; else a UserError naming what is wrong."""
    unknown = sorted(set(channels) - set(CHANNELS))
    if TRAIN not in channels or unknown:
        got = ", ".join(sorted(channels)) or "none"
        described = ", ".join(f"{c.name} ({c.role})" for c in CHANNELS.values())
        raise UserError(f"the job reads channels {described} (train may be named '{TRAINING}', as the built-in "
                        f"TensorFlow algorithm names it); it got: {got}")
    for name in WHOLE_FILES:
        if name in channels and channels[name].input_mode == "Pipe":
            raise UserError(f"channel '{name}' holds a {'weights file' if name == PRETRAINED else 'model'}: use File "
                            "or FastFile mode, not Pipe")
