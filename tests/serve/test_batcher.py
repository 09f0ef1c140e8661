"""The batcher in this process, its model a Python function that records each call: batches made
across requests, slices of a large request in order, a deadline, a request given up, the pace
the door admits by, and a bad image costing only its own request. (The server's tests, test_load.py, show the same through
real HTTP with the real model.)"""

import re
import threading
import time

import pytest
from keras_pipe_serve.batcher import Batcher, Job, Outputs


class Model:
    """Answers each image (an int as bytes) with [value, value + 0.5]; waits for `gate`, when set,
    before each call; refuses b"bad" as the real model refuses an image it cannot decode."""

    def __init__(self, gate: threading.Event | None = None, multi_label: bool = False):
        self.calls: list[list[bytes]] = []
        self.gate = gate
        self.multi_label = multi_label
        self.entered = threading.Event()

    def __call__(self, images):
        self.calls.append(list(images))
        self.entered.set()
        if self.gate:
            assert self.gate.wait(10)
        if b"bad" in images:
            raise ValueError("an image cannot be decoded")
        rows = [[float(i), float(i) + 0.5] for i in map(int, images)]
        return rows, ([[1, 0] for _ in images] if self.multi_label else None)


def images(*values: int) -> list[bytes]:
    return [str(v).encode() for v in values]


def answered(job: Job, within: float = 10) -> Outputs:
    """The job's outputs once the model has them (what the app's request awaits), or its error."""
    assert job.done.wait(within), "no answer"
    if job.error is not None:
        raise job.error
    return job.probabilities, job.predicted


def held(first: list[bytes], **options):
    """(gate, model, batcher, the first request's job): the model busy with that request alone
    until the gate is set, so that what is submitted next waits in the queue."""
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(model, **options)
    job = batcher.submit(first)
    assert model.entered.wait(5)
    return gate, model, batcher, job


def test_requests_queued_while_the_model_is_busy_go_through_it_together():
    gate, model, batcher, first = held(images(0), max_batch=8)
    waiting = [batcher.submit(images(i, i + 1)) for i in (10, 20, 30)]
    gate.set()
    assert answered(first) == ([[0.0, 0.5]], None)
    for job, i in zip(waiting, (10, 20, 30)):
        assert answered(job)[0] == [[i, i + 0.5], [i + 1, i + 1.5]]
    assert model.calls == [images(0), images(10, 11, 20, 21, 30, 31)]


def test_a_request_larger_than_a_batch_goes_through_in_slices_in_order():
    model = Model(multi_label=True)
    batcher = Batcher(model, max_batch=4)
    job = batcher.submit(images(*range(10)))
    probabilities, predicted = answered(job)
    assert probabilities == [[i, i + 0.5] for i in range(10)]
    assert predicted == [[1, 0]] * 10
    assert [len(call) for call in model.calls] == [4, 4, 2]


def test_a_lone_large_request_is_shared_among_the_idle_runners_and_answered_in_order():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(model, max_batch=32, runners=2)
    time.sleep(0.2)  # (both runners waiting for work)
    job = batcher.submit(images(*range(10)))
    deadline = time.monotonic() + 10
    while len(model.calls) < 2 and time.monotonic() < deadline:  # (both calls running at once)
        time.sleep(0.01)
    gate.set()
    assert answered(job)[0] == [[i, i + 0.5] for i in range(10)]
    assert sorted(model.calls) == [images(0, 1, 2, 3, 4), images(5, 6, 7, 8, 9)]


def test_a_wait_gathers_a_fuller_batch():
    model = Model()
    batcher = Batcher(model, max_batch=4, max_wait=0.5)
    jobs = []
    for i in range(4):
        jobs.append(batcher.submit(images(i)))
        time.sleep(0.02)
    for job in jobs:
        answered(job)
    assert model.calls == [images(0, 1, 2, 3)]


def test_a_request_past_its_deadline_or_given_up_is_dropped_uncomputed():
    gate, model, batcher, busy = held(images(1), max_batch=1)
    late = batcher.submit(images(2, 3), deadline=time.monotonic() + 0.2)
    left = batcher.submit(images(4, 5))
    time.sleep(0.3)
    assert batcher.cancel(left) == "2 of 2 images were not computed, and will not be"  # (its client gone)
    gate.set()
    answered(busy)
    after = batcher.submit(images(6))
    answered(after)
    assert model.calls == [images(1), images(6)]  # neither dropped request's images were computed
    assert late.cancelled and not late.done.is_set()  # (its request thread answers it 504 at its deadline)


def test_the_pace_the_door_admits_by_is_the_recent_calls_seconds_an_image_shared_by_the_runners():
    batcher = Batcher(Model(), max_batch=2)
    assert batcher.per_image_s() == 0 and batcher.expected_s(100) == 0  # (no call timed yet: every request is in time)
    batcher.timed(1, 0.5)  # (a warm-up: half a second for one image)
    assert batcher.per_image_s() == 0.5
    for _ in range(30):  # (batched calls since: a tenth of a second an image)
        batcher.timed(32, 3.2)
    assert abs(batcher.per_image_s() - 0.1) < 0.001
    assert abs(batcher.expected_s(9, own=1) - 0.1 * 10) < 0.01
    two = Batcher(Model(), runners=2)
    two.timed(1, 0.2)
    assert two.expected_s(9, own=1) == 0.2 * 10 / 2


def test_a_call_slower_than_the_models_pace_counts_before_it_ends_and_the_backlog_counts_what_is_queued():
    gate, model, batcher, running = held(images(1), max_batch=2)
    batcher.timed(10, 0.01)  # (a millisecond an image so far)
    queued = [batcher.submit(images(2, 3)), batcher.submit(images(4))]
    assert batcher.backlog() == 1 + 3  # (the call running, and the images queued)
    time.sleep(0.3)
    assert batcher.per_image_s() >= 0.3  # (the call running: one image for 0.3 s and more)
    gate.set()
    for job in (running, *queued):
        answered(job)
    until = time.monotonic() + 5  # (a runner ends its call a moment after its jobs are answered)
    while batcher.backlog() and time.monotonic() < until:
        time.sleep(0.01)
    assert batcher.backlog() == 0 and batcher.per_image_s() < 0.3


def test_the_warm_up_is_history_not_pace_and_one_slow_runner_does_not_slow_the_estimate_of_the_others():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(model, max_batch=1, runners=2)
    batcher.timed(1, 5.0, recent=False)  # (the warm-up: the graph's first run)
    assert batcher.per_image_s() == 0 and batcher.slowest_per_image == 5.0
    batcher.timed(10, 0.1)  # (10 ms an image lately)
    job = batcher.submit(images(1))
    assert model.entered.wait(5)
    time.sleep(0.3)  # (one runner's call: 0.3 s and more on its image; the other runner idle)
    assert abs(batcher.per_image_s() - 0.01) < 0.001
    gate.set()
    answered(job)


def test_an_image_the_model_refuses_fails_only_its_own_request():
    gate, model, batcher, busy = held(images(0), max_batch=8)
    good, bad, other = batcher.submit(images(1)), batcher.submit([b"7", b"bad"]), batcher.submit(images(2, 3))
    gate.set()
    answered(busy)
    assert answered(good)[0] == [[1.0, 1.5]]
    with pytest.raises(ValueError, match="cannot be decoded"):
        answered(bad)
    assert answered(other)[0] == [[2.0, 2.5], [3.0, 3.5]]
    # the batch of three failed, then each ran alone
    assert model.calls[1:] == [[b"1", b"7", b"bad", b"2", b"3"], [b"1"], [b"7", b"bad"], [b"2", b"3"]]


def test_a_call_is_stuck_only_far_past_the_models_own_history_and_never_before_the_floor():
    gate = threading.Event()
    model = Model(gate)
    batcher = Batcher(model, stuck_floor=0.3)
    batcher.timed(1, 0.001)  # (a warm-up: a millisecond an image)
    assert batcher.stuck() is None
    job = batcher.submit(images(1, 2))
    assert model.entered.wait(5)
    time.sleep(0.1)
    assert batcher.stuck() is None and batcher.problem() is None  # (slow so far, not stuck: /ping says 200)
    time.sleep(0.4)
    assert re.fullmatch(r"one call of the model on 2 image\(s\) has run 0\.\d s, past 0\.3 s \(20 times the slowest it has "
                        r"been, 0\.001 s an image, and at least 0\.3 s\)", batcher.stuck())
    gate.set()
    answered(job)
    assert batcher.stuck() is None
    # a slow model's history lifts the bar: 0.05 s an image, 20 times, 2 images: 2 s
    batcher.timed(2, 0.1)
    gate.clear()
    model.entered.clear()
    job = batcher.submit(images(3, 4))
    assert model.entered.wait(5)
    time.sleep(0.5)
    assert batcher.stuck() is None
    gate.set()
    answered(job)


def test_every_job_waiting_or_in_a_call_can_be_failed_at_once():
    gate, model, batcher, running = held(images(1), max_batch=1)
    queued = batcher.submit(images(2))
    batcher.fail_all(RuntimeError("restarting"))
    for job in (running, queued):
        with pytest.raises(RuntimeError, match="restarting"):
            answered(job)
    assert batcher.queued() == 0
    gate.set()


def test_a_cancelled_request_leaves_the_queue_and_lets_go_of_its_images_at_once():
    gate, model, batcher, running = held(images(1), max_batch=1)
    given_up = batcher.submit(images(*range(100, 150)))
    kept = batcher.submit(images(7))
    assert batcher.cancel(given_up) == "50 of 50 images were not computed, and will not be"
    assert given_up.images == () and batcher.queued() == 1
    gate.set()
    assert answered(kept)[0] == [[7.0, 7.5]]
    assert model.calls == [images(1), images(7)]


def test_the_model_is_never_called_on_no_image_when_every_waiting_job_was_given_up():
    model = Model()
    batcher = Batcher(model, max_batch=8, max_wait=0.3)  # (the runner waits 0.3 s for a fuller batch)
    job = batcher.submit(images(1))
    time.sleep(0.05)
    batcher.cancel(job)
    time.sleep(0.5)
    assert model.calls == []
    assert answered(batcher.submit(images(2)))[0] == [[2.0, 2.5]]
    assert model.calls == [images(2)]


def test_a_connection_back_before_its_retry_after_has_its_refusals_held_longer_each_time_and_one_that_waited_none():
    from keras_pipe_serve.app import HOLD_MAX_S, Holds

    now = [100.0]
    holds = Holds(clock=lambda: now[0])
    client = ("127.0.0.1", 5000)
    assert holds.hold_s(client, 1) == 0  # (its first refusal: at once)
    held = [holds.hold_s(client, 1) for _ in range(7)]  # (each resent at once)
    assert held == [0.05, 0.1, 0.2, 0.4, 0.8, HOLD_MAX_S, HOLD_MAX_S]
    assert holds.hold_s(("127.0.0.1", 5001), 1) == 0  # (another connection)
    now[0] += HOLD_MAX_S + 1  # (answered after its hold, then waited its Retry-After of 1 s)
    assert holds.hold_s(client, 1) == 0
    now[0] += 0.5  # (back before the Retry-After: held again)
    assert holds.hold_s(client, 1) == 0.05
    now[0] += 10
    holds.forget_past()
    assert holds.hold_s(client, 1) == 0
