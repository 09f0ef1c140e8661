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
import re
import time
from concurrent.futures import ThreadPoolExecutor

from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError

CALLS_AT_ONCE = 8
MAX_BODY = 6 * 1024 * 1024  # InvokeEndpoint's payload limit (a real-time endpoint's)
RICH = "application/vnd.keras-pipe+json"  # (keras_pipe_serve.payloads.RICH: this project's object in any dialect)
# a multi-model endpoint still downloading or loading the target model answers ModelNotReadyException:
# AWS asks to try again; so many times, waiting twice as long each time (1 s first)
NOT_READY_TRIES = 6
# a ValidationError that is one body's size (a serverless endpoint's 4 MB), not the request's
_TOO_LARGE = re.compile(r"(?i)payload|too large|exceed|length")


class EndpointPredictor:
    """What cli/predict.py's `predict` asks of a model (problem, predict, labels), of an endpoint."""

    def __init__(self, endpoint: str, target_model: str | None = None, client=None):
        import boto3

        self.endpoint, self.target_model = endpoint, target_model
        self.client = client or boto3.client("sagemaker-runtime")
        self.labels: list[str] | None = None  # (the classes, from the first answer: each answer names them)

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
        network) is a UsageError."""
        with ThreadPoolExecutor(min(CALLS_AT_ONCE, max(1, len(images)))) as calls:
            answers = list(calls.map(lambda image: self._asked(image, top_k), images))
        for answer in answers:
            if isinstance(answer, dict) and self.labels is None:
                self.labels = [str(label) for label in answer["labels"]]
        return answers

    def _asked(self, image: bytes, top_k: int | None) -> dict | str:
        import botocore.exceptions

        request = {"EndpointName": self.endpoint, "Body": image, "ContentType": "application/x-image", "Accept": RICH}
        if self.target_model:
            request["TargetModel"] = self.target_model
        if top_k:
            request["CustomAttributes"] = f"top_k={top_k}"
        for attempt in range(NOT_READY_TRIES):
            try:
                body = self.client.invoke_endpoint(**request)["Body"].read()
                break
            except botocore.exceptions.ClientError as err:
                error = err.response.get("Error", {})
                if error.get("Code") == "ModelError":  # (the container's answer: this image's)
                    status = err.response.get("OriginalStatusCode") or error.get("OriginalStatusCode")
                    message = err.response.get("OriginalMessage") or error.get("OriginalMessage") \
                        or error.get("Message", "")
                    return f"the endpoint answered {status or 'an error'}: {_said(message)}"
                if error.get("Code") == "ValidationError" and _TOO_LARGE.search(error.get("Message", "")):
                    # (a serverless endpoint takes 4 MB: this image's refusal, not the endpoint's)
                    return f"the endpoint refused it: {shown(error.get('Message', ''))}"
                if error.get("Code") == "ModelNotReadyException" and attempt + 1 < NOT_READY_TRIES:
                    time.sleep(2 ** attempt)
                    continue
                raise UsageError(f"endpoint {shown(self.endpoint)}"
                                 f"{f' (target model {shown(self.target_model)})' if self.target_model else ''}: "
                                 f"{error.get('Code', 'error')}: {shown(error.get('Message', str(err)))}") from None
            except botocore.exceptions.BotoCoreError as err:  # (no credentials, no region, no network)
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
        return answer


def _said(message: str) -> str:
    """The container's error message: its JSON's "error", as the server writes it, else as it is."""
    try:
        said = json.loads(message)
    except ValueError:
        return shown(message)
    return shown(said.get("error", message) if isinstance(said, dict) else message)
