"""Runs the training image through a SageMaker SDK's own local mode, as its users do; used by
tests/image/test_sdk_local.py under the SDK's virtualenv (v2 in .venv-sdk2, v3 in .venv).

    python tests/image/sdk_local_run.py '{"sdk": "v2", "image": ..., "hosts": 1, "channels": {...},
                                    "hyperparameters": {...}, "output": DIR}'

Hyperparameters are given as Python values and the SDK encodes them its own way. Prints one JSON
line last: {"artifacts": folder holding model.tar.gz and output.tar.gz, "error": the exception the
SDK raised, or null}.
"""

import glob
import json
import os
import sys

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"


def v2(job: dict) -> str:
    from sagemaker.estimator import Estimator
    from sagemaker.local import LocalSession

    session = LocalSession()
    session.config = {"local": {"local_code": True}}
    estimator = Estimator(image_uri=job["image"], role=ROLE, instance_count=job["hosts"], instance_type="local",
                          output_path=f"file://{job['output']}", hyperparameters=job["hyperparameters"],
                          sagemaker_session=session, base_job_name="sdk-local")
    estimator.fit({name: f"file://{path}" for name, path in job["channels"].items()}, logs=True)
    return job["output"]  # (a file:// output_path gets model.tar.gz and output.tar.gz themselves)


def v3(job: dict) -> str:
    from sagemaker.core.training.configs import Compute, InputData
    from sagemaker.train.model_trainer import Mode, ModelTrainer

    trainer = ModelTrainer(training_image=job["image"], role=ROLE, training_mode=Mode.LOCAL_CONTAINER,
                           compute=Compute(instance_type="local_cpu", instance_count=job["hosts"]),
                           hyperparameters=job["hyperparameters"], local_container_root=job["output"],
                           base_job_name="sdk-local")
    trainer.train(input_data_config=[InputData(channel_name=name, data_source=path)
                                     for name, path in job["channels"].items()], wait=True)
    return os.path.join(job["output"], "compressed_artifacts")


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    artifacts, error = None, None
    try:
        artifacts = (v2 if job["sdk"] == "v2" else v3)(job)
    except Exception as err:  # any failure: reported to the test, which asserts on it
        error = f"{type(err).__name__}: {err}"
        found = glob.glob(os.path.join(job["output"], "**", "output.tar.gz"), recursive=True)
        artifacts = os.path.dirname(found[0]) if found else None
    print(json.dumps({"artifacts": artifacts, "error": error}), flush=True)
