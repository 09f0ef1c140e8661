"""Which tf.distribute strategy runs the job, from the environment SageMaker gives it.

  several hosts (resourceconfig.json)  MultiWorkerMirroredStrategy; TF_CONFIG is built from the
                                       hosts, the chief is the first host in sorted order
  one host, several GPUs               MirroredStrategy
  otherwise                            the default strategy (one device)

`batch_size` is the global batch: each step trains on batch_size examples in all, split evenly
between the replicas (GPUs, or CPUs of several hosts). The learning rate is the one for that
global batch, so a job behaves the same on one GPU or on sixteen, and needs no rescaling.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import time

import numpy as np
import tensorflow as tf

from keras_pipe_train.settings.contract import ResourceConfig
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.settings.tracing import traced

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Cluster:
    strategy: tf.distribute.Strategy
    workers: int
    worker_index: int
    is_chief: bool
    # several hosts: host:port of the chief's TensorFlow server, and how long a collective waits
    chief_address: str | None = None
    collective_timeout_s: float | None = None
    _any: object = dataclasses.field(default=None, init=False, repr=False)  # the traced collectives
    _gather: object = dataclasses.field(default=None, init=False, repr=False)

    @property
    def replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    @property
    def local_replicas(self) -> int:
        return self.replicas // self.workers

    @property
    def multi_worker(self) -> bool:
        return self.workers > 1

    def any_worker(self, flag: bool) -> bool:
        """Whether `flag` is true on any worker: the same answer everywhere. A collective: every
        worker calls it at the same point, and it waits (up to collective_timeout) for them all."""
        if not self.multi_worker:
            return flag
        if self._any is None:
            strategy = self.strategy
            self._any = traced(lambda value: strategy.reduce(
                "sum", strategy.run(lambda: tf.identity(value)), axis=None))
        return float(self._any(tf.constant(1.0 if flag else 0.0))) > 0

    def all_texts(self, text: str) -> list[str]:
        """Every worker's `text`, in worker order: the same list on every worker. A collective (two:
        the lengths, then the texts padded to the longest), called by every worker at the same point."""
        if not self.multi_worker:
            return [text]
        if self._gather is None:
            strategy = self.strategy
            self._gather = traced(lambda value: strategy.gather(
                strategy.run(lambda: tf.identity(value)), axis=0), reduce_retracing=True)
        data = list(text.encode())
        # (each of a worker's replicas gives the same value: one row per replica, workers in order)
        lengths = self._gather(tf.constant([len(data)], tf.int64)).numpy()[::self.local_replicas]
        width = max(1, int(lengths.max()))
        rows = self._gather(tf.constant([data + [0] * (width - len(data))], tf.int32)).numpy()[::self.local_replicas]
        return [bytes(row[:length].astype(np.uint8)).decode() for row, length in zip(rows, lengths)]

    def leave_together(self) -> None:
        """The last step of a multi-host job, on every host, before it exits. A collective can be
        over on one host while a peer still fetches its last part from it: a host that exits right
        after the job's last collective fails its peer with "Socket closed" (the chief, after its
        export, can fail so). So: one more collective, which no host passes
        before every host has finished the one before; then the chief leaves, and the others leave
        only once its TensorFlow server is gone (up to collective_timeout_s), answering its last fetches until
        then. A worker's part of this one may fail as the chief leaves: nothing is lost then (and
        if the chief failed instead, its own exit code fails the job)."""
        if not self.multi_worker:
            return
        try:
            self.any_worker(False)
        except tf.errors.OpError as err:
            if self.is_chief:
                raise
            log.info("the chief left, or failed (its log says), during the last collective (%s)", type(err).__name__)
        if not self.is_chief:
            log.info("done: waiting for the chief (%s) to exit", self.chief_address)
            if not wait_until_gone(self.chief_address, self.collective_timeout_s):
                log.warning("the chief (%s) still answers after %.0f s: leaving anyway", self.chief_address,
                            self.collective_timeout_s)

    def per_replica_batch(self, global_batch: int) -> int:
        if global_batch % self.replicas:
            raise UserError(
                f"hyperparameter batch_size ({global_batch}) must be a multiple of the number of "
                f"replicas ({self.replicas}: {self.workers} host(s) x {self.local_replicas} device(s))"
            )
        return global_batch // self.replicas


def wait_until_gone(address: str, wait_s: float, every_s: float = 0.2) -> bool:
    """Waits until nothing accepts connections at host:port (refused, unreachable or silent: a
    live process's listening socket is accepted by its kernel however busy the process is).
    Returns False if something still does after wait_s."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
                pass
        except OSError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)


def keep_python_sigterm_handler() -> None:
    """Puts Python's SIGTERM handler (keras_pipe_train.main's: stop after this step, save a checkpoint) back.
    Starting TensorFlow's multi-worker runtime replaces it with a C++ one of its own (the
    coordination service's preemption notifier), and the job then ignored SIGTERM until SIGKILL."""
    handler = signal.getsignal(signal.SIGTERM)
    if callable(handler):
        signal.signal(signal.SIGTERM, handler)


def cluster_for(resources: ResourceConfig, addresses: dict[str, str], collective_timeout_s: float) -> Cluster:
    hosts = sorted(resources.hosts)
    gpus = tf.config.list_physical_devices("GPU")
    if len(hosts) > 1:
        index = hosts.index(resources.current_host)
        os.environ["TF_CONFIG"] = json.dumps({
            "cluster": {"worker": [addresses[h] for h in hosts]},
            "task": {"type": "worker", "index": index},
        })
        # A collective that waits longer than this means a peer is gone: fail rather than hang
        # until SageMaker's max runtime.
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout_s)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        keep_python_sigterm_handler()
        cluster = Cluster(strategy, len(hosts), index, index == 0, chief_address=addresses[hosts[0]],
                          collective_timeout_s=collective_timeout_s)
        name = "MultiWorkerMirroredStrategy"
    elif len(gpus) > 1:
        cluster, name = Cluster(tf.distribute.MirroredStrategy(), 1, 0, True), "MirroredStrategy"
    else:
        cluster, name = Cluster(tf.distribute.get_strategy(), 1, 0, True), "the default strategy (one device)"
    # (type(strategy) would say CollectiveAllReduceStrategy, TF's internal name for MWMS)
    log.info("%s: %d worker(s), %d replica(s) in sync; this is worker %d%s", name, cluster.workers,
             cluster.replicas, cluster.worker_index, " (chief)" if cluster.is_chief else "")
    return cluster
