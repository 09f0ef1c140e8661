"""The models a worker serves: the endpoint's one model, or, on a multi-model endpoint (MME), those
SageMaker has asked it to load.

A multi-model endpoint (CreateModel with Mode MultiModel; `keras-pipe-serve` with
SAGEMAKER_MULTI_MODEL=true) downloads each model.tar.gz the first time a request names it
(InvokeEndpoint's TargetModel), unpacks it under /opt/ml/models/<name>/model, and drives the
container through the "Custom Containers Contract for Multi-Model Endpoints":

    POST   /models                 {"model_name": NAME, "url": FOLDER}: load it; 409 if NAME is
                                   loaded already; 507 when memory is short (SageMaker then unloads
                                   the models used least and asks again)
    GET    /models                 {"models": [{"modelName": ..., "modelUrl": ...}, ...]}, a page at
                                   a time (?next_page_token=, nextPageToken while more are left)
    GET    /models/NAME            {"modelName": ..., "modelUrl": ...}; 404 if not loaded
    DELETE /models/NAME            unload it; 404 if not loaded
    POST   /models/NAME/invoke     what POST /invocations answers, from that model

NAME is opaque (SageMaker's is a hash): not the TargetModel the caller gave, which comes as the
X-Amzn-SageMaker-Target-Model header (logged with each load and unload, never used to choose).
Each model is served as the endpoint's one model is: its own batcher, the door's admission by its
own pace.

Memory: a load is refused with 507, before anything is read, when the model's SavedModel's size times
LOAD_FACTOR, plus LOAD_MB, exceeds the memory left (the container's limit less what it uses but
for the page cache it can drop, cgroup v2 or v1, else the host's MemAvailable); and when
TensorFlow says it ran out while loading (on a CPU, the kernel's OOM killer may end the worker
first). Another model that cannot be loaded is a 400 saying why. An unload returns once the model's
calls under way have ended and its memory is let go (a full garbage collection, and glibc's free
memory handed back). The models' calls at once share the worker's runner slots (Batcher's `calls`):
no more calls at once, and no more memory for them, than one model would have.

One worker holds the models: SageMaker loads each model once per instance, through whichever
connection, so every worker would have to load every model it is asked to serve. The models loaded
are written down (REGISTRY), so that a worker started again (after a stuck model call) loads them
again before it answers.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from keras_pipe_serve.batcher import Batcher
from keras_pipe_serve.payloads import BadRequest, Refusal
from keras_pipe_serve.predictor import ModelError, Predictor, saved_model_dir
from keras_pipe_serve.sizing import memory_available, model_bytes
from keras_pipe_train.report.text import printable

log = logging.getLogger("keras_pipe_serve")

# a loaded model's memory, as a multiple of its SavedModel's size (its variables held once by
# TensorFlow, its graph and the functions traced from it), and a floor for the smallest: bench.serve's
# MobileNetV3-Small took about 57 MB a model, its SavedModel 8.7 MB: 90 MB asked (docs/speed.md)
LOAD_FACTOR = 3
LOAD_MB = 64
# models listed in one page of GET /models
PAGE = 100
# the largest body of a load request (a name and a path)
LOAD_BODY_BYTES = 64 << 10
# seconds an unload waits for the model's calls under way to end before it lets the model go anyway
UNLOAD_WAIT_S = 60.0


@dataclass
class Served:
    """One model in service: its name ("" for the endpoint's own), the folder it was loaded from,
    its predictor and its batcher."""
    name: str
    url: str
    predictor: Predictor
    batcher: Batcher

    def described(self) -> dict:
        return {"modelName": self.name, "modelUrl": self.url}


class InsufficientStorage(Refusal):
    """507: SageMaker's signal to unload the models used least, then load again."""

    def __init__(self, message: str):
        super().__init__(507, message)


class Models:
    """The models of a worker, by name. `load(folder)` loads one (a Predictor and its Batcher,
    warmed up: keras_pipe_serve.server); `registry`: where the models loaded are written down
    (None: nowhere)."""

    def __init__(self, load: Callable[[Path], tuple[Predictor, Batcher]], multi: bool,
                 registry: Path | None = None, available: Callable[[], int | None] = memory_available):
        self.multi = multi
        self._load, self._registry, self._available = load, registry, available
        self._served: dict[str, Served] = {}
        self._loading: dict[str, threading.Event] = {}  # name -> set once its load has ended, either way
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # (the registry: one writer at a time, in the order of the changes)

    # -- the endpoint's own model --
    def serve_default(self, predictor: Predictor, batcher: Batcher, url: str) -> None:
        self._served[""] = Served("", url, predictor, batcher)

    def default(self) -> Served:
        """The model POST /invocations answers from."""
        served = self._served.get("")
        if served is None:
            raise BadRequest(404, "this is a multi-model endpoint: POST /models/<name>/invoke, with the name of a "
                                  "model loaded by POST /models")
        return served

    # -- the multi-model contract --
    def named(self, name: str) -> Served:
        served = self._served.get(name) if name else None
        if served is None:
            raise BadRequest(404, f"no model named {name[:200]!r} is loaded")
        return served

    def all(self) -> list[Served]:
        return list(self._served.values())

    def page(self, token: str | None) -> dict:
        """GET /models: a page of the models loaded, from `token` (the last page's nextPageToken)."""
        with self._lock:
            names = sorted(name for name in self._served if name)
        start = int(token) if token and token.isdigit() else 0
        listed = {"models": [served.described() for name in names[start:start + PAGE]
                             if (served := self._served.get(name))]}
        if start + PAGE < len(names):
            listed["nextPageToken"] = str(start + PAGE)
        return listed

    def load(self, body: bytes, target: str | None = None, record: bool = True) -> Served:
        """POST /models (in a thread of its own: loading takes seconds): the model named in `body`
        loaded and in service. A second request for a name being loaded waits for that load and
        answers as it does (409 once it is in: SageMaker then invokes it). `target`: the
        X-Amzn-SageMaker-Target-Model header, for the log; `record`: written in the registry."""
        name, url = _load_request(body)
        with self._lock:
            if name in self._served:
                raise BadRequest(409, f"a model named {name[:200]!r} is loaded already")
            loading = self._loading.get(name)
            if loading is None:
                self._loading[name] = threading.Event()
        if loading is not None:
            loading.wait()
            if name in self._served:
                raise BadRequest(409, f"a model named {name[:200]!r} is loaded already")
            raise BadRequest(404, f"model {name[:200]!r} was being loaded by another request, which failed")
        try:
            served = Served(name, url, *self._loaded(name, url, self._checked(name, url)))
            with self._lock:
                self._served[name] = served
            if record:
                self._write_registry()
            log.info("loaded model %r from %s (TargetModel %s)", name, url, printable(target or "not given", limit=200))
            return served
        finally:
            with self._lock:
                self._loading.pop(name).set()

    def _loaded(self, name: str, url: str, folder: Path) -> tuple[Predictor, Batcher]:
        """self._load's, its failures said: 507 where TensorFlow ran out of memory, else 400 with why."""
        try:
            return self._load(Path(url))
        except MemoryError as err:
            raise InsufficientStorage(f"model {name[:200]!r} ran out of memory while loading: {err}") from None
        except ModelError as err:  # (the predictor's: TensorFlow's own error is its cause)
            cause = f"{type(err.__cause__).__name__}: {err.__cause__}" if err.__cause__ else ""
            if "ResourceExhausted" in cause or "OOM" in cause[:2000]:
                raise InsufficientStorage(f"model {name[:200]!r} ran out of memory while loading: {err}") from None
            raise BadRequest(400, f"model {name[:200]!r} in {folder} cannot be served: {err}") from None

    def _checked(self, name: str, url: str) -> Path:
        """The SavedModel folder under `url`; 404 where there is none, 507 where it would not fit."""
        try:
            folder = saved_model_dir(Path(url))
        except (ModelError, OSError) as err:
            raise BadRequest(404, f"model {name[:200]!r} cannot be loaded from {url[:300]!r}: {err}") from None
        need = model_bytes(folder) * LOAD_FACTOR + (LOAD_MB << 20)  # (the SavedModel: what TensorFlow loads)
        left = self._available()
        if left is not None and need > left:
            raise InsufficientStorage(f"model {name[:200]!r} needs about {need >> 20} MB ({LOAD_FACTOR} times its "
                                      f"files, and {LOAD_MB} MB); {left >> 20} MB of memory are left")
        return folder

    def unload(self, name: str, target: str | None = None) -> None:
        """DELETE /models/NAME (in a thread of its own): out of service at once (a request for it
        that had not reached its queue is answered 404), its calls under way let finish (up to
        UNLOAD_WAIT_S), then its memory let go before the answer, as the contract asks."""
        with self._lock:
            served = self.named(name)
            del self._served[name]
        self._write_registry()
        if not served.batcher.close(UNLOAD_WAIT_S):
            log.warning("model %r: its calls were still running %g s after it was unloaded", name, UNLOAD_WAIT_S)
        del served
        _let_go()
        log.info("unloaded model %r (TargetModel %s)", name, printable(target or "not given", limit=200))

    # -- a worker started again --
    def reload_registered(self) -> None:
        """The models the registry lists, loaded again (a worker that replaces one ended); the
        registry is left as it is until SageMaker changes what is loaded (a worker ended while
        reloading leaves it whole for the next)."""
        if not (self._registry and self._registry.is_file()):
            return
        for name, url in json.loads(self._registry.read_text()).items():
            try:
                self.load(json.dumps({"model_name": name, "url": url}).encode(), record=False)
            except Exception as err:  # (one that no longer loads is left out; SageMaker loads it again on demand)
                log.warning("model %r, loaded before this worker started, was not loaded again: %s", name, err)

    def _write_registry(self) -> None:
        if not self._registry:
            return
        with self._writing:
            with self._lock:
                listed = {name: served.url for name, served in self._served.items() if name}
            handle, partial = tempfile.mkstemp(dir=self._registry.parent, prefix=self._registry.name)
            with os.fdopen(handle, "w") as out:
                json.dump(listed, out)
            os.replace(partial, self._registry)


def _let_go() -> None:
    """The memory of a model no longer referred to, given back: a full collection, the worker's
    frozen objects included (server.frozen freezes what is loaded at start, a model reloaded
    then among them), and glibc's free memory returned to the system (malloc_trim)."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # (not glibc)
        pass


def _load_request(body: bytes) -> tuple[str, str]:
    """(model_name, url) of a load request's body, or a 400 saying what is wrong with it."""
    try:
        asked = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadRequest(400, f"the body of POST /models is not JSON: {err}") from None
    if not isinstance(asked, dict) or not all(isinstance(asked.get(key), str) and asked[key]
                                              for key in ("model_name", "url")):
        raise BadRequest(400, 'POST /models takes {"model_name": "...", "url": "..."}, both non-empty strings')
    return asked["model_name"], asked["url"]
