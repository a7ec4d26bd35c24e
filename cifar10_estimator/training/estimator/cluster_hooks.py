"""The training hooks that keep a cluster's tasks together, over ``task/``'s coordination.

- ``RestartOnLostPeer``: an all-reduce task whose first session broke (a peer was lost) ends
  for a restart when Estimator creates a second one (``task.allreduce.exit_for_restart``).
- ``FirstStepHook``: marks an all-reduce task's first step for its join deadline
  (``task.allreduce.JoinWithin``).
- ``AgreedStopHook``: stops every all-reduce task at the step they agreed on after a signal
  to any of them (``task.allreduce.AgreedStop``).
- ``ParameterServerWatchdog``: a parameter server that dies mid-run and comes back on the same
  address is recovered by TensorFlow (``MonitoredSession`` recreates the sessions; the chief
  restores the latest checkpoint into the new one). One that does not come back would leave
  every trainer retrying forever; the watchdog ends the task with one line instead.
"""

import logging
import os
import sys
import threading
import time
from typing import Callable, Mapping, Optional

import tensorflow as tf

from cifar10_estimator.task import allreduce, peers

log = logging.getLogger("cifar10_estimator")

# Exit status of a trainer that lost a parameter server for good: a failure, not a signal, so
# an orchestrator that restarts signalled pods (Kubeflow's restartPolicy ExitCode) does not loop.
LOST_PS_EXIT_STATUS = 1


class RestartOnLostPeer(tf.estimator.SessionRunHook):
    """Ends the task for a restart when Estimator creates a second training session: the
    first one broke on a lost task, and collective operations do not recover in-process."""

    def __init__(self, task: str, job_dir: str, exit_now: Callable[[int], None] = os._exit):
        self._task, self._job_dir, self._exit_now = task, job_dir, exit_now
        self._sessions = 0

    def after_create_session(self, session, coord):
        self._sessions += 1
        if self._sessions > 1:
            allreduce.exit_for_restart(self._task, "its training session broke (a task of the "
                                       "job was lost or restarted)", self._job_dir,
                                       self._exit_now)


class FirstStepHook(tf.estimator.SessionRunHook):
    """Tells ``deadline`` (a started ``JoinWithin``) that a step ran: the group formed."""

    def __init__(self, deadline: allreduce.JoinWithin):
        self._deadline = deadline

    def after_run(self, run_context, run_values):
        self._deadline.joined()


class AgreedStopHook(tf.estimator.SessionRunHook):
    """Before each step, reads the step ``agreed`` holds (written by any task, this one when
    ``signalled()``); after the step that reaches it, stops the session. ``on_session`` runs
    once the session exists (and TensorFlow's servers with it), in the main thread."""

    def __init__(self, agreed: allreduce.AgreedStop, signalled: Callable[[], bool],
                 on_session: Callable[[], None] = lambda: None):
        self._agreed, self._signalled, self._on_session = agreed, signalled, on_session

    def begin(self):
        self._step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self._on_session()
        self._agreed.start_step = int(session.run(self._step))

    def before_run(self, run_context):
        return tf.estimator.SessionRunArgs(self._step)

    def after_run(self, run_context, run_values):
        agreed = self._agreed
        step = int(run_values.results) + 1  # the step just run
        if self._signalled() and agreed.stop_step is None:
            agreed.stop_step = agreed.request(step)
        found = agreed.read()
        # An agreement from before this task started is an earlier run's.
        if found is not None and found > agreed.start_step:
            agreed.stop_step = found
        if agreed.stop_step is not None and step >= agreed.stop_step:
            run_context.request_stop()


class ParameterServerWatchdog(tf.estimator.SessionRunHook):
    """Ends a trainer whose parameter servers stay unreachable while no step completes.

    Every ``check_secs`` a thread looks at the time since the last completed step; past
    ``timeout_secs`` it probes the parameter servers, and if one still does not answer it logs
    one line (what happened, how to resume) and exits the process with status 1. TensorFlow's
    recovery loop gives no other way out: it retries session creation forever.
    """

    def __init__(self, ps_tasks: Mapping[str, str], timeout_secs: float, resume_hint: str,
                 check_secs: float = 5.0,
                 exit_fn: Callable[[int], None] = os._exit):
        """
        Args:
          ps_tasks: parameter server name (``ps:0``) -> ``host:port``.
          timeout_secs: how long without a step and without a parameter server to accept.
          resume_hint: what the user should do, appended to the message.
          check_secs: how often the thread looks.
          exit_fn: ends the process (``os._exit``: the session cannot be closed cleanly).
        """
        self._ps = dict(ps_tasks)
        self._timeout = timeout_secs
        self._hint = resume_hint
        self._check = check_secs
        self._exit = exit_fn
        self._last_step = time.monotonic()
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def begin(self):
        self._last_step = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="ps_watchdog",
                                            daemon=True)
            self._thread.start()

    def after_run(self, run_context, run_values):
        self._last_step = time.monotonic()

    def end(self, session):
        self._done.set()

    def _watch(self):
        while not self._done.wait(self._check):
            idle = time.monotonic() - self._last_step
            if idle < self._timeout:
                continue
            lost = [f"{name} at {address}" for name, address in self._ps.items()
                    if not peers.answers(name, address, peers.PROBE_SECS)]
            if lost and not self._done.is_set():
                log.error("lost %s: no answer and no training step for %.0f s "
                          "(--cluster-timeout-secs); %s", ", ".join(lost), idle, self._hint)
                for handler in log.handlers:
                    handler.flush()
                sys.stderr.flush()
                self._exit(LOST_PS_EXIT_STATUS)
                return
