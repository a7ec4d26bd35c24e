"""Collective all-reduce: the tf.distribute strategies the trainer runs through Estimator's
``train_distribute``, and what keeps a multi-worker all-reduce job whole.

``make_strategy`` builds ``mirrored`` (``tf.distribute.MirroredStrategy`` over one machine's
GPUs, or its logical CPU devices) and ``multi-worker-mirrored``
(``tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy``, which Estimator 2.15
runs with the cluster of ``TF_CONFIG``: a chief and workers, no parameter servers). Every step
all-reduces every replica's gradients, so the replicas of all workers step together.

An all-reduce step needs every worker. TensorFlow cannot mend a group that lost one: after a
worker dies, the others' collective operations fail, Estimator's ``MonitoredSession`` creates a
new session, and the collective executor stays aborted until the process restarts ("Restart
your program to reset"). So this module turns any loss into a restart of the whole job from its
latest checkpoint, which Kubernetes' ExitCode restart policy and the local launcher perform:

- a second session in a task (the first broke) ends the task at once with ``RESTART_STATUS``
  (``exit_for_restart``, called by ``training.estimator.cluster_hooks.RestartOnLostPeer``), and so does
  a collective error out of training (``is_lost_peer``).
- ``JoinWithin``: a task whose first step has not run within ``--cluster-timeout-secs`` (a
  worker that never came) ends with one line and status 1 (its first step is marked by
  ``training.estimator.cluster_hooks.FirstStepHook``).
- ``AgreedStop``: a signal to any task (SIGTERM, SIGINT) stops every task at the same step,
  so the chief saves that step and nothing is lost: the signalled task writes the step to stop
  at into the job dir (``STOP_FILE``), every task reads it before each step
  (``training.estimator.cluster_hooks.AgreedStopHook``).
"""

import json
import logging
import os
import threading
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from cifar10_estimator import storage
from cifar10_estimator.config.settings import MIRRORED, MULTI_WORKER_MIRRORED
from cifar10_estimator.errors import UserError

log = logging.getLogger("cifar10_estimator")

# A stop for a restart: 128 + SIGTERM's 15, the status of a preempted task, which Kubernetes'
# ExitCode restart policy and the local launcher restart (128-255).
RESTART_STATUS = 143
# JOB/<this>: the global step an all-reduce job stops at, for a signal to one of its tasks.
STOP_FILE = "allreduce_stop.json"
# Steps between the signal and the agreed stop: the other tasks read the file before each
# step, and all-reduce keeps them within one step of each other.
_STOP_MARGIN = 2
# TensorFlow errors a lost peer raises in the others' collective operations.
_LOST_PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.CancelledError,
                     tf.errors.AbortedError, tf.errors.DeadlineExceededError,
                     tf.errors.InternalError)


def make_strategy(name: str, devices: Sequence[str]) -> tf.distribute.Strategy:
    """The strategy of ``--distribution-strategy name`` over this machine's ``devices``."""
    if name == MIRRORED:
        return tf.distribute.MirroredStrategy(list(devices))
    if name == MULTI_WORKER_MIRRORED:
        # One replica per local GPU, or one on the CPU; the cluster comes from TF_CONFIG.
        return tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()
    raise ValueError(f"no tf.distribute strategy for {name!r}")


def is_lost_peer(error: BaseException) -> bool:
    """Whether a TensorFlow error out of an all-reduce job's training means a lost task."""
    return isinstance(error, _LOST_PEER_ERRORS)


def exit_for_restart(task: str, why: str, job_dir: str,
                     exit_now: Callable[[int], None] = os._exit) -> None:
    """Logs why this task of an all-reduce job stops for a restart, and exits."""
    latest = tf.train.latest_checkpoint(job_dir)
    log.info("%s: %s; an all-reduce job cannot go on without every task, so this task exits "
             "with status %d for a restart of the job, which resumes from %s", task, why,
             RESTART_STATUS, latest or "the start (no checkpoint yet)")
    for handler in log.handlers:
        handler.flush()
    exit_now(RESTART_STATUS)


class JoinWithin:
    """A deadline for the first step: the all-reduce group forms only once every task runs."""

    def __init__(self, seconds: float, what: str, exit_now: Callable[[int], None] = os._exit):
        self._done = threading.Event()
        self._seconds, self._what, self._exit_now = seconds, what, exit_now
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="allreduce-join-deadline")

    def start(self) -> "JoinWithin":
        self._thread.start()
        return self

    def joined(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        if self._done.wait(self._seconds):
            return
        log.info("the all-reduce job did not run its first step within %d s "
                 "(--cluster-timeout-secs): %s", self._seconds, self._what)
        for handler in log.handlers:
            handler.flush()
        self._exit_now(1)


class AgreedStop:
    """Every task of an all-reduce job stops at one step after a signal to any of them."""

    def __init__(self, job_dir: str):
        self.path = storage.join(job_dir, STOP_FILE)
        self.start_step: Optional[int] = None  # the global step this task started at
        self.stop_step: Optional[int] = None  # the step the job agreed to stop at, once read

    def clear(self) -> None:
        """Forgets an agreement of an earlier run (the chief, before its first step)."""
        storage.remove(self.path)

    def request(self, current_step: int) -> int:
        """Asks every task to stop at ``current_step`` + a margin (a signal came here)."""
        step = current_step + _STOP_MARGIN
        agreed = self.read()
        if agreed is None or agreed > step or agreed <= (self.start_step or 0):
            storage.write_bytes_atomic(self.path, json.dumps({"step": step}).encode())
            agreed = step
        return agreed

    def read(self) -> Optional[int]:
        """The step the job agreed to stop at, if any task wrote one."""
        try:
            return int(json.loads(storage.read_bytes(self.path))["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @property
    def stopped(self) -> bool:
        return self.stop_step is not None


def wait_for_file(path: str, timeout_secs: float, what: str, poll_secs: float = 0.5) -> None:
    """Waits until ``path`` exists (a worker for the chief's settings record)."""
    deadline = time.monotonic() + timeout_secs
    while not storage.exists(path):
        if time.monotonic() > deadline:
            raise UserError(f"{what} did not appear within {timeout_secs:g} s "
                            f"(--cluster-timeout-secs): {path}")
        time.sleep(poll_secs)
