"""A drop-in for SageMaker's built-in image classifiers: a model exported in a built-in's dialect
(serving.json's "dialect") answers that built-in's clients as it did, and this project's own answer
stays one Accept away (application/vnd.keras-pipe+json).

The clients are the AWS sample notebooks' own code (aws/amazon-sagemaker-examples at 4883224d,
introduction_to_amazon_algorithms/imageclassification_caltech, _mscoco_multi_label and
image_classification_tensorflow), each cell copied line for line into a function of its own
(tests/builtin/cells.py), run against the real server over HTTP. The AWS clients they call are
stand-ins that send what those send: boto3's invoke_endpoint (no Accept unless given), SDK v2's
Predictor (its serializer's Content-Type, its BytesDeserializer's Accept: */*), the batch
transform (the .out file is the body the container answered; SageMaker sets SAGEMAKER_BATCH=true).

The model knows colours (weights set by hand, no training): a red photo is "red", and each
notebook must get back the class the photo truly is."""

import base64
import dataclasses
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from keras_pipe_serve import payloads

from keras_pipe_train.settings import serving_schema
from tests.builtin.cells import (
    a1_cell_31_get_label,
    a1_cell_45,
    a8_cell_35,
    a9_cell_35,
    a10_cell_61,
    b1_cell_18,
    b1_cell_44,
)
from tests.serve.conftest import Server

pytestmark = pytest.mark.slow

COLORS = ("blue", "green", "red")  # the TF algorithm's rule: class folders in alphabetical order
PIXELS = {"red": (230, 25, 25), "green": (25, 230, 25), "blue": (25, 25, 230), "yellow": (230, 230, 25)}
RICH_KEYS = ["predicted_label", "top_k", "labels", "probabilities"]


def color_model(folder: Path, dialect: str, multi_label: bool = False) -> Path:
    """A classifier of colours exported by the job's own export() in `dialect`: a backbone whose
    1x1 convolution passes the RGB channels through, pooled to the photo's mean colour, and a head
    weighing each channel for its class (sigmoid, from 0.5 of a channel up: multi-label)."""
    import keras

    from keras_pipe_train.model import classifier as M
    from keras_pipe_train.model.export import export

    backbone = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                                 keras.layers.Conv2D(3, 1, activation="relu")], name="colors")
    backbone.layers[-1].set_weights([np.eye(3, dtype="float32").reshape(1, 1, 3, 3), np.zeros(3, "float32")])
    classifier = M.build_classifier("mobilenet_v3_small", backbone, len(COLORS), 0.0, batchnorm_frozen=False,
                                    activation="sigmoid" if multi_label else "softmax")
    kernel = np.zeros((3, len(COLORS)), "float32")
    for channel, color in enumerate(("red", "green", "blue")):
        kernel[channel, COLORS.index(color)] = 10
    classifier.get_layer("classifier").set_weights([kernel, np.full(len(COLORS), -5 if multi_label else 0, "float32")])
    export(classifier, COLORS, 32, folder, threshold=0.5 if multi_label else None, dialect=dialect)
    return folder


def in_dialect(model: Path, folder: Path, dialect: str) -> Path:
    """The same export in another dialect: export() writes the same files whatever the dialect but
    serving.json's "dialect" (test_the_export_writes_its_dialect below), so a copy with only that changed."""
    shutil.copytree(model, folder)
    dataclasses.replace(serving_schema.read(folder), dialect=dialect).write(folder)
    return folder


def photo(folder: Path, color: str) -> str:
    """A JPEG photo of one colour, with noise, written to a file (the notebooks open files)."""
    from PIL import Image

    noise = np.random.default_rng(len(color)).integers(-20, 20, (30, 40, 3))
    pixels = np.clip(np.array(PIXELS[color]) + noise, 0, 255).astype(np.uint8)
    path = folder / f"{color}.jpg"
    Image.fromarray(pixels).save(path, "JPEG")
    return str(path)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`serve` on each dialect's model, all started at once (each one worker): the MXNet
    built-in's for real-time and for batch transform, its multi-label, the TensorFlow built-in's."""
    root = tmp_path_factory.mktemp("dialects")
    mxnet = color_model(root / "mxnet", "mxnet")
    models = {"mxnet": (mxnet, {}), "mxnet-batch": (mxnet, {"SAGEMAKER_BATCH": "true"}),
              "mxnet-multi-label": (color_model(root / "multi", "mxnet", multi_label=True), {}),
              "tensorflow": (in_dialect(mxnet, root / "tensorflow", "tensorflow"), {})}
    servers = {name: Server(model, root / f"{name}.log", SAGEMAKER_MODEL_SERVER_WORKERS="1", **env)
               for name, (model, env) in models.items()}
    for name, server in servers.items():
        server.model = models[name][0]
    try:
        for server in servers.values():
            server.wait_until_healthy()
        yield servers
    finally:
        for server in servers.values():  # (all told at once, then each waited for)
            server.process.terminate()
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("photos")
    return {color: photo(folder, color) for color in PIXELS}


class Runtime:
    """boto3's sagemaker-runtime client (invoke_endpoint): its Accept header only when given."""

    def __init__(self, server: Server):
        self.server = server
        self.sent: list[dict] = []  # the answers' headers

    def invoke_endpoint(self, EndpointName, Body, ContentType, Accept=None):  # (boto3's names)
        headers = {"Content_Type": ContentType, **({"Accept": Accept} if Accept is not None else {})}
        status, body, sent = self.server.request("POST", "/invocations", bytes(Body), **headers)
        assert status == 200, body[:500]
        self.sent.append(sent)
        return {"Body": io.BytesIO(body), "ContentType": sent["Content-Type"]}


class IdentitySerializer:
    """sagemaker.serializers.IdentitySerializer (SDK v2)."""

    def __init__(self, content_type="application/octet-stream"):
        self.CONTENT_TYPE = content_type


class Predictor:
    """sagemaker.predictor.Predictor (SDK v2), as deploy() returns it: initial_args' ContentType
    and Accept, else its serializer's and its BytesDeserializer's (*/*); the body's bytes back."""

    def __init__(self, server: Server, serializer=None):
        self.runtime = Runtime(server)
        self.serializer = serializer or IdentitySerializer()

    def predict(self, data, initial_args=None):
        args = {"ContentType": self.serializer.CONTENT_TYPE, "Accept": "*/*", **(initial_args or {})}
        return self.runtime.invoke_endpoint(EndpointName="endpoint", Body=data, **args)["Body"].read()


class S3:
    """boto3's S3 client, download_file only: the batch transform's output "bucket" is a folder."""

    def __init__(self, folder: Path):
        self.folder = folder

    def download_file(self, bucket, key, filename):
        shutil.copyfile(self.folder / key, filename)


def answer(server: Server, image: str, accept: str | None = None, content_type: str = "application/x-image"):
    """(status, Content-Type, body) for one photo."""
    headers = {"Content_Type": content_type, **({"Accept": accept} if accept is not None else {})}
    status, body, sent = server.request("POST", "/invocations", Path(image).read_bytes(), **headers)
    return status, sent["Content-Type"], body


def test_the_export_writes_its_dialect(served, model_dir, tmp_path):
    from keras_pipe_train.model import export

    assert serving_schema.read(model_dir).dialect == "keras-pipe"  # export()'s default
    mxnet, tensorflow = (served[name].model for name in ("mxnet", "tensorflow"))
    written, rewritten = (serving_schema.read(m) for m in (mxnet, tensorflow))
    assert written.dialect == "mxnet" and rewritten == dataclasses.replace(written, dialect="tensorflow")
    with pytest.raises(ValueError, match="dialect 'pytorch': one of keras-pipe, mxnet, tensorflow"):
        export.export(None, ("a", "b"), 32, tmp_path / "model", dialect="pytorch")
    assert not (tmp_path / "model").exists()


def test_the_mxnet_notebooks_real_time_code_gets_each_photos_class(served, photos, tmp_path, monkeypatch):
    runtime, ic_classifier = Runtime(served["mxnet"]), Predictor(served["mxnet"])  # boto3; SDK v2 (Accept */*)
    (tmp_path / "test_inputs").mkdir()
    for color in COLORS:
        label, result = a1_cell_45(runtime, "ic-endpoint", photos[color], list(COLORS))
        assert label == color and sum(result) == pytest.approx(1, abs=1e-5) and len(result) == len(COLORS)
        assert a8_cell_35(ic_classifier, photos[color], list(COLORS), IdentitySerializer) == color
        shutil.copy(photos[color], tmp_path / "test_inputs")
    monkeypatch.chdir(tmp_path)
    assert [a10_cell_61(runtime, "ic-endpoint", list(COLORS), [f"{color}.jpg"]) for color in COLORS] == list(COLORS)
    assert {sent["Content-Type"] for sent in runtime.sent + ic_classifier.runtime.sent} == {"application/json"}


def test_the_mxnet_dialects_answer_to_each_accept(served, photos):
    server, red = served["mxnet"], photos["red"]
    status, kind, body = answer(server, red, payloads.RICH)  # this project's answer, one Accept away
    rich = json.loads(body)
    assert (status, kind, list(rich)) == (200, payloads.RICH, RICH_KEYS) and rich["predicted_label"] == "red"
    probabilities = rich["probabilities"]
    for accept, content_type in [(None, "application/x-image"), ("*/*", "image/jpeg"),
                                 ("application/json", "application/x-image"), ("application/json;verbose", "image/jpeg")]:
        assert answer(server, red, accept, content_type) == (200, "application/json", json.dumps(probabilities).encode())
    assert answer(server, red, "application/jsonlines") == (
        200, "application/jsonlines", (json.dumps({"prediction": probabilities}) + "\n").encode())
    status, kind, body = answer(server, red, payloads.RICH_LINES)
    assert (status, kind) == (200, payloads.RICH_LINES) and body.decode().splitlines() == [json.dumps(rich)]
    several = json.dumps({"instances": [{"b64": base64.b64encode(Path(photos[c]).read_bytes()).decode()}
                                        for c in ("red", "blue")]}).encode()
    status, body, sent = server.request("POST", "/invocations", several, Content_Type="application/json")
    assert status == 200 and [int(np.argmax(p)) for p in json.loads(body)["predictions"]] == [2, 0]
    status, kind, body = answer(server, red, "text/csv")
    assert (status, kind) == (406, "application/json") and payloads.RICH in json.loads(body)["error"]


def test_the_mxnet_notebooks_batch_transform_output_gets_each_photos_class(served, photos, tmp_path, monkeypatch):
    """The notebooks' transform job (ContentType application/x-image, SplitType None, no Accept):
    each photo POSTed as it is, its answer written to <photo>.out, read back by their get_label."""
    server, bucket = served["mxnet-batch"], tmp_path / "bucket"
    (bucket / "job" / "output").mkdir(parents=True)
    for color in COLORS:
        status, kind, body = answer(server, photos[color])
        assert (status, kind) == (200, "application/jsonlines"), body[:500]
        (bucket / "job" / "output" / f"{color}.jpg.out").write_bytes(body)
    monkeypatch.chdir(tmp_path)
    for color in COLORS:
        label, probability = a1_cell_31_get_label(S3(bucket), "bucket", f"job/output/{color}.jpg.out", list(COLORS))
        assert label == color and probability > 0.99
    # the .out file exactly: one line, {"prediction": [every class's probability]}
    rich = json.loads(answer(server, photos["red"], payloads.RICH)[2])
    out = (bucket / "job" / "output" / "red.jpg.out").read_text()
    assert out == json.dumps({"prediction": rich["probabilities"]}) + "\n"
    assert answer(server, photos["red"], "*/*")[1:] == ("application/jsonlines", out.encode())
    assert answer(server, photos["red"], "application/json")[1:] == (  # asked for: the real-time answer
        "application/json", json.dumps(rich["probabilities"]).encode())


def test_the_multi_label_notebooks_code_gets_each_class_of_the_photo(served, photos, capsys):
    """A9's endpoint: deploy(serializer=IdentitySerializer(content_type="application/x-image")), cell 33."""
    ic_classifier = Predictor(served["mxnet-multi-label"], IdentitySerializer(content_type="application/x-image"))
    classes = list(COLORS)
    for color, expected in [("yellow", ["green", "red"]), ("red", ["red"]), ("blue", ["blue"])]:
        prob = a9_cell_35(ic_classifier, photos[color], classes)
        assert [c for c, p in zip(classes, prob) if p >= 0.5] == expected
    assert capsys.readouterr().out.startswith("blue:0.0")  # (the yellow photo's first class)
    rich = json.loads(answer(served["mxnet-multi-label"], photos["yellow"], payloads.RICH)[2])
    assert rich["predicted_labels"] == ["green", "red"] and rich["threshold"] == 0.5


def test_the_tensorflow_notebooks_code_gets_each_photos_class(served, photos):
    predictor, shown = Predictor(served["tensorflow"]), []
    images = {photos[color]: f"{color}/1.jpg" for color in COLORS}
    b1_cell_18(predictor, images, HTML=str, display=shown.append)
    b1_cell_44(predictor, images, HTML=str, display=shown.append)
    captions = [html.split("<figcaption>")[1] for html in shown]
    assert [caption.split(", ")[0] for caption in captions[:3]] == [f"Top-5 predictions: {c}" for c in COLORS]
    assert captions[3:] == [f"Predicted Label: {color}</figcaption>" for color in COLORS]


def test_the_tensorflow_dialects_answer_to_each_accept(served, photos):
    server, red = served["tensorflow"], photos["red"]
    status, kind, body = answer(server, red, payloads.RICH)
    rich = json.loads(body)
    assert (status, kind, list(rich)) == (200, payloads.RICH, RICH_KEYS) and rich["predicted_label"] == "red"
    probabilities = rich["probabilities"]
    verbose = {"probabilities": probabilities, "labels": list(COLORS), "predicted_label": "red"}
    assert answer(server, red, "application/json;verbose") == (200, "application/json", json.dumps(verbose).encode())
    for accept in (None, "*/*", "application/json"):  # the JumpStart predictor's default Accept: application/json
        assert answer(server, red, accept) == (200, "application/json",
                                               json.dumps({"probabilities": probabilities}).encode())
    assert answer(server, red, "application/jsonlines") == (
        200, "application/jsonlines", (json.dumps({"probabilities": probabilities}) + "\n").encode())
    assert answer(server, red, "text/csv")[:2] == (406, "application/json")
