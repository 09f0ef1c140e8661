"""`serve`: what SageMaker runs to host the model (`docker run IMAGE serve`): gunicorn workers,
each with the SavedModel loaded in-process, answering on port 8080.

Why gunicorn, with uvicorn's protocol in its workers, and no nginx or TF Serving: the model call
is the whole cost of a request and releases the GIL, so the model called in-process, fed by a
batcher (keras_pipe_serve.batcher), is as fast as a model server would be (docs/speed.md, Figures
behind the code's choices: In-process model), without a second server to start, watch and proxy
to. gunicorn's master and uvicorn's HTTP/1.1 protocol (on h11, run in each worker by the
uvicorn-worker package) bring what a hand-written server would get wrong: HTTP/1.1 parsing,
keep-alive, worker supervision and restarts, graceful shutdown on SIGTERM. Each worker is an event
loop (keras_pipe_serve.connections says why this front, and what it adds to uvicorn's protocol):
every connection is read at once, at the cost of a socket, and everything is decided at the door,
as a request's headers come in (keras_pipe_serve.app): /ping answered there and then; admission,
with 503 and Retry-After before a body is read; each request's time counted from its arrival;
bodies that stall, idle connections and lingering closes costing a socket each, not a thread.
gunicorn's gthread worker holds a thread of a fixed pool per connection: a crowd of clients,
stalled uploads or a few lingering closes take them all, and /ping waits behind them
(docs/speed.md, Serving the model, has the figures of both). The master never imports TensorFlow,
and refuses to start on versions of gunicorn, uvicorn, uvicorn-worker or h11 other than those the
front was built for (connections.BUILT_FOR); each worker loads the model after the fork
(TensorFlow's thread pools do not survive one), warms it up, puts what it loaded out of the
garbage collector's reach (frozen, gunicorn's post_worker_init hook), and is replaced by the
master if it ends: a watchdog ends a worker whose model call is stuck.

How many workers: one per GPU, each on its own (CUDA_VISIBLE_DEVICES set per worker); on a host
without one, one, whose model is called from a thread per core, each call on one TensorFlow
thread, each thread taking the next batch from the one queue. Against a worker per core (python -m
bench.serve; docs/speed.md, Figures behind the code's choices: One worker): a lone request goes
through every core at once; two clients never land on the same worker while another idles; one
copy of the model is in memory; the cost, a little of the rate and a longer /ping tail under a
load of many large requests, where one process's Python parses every body
(SAGEMAKER_MODEL_SERVER_WORKERS=N shares the cores among N workers, for a host always saturated).
Never more workers than the container's memory limit
(cgroup v2 or v1) holds at WORKER_MB, RUNNER_MB for each thread calling the model beyond the
first, and twice the model's size. Each choice is logged.

Settings, from the environment as SageMaker and its SDKs set them:
  SAGEMAKER_BIND_TO_PORT          the port (inference pipelines set it; default 8080)
  SAGEMAKER_MODEL_SERVER_WORKERS  workers (default: as above)
  SAGEMAKER_MODEL_SERVER_TIMEOUT  seconds a request may take from its arrival (60; in a batch
                                  transform 600, the transform's own default invocation timeout,
                                  which SageMaker does not pass on): past it, it is answered 504 and
                                  its images not yet computed are dropped
  SAGEMAKER_MAX_PAYLOAD_IN_MB     the largest body taken (batch transform sets it; default 6 MB,
                                  real-time inference's own limit; 0, as a transform may say for
                                  bodies of any size, sent in chunks: as large as the worker's
                                  KERAS_PIPE_MAX_BODIES_MB); however many images it holds go
                                  through the model KERAS_PIPE_MAX_BATCH at a time
  SAGEMAKER_BATCH                 "true" in a batch transform (SageMaker sets it): the timeout's
                                  default is 600 s, and a model of the MXNet built-in's dialect
                                  answers JSON Lines by default, as that built-in did
                                  (keras_pipe_serve.payloads)
  SAGEMAKER_MULTI_MODEL           "true": a multi-model endpoint, no model until SageMaker loads one,
                                  by its contract (keras_pipe_serve.models), into one worker
  SM_MODEL_DIR                    the model (default: model/ under the job's base folder, where the
                                  training job writes it: /opt/ml/model, or under $SAGEMAKER_BASE_DIR)
and this server's own:
  KERAS_PIPE_MAX_BATCH            images per model call, across requests (32)
  KERAS_PIPE_BATCH_WAIT_MS        how long the model waits for more images once one request is
                                  queued (0: requests arriving while it is busy make the next batch)
  KERAS_PIPE_MAX_QUEUE            requests in flight per worker, from their headers to their
                                  answer; one more is answered 503 with Retry-After on its headers
                                  (512, or twice the cores where more: `keras-pipe transform`
                                  sends as many requests at once as the instance's cores). Within
                                  it, a request the model would not answer within half the
                                  timeout, at its recent pace behind the images ahead, is
                                  answered 503 too, Retry-After saying when it would
  KERAS_PIPE_MAX_BODIES_MB        the bodies a worker reads or holds at once, by their declared
                                  length; a body that would pass it is answered 503 likewise (four
                                  of the largest allowed, at least 256 MB, at most a quarter of the
                                  worker's share of the memory limit)
  KERAS_PIPE_STUCK_AFTER_S        the fewest seconds after which a model call may be called stuck
                                  (30): stuck is 20 times the model's slowest seconds per image so
                                  far, times the call's images, and at least this; the worker is
                                  then replaced (keras_pipe_serve.batcher)
  KERAS_PIPE_KEEPALIVE_S          seconds a connection may wait for its next request (75: above
                                  the 60 s idle timeout of AWS's load balancers), and at most for
                                  the rest of headers it began (15)
  KERAS_PIPE_MODEL_NICENESS       how much lower the model's threads' scheduling priority is than the
                                  request threads', so that a ping never waits for a core (5; 0:
                                  the same)
  KERAS_PIPE_RUNTIME              what runs the model: "tensorflow", the SavedModel (the default), or
                                  "onnx", its ONNX export, exports/model.onnx beside it
                                  (export_formats=onnx, or `keras-pipe export`), in ONNX Runtime,
                                  the images decoded and prepared by the SavedModel's own code
                                  (keras_pipe_serve.export_predictor): the same answers, faster on
                                  small batches on a CPU (docs/speed.md, ONNX Runtime)
and TensorFlow's own, where set: TF_NUM_INTRAOP_THREADS (threads within an op), TF_NUM_INTEROP_THREADS
(ops at once, as a batch's images decode).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from keras_pipe_serve.app import ACCESS_LOG
from keras_pipe_serve.batcher import STUCK_FLOOR_S
from keras_pipe_serve.predictor import ModelError, saved_model_dir
from keras_pipe_serve.sizing import Plan, cpus, gpus, memory_limit, model_bytes, plan
from keras_pipe_train.settings import contract  # (no TensorFlow: the master never loads it)
from keras_pipe_train.settings.paused_collector import pause_collector_while_tensorflow_imports
from keras_pipe_train.settings.unneeded_imports import skip_unneeded_imports

log = logging.getLogger("keras_pipe_serve")
T = TypeVar("T")

DEFAULT_PAYLOAD_MB = 6
# SageMaker sends SIGKILL 30 s after SIGTERM: requests in flight get most of that to finish
GRACEFUL_S = 25
TENSORFLOW, ONNX = "tensorflow", "onnx"
RUNTIMES = (TENSORFLOW, ONNX)  # (KERAS_PIPE_RUNTIME's)
# a batch transform waits for an answer up to its invocation timeout, 600 s unless the job says
# otherwise (ModelClientConfig.InvocationsTimeoutInSeconds), and passes the container no setting of it
BATCH_TIMEOUT_S = 600
# the bodies a worker reads or holds at once, unless KERAS_PIPE_MAX_BODIES_MB says: four of the largest
# allowed, at least this many MB, and never more than a quarter of the worker's share of the memory limit
BODIES_MB = 256
# seconds a connection may wait for its next request: above the 60 s idle timeout of AWS's load
# balancers, which close theirs first (KERAS_PIPE_KEEPALIVE_S)
KEEPALIVE_S = 75
# requests in flight per worker (KERAS_PIPE_MAX_QUEUE): a bound on what a worker holds, high enough
# that a crowd the model can answer in time waits its turn; who is answered in time is decided by
# the requests' deadlines (keras_pipe_serve.app: admission by deadline)
MAX_QUEUE = 512
# how far below the request threads the model's threads run (KERAS_PIPE_MODEL_NICENESS; 0: level)
MODEL_NICENESS = 5


def _positive(name: str, default: float, kind=int, zero: bool = False):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise SystemExit(f"serve: {name}={raw[:40]!r} is not a {'whole ' if kind is int else ''}number") from None
    if not (value >= 0 if zero else value > 0):
        raise SystemExit(f"serve: {name} must be {'0 or more' if zero else 'above 0'}, got {raw[:40]!r}")
    return value


def settings(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR") or contract.paths().model)
    parser.add_argument("--port", type=int, default=_positive("SAGEMAKER_BIND_TO_PORT", 8080))
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--workers", type=int, default=_positive("SAGEMAKER_MODEL_SERVER_WORKERS", None))
    args = parser.parse_args(argv)
    if (args.workers is not None and args.workers < 1) or not 0 < args.port < 65536:
        parser.error("--workers must be at least 1 and --port in 1..65535")
    batch = os.environ.get("SAGEMAKER_BATCH", "").strip().lower() == "true"
    multi = os.environ.get("SAGEMAKER_MULTI_MODEL", "").strip().lower() == "true"
    return dict(model_dir=Path(args.model_dir), bind=f"{args.host}:{args.port}", workers=args.workers,
                timeout=_positive("SAGEMAKER_MODEL_SERVER_TIMEOUT", BATCH_TIMEOUT_S if batch else 60, float),
                max_body=int(_positive("SAGEMAKER_MAX_PAYLOAD_IN_MB", DEFAULT_PAYLOAD_MB, float, zero=True) * 2**20),
                batch=batch, multi=multi,
                bodies=_positive("KERAS_PIPE_MAX_BODIES_MB", None, float),
                stuck_floor=_positive("KERAS_PIPE_STUCK_AFTER_S", STUCK_FLOOR_S, float),
                max_batch=_positive("KERAS_PIPE_MAX_BATCH", 32),
                max_wait=_positive("KERAS_PIPE_BATCH_WAIT_MS", 0, float, zero=True) / 1000,
                max_queue=_positive("KERAS_PIPE_MAX_QUEUE", max(MAX_QUEUE, 2 * cpus())),
                intra=_positive("TF_NUM_INTRAOP_THREADS", None),
                inter=_positive("TF_NUM_INTEROP_THREADS", None),
                niceness=_positive("KERAS_PIPE_MODEL_NICENESS", MODEL_NICENESS, zero=True),
                keepalive=_positive("KERAS_PIPE_KEEPALIVE_S", KEEPALIVE_S),
                runtime=_runtime())


def _runtime() -> str:
    raw = os.environ.get("KERAS_PIPE_RUNTIME", "").strip().lower() or TENSORFLOW
    if raw not in RUNTIMES:
        raise SystemExit(f"serve: KERAS_PIPE_RUNTIME must be one of {', '.join(RUNTIMES)}, got "
                         f"{os.environ['KERAS_PIPE_RUNTIME'][:40]!r}")
    return raw


def chosen_plan(config: dict, gpu_count: int) -> Plan:
    """The workers and threads for `config`'s model (or a multi-model endpoint's), once its files are
    found: a missing model, or its missing ONNX export, said once, before any worker starts."""
    if config["runtime"] == ONNX and gpu_count:
        log.warning("KERAS_PIPE_RUNTIME=onnx on a host with %d GPU(s): the image's ONNX Runtime is its CPU build, and "
                    "runs the model on the CPU; the SavedModel (KERAS_PIPE_RUNTIME=tensorflow) runs on the GPU",
                    gpu_count)
    if config["multi"]:
        return multi_model_plan(config, gpu_count)
    try:
        served = saved_model_dir(config["model_dir"])
        if config["runtime"] == ONNX:
            from keras_pipe_serve.export_predictor import onnx_export_of

            onnx_export_of(config["model_dir"])
    except ModelError as err:
        raise SystemExit(f"serve: {err}") from None
    return plan(cpus(), gpu_count, config["memory"], model_bytes(served), config["workers"], config["intra"],
                config["inter"])


def multi_model_plan(config: dict, gpu_count: int) -> Plan:
    """A multi-model endpoint's: one worker, which holds every model loaded (keras_pipe_serve.models),
    with the registry of those loaded, for a worker that replaces it, in a folder of the server's."""
    chosen = plan(cpus(), gpu_count, config["memory"], 0, 1, config["intra"], config["inter"])
    if config["workers"] not in (None, 1):
        log.warning("SAGEMAKER_MODEL_SERVER_WORKERS=%d: a multi-model endpoint is served by one worker, which holds "
                    "the models SageMaker loads", config["workers"])
    config["registry"] = Path(tempfile.mkdtemp(prefix="keras-pipe-models-")) / "models.json"
    why = tuple(w for w in chosen.why if not w.startswith("SAGEMAKER_MODEL_SERVER_WORKERS"))
    return dataclasses.replace(chosen, why=(*why, "a multi-model endpoint: one worker holds the models"))


def made_yielding(make: Callable[[], T], niceness: int) -> T:
    """make() called in a thread of its own whose niceness is raised by `niceness` (on Linux, a
    thread's own; the threads it starts inherit it): TensorFlow's thread pools, which the model's
    first op starts, and the batcher's threads are then the ones that wait for a core, not the
    request threads. Without it, with the model's threads on every core, a ping's thread waits
    for a turn among them. Raising one's niceness needs no privilege; where it cannot be set,
    nothing changes."""
    made: list = []

    def run():
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + niceness)
        except (OSError, AttributeError):  # (not Linux, or refused: the model runs at the server's priority)
            pass
        try:
            made.append(make())
        except BaseException as err:  # (raised again in the caller's thread, whatever it is)
            made.append(err)

    maker = threading.Thread(target=run, name="model-loader")
    maker.start()
    maker.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


def gpu_slot(live: list[int | None], count: int) -> int:
    """The GPU for a new worker: the one fewest live workers use (a restarted worker takes its
    predecessor's)."""
    used = [sum(1 for slot in live if slot == gpu) for gpu in range(count)]
    return used.index(min(used))


def frozen(worker) -> None:
    """gunicorn's post_worker_init hook, in each worker once its app (the model) is loaded: what is
    loaded put out of the collector's reach. The model's millions of Python objects (TensorFlow's,
    the graph's) would otherwise be walked by each full collection, a pause of the loop, and of
    /ping, each time a crowd's garbage sets one off (docs/speed.md, Figures behind the code's
    choices: gc.freeze())."""
    gc.collect()
    gc.freeze()


def gunicorn_settings(config: dict, chosen: Plan, gpu_count: int) -> dict:
    settings_ = {
        "bind": [config["bind"]], "workers": chosen.workers,
        # (uvicorn's h11 protocol, run by uvicorn-worker, with what it leaves out added: connections.py says why)
        "worker_class": "keras_pipe_serve.connections.Worker",
        # (the heartbeat: uvicorn's loop tells the master every half of it unless the loop is
        # blocked, which nothing in it is for long; a request's own time, and a stuck model, are the
        # app's to end)
        "timeout": 60,
        "graceful_timeout": GRACEFUL_S,
        "keepalive": config["keepalive"],  # (uvicorn's timeout_keep_alive, through uvicorn-worker)
        "preload_app": False,  # the model is loaded in each worker, after the fork
        # (no access log of gunicorn's or uvicorn's: the app writes its own line to stdout, as
        # CloudWatch collects it; keras_pipe_serve.app.ACCESS)
        "errorlog": "-", "proc_name": "keras-pipe-serve",
        "control_socket_disable": True,  # (gunicorn 26's admin socket in $HOME: not needed)
        "post_worker_init": frozen,
    }
    if gpu_count > 1:
        def pre_fork(server, worker):  # (in the master: which GPU the new worker gets)
            worker.gpu = gpu_slot([getattr(w, "gpu", None) for w in server.WORKERS.values()], gpu_count)

        def post_fork(server, worker):  # (in the worker, before TensorFlow is imported)
            os.environ["CUDA_VISIBLE_DEVICES"] = str(worker.gpu)
            log.info("worker %d serves on GPU %d", os.getpid(), worker.gpu)

        settings_.update(pre_fork=pre_fork, post_fork=post_fork)
    return settings_


def body_budget(max_body: int, memory: int | None, workers: int, asked_mb: float | None = None) -> int:
    """The bytes of bodies a worker reads or holds at once (App's door): KERAS_PIPE_MAX_BODIES_MB, else
    four of the largest allowed and at least BODIES_MB, at most a quarter of the worker's share of
    the memory limit; never less than one of the largest."""
    if asked_mb:
        return int(asked_mb * 2**20)
    budget = max(4 * max_body, BODIES_MB * 2**20)
    if memory is not None:
        budget = min(budget, memory // workers // 4)
    return max(budget, max_body)


def loaded_app(config: dict, chosen: Plan):
    """What a worker serves: the model loaded and warmed up, its batcher's threads started (both
    below the request threads' priority: made_yielding), the ASGI app on them. On a multi-model
    endpoint, no model until SageMaker loads one (keras_pipe_serve.models), but those loaded
    before this worker started."""
    from keras_pipe_serve.app import App
    from keras_pipe_serve.batcher import Batcher
    from keras_pipe_serve.models import Models
    from keras_pipe_serve.predictor import Predictor

    # a multi-model endpoint's models share the runners' slots: no more calls at once than one model's
    calls = threading.Semaphore(chosen.runners) if config["multi"] else None

    def model(folder: Path):
        if config["runtime"] == ONNX:
            from keras_pipe_serve.export_predictor import ExportPredictor, onnx_export_of

            predictor = ExportPredictor(onnx_export_of(folder), threads=chosen.intra, inter_threads=chosen.inter)
        else:
            predictor = Predictor(folder, threads=chosen.intra, inter_threads=chosen.inter)
        warm_up = predictor.warm_up()  # (before the batcher's threads start: a model that fails here holds none)
        batcher = Batcher(predictor.run, config["max_batch"], config["max_wait"], stuck_floor=config["stuck_floor"],
                          runners=chosen.runners, calls=calls)
        batcher.timed(1, warm_up, recent=False)
        return predictor, batcher

    def load(folder: Path):
        return made_yielding(lambda: model(folder), config["niceness"])

    models = Models(load, config["multi"], config.get("registry"))
    if config["multi"]:
        models.reload_registered()
    else:
        models.serve_default(*load(config["model_dir"]), str(config["model_dir"]))
    budget = body_budget(config["max_body"], config["memory"], chosen.workers, config["bodies"])
    # (SAGEMAKER_MAX_PAYLOAD_IN_MB=0, a transform's "arbitrarily large" bodies: the worker's budget bounds each)
    return App(models, config["max_body"] or budget, config["batch"], config["timeout"], config["max_queue"], budget)


def run(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from keras_pipe_serve.connections import wrong_versions

    wrong = wrong_versions()  # (the worker's front leans on these versions: connections.py)
    if wrong:
        raise SystemExit("serve: " + "; ".join(wrong) + " (requirements/base.txt pins them)")
    access = logging.getLogger(ACCESS_LOG)  # (the app's access lines: stdout, one a line, as they are)
    access.addHandler(logging.StreamHandler(sys.stdout))
    access.propagate = False
    config = settings(sys.argv[1:] if argv is None else argv)
    gpu_count = gpus()
    config["memory"] = memory_limit()  # (read once, in the master: the workers' body budget weighs it too)
    chosen = chosen_plan(config, gpu_count)

    from gunicorn.app.base import BaseApplication

    # (in the master: its workers, forked from it, import TensorFlow)
    skip_unneeded_imports()
    pause_collector_while_tensorflow_imports()

    class Server(BaseApplication):
        def load_config(self):
            for name, value in gunicorn_settings(config, chosen, gpu_count).items():
                self.cfg.set(name, value)

        def load(self):
            return loaded_app(config, chosen)

    log.info("serving %s on %s: %d worker(s) (%s), each calling its model from %d thread(s), TensorFlow on %d "
             "thread(s) within an op and %d ops at once; up to %d images a model call, %g ms wait for more, %d "
             "requests in flight per worker; requests end after %g s; bodies up to %s bytes%s",
             "the models SageMaker loads (a multi-model endpoint)" if config["multi"] else config["model_dir"],
             config["bind"], chosen.workers, "; ".join(chosen.why), chosen.runners, chosen.intra, chosen.inter,
             config["max_batch"], config["max_wait"] * 1000, config["max_queue"], config["timeout"],
             config["max_body"] or "the worker's body budget's (SAGEMAKER_MAX_PAYLOAD_IN_MB=0)",
             " (batch transform)" if config["batch"] else "")
    Server().run()
