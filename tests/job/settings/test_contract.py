"""The SageMaker contract: /opt/ml paths, the three config files, hyperparameter decoding."""

import json

import pytest

from keras_pipe_train.settings import contract, failure
from keras_pipe_train.settings.errors import UserError
from pipemode import PipeConfigError


def test_paths_follow_sagemaker_base_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path))
    layout = contract.paths()
    assert layout.hyperparameters == tmp_path / "input/config/hyperparameters.json"
    assert layout.input_data == tmp_path / "input/data"
    assert layout.model == tmp_path / "model"
    assert layout.failure == tmp_path / "output/failure"
    assert layout.checkpoints == tmp_path / "checkpoints"
    monkeypatch.delenv("SAGEMAKER_BASE_DIR")
    assert str(contract.paths().model) == "/opt/ml/model"


def test_hyperparameters_are_read_as_written_for_the_job_to_type(tmp_path):
    path = tmp_path / "hyperparameters.json"
    written = {"epochs": "3", "names": '["a", "b"]', "quoted": '"x"', "plain": 7}
    path.write_text(json.dumps(written))
    assert contract.read_hyperparameters(path) == written
    assert contract.read_hyperparameters(tmp_path / "absent.json") == {}


def test_input_data_config_channels(tmp_path):
    (tmp_path / "inputdataconfig.json").write_text(json.dumps({
        "train": {"TrainingInputMode": "Pipe", "S3DistributionType": "ShardedByS3Key",
                  "RecordWrapperType": "RecordIO", "CompressionType": "Gzip"},
        "validation": {"TrainingInputMode": "File"},
    }))
    channels = contract.read_input_data_config(tmp_path)
    assert channels["train"] == contract.ChannelConfig(
        "train", "Pipe", "RecordIO", "ShardedByS3Key", "Gzip", None)
    assert channels["validation"].input_mode == "File"
    assert channels["validation"].record_wrapper == "None"


@pytest.mark.parametrize("content, message", [
    ("{not json", "cannot read"),
    ("[]", "must hold a JSON object"),
    ('{"train": {"TrainingInputMode": "Stream"}}', "TrainingInputMode 'Stream'; expected one of File, FastFile, Pipe"),
    ('{"train": {"TrainingInputMode": "Pipe", "RecordWrapperType": "Avro"}}', "RecordWrapperType 'Avro'"),
])
def test_bad_input_data_config_is_a_clear_error(tmp_path, content, message):
    (tmp_path / "inputdataconfig.json").write_text(content)
    # the reader's own error (the job reads the file through pipemode), reported as the job's
    # configuration error
    with pytest.raises(PipeConfigError, match=message) as raised:
        contract.read_input_data_config(tmp_path)
    assert failure.classify(raised.value) == ("configuration error", str(raised.value))


def test_resource_config(tmp_path):
    path = tmp_path / "resourceconfig.json"
    path.write_text(json.dumps({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"],
                                "current_instance_type": "ml.g5.xlarge", "network_interface_name": "eth0"}))
    resources = contract.read_resource_config(path)
    assert (resources.current_host, resources.hosts, resources.is_chief) == ("algo-2", ("algo-1", "algo-2"), False)
    assert contract.read_resource_config(tmp_path / "absent.json").is_chief
    path.write_text(json.dumps({"current_host": "algo-3", "hosts": ["algo-1"]}))
    with pytest.raises(UserError, match="current_host 'algo-3' is not among hosts"):
        contract.read_resource_config(path)
