"""Runs the training image through a SageMaker SDK's own local mode, as its users do; used by
tests/image/test_sdk_local.py under the SDK's virtualenv (v2 in .venv-sdk2, v3 in .venv).

    python tests/image/sdk_local_run.py '{"sdk": "v2", "image": ..., "hosts": 1, "channels": {...},
                                    "hyperparameters": {...}, "output": DIR}'

Hyperparameters are given as Python values and the SDK encodes them its own way. Prints one JSON
line last: {"artifacts": folder holding model.tar.gz and output.tar.gz, "error": the exception the
SDK raised, or null}.

    python tests/image/sdk_local_run.py '{"sdk": "v2", "image": ..., "serve": {"model_data": TAR_GZ,
                                    "images": [JPEG, ...], "transform": [INPUT_DIR, OUTPUT_DIR] (v2)}}'

deploys a model.tar.gz to a local endpoint, sends it each image as the SDK's users do, and (v2) runs
a local batch transform over a folder; prints {"answers": [each image's answer], "error": ...}.

    python tests/image/sdk_local_run.py '{"sdk": "v2", "image": ..., "output": DIR, "notebook": {
                                    "hyperparameters": {...}, "channels": {...}, "classes": [...],
                                    "images": [JPEG, ...]}}'

runs AWS's incremental-training notebook's own cells (SDK v2) in local mode: its Estimator, its
hyperparameters, its RecordIO channels, fit, deploy, and its cell 35 for each image; prints
{"answers": [the class cell 35 names for each image], "error": ...}.
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


def v2_serve(job: dict) -> list:
    """SDK v2: Model.deploy(instance_type="local") and predictor.predict(bytes), as its users host a
    model (the Predictor's default serializer sends application/octet-stream); then a local batch
    transform of a folder, one image per file (SingleRecord: v2 refuses MultiRecord on binary files)."""
    from sagemaker.local import LocalSession
    from sagemaker.model import Model
    from sagemaker.predictor import Predictor

    session = LocalSession()
    session.config = {"local": {"local_code": True}}
    serve = job["serve"]
    model = Model(image_uri=job["image"], model_data=f"file://{serve['model_data']}", role=ROLE,
                  predictor_cls=Predictor, sagemaker_session=session)
    try:
        predictor = model.deploy(initial_instance_count=1, instance_type="local")
        answers = [json.loads(predictor.predict(open(path, "rb").read())) for path in serve["images"]]
    finally:  # (the endpoint's container stopped whatever failed: it holds port 8080)
        if model.endpoint_name:
            session.sagemaker_client.delete_endpoint(EndpointName=model.endpoint_name)
    source, target = serve["transform"]
    transformer = model.transformer(instance_count=1, instance_type="local", strategy="SingleRecord",
                                    assemble_with="None", output_path=f"file://{target}",
                                    accept="application/jsonlines")
    transformer.transform(f"file://{source}", content_type="application/x-image", split_type="None", wait=True,
                          logs=False)  # (logs=True reads CloudWatch, even in local mode)
    return answers


def v2_notebook(job: dict) -> list:
    """Image-classification-incremental-training-highlevel.ipynb, cells 16, 18, 20, then fit, deploy
    and cell 35 (tests/builtin/cells.py), with instance_type "local" and the channels' folders for
    its S3 prefixes (and its training image: this one)."""
    import sagemaker
    from sagemaker.local import LocalSession
    from sagemaker.serializers import IdentitySerializer

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from tests.builtin.cells import a8_cell_35

    sess = LocalSession()
    sess.config = {"local": {"local_code": True}}
    notebook, training_image, role = job["notebook"], job["image"], ROLE
    ic = sagemaker.estimator.Estimator(training_image, role, instance_count=1, instance_type="local", volume_size=50,
                                       max_run=360000, input_mode="File", output_path=f"file://{job['output']}",
                                       sagemaker_session=sess)
    ic.set_hyperparameters(**notebook["hyperparameters"])
    data_channels = {name: sagemaker.inputs.TrainingInput(f"file://{path}", distribution="FullyReplicated",
                                                          content_type="application/x-recordio", s3_data_type="S3Prefix")
                     for name, path in notebook["channels"].items()}
    ic.fit(inputs=data_channels, logs=True)
    ic_classifier = ic.deploy(initial_instance_count=1, instance_type="local")
    try:
        return [a8_cell_35(ic_classifier, path, notebook["classes"], IdentitySerializer) for path in notebook["images"]]
    finally:  # (the endpoint's container stopped whatever failed: it holds port 8080)
        sess.sagemaker_client.delete_endpoint(EndpointName=ic_classifier.endpoint_name)


def v3_serve(job: dict) -> list:
    """SDK v3: its local session's CreateModel, CreateEndpointConfig, CreateEndpoint and
    InvokeEndpoint (v3's ModelBuilder starts only AWS's own model servers locally)."""
    from sagemaker.core.local import LocalSession

    session = LocalSession()
    client, runtime = session.sagemaker_client, session.sagemaker_runtime_client
    client.create_model(ModelName="sdk-local-v3", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": job["image"], "ModelDataUrl": f"file://{job['serve']['model_data']}", "Environment": {}})
    client.create_endpoint_config(EndpointConfigName="sdk-local-v3", ProductionVariants=[{
        "VariantName": "AllTraffic", "ModelName": "sdk-local-v3", "InitialInstanceCount": 1, "InstanceType": "local"}])
    client.create_endpoint(EndpointName="sdk-local-v3", EndpointConfigName="sdk-local-v3")
    try:
        return [json.loads(runtime.invoke_endpoint(Body=open(path, "rb").read(), EndpointName="sdk-local-v3",
                                                   ContentType="image/jpeg", Accept="application/json")["Body"].read())
                for path in job["serve"]["images"]]
    finally:
        client.delete_endpoint("sdk-local-v3")


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    if "serve" in job or "notebook" in job:
        answers, error = None, None
        try:
            answers = v2_notebook(job) if "notebook" in job else (v2_serve if job["sdk"] == "v2" else v3_serve)(job)
        except Exception as err:  # reported to the test, which asserts on it
            error = f"{type(err).__name__}: {err}"
        print(json.dumps({"answers": answers, "error": error}), flush=True)
        # (not sys.exit: a container the SDK failed to stop keeps a thread of its waiting for output,
        # and Python would wait for that thread for ever)
        os._exit(0)
    artifacts, error = None, None
    try:
        artifacts = (v2 if job["sdk"] == "v2" else v3)(job)
    except Exception as err:  # any failure: reported to the test, which asserts on it
        error = f"{type(err).__name__}: {err}"
        found = glob.glob(os.path.join(job["output"], "**", "output.tar.gz"), recursive=True)
        artifacts = os.path.dirname(found[0]) if found else None
    print(json.dumps({"artifacts": artifacts, "error": error}), flush=True)
