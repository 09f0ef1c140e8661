"""Threads of their own call the model (`runners`: one per core on a host without a GPU); requests
wait for them in a bounded queue, and whatever images are waiting when one is free go through the
model together, as TF Serving batches.

Why: a model call on 8 images costs far less than 8 calls on one (the convolutions run on larger
matrices, the graph's fixed cost is paid once), and a request thread that only waits for its
answer is free to notice that its client has gone or that its time is up. The request threads
themselves never run the model, so a ping never waits behind it (keras_pipe_serve.app).

- A batch takes images from the requests in arrival order, up to `max_batch` images: a request with
  more (a batch transform's MultiRecord mini-batch of hundreds) goes through in slices of
  `max_batch`, so that its decoded pixels never all exist at once; the runners that are idle share
  what is waiting, so that a lone request goes through every core at once.
- `max_wait`: how long a runner waits, once a request is queued, for more images before
  it calls the model (TF Serving's batch_timeout_micros). 0, the default: no wait; the requests
  that arrive while the model is busy form the next batch ("natural batching"), which gains
  batching's throughput under load and costs a lone request nothing (docs/speed.md has figures).
- `max_queue`: requests queued and not yet taken; one more is refused (Full: the server answers 503
  with Retry-After) instead of the queue, and every request's wait, growing without end.
- A request whose client has gone, or whose time is up, is cancelled: its images not yet taken are
  never computed.
- One image that the model cannot decode fails the model's call for the whole batch: the batch is
  then run again request by request, so that only the request holding it gets the error.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

# what a model call returns for its images: each one's probabilities, and a multi-label model's 0/1
# per class (or None): Predictor.run
Outputs = tuple[list, list | None]


class Full(Exception):
    """The queue holds max_queue requests already."""


class Dropped(Exception):
    """A request given up before its answer came: its message says how many of its images were
    never computed."""


class TimedOut(Dropped):
    """The request's deadline passed."""


class Gone(Dropped):
    """The request's client closed its connection."""


class Job:
    """One request's images and, once computed, their outputs."""

    def __init__(self, images: list[bytes]):
        self.images = images
        self.taken = 0  # images handed to the model so far
        self.probabilities: list = [None] * len(images)
        self.predicted: list | None = None
        self.left = len(images)
        self.error: BaseException | None = None
        self.cancelled = False
        self.done = threading.Event()
        self._filling = threading.Lock()

    def fill(self, start: int, outputs: Outputs) -> None:
        probabilities, predicted = outputs
        with self._filling:  # (two runners may finish slices of one request at once)
            self.probabilities[start:start + len(probabilities)] = probabilities
            if predicted is not None:
                if self.predicted is None:
                    self.predicted = [None] * len(self.images)
                self.predicted[start:start + len(predicted)] = predicted
            self.left -= len(probabilities)
            if not self.left:
                self.done.set()

    def drop(self) -> str:
        self.cancelled = True
        return f"{len(self.images) - self.taken} of {len(self.images)} images were not computed, and will not be"

    def fail(self, error: BaseException) -> None:
        self.error, self.cancelled = error, True  # (its slices still queued are dropped)
        self.done.set()


class Batcher:
    def __init__(self, run: Callable[[list[bytes]], Outputs], max_batch: int = 32, max_wait: float = 0.0,
                 max_queue: int = 64, stuck_after: float = 60.0, runners: int = 1):
        """`stuck_after`: seconds one model call may run before /ping calls the model stuck (the
        server's request timeout: no request could be answered in time). `runners`: threads
        calling the model at once, each on the next batch."""
        self._run = run
        self.stuck_after = stuck_after
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait, max_queue
        self._queue: deque[Job] = deque()
        self._ready = threading.Condition()
        self._idle = 0  # runners waiting for work
        self.busy_since: list[float | None] = [None] * runners  # when each runner's call now running began
        self._threads = [threading.Thread(target=self._serve, args=(i,), name=f"model-{i}", daemon=True)
                         for i in range(runners)]
        for thread in self._threads:
            thread.start()

    # -- the request threads' side --
    def submit(self, images: list[bytes]) -> Job:
        job = Job(images)
        with self._ready:
            queued = sum(not queued.cancelled for queued in self._queue)
            if queued >= self.max_queue:
                raise Full(f"{queued} requests are queued for the model already")
            self._queue.append(job)
            self._ready.notify()
        return job

    def wait(self, job: Job, deadline: float, gone: Callable[[], bool] = lambda: False, poll: float = 0.1) -> Outputs:
        """The job's outputs; TimedOut at `deadline` (time.monotonic), Gone as soon as `gone()` says
        so (asked every `poll` seconds); or the job's own error. Both cancel it."""
        while not job.done.wait(max(0.0, min(poll, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                raise TimedOut(job.drop())
            if gone():
                raise Gone(job.drop())
        if job.error is not None:
            raise job.error
        return job.probabilities, job.predicted

    def problem(self) -> str | None:
        """Why the model cannot answer now (None: it can): what /ping says."""
        if not all(thread.is_alive() for thread in self._threads):
            return "a thread calling the model has stopped"
        since = min((t for t in self.busy_since if t is not None), default=None)
        if since is not None and time.monotonic() - since > self.stuck_after:
            return f"one call of the model has run {time.monotonic() - since:.1f} s, past {self.stuck_after:g} s"
        return None

    # -- the model thread's side --
    def _serve(self, runner: int) -> None:
        while True:
            batch = self._next_batch()
            self.busy_since[runner] = time.monotonic()
            try:
                self._compute(batch)
            finally:
                self.busy_since[runner] = None

    def _next_batch(self) -> list[tuple[Job, int, int]]:
        """(job, start, end) slices of the queued jobs, at most max_batch images in all, and no more
        than this runner's share of what is waiting among the runners that are idle: a lone large
        request goes through every idle runner at once, each on its own slice."""
        with self._ready:
            self._idle += 1
            while not self._live():
                self._ready.wait()
            if self.max_wait:
                until = time.monotonic() + self.max_wait
                while self._waiting_images() < self.max_batch and (left := until - time.monotonic()) > 0:
                    self._ready.wait(left)
            share = -(-self._waiting_images() // self._idle)  # (rounded up)
            self._idle -= 1
            batch, room = [], max(1, min(self.max_batch, share))
            while room and self._live():
                job = self._queue[0]
                start = job.taken
                job.taken = end = min(len(job.images), start + room)
                room -= end - start
                batch.append((job, start, end))
                if end == len(job.images):
                    self._queue.popleft()
            if self._live():
                self._ready.notify()  # (images left: the next idle runner takes its share)
            return batch

    def _live(self) -> bool:
        """Whether a job is queued that is still wanted (the cancelled ones at its head are dropped)."""
        while self._queue and self._queue[0].cancelled:
            self._queue.popleft()
        return bool(self._queue)

    def _waiting_images(self) -> int:
        return sum(len(job.images) - job.taken for job in self._queue if not job.cancelled)

    def _compute(self, batch: list[tuple[Job, int, int]]) -> None:
        images = [image for job, start, end in batch for image in job.images[start:end]]
        try:
            outputs = self._run(images)
        except Exception as err:  # (whose fault it is is found by running each alone)
            if len(batch) == 1:
                batch[0][0].fail(err)
                return
            for job, start, end in batch:
                if not job.cancelled:
                    self._compute([(job, start, end)])
            return
        probabilities, predicted = outputs
        at = 0
        for job, start, end in batch:
            count = end - start
            if not job.cancelled:
                job.fill(start, (probabilities[at:at + count], None if predicted is None else predicted[at:at + count]))
            at += count
