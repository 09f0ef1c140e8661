"""SageMaker's runtime in front of a container, as far as InvokeEndpoint goes, on 127.0.0.1: what
boto3's sagemaker-runtime client talks to in tests that ask an endpoint (AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME).
Neither moto nor the SDKs' local modes route a multi-model endpoint's TargetModel, so this does,
as AWS's pages say SageMaker does:

- POST /endpoints/{name}/invocations is the container's POST /invocations, its Content-Type,
  Accept and X-Amzn-SageMaker-Custom-Attributes passed on;
- with X-Amzn-SageMaker-Target-Model, on a multi-model endpoint: the model's model.tar.gz, from
  the endpoint's prefix (a folder here, S3 there), is unpacked under models/<name>/model on its
  first call and loaded (POST /models), then asked at POST /models/<name>/invoke with the header
  passed on; a key under the prefix that holds nothing is a ValidationError;
- a container's answer other than 200 is a ModelError (HTTP 424: OriginalStatusCode,
  OriginalMessage, as the API reference's InvokeEndpoint says); an endpoint it does not know, a
  multi-model endpoint asked without a target model, or another asked with one, a ValidationError
  (400), in the words SageMaker's have been seen to use.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote


class Runtime:
    def __init__(self, endpoints: dict[str, str], prefixes: dict[str, Path] | None = None,
                 models: Path | None = None):
        """`endpoints`: each endpoint's container (its URL); `prefixes`: a multi-model endpoint's
        folder of model.tar.gz, `models` where they are unpacked (the container's /opt/ml/models)."""
        self.endpoints, self.prefixes, self.models = endpoints, prefixes or {}, models
        self.loaded: set[tuple[str, str]] = set()
        self.invoked: list[dict] = []  # (each call's endpoint, target model and headers passed on)
        self._lock = threading.Lock()
        runtime = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                runtime.answer(self)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length", 0)))
        parts = request.path.split("/")
        if len(parts) != 4 or parts[1] != "endpoints" or parts[3] != "invocations":
            return _send(request, 404, {"message": "no such operation"}, "UnknownOperationException")
        endpoint = unquote(parts[2])
        if endpoint not in self.endpoints:
            return _send(request, 400, {"message": f"Endpoint {endpoint} of account 123456789012 not found."},
                         "ValidationError")
        target = request.headers.get("X-Amzn-SageMaker-Target-Model")
        passed = {name: request.headers[name] for name in ("Content-Type", "Accept", "X-Amzn-SageMaker-Custom-Attributes")
                  if request.headers.get(name)}
        self.invoked.append({"endpoint": endpoint, "target": target, **passed})
        container = self.endpoints[endpoint]
        path = "/invocations"
        if target is None and endpoint in self.prefixes:
            return _send(request, 400, {"message": "Request 0f6ad3ef is missing a target model header"},
                         "ValidationError")
        if target is not None:
            if endpoint not in self.prefixes:
                return _send(request, 400, {"message": f"Endpoint {endpoint} is not a multi-model endpoint and does "
                                                       "not support target model header."}, "ValidationError")
            name = hashlib.sha256(target.encode()).hexdigest()[:16]  # (SageMaker's own names look like this)
            problem = self._loaded(endpoint, target, name, container)
            if problem:  # (AWS documents no form for a model the container will not load: a ValidationError here)
                return _send(request, 400, {"message": problem}, "ValidationError")
            path, passed["X-Amzn-SageMaker-Target-Model"] = f"/models/{name}/invoke", target
        status, answer = _post(container + path, body, passed)
        if status != 200:
            kind, source = "client" if status < 500 else "server", "model" if target is not None else "primary"
            return _send(request, 424, {
                "Message": f"Received {kind} error ({status}) from {source} with message \"{answer.decode()}\".",
                "OriginalStatusCode": status, "OriginalMessage": answer.decode(),
                "LogStreamArn": f"arn:aws:logs:us-east-1:123456789012:log-group:/aws/sagemaker/Endpoints/{endpoint}"},
                "ModelError")
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(answer)))
        request.end_headers()
        request.wfile.write(answer)

    def _loaded(self, endpoint: str, target: str, name: str, container: str) -> str | None:
        """The target model unpacked and loaded, once; or why it cannot be."""
        with self._lock:
            if (endpoint, target) in self.loaded:
                return None
            archive = self.prefixes[endpoint] / target
            if not archive.is_file():
                return f"Failed to download model data(bucket: my-bucket, key: models/{target})."
            folder = self.models / name / "model"
            folder.mkdir(parents=True)
            with tarfile.open(archive) as tar:
                tar.extractall(folder, filter="data")
            status, answer = _post(container + "/models", json.dumps({"model_name": name, "url": str(folder)}).encode(),
                                   {"Content-Type": "application/json"})
            if status != 200:
                return f"the container could not load {target}: {status} {answer.decode()}"
            self.loaded.add((endpoint, target))
            return None


def _post(url: str, body: bytes, headers: dict) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=120) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def _send(request: BaseHTTPRequestHandler, status: int, body: dict, error_type: str) -> None:
    data = json.dumps(body).encode()
    request.send_response(status)
    request.send_header("Content-Type", "application/json")
    request.send_header("X-Amzn-ErrorType", f"{error_type}:http://internal.amazon.com/coral/com.amazon.sagemaker/")
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)
