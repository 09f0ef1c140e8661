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
- How long the images queued will take: `backlog()` images ahead, at the pace the model has kept
  over its recent calls (`per_image_s()`, batched as they were): `expected_s()`, by which the door
  admits a request only if it can be answered within its timeout (keras_pipe_serve.app).
- A request whose client has gone, or whose time is up, is cancelled: its images not yet taken are
  never computed. A request whose deadline passes while it waits is dropped before the model
  takes it, whatever its request thread has noticed yet.
- One image that the model cannot decode fails the model's call for the whole batch: the batch is
  then run again request by request, so that only the request holding it gets the error.
- A cancelled request leaves the queue at once, and lets go of its images: behind a long request,
  the images of requests given up do not stay in memory until the model reaches them.
- Stuck or slow: `stuck()` says when a call has run far longer than the model has ever needed for
  as many images (STUCK_FACTOR times its slowest seconds per image, at least `stuck_floor`): the
  server then restarts its worker (keras_pipe_serve.app). A call merely slower than the request
  timeout is not stuck: its requests get 504s, and the instance stays in service.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

# a call is stuck once it has run this many times the model's slowest seconds per image so far,
# times its images: far beyond any slowness its inputs explain (a PNG of the largest size allowed
# decodes in about a second)
STUCK_FACTOR = 20
# and never before this many seconds (KERAS_PIPE_STUCK_AFTER_S): a first call, or one of a model
# whose history is short, is given time
STUCK_FLOOR_S = 30.0

# the model's recent pace: each call's seconds and images, the calls before it weighing this much
# less at each call (about the last ten count): a burst's batched calls set it within a few calls
RECENT_DECAY = 0.8

# what a model call returns for its images: each one's probabilities, and a multi-label model's 0/1
# per class (or None): Predictor.run
Outputs = tuple[list, list | None]


class Job:
    """One request's images and, once computed, their outputs."""

    def __init__(self, images: list[bytes], deadline: float = float("inf")):
        self.images = images
        self.deadline = deadline  # (time.monotonic) past it, its images still queued are never computed
        self.taken = 0  # images handed to the model so far
        self.probabilities: list = [None] * len(images)
        self.predicted: list | None = None
        self.left = len(images)
        self.error: BaseException | None = None
        self.cancelled = False
        self.done = threading.Event()
        self._filling = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def when_done(self, callback: Callable[[], None]) -> None:
        """callback() once the job is answered or failed, in the thread that ends it (a model
        runner's), or at once if it is already."""
        with self._filling:
            if not self.done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def _finish(self) -> None:  # (with self._filling held)
        self.done.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

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
                self._finish()

    def fail(self, error: BaseException) -> None:
        with self._filling:
            if self.done.is_set():
                return
            self.error, self.cancelled = error, True  # (its slices still queued are dropped)
            self._finish()


class Closed(Exception):
    """The batcher takes no more jobs: its model was unloaded (keras_pipe_serve.models)."""


class Batcher:
    def __init__(self, run: Callable[[list[bytes]], Outputs], max_batch: int = 32, max_wait: float = 0.0,
                 stuck_floor: float = STUCK_FLOOR_S, runners: int = 1, calls: threading.Semaphore | None = None):
        """`stuck_floor`: the fewest seconds after which a call may be called stuck (stuck()).
        `runners`: threads calling the model at once, each on the next batch. `calls`: slots shared
        with other batchers (a multi-model endpoint's models), one taken for each model call, so
        that the models' calls at once are no more than the cores (and their memory) allow."""
        self._run = run
        self.stuck_floor = stuck_floor
        self.slowest_per_image = 0.0  # the longest a finished call took, per image: the model's history
        self._recent_s = self._recent_images = 0.0  # the recent calls' seconds and images (RECENT_DECAY)
        self._pace = threading.Lock()  # (the runners time their calls at once)
        self.max_batch, self.max_wait, self.runners = max_batch, max_wait, runners
        self._queue: deque[Job] = deque()
        self._ready = threading.Condition()
        self._idle = 0  # runners waiting for work
        self._running: set[Job] = set()  # jobs with a slice in a call now
        self._closed = False  # (close(): the runners end once the queue is empty)
        self._calls = calls
        self.busy_since: list[float | None] = [None] * runners  # when each runner's call now running began
        self.busy_images = [0] * runners  # and on how many images
        self._threads = [threading.Thread(target=self._serve, args=(i,), name=f"model-{i}", daemon=True)
                         for i in range(runners)]
        for thread in self._threads:
            thread.start()

    # -- the request threads' side --
    def submit(self, images: list[bytes], deadline: float = float("inf")) -> Job:
        """Queues a request's images (the door has bounded how many wait: keras_pipe_serve.app);
        past `deadline` (time.monotonic) those not yet taken are dropped."""
        job = Job(images, deadline)
        with self._ready:
            if self._closed:
                raise Closed("the model was unloaded")
            self._queue.append(job)
            self._ready.notify()
        return job

    def queued(self) -> int:
        """Requests waiting for the model, none of their images taken yet or some."""
        return len(self._queue)

    def cancel(self, job: Job) -> str:
        """Gives the job up: out of the queue, its images let go (slices a runner has taken finish,
        unused); says how many of its images were never computed."""
        with self._ready:
            job.cancelled = True
            if job in self._queue:
                self._queue.remove(job)
            count, left = len(job.images), len(job.images) - job.taken
            job.images = ()
        return f"{left} of {count} images were not computed, and will not be"

    def fail_all(self, error: BaseException) -> None:
        """Every job queued or in a call ends with `error` (the worker is about to restart)."""
        with self._ready:
            jobs = list(self._queue)
            self._queue.clear()
        for job in jobs + list(self._running):
            job.fail(error)

    def backlog(self) -> int:
        """Images the runners have yet to finish: those queued and not taken, and those of the calls
        running now."""
        with self._ready:
            return self._waiting_images() + sum(count for since, count in zip(self.busy_since, self.busy_images)
                                                if since is not None)

    def per_image_s(self) -> float:
        """Seconds an image has taken the model over its recent calls (their seconds over their
        images, batched as they came: under load, full batches), on one runner; 0 before any.
        Where every runner is in a call that has taken longer an image already, the least of
        those counts at once: images slower than the model's history (larger photos, a busier
        host, the first calls after the warm-up) slow the estimate before the calls end, and one
        slow call among runners that keep their pace does not."""
        with self._pace:
            pace = self._recent_s / self._recent_images if self._recent_images else 0.0
        now = time.monotonic()
        with self._ready:
            running = [(now - since) / count for since, count in zip(self.busy_since, self.busy_images)
                       if since is not None and count]
        if len(running) == self.runners:
            pace = max(pace, min(running))
        return pace

    def expected_s(self, ahead: int, own: int = 1, pace: float | None = None) -> float:
        """Seconds until a request of `own` images, queued behind `ahead` images, has its answer at
        the model's recent pace (or `pace`, per_image_s() read once for several estimates), the
        runners sharing the work."""
        return (self.per_image_s() if pace is None else pace) * (ahead + own) / self.runners

    def problem(self) -> str | None:
        """Why the model cannot answer now (None: it can): what /ping says. A slow call is not one:
        it ends, and the model answers again."""
        if not all(thread.is_alive() for thread in self._threads):
            return "a thread calling the model has stopped"
        return None

    def stuck(self) -> str | None:
        """Why a call now running is stuck, not slow (None: none is): it has run longer than
        STUCK_FACTOR times the model's slowest seconds per image so far, times its images, and
        than `stuck_floor`."""
        now = time.monotonic()
        for since, count in zip(list(self.busy_since), list(self.busy_images)):
            if since is None:
                continue
            limit = max(self.stuck_floor, STUCK_FACTOR * self.slowest_per_image * count)
            if now - since > limit:
                return (f"one call of the model on {count} image(s) has run {now - since:.1f} s, past {limit:.1f} s "
                        f"({STUCK_FACTOR} times the slowest it has been, {self.slowest_per_image:.3f} s an image, "
                        f"and at least {self.stuck_floor:g} s)")
        return None

    def timed(self, images: int, seconds: float, recent: bool = True) -> None:
        """A call's time on `images` images, into the model's history (the predictor's warm-up
        call gives the first) and, where `recent`, into its pace (not the warm-up's: the graph's
        first run, on a tiny image, is not the model's pace)."""
        if images:
            self.slowest_per_image = max(self.slowest_per_image, seconds / images)
            if recent:
                with self._pace:
                    self._recent_s = RECENT_DECAY * self._recent_s + seconds
                    self._recent_images = RECENT_DECAY * self._recent_images + images

    def close(self, wait_s: float = 0.0) -> bool:
        """Takes no more jobs (submit raises Closed: the model is unloaded); the runners end once
        those queued are done, letting go of the model. Whether they had ended within `wait_s`."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()
        deadline = time.monotonic() + wait_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    # -- the model thread's side --
    def _serve(self, runner: int) -> None:
        while True:
            batch = self._next_batch(runner)
            if batch is None:  # (closed, and nothing left to do)
                return
            if not batch:  # (every job waiting was given up meanwhile: no call on no image)
                continue
            count = self.busy_images[runner]
            jobs = {job for job, _, _ in batch}
            self._running |= jobs
            try:
                if self._calls is not None:
                    self._calls.acquire()  # (a call of another model's may be running: the call starts after it)
                    with self._ready:
                        self.busy_since[runner] = time.monotonic()
                try:
                    self._compute(batch)
                finally:
                    if self._calls is not None:
                        self._calls.release()
                self.timed(count, time.monotonic() - self.busy_since[runner])
            finally:
                with self._ready:
                    self.busy_since[runner] = None
                self._running -= jobs

    def _next_batch(self, runner: int) -> list[tuple[Job, int, int]] | None:
        """(job, start, end) slices of the queued jobs, at most max_batch images in all, and no more
        than this runner's share of what is waiting among the runners that are idle: a lone large
        request goes through every idle runner at once, each on its own slice. The runner is
        counted busy on them (busy_images, busy_since) before the lock is let go, so that
        backlog() never misses images between the queue and the call. None: the batcher is
        closed and nothing is queued."""
        with self._ready:
            self._idle += 1
            while not self._live():
                if self._closed:
                    self._idle -= 1
                    return None
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
            if batch:
                self.busy_images[runner] = sum(end - start for _, start, end in batch)
                self.busy_since[runner] = time.monotonic()
            return batch

    def _live(self) -> bool:
        """Whether a job is queued that is still wanted (those at its head that are cancelled, or
        past their deadline, are dropped: the request thread answers 504 at the deadline)."""
        now = time.monotonic()
        while self._queue and (self._queue[0].cancelled or self._queue[0].deadline <= now):
            self._queue.popleft().cancelled = True
        return bool(self._queue)

    def _waiting_images(self) -> int:
        return sum(len(job.images) - job.taken for job in self._queue if not job.cancelled)

    def _compute(self, batch: list[tuple[Job, int, int]]) -> None:
        # each slice's images, taken here, out of the lock (a lazy request decodes them now): a job
        # given up meanwhile has let go of its images and is left out
        slices = [(job, start, images) for job, start, end in batch
                  if len(images := job.images[start:end]) == end - start and not job.cancelled]
        self._call(slices)

    def _call(self, slices: list[tuple[Job, int, list]]) -> None:
        if not slices:
            return
        try:
            outputs = self._run([image for _, _, images in slices for image in images])
        except Exception as err:  # (whose fault it is is found by running each alone)
            if len(slices) == 1:
                job = slices[0][0]
                if hasattr(err, "index"):  # (the predictor's ImageError: which image, in this slice)
                    err.index += slices[0][1]
                job.fail(err)
                with self._ready:
                    if job in self._queue:
                        self._queue.remove(job)
                return
            for one in slices:
                if not one[0].cancelled:
                    self._call([one])
            return
        probabilities, predicted = outputs
        at = 0
        for job, start, images in slices:
            count = len(images)
            if not job.cancelled:
                job.fill(start, (probabilities[at:at + count], None if predicted is None else predicted[at:at + count]))
            at += count
