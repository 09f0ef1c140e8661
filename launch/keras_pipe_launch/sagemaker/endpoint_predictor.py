"""`keras-pipe predict --endpoint NAME`: a SageMaker endpoint serving this project's image, asked as
`keras-pipe predict` asks a model here (cli/predict.py): the same rows and lines out.

Each image is one InvokeEndpoint call (sagemaker-runtime), its body the image as it is
(application/x-image: the server reads what it is from its header), answered in this project's
prediction object whatever the model's dialect (Accept application/vnd.keras-pipe+json), top_k in
X-Amzn-SageMaker-Custom-Attributes, as the server takes it. `target_model`: the model of a
multi-model endpoint to ask (TargetModel: its key under the endpoint's S3 prefix, such as
customer-a/model.tar.gz; SageMaker loads it on its first call). CALLS_AT_ONCE calls run at once:
each waits on the network and the endpoint, not on this machine.

Why not one call a batch: InvokeEndpoint takes 6 MB a body (MAX_BODY), a few photos; and an image
the model refuses (a 4xx of the container's: ModelError) is then that image's alone.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from keras_pipe_serve.payloads import RICH  # (this project's object in any dialect)

from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError

CALLS_AT_ONCE = 8
MAX_BODY = 6 * 1024 * 1024  # InvokeEndpoint's payload limit (a real-time endpoint's)
SERVERLESS_BODY = 4 * 1024 * 1024  # a serverless endpoint's: a body past it is refused (ValidationError, or a bare 413)
# answers AWS asks to try again: a multi-model endpoint still loading the target model, and a call past
# the endpoint's concurrency (a serverless endpoint's MaxConcurrency: `keras-pipe deploy`'s default is 5,
# fewer than CALLS_AT_ONCE). botocore's standard retries stop after 3 tries within a second and do not
# retry a modelled 429: so many tries here, waiting twice as long each time (1 s first)
TRY_AGAIN = ("ModelNotReadyException", "ThrottlingException", "ServiceUnavailable")
# and the container's own 503 (a ModelError whose original status is 503): this project's server refuses
# so, at once, what it could not answer in time (docs/image.md), with a Retry-After InvokeEndpoint does
# not pass on; an image answered 503 is not the image's fault
BUSY = 503
TRIES = 6
# SageMaker answers within 60 s, botocore's own read timeout: a little longer, so that its answer
# (ModelNotReadyException, a slow model's 424) comes rather than botocore's timeout
READ_TIMEOUT_S = 70


class EndpointPredictor:
    """What cli/predict.py's `predict` asks of a model (problem, predict, labels), of an endpoint."""

    def __init__(self, endpoint: str, target_model: str | None = None, client=None):
        import boto3
        import botocore.config
        import botocore.exceptions

        self.endpoint, self.target_model = endpoint, target_model
        try:
            self.client = client or boto3.client("sagemaker-runtime", config=botocore.config.Config(
                read_timeout=READ_TIMEOUT_S, connect_timeout=10))
        except botocore.exceptions.BotoCoreError as err:  # (no region configured)
            raise UsageError(f"endpoint {shown(endpoint)}: {err}") from None
        self.labels: list[str] | None = None  # (the classes, from the first answer: each answer names them)
        self.failing = 0  # images the container failed on (a 5xx) since the run began, before any answer
        self.sent = 0  # images sent before any answer

    def problem(self, data: bytes) -> str | None:
        """Why `data` is not an image to send (from its header; the endpoint checks its size in
        pixels), or None."""
        from keras_pipe_train.sources import images

        if len(data) > MAX_BODY:
            return f"is {len(data):,} bytes, past the {MAX_BODY:,} InvokeEndpoint takes"
        return images.problem(data, max_pixels=2 ** 62)

    def predict(self, images: list[bytes], top_k: int | None = None) -> list[dict | str]:
        """Each image's prediction object, or why the endpoint refused it (the container's 4xx or
        5xx, as its message says). What is no one image's fault (no such endpoint, no access, no
        network) is a UsageError. Until the container has answered an image, CALLS_AT_ONCE are sent
        at a time, so that one failing on each stops the run after as many (_stop_if_failing)."""
        answers: list[dict | str] = []
        while len(answers) < len(images):
            # (up to the run's CALLS_AT_ONCE-th image, while it may be failing on each)
            size = CALLS_AT_ONCE - self.failing if self.labels is None else len(images)
            chunk = images[len(answers):len(answers) + size]
            with ThreadPoolExecutor(min(CALLS_AT_ONCE, len(chunk))) as calls:
                asked = list(calls.map(lambda image: self._asked(image, top_k), chunk))
            self._stop_if_failing([answer for answer, failed in asked if failed], len(asked),
                                  any(isinstance(answer, dict) for answer, _ in asked))
            answers += [answer for answer, _ in asked]
            self._same_labels([answer for answer, _ in asked if isinstance(answer, dict)])
        return answers

    def _same_labels(self, answered: list[dict]) -> None:
        """The classes the answers name, kept from the first: another set midway is a UsageError."""
        for answer in answered:
            labels = [str(label) for label in answer["labels"]]
            if self.labels is not None and labels != self.labels:  # (the endpoint updated to another model)
                raise UsageError(f"endpoint {shown(self.endpoint)} answered with other classes than before "
                                 f"({len(labels)}, not {len(self.labels)} or not in their order): was it "
                                 "updated to another model meanwhile?")
            self.labels = labels

    def _stop_if_failing(self, failures: list[str], count: int, answered: bool) -> None:
        """A UsageError once the container has failed (a 5xx, a 503 past every try, a timeout) on
        CALLS_AT_ONCE of the run's images before answering any: a model that cannot answer at all
        (it failed to load, it runs out of memory) would fail alike on every image, each one a call.
        An image refused for itself (a 4xx: the server's decoder) neither counts nor stops the
        count: it shows the container's front works, not its model, so a few undecodable images
        first do not keep a broken model asked about every other image. One answer ends the count."""
        if self.labels is not None or answered:
            return
        self.failing, self.sent = self.failing + len(failures), self.sent + count
        if self.failing >= CALLS_AT_ONCE:
            how = ("each a server error (5xx, or no answer in time)" if self.failing == self.sent else
                   f"{self.failing} of them a server error (5xx, or no answer in time), the others refused (4xx)")
            raise UsageError(f"endpoint {shown(self.endpoint)}"
                             f"{f' (target model {shown(self.target_model)})' if self.target_model else ''}"
                             f" answered none of the first {self.sent} images, {how}: "
                             f"stopped before sending the others ({failures[0]})")

    def _asked(self, image: bytes, top_k: int | None) -> tuple[dict | str, bool]:
        """(the prediction object, or why the endpoint refused the image; whether the container
        failed on it: a 5xx)."""
        import botocore.exceptions

        request = {"EndpointName": self.endpoint, "Body": image, "ContentType": "application/x-image", "Accept": RICH}
        if self.target_model:
            request["TargetModel"] = self.target_model
        if top_k:
            request["CustomAttributes"] = f"top_k={top_k}"
        for attempt in range(TRIES):
            try:
                body = self.client.invoke_endpoint(**request)["Body"].read()
                break
            except botocore.exceptions.ClientError as err:
                status = _container_status(err.response)
                if ((err.response.get("Error", {}).get("Code") in TRY_AGAIN or status == BUSY)
                        and attempt + 1 < TRIES):
                    time.sleep(2 ** attempt)
                    continue
                refused = _refused_of(err.response, len(image))
                if refused is not None:
                    return refused, _container_failed(err.response, status)
                error = err.response.get("Error", {})
                raise UsageError(f"endpoint {shown(self.endpoint)}"
                                 f"{f' (target model {shown(self.target_model)})' if self.target_model else ''}: "
                                 f"{error.get('Code') or 'error'}: {shown(error.get('Message') or str(err))}") from None
            except botocore.exceptions.BotoCoreError as err:  # (no credentials, no network, a read timeout)
                raise UsageError(f"endpoint {shown(self.endpoint)}: {err}") from None
        try:
            answer = json.loads(body)
            if not (isinstance(answer, dict) and isinstance(answer.get("probabilities"), list)
                    and isinstance(answer.get("labels"), list)):
                raise ValueError("not a prediction object")
        except ValueError:
            raise UsageError(f"endpoint {shown(self.endpoint)} answered {shown(body[:200].decode('utf-8', 'replace'))}"
                             f", not a prediction object of this project's: is it serving a keras-pipe model?"
                             ) from None
        return answer, False


def _container_status(response: dict) -> int | None:
    """The status the container answered, where the error is its answer (a ModelError)."""
    error = response.get("Error", {})
    if error.get("Code") != "ModelError":
        return None
    status = response.get("OriginalStatusCode")
    status = error.get("OriginalStatusCode") if status is None else status
    try:
        return int(status)
    except (TypeError, ValueError):
        return None


def _container_failed(response: dict, status: int | None) -> bool:
    """Whether the container failed on the image (a ModelError not a 4xx): a 5xx, and a call it did
    not answer in time, which SageMaker reports as status 0 ("Received server error (0) ...
    invocation timed out"), or with none. A 4xx is the image's own refusal."""
    if response.get("Error", {}).get("Code") != "ModelError":
        return False
    return status is None or not 400 <= status < 500


def _refused_of(response: dict, size: int) -> str | None:
    """Why the endpoint refused this image, where the error is the image's own (None: it is the
    endpoint's or the request's): the container's answer (ModelError: its status and message), or
    a body past a serverless endpoint's 4 MB (a ValidationError, or a bare 413)."""
    error = response.get("Error", {})
    code = error.get("Code")
    if code == "ModelError":
        status = _container_status(response)
        message = response.get("OriginalMessage") or error.get("OriginalMessage") or error.get("Message") or ""
        return f"the endpoint answered {status or 'an error'}: {_said(message)}"
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if size > SERVERLESS_BODY and (code in ("ValidationError", "413") or status == 413):
        return f"the endpoint refused its {size:,} bytes: {shown(error.get('Message') or code or '')}"
    return None


def _said(message: str) -> str:
    """The container's error message: its JSON's "error", as the server writes it, else as it is."""
    try:
        said = json.loads(message)
    except ValueError:
        return shown(message)
    error = said.get("error") if isinstance(said, dict) else None
    return shown(error if isinstance(error, str) else message)
