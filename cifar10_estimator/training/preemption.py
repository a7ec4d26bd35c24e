"""SIGTERM and SIGINT in a task: a preempted run saves where it is and exits for a restart.

Kubernetes evicting a pod, Slurm preempting a job and a spot VM being reclaimed all send
SIGTERM, wait a grace period (Kubernetes: ``terminationGracePeriodSeconds``, 30 s by default)
and then SIGKILL. A ``Preemption`` installed for the task turns the first SIGTERM or SIGINT into:

- in a training session (a local run, the chief, a worker): the step in flight finishes (the
  signal is handled when the step returns to Python), the training hook asks the session to
  stop, and the session's checkpoint hook saves the current global step on the way out (only
  the chief and a local run save; a worker's variables live on the parameter servers). A local
  evaluation that would follow is not run.
- in a parameter server: it serves on until the chief, stopped by the same signal, has saved
  (``task.peers.run_parameter_server``), then exits as below.
- anywhere else (start-up, an evaluation, the evaluator task, the export):
  the process ends at once, after the callbacks given to ``before_exit`` (the log line, the
  job dir's lock); nothing there is unsaved. It ends with ``os._exit`` from the handler rather
  than an exception: the handler may run inside TensorFlow's C++ (a session polls for signals),
  where an exception becomes a pybind11 ``RuntimeError`` instead of unwinding cleanly.

The first signal also restores the signals' default action, so a second one ends the process
at once, even in the middle of the save. A process whose parent's death signals it (a task of
the local launcher: ``platform.parent_death``) handles that signal as well, once: the kernel
may repeat it, and a repeat is ignored rather than taken for a second signal. The task then exits with status 128 + the signal's
number (143 for SIGTERM), which Kubernetes' ``ExitCode`` restart policy and the local cluster
launcher take for a restartable stop. ``install`` changes process-wide state: only the trainer's
entry point calls it, and only on the main thread (Python delivers signals there, and
``signal.signal`` works nowhere else); ``restore`` puts the handlers back when it returns. A
``Preemption`` that is not installed handles nothing: the caller's handlers stay in charge.
"""

import logging
import os
import signal
import sys
import threading
from typing import Callable, Optional

import tensorflow as tf

from cifar10_estimator.errors import Stopped, close_event_files
from cifar10_estimator.model.checkpoints import checkpoint_step

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How long a process that ends at once for a signal waits for its event files to close (within
# Kubernetes' default grace period of 30 s).
_CLOSE_SECS = 10.0


def on_main_thread() -> bool:
    """Whether this thread may install signal handlers (Python's main thread only)."""
    return threading.current_thread() is threading.main_thread()


class Preemption:
    """The signal state of one task; the session hooks that act on it are
    ``training.estimator.preemption_hooks``'."""

    def __init__(self):
        self.signum: Optional[int] = None
        self.last_step: Optional[int] = None  # the global step after the last training step
        # Set by the session hooks (estimator.preemption_hooks): a signal in a training
        # session waits for its step; one in an evaluation or anywhere else ends the process.
        self.training = False
        self.evaluating = False
        # A parameter server's serving loop (task.peers) acts on a signal itself.
        self.serving = False
        self._before_exit: list[Callable[[Stopped], None]] = []
        self._previous: dict = {}
        self._handled: tuple[int, ...] = SIGNALS
        self._once: Optional[int] = None  # the parent-death signal, taken once

    def before_exit(self, callback: Callable[[Stopped], None]) -> None:
        """Runs ``callback`` before the process ends at once for a signal."""
        self._before_exit.append(callback)

    def install(self, parent_death: int = 0) -> "Preemption":
        """Handles SIGTERM and SIGINT from now on (main thread only), and ``parent_death``, the
        signal this process gets when its parent ends (``platform.parent_death``), if any."""
        # (SIGKILL, which a Ray node's runner sets, and SIGSTOP cannot be handled.)
        if parent_death and parent_death not in (*SIGNALS, signal.SIGKILL, signal.SIGSTOP):
            self._once = parent_death
            self._handled = (*SIGNALS, parent_death)
        for signum in self._handled:
            self._previous[signum] = signal.signal(signum, self._on_signal)
            # Restart system calls the signal interrupts (SA_RESTART): TensorFlow's collective
            # operations wait in calls that do not retry on EINTR, and an all-reduce step
            # hung for good when a signal interrupted it.
            signal.siginterrupt(signum, False)
        return self

    def reinstall(self) -> None:
        """Takes SIGTERM and SIGINT back (main thread only) from a library that replaced the
        process's handler: TensorFlow's coordination service, which multi-worker strategies
        start, installs its own SIGTERM notifier, and a signal then never reaches Python."""
        if self._previous and self.signum is None:
            for signum in self._handled:
                signal.signal(signum, self._on_signal)
                signal.siginterrupt(signum, False)

    def restore(self) -> None:
        """Puts back the handlers ``install`` replaced (a command that returns to a caller).

        Putting a handler back also clears the SA_RESTART that ``install`` set, as it was
        before. A handler installed outside Python (``signal.signal`` returned None for it)
        cannot be put back from Python: the default action takes its place, rather than a
        handler that would end the caller's process."""
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            for other in SIGNALS:  # a second signal: the default action, at once
                signal.signal(other, signal.SIG_DFL)
            if self._once:  # ...but the kernel's repeats of the parent's death: nothing
                signal.signal(self._once, signal.SIG_IGN)
        elif signum == self._once:
            return
        if self.serving or (self.training and not self.evaluating):
            # The training hook stops the session after the step in flight; a parameter
            # server's loop stops once the chief has saved.
            return
        self._exit_now(Stopped(signum))

    def _exit_now(self, stop: Stopped) -> None:
        try:
            for callback in reversed(self._before_exit):
                callback(stop)
        finally:
            # A signal during an evaluation (Estimator evaluates at the first checkpoint after
            # the start, whatever the throttle) ends the process here: its event files are
            # closed as on any other exit for a signal (errors.run_cli).
            close_event_files(timeout=_CLOSE_SECS)
            for handler in logging.getLogger("cifar10_estimator").handlers:
                handler.flush()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(stop.exit_status)

    def check(self) -> None:
        """Raises ``errors.Stopped`` if a signal came (after a session that stopped for it)."""
        if self.signum is not None:
            raise Stopped(self.signum)


def stopped_line(stop: Stopped, role, job_dir: Optional[str],
                 last_step: Optional[int]) -> str:
    """What a task that received a signal (or stopped with one that did) says before it
    exits; ``role`` is its ``config.role.Role``."""
    head = stop.why or f"received {stop.name}"
    if role.task_type == "ps":
        return (f"{head}: parameter server stopped (the chief's checkpoints hold the "
                f"variables); start it again with the same command")
    if role.task_type == "evaluator":
        return f"{head}: evaluator stopped; rerun the same command to evaluate on"
    at = f" at step {last_step}" if last_step is not None else " before training started"
    if not role.is_chief:
        return (f"{head}{at}: worker stopped (the chief saves the checkpoints); rerun the same "
                f"command to rejoin")
    latest = tf.train.latest_checkpoint(job_dir) if job_dir else None
    if latest and last_step is not None and checkpoint_step(latest) >= last_step:
        kept = f"saved {latest}"
    else:
        kept = f"the latest checkpoint is {latest}" if latest else "no checkpoint yet"
    return f"{head}{at}: {kept}; rerun the same command to resume"
