"""The job's processes of a local run, supervised as SageMaker supervises a job's hosts: each
host's log lines prefixed with its name, a stop sent as SIGTERM then SIGKILL after 120 s, every host
stopped when one fails, and this runner's own Ctrl-C (or a closed terminal) passed on as a stop."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

from keras_pipe_launch.common.untrusted import log_line

STOP_GRACE_S = 120  # SageMaker sends SIGKILL 120 s after SIGTERM
RELAY_DRAIN_S = 10  # how long the hosts' last lines are waited for once every host has ended


class Console:
    """Where the runner's lines and the hosts' logs go, one line at a time from any thread."""

    def __init__(self, out):
        self.out = out
        self._lock = threading.Lock()
        self._lost = False

    def say(self, message: str) -> None:
        self.write(f"launch | {message}")

    def write(self, line: str) -> None:
        """Prints a line; once the output is gone (a closed terminal: EIO, a closed pipe: EPIPE),
        carries on silently, since the jobs' logs must still be drained or they would block."""
        with self._lock:
            if self._lost:
                return
            try:
                print(line, file=self.out, flush=True)
            except (OSError, ValueError):
                self._lost = True


class Supervisor:
    """Starts one process per host, relays its output, and stops them all together."""

    def __init__(self, console: Console):
        self.console = console
        self.stopping = False
        self.interrupted = False  # stopped by the user (Ctrl-C, SIGTERM, a closed terminal), not by a failure
        self._jobs: dict[str, subprocess.Popen] = {}
        self._relays: list[threading.Thread] = []
        self._kill_timer: threading.Timer | None = None

    def start(self, host: str, command: list[str], env: dict[str, str]) -> None:
        # a session of its own: a terminal's Ctrl-C reaches only this runner, which forwards it
        # as SageMaker would (SIGTERM, then SIGKILL after the grace period)
        job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True, text=True, errors="replace", bufsize=1)
        self._jobs[host] = job
        relay = threading.Thread(target=self._relay, args=(host, job), daemon=True, name=f"log-{host}")
        relay.start()
        self._relays.append(relay)

    def _relay(self, host: str, job: subprocess.Popen) -> None:
        for line in job.stdout:  # (a job's code is anyone's: its lines may hold a terminal's escape codes)
            self.console.write(f"{host} | {log_line(line)}")

    def wait(self) -> dict[str, int]:
        """Every host's exit code (as a shell gives it), in the order they were started. When one
        fails, the others are stopped, as SageMaker does (a host alone would wait for its peers
        until its collectives time out)."""
        codes: dict[str, int] = {}
        while len(codes) < len(self._jobs):
            for host, job in self._jobs.items():
                if host not in codes and job.poll() is not None:
                    codes[host] = shell_code(job.returncode)
                    if codes[host] and len(codes) < len(self._jobs) and not self.stopping:
                        self.stop(f"{host} ended with exit code {codes[host]}: stopping the other hosts")
            time.sleep(0.1)
        # a host's last lines (often why it failed) are said before what follows its end; a
        # process it left behind that holds the pipe open must not hold the runner too
        deadline = time.monotonic() + RELAY_DRAIN_S
        for relay in self._relays:
            relay.join(timeout=max(0.0, deadline - time.monotonic()))
        return {host: codes[host] for host in self._jobs}

    @contextlib.contextmanager
    def forwarding_signals(self) -> Iterator[None]:
        """While inside: Ctrl-C and SIGTERM stop the job (a second one kills it), and a closed
        terminal (SIGHUP, whose default would kill this runner alone and leave the jobs, in
        sessions of their own, running unattended) stops it too. Afterwards no kill is pending."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hangup)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._kill_timer:
                self._kill_timer.cancel()

    def _on_signal(self, signum, frame) -> None:
        self.interrupted = True
        if self.stopping:
            self.console.say("second interrupt: killing the job")
            self.signal_all(signal.SIGKILL)
            return
        self.stop(f"stopping: SIGTERM sent to the job (SIGKILL in {STOP_GRACE_S} s; interrupt again to kill now)")

    def _on_hangup(self, signum, frame) -> None:
        self.interrupted = True
        if not self.stopping:
            self.stop(f"the terminal closed (SIGHUP): SIGTERM sent to the job (SIGKILL in {STOP_GRACE_S} s)")

    def stop(self, message: str) -> None:
        """What SageMaker does to stop a job: SIGTERM, then SIGKILL after the grace period."""
        self.stopping = True
        self.console.say(message)
        self.signal_all(signal.SIGTERM)
        self._kill_timer = threading.Timer(STOP_GRACE_S, self.signal_all, args=(signal.SIGKILL,))
        self._kill_timer.daemon = True  # must not keep the runner alive once the job has stopped
        self._kill_timer.start()

    def signal_all(self, signum: int) -> None:
        for job in list(self._jobs.values()):
            if job.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # (it ended meanwhile)
                    job.send_signal(signum)


@contextlib.contextmanager
def stopped_by_any_signal() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP (a closed terminal) interrupt as Ctrl-C does: the
    KeyboardInterrupt handler that says what goes on and what to do next runs for all three,
    instead of the process ending silently."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def shell_code(returncode: int) -> int:
    """Popen says -N for a process killed by signal N; shells (and SageMaker's logs) say 128 + N."""
    return 128 - returncode if returncode < 0 else returncode
