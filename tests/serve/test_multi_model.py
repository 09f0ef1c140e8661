"""A multi-model endpoint (keras_pipe_serve.models): `keras-pipe-serve` with SAGEMAKER_MULTI_MODEL=true,
driven as SageMaker drives a container under its "Custom Containers Contract for Multi-Model
Endpoints" (the models unpacked under /opt/ml/models/<name>/model, loaded, listed, described,
invoked, unloaded), and the registry's rules alone: 507 when memory is short, pages, a worker's
reload of the models loaded before it."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import image_bytes
from tests.serve.conftest import CLASSES, Server
from tests.timeouts import wait_s

JPEG = image_bytes("JPEG", 40, 30)


def call(server: Server, method: str, path: str, body: bytes | None = None, **headers: str) -> tuple[int, dict]:
    status, answer, _ = server.request(method, path, body, timeout=wait_s(120), **headers)
    return status, json.loads(answer) if answer else {}


def load(server: Server, name: str, url) -> tuple[int, dict]:
    return call(server, "POST", "/models", json.dumps({"model_name": name, "url": str(url)}).encode(),
                Content_Type="application/json", Accept="application/json")


@pytest.mark.slow
def test_a_multi_model_endpoint_loads_lists_invokes_and_unloads_models_as_sagemaker_asks(
        model_dir, multi_label_model_dir, tmp_path):
    models = tmp_path / "opt-ml" / "models"  # (as SageMaker unpacks each model.tar.gz it is asked for)
    for name, source in (("7f3a9c", model_dir), ("b41d02", multi_label_model_dir)):
        shutil.copytree(source, models / name / "model")
    (tmp_path / "opt-ml" / "model").mkdir()  # (empty on a multi-model endpoint)
    server = Server(tmp_path / "opt-ml" / "model", tmp_path / "serve.log", SAGEMAKER_MULTI_MODEL="true")
    try:
        server.wait_until_healthy()  # (healthy with no model loaded)
        assert call(server, "GET", "/models") == (200, {"models": []})
        assert load(server, "7f3a9c", models / "7f3a9c" / "model") == (
            200, {"modelName": "7f3a9c", "modelUrl": str(models / "7f3a9c" / "model")})
        status, answer = load(server, "7f3a9c", models / "7f3a9c" / "model")
        assert status == 409 and "loaded already" in answer["error"], answer
        status, answer = load(server, "nowhere", models / "nowhere" / "model")
        assert status == 404 and "holds no SavedModel" in answer["error"], answer

        # InvokeEndpoint(TargetModel="customer-a.tar.gz") comes as the model's invoke, the name its own
        status, answer = call(server, "POST", "/models/7f3a9c/invoke", JPEG, Content_Type="image/jpeg",
                              X_Amzn_SageMaker_Target_Model="customer-a.tar.gz")
        assert status == 200 and answer["predicted_label"] in CLASSES, answer
        status, answer = call(server, "POST", "/invocations", JPEG, Content_Type="image/jpeg")
        assert status == 404 and "multi-model endpoint" in answer["error"], answer
        status, answer = call(server, "POST", "/models/b41d02/invoke", JPEG, Content_Type="image/jpeg")
        assert status == 404 and "no model named 'b41d02'" in answer["error"], answer

        assert load(server, "b41d02", models / "b41d02" / "model")[0] == 200
        status, answer = call(server, "POST", "/models/b41d02/invoke", JPEG, Content_Type="image/jpeg")
        assert status == 200 and "predicted_labels" in answer, answer  # (the multi-label model's answer)
        assert call(server, "GET", "/models")[1]["models"] == [
            {"modelName": name, "modelUrl": str(models / name / "model")} for name in ("7f3a9c", "b41d02")]
        assert call(server, "GET", "/models/b41d02") == (
            200, {"modelName": "b41d02", "modelUrl": str(models / "b41d02" / "model")})

        assert call(server, "DELETE", "/models/7f3a9c")[0] == 200
        assert call(server, "GET", "/models/7f3a9c")[0] == 404
        assert call(server, "DELETE", "/models/7f3a9c")[0] == 404
        assert call(server, "POST", "/models/7f3a9c/invoke", JPEG, Content_Type="image/jpeg")[0] == 404
        assert [m["modelName"] for m in call(server, "GET", "/models")[1]["models"]] == ["b41d02"]
        assert call(server, "POST", "/models/b41d02/invoke", JPEG, Content_Type="image/jpeg")[0] == 200
        status, answer = call(server, "PUT", "/models/b41d02")
        assert status == 405, answer
        assert call(server, "GET", "/ping")[0] == 200
    finally:
        assert server.stop() == 0
    log = server.log.read_text()
    assert "serving the models SageMaker loads (a multi-model endpoint)" in log
    assert "loaded model '7f3a9c'" in log and "unloaded model '7f3a9c'" in log


def test_an_ordinary_endpoint_answers_none_of_the_multi_model_paths(server):
    status, answer = call(server, "GET", "/models")
    assert status == 404 and "POST /invocations" in answer["error"], answer


# -- the registry alone, with a stand-in for loading a model --

class Loaded:
    """What load() returns in place of a model: a predictor and a batcher, both stand-ins."""

    def __init__(self):
        self.closed = False

    def close(self, wait_s: float = 0.0) -> bool:
        self.closed = True
        return True


def registry(tmp_path, available=None, **options):
    from keras_pipe_serve.models import Models

    loads = []

    def load(folder):
        loads.append(folder)
        return object(), Loaded()

    return Models(load, multi=True, available=lambda: available, **options), loads


def model_folder(tmp_path, name: str, size: int = 1000):
    folder = tmp_path / name / "model"
    (folder / "1" / "variables").mkdir(parents=True)
    (folder / "1" / "saved_model.pb").write_bytes(b"\0" * 100)
    (folder / "1" / "variables" / "variables.data-00000-of-00001").write_bytes(b"\0" * size)
    return folder


def asked(name: str, url) -> bytes:
    return json.dumps({"model_name": name, "url": str(url)}).encode()


def test_a_model_that_would_not_fit_in_the_memory_left_is_refused_507_before_it_is_read(tmp_path):
    from keras_pipe_serve.models import LOAD_FACTOR, LOAD_MB

    big = model_folder(tmp_path, "big", size=100 << 20)
    need = (100 << 20) * LOAD_FACTOR + (LOAD_MB << 20)
    models, loads = registry(tmp_path, available=need - 1)
    with pytest.raises(Exception) as refused:
        models.load(asked("big", big))
    assert refused.value.status == 507 and "MB of memory are left" in str(refused.value), refused.value
    assert loads == [] and models.all() == []
    models, loads = registry(tmp_path, available=need + (1 << 20))
    assert models.load(asked("big", big)).name == "big" and loads == [big]


def test_a_model_that_runs_out_of_memory_while_loading_is_refused_507_and_can_be_asked_again(tmp_path):
    from keras_pipe_serve.models import Models

    folder, calls = model_folder(tmp_path, "m"), []

    def load(path):
        calls.append(path)
        if len(calls) == 1:
            raise MemoryError("no room")
        return object(), Loaded()

    models = Models(load, multi=True, available=lambda: None)
    with pytest.raises(Exception) as refused:
        models.load(asked("m", folder))
    assert refused.value.status == 507, refused.value
    assert models.load(asked("m", folder)).name == "m"  # (not left "loading": SageMaker asks again after unloading)


def test_load_requests_that_are_not_the_contracts_are_refused_400(tmp_path):
    models, _ = registry(tmp_path)
    for body in (b"{", b"[]", b'{"model_name": "a"}', b'{"model_name": "", "url": "/x"}', b'{"model_name": 1, "url": "/x"}'):
        with pytest.raises(Exception) as refused:
            models.load(body)
        assert refused.value.status == 400, body


def test_the_list_comes_a_page_at_a_time_with_a_token_for_the_next(tmp_path):
    from keras_pipe_serve.models import PAGE

    models, _ = registry(tmp_path)
    names = [f"m{i:04d}" for i in range(PAGE + 20)]
    for name in names:
        models.load(asked(name, model_folder(tmp_path, name, size=10)))
    first = models.page(None)
    assert [m["modelName"] for m in first["models"]] == names[:PAGE] and first["nextPageToken"] == str(PAGE)
    second = models.page(first["nextPageToken"])
    assert [m["modelName"] for m in second["models"]] == names[PAGE:] and "nextPageToken" not in second


def test_unloading_closes_the_models_batcher_and_a_new_worker_loads_again_what_was_loaded(tmp_path):
    record = tmp_path / "registry" / "models.json"
    record.parent.mkdir()
    models, _ = registry(tmp_path, registry=record)
    for name in ("a", "b"):
        models.load(asked(name, model_folder(tmp_path, name)))
    batcher = models.named("a").batcher
    models.unload("a")
    assert batcher.closed and [s.name for s in models.all()] == ["b"]
    again, loads = registry(tmp_path, registry=record)  # (the worker that replaces an ended one)
    again.reload_registered()
    assert [s.name for s in again.all()] == ["b"] and loads == [tmp_path / "b" / "model"]


def test_a_closed_batcher_ends_its_runners_once_its_queue_is_done():
    from keras_pipe_serve.batcher import Batcher

    batcher = Batcher(lambda images: ([[1.0]] * len(images), None), runners=2)
    job = batcher.submit([b"x"] * 3)
    batcher.close()
    assert job.done.wait(10) and job.probabilities == [[1.0]] * 3
    for thread in batcher._threads:
        thread.join(10)
        assert not thread.is_alive()


def test_a_model_that_cannot_be_served_is_a_400_saying_why_and_not_left_loading(tmp_path):
    from keras_pipe_serve.models import Models
    from keras_pipe_serve.predictor import ModelError

    folder = model_folder(tmp_path, "m")

    def load(path):
        raise ModelError(f"{path} has no serving_default signature")

    models = Models(load, multi=True, available=lambda: None)
    for _ in range(2):  # (and again: a failed load leaves nothing behind)
        with pytest.raises(Exception) as refused:
            models.load(asked("m", folder))
        assert refused.value.status == 400 and "has no serving_default signature" in str(refused.value)


def test_a_second_load_of_a_name_being_loaded_waits_for_it_and_answers_409(tmp_path):
    import threading

    from keras_pipe_serve.models import Models

    folder, started, release = model_folder(tmp_path, "m"), threading.Event(), threading.Event()

    def load(path):
        started.set()
        release.wait(10)
        return object(), Loaded()

    models = Models(load, multi=True, available=lambda: None)
    first = threading.Thread(target=models.load, args=(asked("m", folder),))
    first.start()
    assert started.wait(10)
    answers = []

    def second():
        try:
            models.load(asked("m", folder))
        except Exception as err:
            answers.append(err.status)

    waiting = threading.Thread(target=second)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive()  # (it waits for the first load, not a 409 before the model is in)
    release.set()
    first.join(10)
    waiting.join(10)
    assert answers == [409] and [s.name for s in models.all()] == ["m"]


def test_a_batcher_closed_takes_no_more_jobs():
    from keras_pipe_serve.batcher import Batcher, Closed

    batcher = Batcher(lambda images: ([[1.0]] * len(images), None))
    assert batcher.close(10)
    with pytest.raises(Closed):
        batcher.submit([b"x"])
