"""The launch loop: a cluster's tasks started, watched, restarted and stopped, wherever their
processes run.

``LaunchLoop`` starts one process per task (``layout``), each running the trainer command line
(``python -m cifar10_estimator`` + the trainer's flags) with its own ``TF_CONFIG``, and streams
each task's output with a ``[chief]``, ``[worker0]``, ``[ps0]``, ``[evaluator]`` prefix. A task
that a signal stopped (exit status 128 or more, e.g. 143 after SIGTERM) is started again, as
Kubernetes' ExitCode restart policy does; when a task fails (status 1 to 127), every other task
is stopped. Training is done when the chief, the workers and the
evaluator have exited 0; parameter servers exit by themselves once every training task has
reported (``task.peers.run_parameter_server``) and are stopped if they linger. Every task
shares the trainer's ``--job-dir``, as a real cluster must (on several hosts: shared storage).

Where the processes run is the ``Placement`` the loop is handed: this host's processes
(``host_processes.HostProcesses``), or Ray actors on a Ray cluster's nodes (``ray_actors.RayActors``).
The rules are the loop's alone, for both: the restarts in place, the ending, and the job placed
again (at most ``max_failures`` times) when a placement has lost a task's place for good, which
only Ray's does (a lost node: the others' ``TF_CONFIG`` names its address).

On one host it is for trying distribution and for tests; several hosts need a cluster manager
(see the Kubernetes TFJob in ``k8s/``) or Ray. The ``cluster`` command is its command line.
"""

import json
import subprocess
import sys
import threading
import time
from typing import Mapping, Optional, Protocol, Sequence, TextIO

from cifar10_estimator.errors import UserError
from cifar10_estimator.launch.layout import LaunchedTask, how_ended

_POLL_SECS = 0.2
# After the chief has finished, a worker needs at most one more step and its report to the
# parameter servers; one that is still running this much later is hung.
_WORKER_GRACE_SECS = 120
# Parameter servers exit as soon as every trainer has reported; this only bounds a straggler.
_PS_GRACE_SECS = 30
# SIGTERM first so a task can flush its log; SIGKILL after this.
_TERM_GRACE_SECS = 10


class Placement(Protocol):
    """Where a cluster's task processes run: what differs between this host and a Ray
    cluster's nodes. The loop decides when; a placement does what it is asked."""

    def line(self, addresses: Sequence[str]) -> str:
        """The launcher's first line: where the tasks listen, and who can reach them."""

    def spawn(self, task: LaunchedTask, trainer_args: Sequence[str], env: Mapping[str, str]):
        """Starts ``task``'s trainer with ``trainer_args`` and ``env`` (its ``TF_CONFIG``
        set); returns its process as a ``subprocess.Popen`` shows one: ``poll``,
        ``terminate``, ``kill``, ``wait``, ``pid`` and ``stdout``."""

    def where(self, task: LaunchedTask) -> str:
        """Where ``task`` was started, for its line (`` on HOST``), or nothing."""

    def in_doubt(self, task: LaunchedTask) -> bool:
        """Whether ``task``'s place may be gone (lost, or unreachable for now)."""

    def lost(self, task: LaunchedTask) -> Optional[str]:
        """What was lost when ``task``'s place is gone for good (the job must be placed
        again), in words (``worker0's node 10.0.0.2 (node 1a2b3c4d) was lost (why)``); None
        while it is not."""

    def place_again(self) -> list[LaunchedTask]:
        """New places for every task (new ``TF_CONFIG`` values), after ``close``; UserError
        when there is no room for them."""

    def summary(self) -> str:
        """One line on where the tasks were placed."""

    def close(self) -> None:
        """Releases the places (and, with them, any process still in one)."""


class LaunchLoop:
    """Starts, watches and stops the processes of a cluster's tasks, in ``placement``; a job
    whose placement lost a task's place is placed again at most ``max_failures`` times."""

    def __init__(self, tasks: Sequence[LaunchedTask], placement: Placement,
                 trainer_args: Sequence[str], env: Mapping[str, str], out: TextIO = sys.stdout,
                 max_failures: int = 0):
        self.tasks = list(tasks)
        self.placement = placement
        self.trainer_args = list(trainer_args)
        self.out = out
        self.env = dict(env)  # the tasks' environment (the command's), TF_CONFIG set per task
        self.max_failures = max_failures
        self.failures = 0  # places lost so far
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
        self.say(self.placement.line([a for job in cluster.values() for a in job]))
        self.say("cluster " + json.dumps(cluster))
        for task in self.tasks:
            self._launch(task)

    def _launch(self, task: LaunchedTask) -> None:
        env = dict(self.env, TF_CONFIG=task.tf_config, PYTHONUNBUFFERED="1")
        task.process = self.placement.spawn(task, self.trainer_args, env)
        task.reader = threading.Thread(target=self._stream, args=(task,), daemon=True)
        task.reader.start()
        self.say(f"started {task.name} (pid {task.process.pid}{self.placement.where(task)})")

    def _place_again(self, failed: Sequence[LaunchedTask]) -> bool:
        """Whether the job was placed and started again after ``failed`` tasks ended: when the
        placement lost one's place for good (a task that failed by itself fails the job), with
        restarts left. The other trainers save (SIGTERM) and stop, and the job resumes from
        the latest checkpoint in its shared job dir."""
        losses = [(t, what) for t in failed for what in [self.placement.lost(t)] if what]
        if not losses:
            return False
        task, what = losses[0]
        if self.failures >= self.max_failures:
            self.say(f"{what}; no restarts left (--max-failures {self.max_failures})")
            return False
        self.failures += 1
        self.say(f"{what}: placing the job again on the nodes that are alive, restart "
                 f"{self.failures} of {self.max_failures} (--max-failures); it resumes from "
                 f"the latest checkpoint")
        self.stop(self.tasks)  # the others save (SIGTERM) and stop
        self._finish_streams()
        self.placement.close()
        try:
            self.tasks = self.placement.place_again()
        except UserError as e:
            self.say(str(e))
            return False
        self.say(self.placement.summary())
        self.start()
        return True

    def _restart_signalled(self, codes: dict[str, Optional[int]]) -> None:
        """Starts again every task that a signal stopped (not the launcher), by the exit
        statuses ``codes`` (by task name) read this tick. This is what Kubernetes' ExitCode
        restart policy does; the task resumes as after a restart."""
        # Every task was asked first: a lost place is found before any restart. A task whose
        # place is lost, or in doubt for now, means the whole job is placed again
        # (``_place_again``): a trainer restarted in place meanwhile would wait for it.
        if any(self.placement.in_doubt(t) for t in self.tasks):
            return
        for task in self.tasks:
            code = codes[task.name]
            if task.signalled(code):
                self.say(f"{task.name} stopped by a signal ({how_ended(code)}): starting it "
                         f"again")
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
                # Each task's exit status, read once this tick (on Ray, a call to its actor);
                # a task that ends after the read is seen by the next tick.
                codes = {t.name: t.poll() for t in self.tasks}
                self._restart_signalled(codes)
                bad = [(t, codes[t.name]) for t in self.tasks
                       if codes[t.name] not in (None, 0) and not t.signalled(codes[t.name])]
                if bad and self._place_again([t for t, _ in bad]):
                    chief_done_at = ps_wait_from = None  # the job starts over, resuming
                    continue
                if bad:
                    failed = f"{bad[0][0].name} failed with exit status {bad[0][1]}"
                    break
                trainers = [t for t in self.tasks if t.task_type != "ps"]
                ps = [t for t in self.tasks if t.task_type == "ps"]
                chief = next(t for t in self.tasks if t.task_type == "chief")
                if codes[chief.name] == 0 and chief_done_at is None:
                    chief_done_at = now
                    self.say("chief finished")
                workers = [t for t in trainers if t.task_type == "worker"]
                hung = [t.name for t in workers if codes[t.name] is None]
                if (chief_done_at is not None and now - chief_done_at > _WORKER_GRACE_SECS
                        and hung):
                    failed = (f"{', '.join(hung)} still running {_WORKER_GRACE_SECS} s after "
                              f"the chief finished")
                    break
                if all(codes[t.name] == 0 for t in trainers):
                    if ps_wait_from is None:
                        ps_wait_from = now
                    lingering = [t for t in ps if codes[t.name] is None]
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
            code = task.poll()
            how = "stopped" if task.stopped and code != 0 else f"exit status {code}"
            self.say(f"{task.name}: {how}")
        if failed:
            return 130 if failed == "interrupted" else 1
        self.say(f"training finished in {time.monotonic() - started:.1f} s")
        return 0
