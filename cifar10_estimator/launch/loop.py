"""A local training cluster's processes: one per task, started, watched and stopped.

``Cluster`` starts one process per task (``layout``), each running the trainer command line
(``python -m cifar10_estimator`` + the trainer's flags) with its own ``TF_CONFIG``, and streams
each task's output with a ``[chief]``, ``[worker0]``, ``[ps0]``, ``[evaluator]`` prefix. A task
that a signal stopped (exit status 128 or more, e.g. 143 after SIGTERM) is started again, as
Kubernetes' ExitCode restart policy does; when a task fails (status 1 to 127), every other task
is stopped. Training is done when the chief, the workers and the
evaluator have exited 0; parameter servers exit by themselves once every training task has
reported (``task.peers.run_parameter_server``) and are stopped if they linger. Every task
shares the trainer's ``--job-dir``, as a real cluster must (on several hosts: shared storage).

It is for trying distribution on one machine and for tests; several hosts need a cluster
manager (see the Kubernetes TFJob in ``k8s/``). The ``cluster`` command is its command line;
``ray_actors.RayCluster`` is the same supervision of tasks on a Ray cluster's nodes.
"""

import json
import signal
import subprocess
import sys
import threading
import time
from typing import Mapping, Optional, Sequence, TextIO

from cifar10_estimator.launch.layout import LaunchedTask, Network

_POLL_SECS = 0.2
# After the chief has finished, a worker needs at most one more step and its report to the
# parameter servers; one that is still running this much later is hung.
_WORKER_GRACE_SECS = 120
# Parameter servers exit as soon as every trainer has reported; this only bounds a straggler.
_PS_GRACE_SECS = 30
# SIGTERM first so a task can flush its log; SIGKILL after this.
_TERM_GRACE_SECS = 10


class Cluster:
    """Starts, watches and stops the processes of a local cluster."""

    def __init__(self, tasks: Sequence[LaunchedTask], trainer_args: Sequence[str],
                 env: Mapping[str, str], out: TextIO = sys.stdout,
                 python: str = sys.executable, network: Optional[Network] = None):
        self.tasks = list(tasks)
        self.network = network or Network()
        self.trainer_args = list(trainer_args)
        self.out = out
        self.python = python
        self.env = dict(env)  # the tasks' environment (the command's), TF_CONFIG set per task
        self._lock = threading.Lock()

    def say(self, message: str) -> None:
        with self._lock:
            self.out.write(f"[cluster] {message}\n")
            self.out.flush()

    def _stream(self, task: LaunchedTask) -> None:
        prefix = f"[{task.name}] "
        for line in task.process.stdout:
            with self._lock:
                self.out.write(prefix + line if line.endswith("\n") else prefix + line + "\n")
                self.out.flush()

    def start(self) -> None:
        cluster = json.loads(self.tasks[0].tf_config)["cluster"]
        self.say(self.network.line([a for job in cluster.values() for a in job]))
        self.say("cluster " + json.dumps(cluster))
        for task in self.tasks:
            self._launch(task)

    def _spawn(self, task: LaunchedTask) -> subprocess.Popen:
        """Starts the trainer process of ``task`` on this host. (``ray_actors`` starts it on
        a Ray node instead, behind the same interface: poll, terminate, kill, wait, pid and
        stdout.)"""
        env = dict(self.env, TF_CONFIG=task.tf_config, PYTHONUNBUFFERED="1")
        return subprocess.Popen(
            [self.python, "-m", "cifar10_estimator", *self.trainer_args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            # Own process group: Ctrl-C reaches the launcher, which stops tasks in order.
            start_new_session=True,
            # Into the cluster's namespace between fork and exec, where the child is
            # single-threaded (setns into a user namespace requires it); no wrapper process, so
            # the pid said below is the task's.
            preexec_fn=self.network.join if self.network.namespace is not None else None)

    def _launch(self, task: LaunchedTask) -> None:
        task.process = self._spawn(task)
        task.reader = threading.Thread(target=self._stream, args=(task,), daemon=True)
        task.reader.start()
        self.say(f"started {task.name} (pid {task.process.pid}{self._where(task)})")

    def _where(self, task: LaunchedTask) -> str:
        return ""

    def _replace(self, failed: Sequence[LaunchedTask]) -> bool:
        """Whether the job was placed and started again after ``failed`` tasks ended: never
        here (a local task that failed fails the job); ``ray_actors`` places a job whose
        node was lost again."""
        return False

    def _restart_signalled(self) -> None:
        """Starts again every task that a signal stopped (not the launcher). This is what
        Kubernetes' ExitCode restart policy does; the task resumes as after a restart."""
        for task in self.tasks:
            code = task.exit_code
            if task.signalled(code):
                how = (f"exit status {code}" if code > 0
                       else f"killed by {signal.Signals(-code).name}")
                self.say(f"{task.name} stopped by a signal ({how}): starting it again")
                if task.reader:
                    task.reader.join(timeout=5)
                self._launch(task)

    def stop(self, tasks: Sequence[LaunchedTask]) -> None:
        """SIGTERM, then SIGKILL after a grace period, for the running ``tasks``."""
        running = [t for t in tasks if t.process and t.process.poll() is None]
        for task in running:
            task.stopped = True
            task.process.terminate()
        deadline = time.monotonic() + _TERM_GRACE_SECS
        for task in running:
            try:
                task.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                task.process.kill()
                task.process.wait()

    def _finish_streams(self) -> None:
        for task in self.tasks:
            if task.reader:
                task.reader.join(timeout=5)

    def run(self, timeout_secs: Optional[float] = None) -> int:
        """Starts the tasks and supervises them; returns 0 when training ended cleanly."""
        started = time.monotonic()
        chief_done_at = None
        ps_wait_from = None
        failed: Optional[str] = None
        try:
            self.start()
            while True:
                time.sleep(_POLL_SECS)
                now = time.monotonic()
                self._restart_signalled()
                # A task a signal stopped after the restart pass above is restarted by the next
                # pass, not taken for a failure (each exit status is read once here).
                codes = [(t, t.exit_code) for t in self.tasks]
                bad = [(t, c) for t, c in codes if c not in (None, 0) and not t.signalled(c)]
                if bad and self._replace([t for t, _ in bad]):
                    chief_done_at = ps_wait_from = None  # the job starts over, resuming
                    continue
                if bad:
                    failed = f"{bad[0][0].name} failed with exit status {bad[0][1]}"
                    break
                trainers = [t for t in self.tasks if t.task_type != "ps"]
                ps = [t for t in self.tasks if t.task_type == "ps"]
                chief = next(t for t in self.tasks if t.task_type == "chief")
                if chief.exit_code == 0 and chief_done_at is None:
                    chief_done_at = now
                    self.say("chief finished")
                workers = [t for t in trainers if t.task_type == "worker"]
                if (chief_done_at is not None and now - chief_done_at > _WORKER_GRACE_SECS
                        and any(t.exit_code is None for t in workers)):
                    hung = [t.name for t in workers if t.exit_code is None]
                    failed = (f"{', '.join(hung)} still running {_WORKER_GRACE_SECS} s after "
                              f"the chief finished")
                    break
                if all(t.exit_code == 0 for t in trainers):
                    if ps_wait_from is None:
                        ps_wait_from = now
                    lingering = [t for t in ps if t.exit_code is None]
                    if not lingering:
                        break
                    if now - ps_wait_from > _PS_GRACE_SECS:
                        self.say(f"stopping {', '.join(t.name for t in lingering)}: "
                                 f"training is done")
                        self.stop(lingering)
                        break
                if timeout_secs is not None and now - started > timeout_secs:
                    failed = f"timed out after {timeout_secs:g} s"
                    break
        except KeyboardInterrupt:
            failed = "interrupted"
        if failed:
            self.say(f"{failed}; stopping every task")
        self.stop(self.tasks)
        self._finish_streams()
        for task in self.tasks:
            code = task.exit_code
            how = "stopped" if task.stopped and code != 0 else f"exit status {code}"
            self.say(f"{task.name}: {how}")
        if failed:
            return 130 if failed == "interrupted" else 1
        self.say(f"training finished in {time.monotonic() - started:.1f} s")
        return 0
