"""Which records each worker reads when several hosts train together (train/keras_pipe_train/sources/datasets.py).

ShardedByS3Key: SageMaker already gave each host its own objects, so a worker reads all it got.
FullyReplicated: every host got everything, so each worker keeps its share: whole files when there
are enough (File mode), otherwise every Nth record (Pipe mode, or fewer files than workers)."""

import collections

import pytest
import tensorflow as tf

from keras_pipe_train.settings import contract
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.sources import datasets
from pipemode import tfrecord

CONFIG = JobConfig.from_hyperparameters({"num_classes": 10})
WORKERS = 2


def worker_records(job, channel: str, worker: int) -> list[bytes]:
    spec = contract.read_input_data_config(job.config_dir)[channel]
    context = tf.distribute.InputContext(num_input_pipelines=WORKERS, input_pipeline_id=worker,
                                         num_replicas_in_sync=WORKERS)
    dataset, _ = datasets.records(spec, contract.paths(job.base), CONFIG, shard=datasets.worker_shard(spec, context))
    return [r.numpy() for r in dataset]


def file_channel(job, name: str, parts: list[list[bytes]], distribution: str) -> None:
    job.add_channel(name, mode="File", distribution=distribution)
    (job.data_dir / name).mkdir()
    for i, part in enumerate(parts):
        (job.data_dir / name / f"part-{i}.tfrecord").write_bytes(tfrecord.encode(part))


@pytest.mark.slow
@pytest.mark.parametrize("files", [3, 1])
def test_file_mode_fully_replicated_splits_the_records_between_workers(job, files, digit_records):
    records = digit_records[0][:90]
    file_channel(job, "train", [records[i::files] for i in range(files)], "FullyReplicated")
    shares = [worker_records(job, "train", w) for w in range(WORKERS)]
    assert collections.Counter(shares[0] + shares[1]) == collections.Counter(records)
    assert all(shares) and not set(shares[0]) & set(shares[1])


def test_file_mode_sharded_by_s3_key_reads_everything_it_was_given(job, digit_records):
    records = digit_records[0][100:140]
    file_channel(job, "train", [records[:25], records[25:]], "ShardedByS3Key")
    for worker in range(WORKERS):  # this host's objects are all its own (read interleaved)
        assert collections.Counter(worker_records(job, "train", worker)) == collections.Counter(records)


def test_pipe_mode_fully_replicated_keeps_every_other_record_of_the_stream(job, digit_records):
    records = digit_records[0][200:251]
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(records))], passes=2)
    # one host, here, reads pass 0 as worker 0 and pass 1 as worker 1: together, every record once
    shares = [worker_records(job, "train", w) for w in range(WORKERS)]
    assert shares == [records[0::2], records[1::2]]


@pytest.mark.parametrize("skips", [0, 3])
def test_file_mode_shuffles_the_files_of_each_epoch_also_when_corrupt_records_may_be_skipped(job, skips,
                                                                                            digit_records):
    """The file order is the epoch's (seeded: a resumed epoch reads the same order), whatever
    max_corrupted_records_to_skip says (an earlier reader ignored shuffle_files when skipping)."""
    records = digit_records[0][300:312]
    file_channel(job, "train", [[r] for r in records], "FullyReplicated")
    config = JobConfig.from_hyperparameters({"num_classes": 10, "max_corrupted_records_to_skip": str(skips)})
    spec = contract.read_input_data_config(job.config_dir)["train"]

    def read(seed: int, shuffle_files: bool = True) -> list[bytes]:
        dataset, _ = datasets.records(spec, contract.paths(job.base), config, seed=seed, shuffle_files=shuffle_files)
        return [r.numpy() for r in dataset]

    in_name_order = read(0, shuffle_files=False)
    epochs = [read(seed) for seed in (1, 2)]
    assert sorted(in_name_order) == sorted(records) == sorted(epochs[0]) == sorted(epochs[1])
    assert len({tuple(in_name_order), tuple(epochs[0]), tuple(epochs[1])}) == 3
    assert read(1) == epochs[0]
