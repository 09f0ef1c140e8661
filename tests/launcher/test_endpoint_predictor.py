"""`keras-pipe predict --endpoint`'s reading of what SageMaker's runtime answers
(sagemaker/endpoint_predictor.py), each answer as botocore parses it (its Stubber, with the error
shapes of the service's own model): what is one image's refusal, what to try again, and what ends
the run. tests/serve/test_predict.py asks a real server through a runtime on 127.0.0.1."""

from __future__ import annotations

import io
import json

import boto3
import pytest
from botocore.stub import Stubber

from keras_pipe_launch.common.usage import UsageError
from keras_pipe_launch.sagemaker import endpoint_predictor as E
from tests.conftest import image_bytes

JPEG = image_bytes("JPEG", 40, 30)
ANSWER = {"predicted_label": "b", "labels": ["a", "b"], "probabilities": [0.25, 0.75],
          "top_k": [{"label": "b", "probability": 0.75}]}


@pytest.fixture
def stubbed(monkeypatch):
    client = boto3.client("sagemaker-runtime", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    slept = []
    monkeypatch.setattr(E.time, "sleep", slept.append)
    with Stubber(client) as stubber:
        yield E.EndpointPredictor("digits", client=client), stubber, slept
        stubber.assert_no_pending_responses()


def answered(stubber, answer=ANSWER):
    stubber.add_response("invoke_endpoint", {"Body": io.BytesIO(json.dumps(answer).encode())})


def test_the_containers_refusal_is_the_images_even_with_no_message(stubbed):
    predictor, stubber, _ = stubbed
    stubber.add_client_error("invoke_endpoint", "ModelError", "Received client error (400) from primary", 424,
                             modeled_fields={"OriginalStatusCode": 400, "OriginalMessage": '{"error": "bad pixels"}'})
    assert predictor.predict([JPEG]) == ["the endpoint answered 400: bad pixels"]
    stubber.add_client_error("invoke_endpoint", "ModelError", None, 424)  # (SageMaker has sent null messages)
    assert predictor.predict([JPEG]) == ["the endpoint answered an error: "]
    assert predictor.labels is None


def test_throttling_and_a_model_still_loading_are_tried_again_then_answered(stubbed):
    predictor, stubber, slept = stubbed
    stubber.add_client_error("invoke_endpoint", "ThrottlingException", None, 400)
    stubber.add_client_error("invoke_endpoint", "ModelNotReadyException", "still loading", 429)
    answered(stubber)
    assert predictor.predict([JPEG], top_k=1) == [ANSWER] and slept == [1, 2] and predictor.labels == ["a", "b"]


def failed(stubber, status: int, message: str = '{"error": "no"}') -> None:
    stubber.add_client_error("invoke_endpoint", "ModelError", f"Received server error ({status}) from primary", 424,
                             modeled_fields={"OriginalStatusCode": status, "OriginalMessage": message})


def test_the_containers_503_at_capacity_is_tried_again_and_after_the_last_try_is_the_images_failure(stubbed):
    predictor, stubber, slept = stubbed
    failed(stubber, 503, '{"error": "the server is at capacity"}')
    answered(stubber)
    assert predictor.predict([JPEG]) == [ANSWER] and slept == [1]
    for _ in range(E.TRIES):
        failed(stubber, 503, '{"error": "the server is at capacity"}')
    assert predictor.predict([JPEG]) == ["the endpoint answered 503: the server is at capacity"]
    assert slept == [1, 1, 2, 4, 8, 16]


def test_a_container_failing_on_each_of_the_first_images_ends_the_run_and_one_refusing_bad_images_does_not(stubbed):
    predictor, stubber, _ = stubbed
    for _ in range(E.CALLS_AT_ONCE):  # (a 4xx: each image's own fault, whatever their number)
        failed(stubber, 400, '{"error": "not an image"}')
    assert predictor.predict([JPEG] * E.CALLS_AT_ONCE) == ["the endpoint answered 400: not an image"] * E.CALLS_AT_ONCE
    predictor = E.EndpointPredictor("digits", client=predictor.client)  # (another run)
    half = E.CALLS_AT_ONCE // 2
    for _ in range(half):  # (a 500 on fewer than CALLS_AT_ONCE images: said, and the run goes on)
        failed(stubber, 500, '{"error": "out of memory"}')
    assert predictor.predict([JPEG] * half) == ["the endpoint answered 500: out of memory"] * half
    for _ in range(E.CALLS_AT_ONCE - half):
        failed(stubber, 500, '{"error": "out of memory"}')
    with pytest.raises(UsageError, match=rf"endpoint digits answered none of the first {E.CALLS_AT_ONCE} images, "
                                         r"each a server error \(5xx, or no answer in time\): stopped before sending the others \(the "
                                         r"endpoint answered 500: out of memory\)"):
        predictor.predict([JPEG] * 32)  # (a batch of cli/predict.py's: the rest never sent)


def test_images_refused_for_themselves_first_do_not_keep_a_failing_model_asked_about_every_other_image(stubbed):
    """A 4xx (the server's decoder refusing an image) shows the container's front works, not its
    model: those images neither count nor stop the count, and 5xx on CALLS_AT_ONCE images before
    any answer end the run, however many 4xx came between."""
    predictor, stubber, _ = stubbed
    refused = 3
    for status in [400] * refused + [500] * (E.CALLS_AT_ONCE - refused):  # (the first 8 at once: in any order)
        failed(stubber, status, '{"error": "the model did not load"}' if status == 500 else '{"error": "not an image"}')
    for _ in range(refused):  # (then as many as the count lacks)
        failed(stubber, 500, '{"error": "the model did not load"}')
    with pytest.raises(UsageError, match=rf"endpoint digits answered none of the first {E.CALLS_AT_ONCE + refused} "
                                         rf"images, {E.CALLS_AT_ONCE} of them a server error \(5xx, or no answer in time\), the others "
                                         r"refused \(4xx\): stopped before sending the others \(the endpoint "
                                         r"answered 500: the model did not load\)"):
        predictor.predict([JPEG] * 32)


def test_a_container_that_times_out_on_each_image_ends_the_run(stubbed):
    """SageMaker reports a container that did not answer within its 60 s as a ModelError of status 0
    ("Received server error (0) from primary with message ... invocation timed out"): the container's
    failure, not the image's refusal."""
    predictor, stubber, _ = stubbed
    for _ in range(E.CALLS_AT_ONCE):
        failed(stubber, 0, "Your invocation timed out while waiting for a response from container primary.")
    with pytest.raises(UsageError, match=rf"answered none of the first {E.CALLS_AT_ONCE} images, each a server error "
                                         r"\(5xx, or no answer in time\): stopped before sending the others \(the "
                                         r"endpoint answered an error: Your invocation timed out"):
        predictor.predict([JPEG] * 32)


def test_a_container_that_answered_once_is_never_stopped_for_its_failures(stubbed):
    predictor, stubber, _ = stubbed
    answered(stubber)
    assert predictor.predict([JPEG]) == [ANSWER]
    for _ in range(2 * E.CALLS_AT_ONCE):
        failed(stubber, 500)
    assert predictor.predict([JPEG] * 2 * E.CALLS_AT_ONCE) == ["the endpoint answered 500: no"] * 2 * E.CALLS_AT_ONCE


def test_a_body_past_a_serverless_endpoints_4_mb_is_that_images_refusal_and_a_name_never_is(stubbed):
    predictor, stubber, _ = stubbed
    large = JPEG + b"\0" * (E.SERVERLESS_BODY + 1)
    stubber.add_client_error("invoke_endpoint", "413", "HTTP content length exceeded 4194304 bytes.", 413)
    assert predictor.predict([large]) == [
        f"the endpoint refused its {len(large):,} bytes: HTTP content length exceeded 4194304 bytes."]
    # (a ValidationError naming an endpoint "payload-classifier" is the endpoint's, whatever the words)
    stubber.add_client_error("invoke_endpoint", "ValidationError",
                             "Endpoint payload-classifier of account 123456789012 not found.", 400)
    with pytest.raises(UsageError, match="endpoint digits: ValidationError: Endpoint payload-classifier of account"):
        predictor.predict([JPEG])


def test_an_endpoint_that_answers_other_classes_midway_or_not_this_projects_object_ends_the_run(stubbed):
    predictor, stubber, _ = stubbed
    answered(stubber)
    answered(stubber, {**ANSWER, "labels": ["a", "c"]})
    assert predictor.predict([JPEG]) == [ANSWER]
    with pytest.raises(UsageError, match="answered with other classes than before"):
        predictor.predict([JPEG])
    answered(stubber, [0.25, 0.75])  # (a built-in algorithm's answer)
    with pytest.raises(UsageError, match="not a prediction object of this project's"):
        predictor.predict([JPEG])


def test_no_region_is_a_usage_error_not_a_traceback(monkeypatch, tmp_path):
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(UsageError, match="endpoint digits: You must specify a region"):
        E.EndpointPredictor("digits")
