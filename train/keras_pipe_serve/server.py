"""`serve`: what SageMaker runs to host the model (`docker run IMAGE serve`): gunicorn workers,
each with the SavedModel loaded in-process, answering on port 8080.

Why gunicorn, and no nginx or TF Serving: the model call is the whole cost of a request and it
releases the GIL, so a process per core with the model in it is as fast as a model server would
be, without a second server to start, watch and proxy to (AWS's own XGBoost container serves the
same way). gunicorn brings what a hand-written loop would get wrong: HTTP/1.1 parsing, keep-alive,
worker supervision and restarts, graceful shutdown on SIGTERM. The master never imports
TensorFlow; each worker loads the model after the fork (TensorFlow's thread pools do not survive
one).

Settings, from the environment as SageMaker and its SDKs set them:
  SAGEMAKER_BIND_TO_PORT          the port (inference pipelines set it; default 8080)
  SAGEMAKER_MODEL_SERVER_WORKERS  workers (default: the CPU count; 1 on a GPU host, whose one GPU
                                  they would share)
  SAGEMAKER_MODEL_SERVER_TIMEOUT  seconds a request may take before its worker is restarted (60)
  SAGEMAKER_MAX_PAYLOAD_IN_MB     the largest body taken (batch transform sets it; default 6 MB,
                                  real-time inference's own limit)
  SAGEMAKER_BATCH                 "true" in a batch transform (SageMaker sets it): a model of the
                                  MXNet built-in's dialect then answers JSON Lines by default, as
                                  that built-in did (keras_pipe_serve.payloads)
  SM_MODEL_DIR                    the model (default: model/ under the job's base folder, where the
                                  training job writes it: /opt/ml/model, or under $SAGEMAKER_BASE_DIR)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from keras_pipe_serve.predictor import ModelError, saved_model_dir
from keras_pipe_train import contract  # (no TensorFlow: the master never loads it)

log = logging.getLogger("keras_pipe_serve")

DEFAULT_PAYLOAD_MB = 6
# SageMaker sends SIGKILL 30 s after SIGTERM: requests in flight get most of that to finish
GRACEFUL_S = 25


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        return os.cpu_count() or 1


def _has_gpu() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


def _positive(name: str, default: float, kind=int):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise SystemExit(f"serve: {name}={raw[:40]!r} is not a {'whole ' if kind is int else ''}number") from None
    if not value > 0:
        raise SystemExit(f"serve: {name} must be above 0, got {raw[:40]!r}")
    return value


def settings(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR") or contract.paths().model)
    parser.add_argument("--port", type=int, default=_positive("SAGEMAKER_BIND_TO_PORT", 8080))
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--workers", type=int,
                        default=_positive("SAGEMAKER_MODEL_SERVER_WORKERS", 1 if _has_gpu() else _cpus()))
    args = parser.parse_args(argv)
    if args.workers < 1 or not 0 < args.port < 65536:
        parser.error("--workers must be at least 1 and --port in 1..65535")
    return dict(model_dir=Path(args.model_dir), bind=f"{args.host}:{args.port}", workers=args.workers,
                timeout=_positive("SAGEMAKER_MODEL_SERVER_TIMEOUT", 60),
                max_body=int(_positive("SAGEMAKER_MAX_PAYLOAD_IN_MB", DEFAULT_PAYLOAD_MB, float) * 1024 * 1024),
                batch=os.environ.get("SAGEMAKER_BATCH", "").strip().lower() == "true")


def run(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    config = settings(sys.argv[1:] if argv is None else argv)
    try:
        saved_model_dir(config["model_dir"])  # a missing model said once, before any worker starts
    except ModelError as err:
        raise SystemExit(f"serve: {err}") from None
    # each worker's TensorFlow gets its share of the cores (at least one)
    threads = max(1, _cpus() // config["workers"])

    from gunicorn.app.base import BaseApplication

    class Server(BaseApplication):
        def load_config(self):
            self.cfg.set("bind", [config["bind"]])
            self.cfg.set("workers", config["workers"])
            self.cfg.set("worker_class", "gthread")  # keep-alive, and the main thread stays free to heartbeat
            self.cfg.set("threads", 1)
            self.cfg.set("timeout", config["timeout"])
            self.cfg.set("graceful_timeout", GRACEFUL_S)
            self.cfg.set("keepalive", 75)  # above the 60 s idle timeout of AWS's load balancers
            self.cfg.set("preload_app", False)  # the model is loaded in each worker, after the fork
            self.cfg.set("accesslog", None)
            self.cfg.set("errorlog", "-")
            self.cfg.set("proc_name", "keras-pipe-serve")
            self.cfg.set("control_socket_disable", True)  # (gunicorn 26's admin socket in $HOME: not needed)

        def load(self):
            from keras_pipe_serve.app import App
            from keras_pipe_serve.predictor import Predictor

            return App(Predictor(config["model_dir"], threads=threads), config["max_body"], config["batch"])

    log.info("serving %s on %s: %d workers, %d TensorFlow threads each, bodies up to %d bytes%s", config["model_dir"],
             config["bind"], config["workers"], threads, config["max_body"],
             " (batch transform)" if config["batch"] else "")
    Server().run()
