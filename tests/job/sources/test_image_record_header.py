"""MXNet's image record header, read once (keras_pipe_train.sources.image_record_header) for the job
(sources/mxnet_records.py) and the server (keras_pipe_serve.payloads): checked on the records MXNet
1.9.1's own writer made (tests/data/*.rec), and both sides take the same image from the same bytes."""

from __future__ import annotations

import pytest
import tensorflow as tf
from keras_pipe_serve.payloads import BadRequest, record_image

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.sources import image_record_header, mxnet_records
from tests.job.sources.test_mxnet_records import QUICK, listed, payloads


@pytest.mark.parametrize("rec, lst", [("digits-mxnet.rec", "digits.lst"), ("pairs-mxnet.rec", "pairs.lst")])
def test_the_header_reads_and_writes_what_mxnet_wrote(rec, lst):
    records, rows = payloads(rec), listed(lst)
    assert len(records) == len(rows) > 0
    for index, (payload, row) in enumerate(zip(records, rows)):
        header = image_record_header.unpack(payload)
        assert list(header.labels) == [float(v) for v in row] and (header.id, header.id2) == (index, 0)
        assert header.flag == (0 if len(row) == 1 else len(row))
        label = float(row[0]) if len(row) == 1 else [float(v) for v in row]
        assert image_record_header.pack(label, index) == bytes(payload[:header.image_offset])
        assert payload[header.image_offset:].startswith(b"\xff\xd8\xff")  # (the JPEGs im2rec packed)


@pytest.mark.parametrize("rec, settings", [("digits-mxnet.rec", {}),
                                           ("pairs-mxnet.rec", {"multi_label": "true", "label_format": "multi_hot"})])
def test_the_job_and_the_server_take_the_same_image_from_a_record(rec, settings):
    combine = mxnet_records.combiner(JobConfig.from_hyperparameters({**QUICK, **settings}))
    for payload in payloads(rec)[:20]:
        trained = tf.train.Example.FromString(combine([payload])).features.feature["image/encoded"].bytes_list.value[0]
        assert trained == record_image(memoryview(payload), "record 1")
        assert trained == payload[image_record_header.unpack(payload).image_offset:]


@pytest.mark.parametrize("payload, message", [
    (b"tiny", "4 bytes, fewer than the image record header's 24"),
    (image_record_header.pack([1.0] * 1000, 0)[:60], "its header says 1000 labels follow, more than its 60 bytes hold"),
])
def test_both_sides_refuse_a_record_the_header_cannot_be_read_from_for_the_same_reason(payload, message):
    with pytest.raises(image_record_header.ImageRecordError, match=message):
        image_record_header.unpack(payload)
    with pytest.raises(ValueError, match=f"^{message}: is this an image RecordIO file"):
        mxnet_records.combiner(JobConfig.from_hyperparameters(QUICK))([payload])
    with pytest.raises(BadRequest, match=f"^record 2 is neither an image nor an im2rec image record: {message}$"):
        record_image(payload, "record 2")
