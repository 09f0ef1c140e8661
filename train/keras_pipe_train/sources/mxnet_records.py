"""MXNet RecordIO image files (record_format=recordio): what SageMaker's built-in Image
Classification - MXNet algorithm trains on, as `im2rec` writes them (`train.rec`; its `.idx` is not
needed), read in Pipe mode (the .rec objects streamed as they are: RecordWrapperType None) or in
File/FastFile mode (the channel's *.rec files).

Each RecordIO record's payload is MXNet's image record (mxnet.recordio.pack): its header
(sources/image_record_header.py, which the server reads too), then the encoded image. A
single-label record holds its class id in the header's label; a multi-label one, as the built-in
algorithm takes it, one 0/1 value per class (the job's label_format=multi_hot). Each becomes the
tf.train.Example the rest of the pipeline reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tensorflow.core.example import example_pb2, feature_pb2

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.sources import image_record_header


def combiner(config: JobConfig) -> Callable[[list[bytes]], bytes]:
    """combine([payload]) -> the serialized Example of one image record; ValueError saying why not."""

    def combine(payloads: list[bytes]) -> bytes:
        (payload,) = payloads
        try:
            header = image_record_header.unpack(payload)
        except image_record_header.ImageRecordError as err:
            raise ValueError(f"{err}: is this an image RecordIO file (im2rec's .rec)?") from None
        image = payload[header.image_offset:]
        feature = {config.image_feature: feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[image]))}
        feature[config.label_feature] = _label_feature(list(header.labels), config)
        return example_pb2.Example(features=feature_pb2.Features(feature=feature)).SerializeToString(deterministic=True)

    return combine


def _label_feature(labels: list[float], config: JobConfig) -> feature_pb2.Feature:
    if config.multi_label:  # (label_format=multi_hot: config checks it)
        if len(labels) != config.num_classes:
            raise ValueError(f"it holds {len(labels)} label value(s); a multi-label record holds one 0 or 1 per class "
                             f"({config.num_classes})")
        return feature_pb2.Feature(float_list=feature_pb2.FloatList(value=labels))
    if len(labels) != 1:
        raise ValueError(f"it holds {len(labels)} labels ({_shown(labels)}): a multi-label file needs hyperparameters "
                         "multi_label=true and label_format=multi_hot")
    value = labels[0]
    if not math.isfinite(value) or not value.is_integer() or value < 0:
        raise ValueError(f"its label {value} is not a class id")
    return feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[int(value)]))


def _shown(labels: list[float]) -> str:
    text = ", ".join(f"{v:g}" for v in labels[:8])
    return text + (", ..." if len(labels) > 8 else "")
