"""Submitting a JobSpec through the installed SageMaker Python SDK: v3 `ModelTrainer` when
`sagemaker>=3` is installed, v2 `Estimator` when `sagemaker<3` is (v2 is in maintenance until
2027-07 and many users are still on it). Both are configured to send the very request that
`sagemaker.request.create_training_job_request()` describes; the tests check it on a local server.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib import metadata
from typing import TYPE_CHECKING

from keras_pipe_launch.sagemaker.request import CHECKPOINT_LOCAL_PATH, TENSORBOARD_LOCAL_PATH, JobSpec, RequestError
from keras_pipe_train.training.metrics import METRIC_DEFINITIONS

if TYPE_CHECKING:
    from keras_pipe_launch.common.channels import ChannelSpec
    from keras_pipe_launch.sagemaker.tuning import TuningSpec


def sdk_major_version() -> int:
    try:
        return int(metadata.version("sagemaker").split(".")[0])
    except metadata.PackageNotFoundError:
        raise RequestError("the SageMaker Python SDK is not installed: pip install 'sagemaker>=3' "
                           "(or 'sagemaker<3' for SDK v2)") from None


def before_v2() -> None:
    """What must be set before SDK v2 is imported: its deprecation warning off (the user chose v2),
    and its config logger on standard error. v2 gives that logger a handler on standard output unless
    it has one ("so logs don't show up with a red background in a notebook"), and its lines would
    then come before the name we print there: `name=$(keras-pipe submit ...)` would take them too."""
    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    config_log = logging.getLogger("sagemaker.config")
    if not config_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)-4s - %(message)s"))
        config_log.addHandler(handler)


def submit(spec: JobSpec, name: str) -> str:
    """Creates the training job (without waiting); returns its name."""
    return _submit_v3(spec) if sdk_major_version() >= 3 else _submit_v2(spec, name)


def _submit_v3(spec: JobSpec) -> str:
    trainer, channels = _model_trainer(spec)
    trainer.train(input_data_config=channels, wait=False, logs=False)
    return trainer._latest_training_job.training_job_name  # (private: v3 keeps it only here)


def _model_trainer(spec: JobSpec):
    """SDK v3: the ModelTrainer for `spec`, and its channels."""
    import boto3
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.core.training import configs
    from sagemaker.train import ModelTrainer

    trainer = ModelTrainer(
        sagemaker_session=Session(boto_session=boto3.Session()),
        role=spec.role,
        training_image=spec.image_uri,
        base_job_name=spec.base_job_name,  # v3 names the job base-YYYYmmddHHMMSS itself
        compute=configs.Compute(instance_type=spec.instance_type, instance_count=spec.instance_count,
                                volume_size_in_gb=spec.volume_size_gb,
                                enable_managed_spot_training=spec.spot or None),
        stopping_condition=configs.StoppingCondition(
            max_runtime_in_seconds=spec.max_run_s,
            max_wait_time_in_seconds=(spec.max_wait_s or spec.max_run_s) if spec.spot else None),
        output_data_config=configs.OutputDataConfig(s3_output_path=spec.output_path, compression_type="GZIP"),
        checkpoint_config=(configs.CheckpointConfig(s3_uri=spec.checkpoint_s3_uri, local_path=CHECKPOINT_LOCAL_PATH)
                           if spec.checkpoint_s3_uri else None),
        networking=configs.Networking(enable_network_isolation=True) if spec.network_isolation else None,
        training_input_mode=spec.input_mode,
        environment=dict(spec.environment),
        hyperparameters=dict(spec.hyperparameters),
        tags=[configs.Tag(key=k, value=v) for k, v in spec.tags] or None,
    ).with_metric_definitions([configs.MetricDefinition(name=d["Name"], regex=d["Regex"])
                               for d in METRIC_DEFINITIONS])
    if spec.tensorboard_s3_uri:
        trainer = trainer.with_tensorboard_output_config(configs.TensorBoardOutputConfig(
            s3_output_path=spec.tensorboard_s3_uri, local_path=TENSORBOARD_LOCAL_PATH))
    return trainer, [_v3_channel(c, configs) for c in spec.channels]


def _v3_channel(c: ChannelSpec, configs):
    """SDK v3: the Channel for `c` (`configs`: sagemaker.core.training.configs)."""
    return configs.Channel(
        channel_name=c.name, input_mode=c.input_mode, content_type=c.content_type,
        compression_type=None if c.compression == "None" else c.compression,
        record_wrapper_type=None if c.record_wrapper == "None" else c.record_wrapper,
        shuffle_config=configs.ShuffleConfig(seed=c.shuffle_seed) if c.shuffle_seed is not None else None,
        data_source=configs.DataSource(s3_data_source=configs.S3DataSource(
            s3_data_type=c.data_type, s3_uri=c.source, s3_data_distribution_type=c.distribution,
            attribute_names=list(c.attribute_names) if c.attribute_names else None)))


def _submit_v2(spec: JobSpec, name: str) -> str:
    before_v2()
    estimator, inputs = _estimator(spec)
    estimator.fit(inputs=inputs, job_name=name, wait=False, logs=False)
    return name


def _estimator(spec: JobSpec):
    """SDK v2: the Estimator for `spec`, and its inputs."""
    from sagemaker.debugger import TensorBoardOutputConfig
    from sagemaker.estimator import Estimator
    from sagemaker.inputs import ShuffleConfig, TrainingInput

    estimator = Estimator(
        image_uri=spec.image_uri,
        role=spec.role,
        instance_count=spec.instance_count,
        instance_type=spec.instance_type,
        volume_size=spec.volume_size_gb,
        max_run=spec.max_run_s,
        use_spot_instances=spec.spot,
        max_wait=(spec.max_wait_s or spec.max_run_s) if spec.spot else None,
        checkpoint_s3_uri=spec.checkpoint_s3_uri,
        checkpoint_local_path=CHECKPOINT_LOCAL_PATH if spec.checkpoint_s3_uri else None,
        output_path=spec.output_path,
        input_mode=spec.input_mode,
        hyperparameters=dict(spec.hyperparameters),
        environment=dict(spec.environment) or None,
        tags=[{"Key": k, "Value": v} for k, v in spec.tags] or None,
        enable_network_isolation=spec.network_isolation,
        metric_definitions=[dict(d) for d in METRIC_DEFINITIONS],
        tensorboard_output_config=(TensorBoardOutputConfig(spec.tensorboard_s3_uri, TENSORBOARD_LOCAL_PATH)
                                   if spec.tensorboard_s3_uri else None),
        base_job_name=spec.base_job_name,
        sagemaker_session=_v2_session(),
        debugger_hook_config=False,  # else v2 adds a debugger hook config to the request
        disable_profiler=True,
    )
    inputs = {
        c.name: TrainingInput(
            c.source, distribution=c.distribution, input_mode=c.input_mode, content_type=c.content_type,
            compression=None if c.compression == "None" else c.compression,
            record_wrapping=None if c.record_wrapper == "None" else c.record_wrapper,
            shuffle_config=ShuffleConfig(c.shuffle_seed) if c.shuffle_seed is not None else None,
            s3_data_type=c.data_type, attribute_names=list(c.attribute_names) if c.attribute_names else None)
        for c in spec.channels
    }
    return estimator, inputs


def _v2_session():
    """SDK v2: a Session whose requests are aligned on v3's."""
    import boto3
    import sagemaker

    class AlignedSession(sagemaker.Session):
        # With the profiler off, v2 still sends ProfilerConfig {DisableProfiler: true}, and it cannot
        # send OutputDataConfig.CompressionType GZIP; v3 sends no ProfilerConfig and always sends GZIP.
        # Both mean the same to the service (no ProfilerConfig: no profiler; GZIP: its default), so
        # v2's request is aligned on v3's: one request, whichever SDK is installed.
        def train(self, **kwargs):
            kwargs["profiler_config"] = None
            kwargs["output_config"] = {**kwargs["output_config"], "CompressionType": "GZIP"}
            return super().train(**kwargs)

        # Likewise for tuning jobs: v2 describes the training jobs' instances as
        # HyperParameterTuningResourceConfig, v3 as ResourceConfig (the same, for one instance type).
        def create_tuning_job(self, job_name, tuning_config, training_config=None, **kwargs):
            config = dict(training_config)
            config["resource_config"] = config.pop("hpo_resource_config")
            config["output_config"] = {**config["output_config"], "CompressionType": "GZIP"}
            return super().create_tuning_job(job_name, tuning_config, training_config=config, **kwargs)

    return AlignedSession(boto_session=boto3.Session())


def tune(spec: TuningSpec, name: str) -> None:
    """Creates the hyperparameter tuning job (without waiting)."""
    (_tune_v3 if sdk_major_version() >= 3 else _tune_v2)(spec, name)


def _tune_v3(spec: TuningSpec, name: str) -> None:
    from sagemaker.core.parameter import CategoricalParameter, ContinuousParameter, IntegerParameter
    from sagemaker.train.tuner import HyperparameterTuner

    class Tuner(HyperparameterTuner):
        # v3's tuner leaves the trainer's network isolation out of the training job definition
        # (sagemaker 3.x); put it back, so the tuned jobs run as `keras-pipe submit`'s would.
        def _build_training_job_definition(self, inputs):
            definition = super()._build_training_job_definition(inputs)
            if spec.job.network_isolation:
                definition.enable_network_isolation = True
            return definition

    trainer, channels = _model_trainer(spec.job)
    tuner = Tuner(model_trainer=trainer,
                  **_tuner_options(spec, IntegerParameter, ContinuousParameter, CategoricalParameter))
    tuner.tune(inputs=channels, job_name=name, wait=False)


def _tune_v2(spec: TuningSpec, name: str) -> None:
    before_v2()
    from sagemaker.parameter import CategoricalParameter, ContinuousParameter, IntegerParameter
    from sagemaker.tuner import HyperparameterTuner

    estimator, inputs = _estimator(spec.job)
    tuner = HyperparameterTuner(estimator,
                                **_tuner_options(spec, IntegerParameter, ContinuousParameter, CategoricalParameter))
    tuner.fit(inputs=inputs, job_name=name, wait=False)


def _tuner_options(spec: TuningSpec, integer, continuous, categorical) -> dict:
    """Every argument of the SDK's HyperparameterTuner but the training job: v2 and v3 take the
    same ones, with their own parameter range classes (same constructors) given here."""
    def range_of(r):
        if r.kind == "Categorical":
            return categorical(list(r.values))
        return {"Integer": integer, "Continuous": continuous}[r.kind](r.values[0], r.values[1], scaling_type=r.scale)

    return dict(objective_metric_name=spec.objective, objective_type=spec.objective_type,
                hyperparameter_ranges={r.name: range_of(r) for r in spec.ranges},
                metric_definitions=[dict(d) for d in METRIC_DEFINITIONS], strategy=spec.strategy,
                max_jobs=spec.max_jobs, max_parallel_jobs=spec.max_parallel_jobs,
                early_stopping_type=spec.early_stopping,
                tags=[{"Key": k, "Value": v} for k, v in spec.job.tags] or None)


def process(request: dict) -> str:
    """Creates the processing job `request` (a CreateProcessingJob request, as --dry-run prints it)
    through the installed SDK, without waiting; returns its name."""
    (_process_v3 if sdk_major_version() >= 3 else _process_v2)(request)
    return request["ProcessingJobName"]


def _processor_options(request: dict) -> dict:
    """The Processor arguments v2 and v3 share (same names), from the request."""
    cluster, app = request["ProcessingResources"]["ClusterConfig"], request["AppSpecification"]
    return dict(role=request["RoleArn"], image_uri=app["ImageUri"], entrypoint=app["ContainerEntrypoint"],
                instance_count=cluster["InstanceCount"], instance_type=cluster["InstanceType"],
                volume_size_in_gb=cluster["VolumeSizeInGB"],
                max_runtime_in_seconds=request["StoppingCondition"]["MaxRuntimeInSeconds"])


def _process_v3(request: dict) -> None:
    import boto3
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.core.processing import Processor
    from sagemaker.core.shapes import ProcessingInput, ProcessingOutput, ProcessingS3Input, ProcessingS3Output

    # AppManaged given, as v2 sends it (v3 leaves out what is not given)
    inputs = [ProcessingInput(input_name=i["InputName"], app_managed=i["AppManaged"], s3_input=ProcessingS3Input(
        s3_uri=i["S3Input"]["S3Uri"], local_path=i["S3Input"]["LocalPath"], s3_data_type=i["S3Input"]["S3DataType"],
        s3_input_mode=i["S3Input"]["S3InputMode"], s3_compression_type=i["S3Input"]["S3CompressionType"],
        s3_data_distribution_type=i["S3Input"]["S3DataDistributionType"])) for i in request["ProcessingInputs"]]
    outputs = [ProcessingOutput(output_name=o["OutputName"], app_managed=o["AppManaged"], s3_output=ProcessingS3Output(
        s3_uri=o["S3Output"]["S3Uri"], local_path=o["S3Output"]["LocalPath"],
        s3_upload_mode=o["S3Output"]["S3UploadMode"])) for o in request["ProcessingOutputConfig"]["Outputs"]]
    processor = Processor(**_processor_options(request), sagemaker_session=Session(boto_session=boto3.Session()))
    processor.run(inputs=inputs, outputs=outputs, arguments=request["AppSpecification"]["ContainerArguments"],
                  wait=False, logs=False, job_name=request["ProcessingJobName"])


def _process_v2(request: dict) -> None:
    before_v2()
    import boto3
    import sagemaker
    from sagemaker.processing import ProcessingInput, ProcessingOutput, Processor

    inputs = [ProcessingInput(source=i["S3Input"]["S3Uri"], destination=i["S3Input"]["LocalPath"],
                              input_name=i["InputName"], s3_data_type=i["S3Input"]["S3DataType"],
                              s3_input_mode=i["S3Input"]["S3InputMode"],
                              s3_data_distribution_type=i["S3Input"]["S3DataDistributionType"],
                              s3_compression_type=i["S3Input"]["S3CompressionType"])
              for i in request["ProcessingInputs"]]
    outputs = [ProcessingOutput(source=o["S3Output"]["LocalPath"], destination=o["S3Output"]["S3Uri"],
                                output_name=o["OutputName"], s3_upload_mode=o["S3Output"]["S3UploadMode"])
               for o in request["ProcessingOutputConfig"]["Outputs"]]
    processor = Processor(**_processor_options(request),
                          sagemaker_session=sagemaker.Session(boto_session=boto3.Session()))
    processor.run(inputs=inputs, outputs=outputs, arguments=request["AppSpecification"]["ContainerArguments"],
                  wait=False, logs=False, job_name=request["ProcessingJobName"])
