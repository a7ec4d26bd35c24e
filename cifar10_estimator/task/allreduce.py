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

- ``RestartOnLostPeer``: a second session in a task (the first broke) ends the task at once
  with ``RESTART_STATUS``, and so does a collective error out of training (``is_lost_peer``).
- ``JoinWithin``: a task whose first step has not run within ``--cluster-timeout-secs`` (a
  worker that never came) ends with one line and status 1.
- ``AgreedStop``: a signal to any task (SIGTERM, SIGINT) stops every task at the same step,
  so the chief saves that step and nothing is lost: the signalled task writes the step to stop
  at into the job dir (``STOP_FILE``), every task reads it before each step.
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


class RestartOnLostPeer(tf.estimator.SessionRunHook):
    """Ends the task for a restart when Estimator creates a second training session: the
    first one broke on a lost task, and collective operations do not recover in-process."""

    def __init__(self, task: str, job_dir: str, exit_now: Callable[[int], None] = os._exit):
        self._task, self._job_dir, self._exit_now = task, job_dir, exit_now
        self._sessions = 0

    def after_create_session(self, session, coord):
        self._sessions += 1
        if self._sessions > 1:
            exit_for_restart(self._task, "its training session broke (a task of the job was "
                             "lost or restarted)", self._job_dir, self._exit_now)


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

    def hook(self) -> tf.estimator.SessionRunHook:
        """A training hook that marks the first step."""
        deadline = self

        class _FirstStep(tf.estimator.SessionRunHook):
            def after_run(self, run_context, run_values):
                deadline.joined()

        return _FirstStep()


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
        agreed = self._read()
        if agreed is None or agreed > step or agreed <= (self.start_step or 0):
            storage.write_bytes_atomic(self.path, json.dumps({"step": step}).encode())
            agreed = step
        return agreed

    def _read(self) -> Optional[int]:
        try:
            return int(json.loads(storage.read_bytes(self.path))["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def hook(self, signalled: Callable[[], bool],
             on_session: Callable[[], None] = lambda: None) -> tf.estimator.SessionRunHook:
        """The training hook: before each step, reads the agreed step (written by any task,
        this one when ``signalled()``); after the step that reaches it, stops the session.
        ``on_session`` runs once the session exists (and TensorFlow's servers with it), in the
        main thread."""
        agreed = self

        class _Hook(tf.estimator.SessionRunHook):
            def begin(self):
                self._step = tf.compat.v1.train.get_global_step()

            def after_create_session(self, session, coord):
                on_session()
                agreed.start_step = int(session.run(self._step))

            def before_run(self, run_context):
                return tf.estimator.SessionRunArgs(self._step)

            def after_run(self, run_context, run_values):
                step = int(run_values.results) + 1  # the step just run
                if signalled() and agreed.stop_step is None:
                    agreed.stop_step = agreed.request(step)
                found = agreed._read()
                # An agreement from before this task started is an earlier run's.
                if found is not None and found > agreed.start_step:
                    agreed.stop_step = found
                if agreed.stop_step is not None and step >= agreed.stop_step:
                    run_context.request_stop()

        return _Hook()

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
