"""Helpers for the tests that run clusters of real processes on 127.0.0.1: TF_CONFIG values and
free ports, the tasks' processes (started by hand with a TF_CONFIG each, or by the launcher,
``python -m cifar10_estimator.cluster``), waiting on their logs, freezing and killing them, and
reading what their logs say.

The pytest fixtures built on these (``cluster_tasks``, ``launch``) are in ``conftest.py``: every
process a test starts through them is ended when the test ends, however it ends.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterable, Iterator

from cifar10_estimator.launch import ports
from cifar10_estimator.jobdir import lock as job_lock
from trainer_fixtures import Trainer, trainer_env, wait_until, work_dir

HOST = "127.0.0.1"

# The cluster flags of the tests' trainers: workers start at once (not staggered by Estimator's
# rule), and a task that waits for another gives up after a minute, not ten.
CLUSTER_FLAGS = ("--max-worker-delay-secs", "0", "--cluster-timeout-secs", "60")

# What the tasks' logs say.
SAVED = re.compile(r"Saving checkpoints for (\d+) ")  # Estimator's line, before the files
EVALUATED = re.compile(r"\bevaluation at step (\d+):")  # every evaluation, the final one too
RAN = re.compile(r"this task ran (\d+) training steps")  # a trainer's own steps, at its end
RATE = re.compile(r"([\d.]+) images/s on average on this worker, cluster ([\d.]+) images/s")


# --- TF_CONFIG --------------------------------------------------------------------------------

def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports of 127.0.0.1 that were free a moment ago (nothing listens
    there: a connection is refused until a task binds one): the launcher's own choice."""
    return ports.free_ports(count, HOST)


@contextlib.contextmanager
def tensorboard_server(logdir, cwd, env: dict | None = None) -> Iterator[str]:
    """This environment's real ``tensorboard`` against ``logdir``, on a free port of 127.0.0.1
    (Python's event reader, ``--load_fast false``), with ``env`` (default: this process's;
    a bucket's settings for an ``s3://`` log dir): its base URL; stopped at the end."""
    port = free_ports(1)[0]
    tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    server = subprocess.Popen([tensorboard, "--logdir", str(logdir), "--port", str(port),
                               "--host", HOST, "--load_fast", "false"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd,
                              env=env)
    try:
        yield f"http://{HOST}:{port}"
    finally:
        server.terminate()
        server.wait(10)


def local_spec(*jobs: str, ports: Iterable[int] | None = None) -> dict[str, list[str]]:
    """A cluster spec of one task per job on 127.0.0.1, in the order given: on ``ports``, or on
    free ones."""
    ports = list(ports) if ports is not None else free_ports(len(jobs))
    assert len(ports) == len(jobs), (jobs, ports)
    return {job: [f"{HOST}:{port}"] for job, port in zip(jobs, ports)}


def tf_config(spec: dict, task_type: str, index: int = 0, **extra) -> str:
    """The TF_CONFIG value of one task of ``spec`` (``extra``: more top-level keys)."""
    return json.dumps({"cluster": spec, "task": {"type": task_type, "index": index}, **extra})


def operator_tf_configs(*jobs: str) -> dict[str, str]:
    """TF_CONFIG per job (one task each, on free ports) as kubeflow/training-operator writes it
    (genTFConfigJSONStr): every replica type listed, the evaluator included, and the
    ``"environment": "cloud"`` key."""
    spec = local_spec(*jobs)
    return {job: tf_config(spec, job, 0, environment="cloud") for job in jobs}


# --- processes ----------------------------------------------------------------------------------

def _pid(target) -> int:
    return target if isinstance(target, int) else target.pid


@contextlib.contextmanager
def frozen(target):
    """Stops a process (a pid, a ``Popen``) with SIGSTOP for the block, then lets it go on
    (SIGCONT), however the block ends."""
    os.kill(_pid(target), signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(_pid(target), signal.SIGCONT)


# How long a trainer that holds a job dir's lock may stay frozen at a stretch: its lease runs out
# when its last heartbeat is older than STALE_SECS less RENEWAL_MARGIN_BEATS heartbeats (40 s),
# and that heartbeat may have come a whole HEARTBEAT_SECS before the freeze; 5 s to spare.
HOLDER_FREEZE_SECS = (job_lock.STALE_SECS - (job_lock.RENEWAL_MARGIN_BEATS + 1)
                      * job_lock.HEARTBEAT_SECS - 5)


def _beat(job_dir) -> int | None:
    """The heartbeat counter of the lease in ``job_dir`` (None while it cannot be read)."""
    holder = job_lock._read_or_none(os.path.join(job_dir, job_lock.LOCK_FILE))
    return holder and holder.beat


@contextlib.contextmanager
def frozen_holder(target, job_dir):
    """``frozen`` for the trainer that holds ``job_dir``'s lock, however long the block takes
    (a worker's start on a loaded machine): every ``HOLDER_FREEZE_SECS`` it lets the trainer
    go on until its heartbeat has renewed its lease, then stops it again. Frozen longer, it
    would rightly give the job dir up (``jobdir.lock``)."""
    pid = _pid(target)
    done = threading.Event()

    def renew() -> None:
        while not done.wait(HOLDER_FREEZE_SECS):
            beat = _beat(job_dir)
            os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + job_lock.HEARTBEAT_SECS
            while _beat(job_dir) == beat and time.monotonic() < deadline and not done.is_set():
                time.sleep(0.01)
            if not done.is_set():
                os.kill(pid, signal.SIGSTOP)

    os.kill(pid, signal.SIGSTOP)
    thread = threading.Thread(target=renew, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        os.kill(pid, signal.SIGCONT)


def wait_stopped(pid: int, timeout: float = 10) -> None:
    """Until SIGSTOP has stopped the process (state T in /proc/<pid>/stat)."""
    def stopped() -> bool:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    wait_until(stopped, "the process stopping", timeout)


class Task(Trainer):
    """One replica of a hand-made cluster: the trainer with its own TF_CONFIG, named, running in
    ``cwd`` (the test's tmp_path) with its log ``cwd/NAME.log``, and restartable: ``start``
    again runs the same command, as Kubernetes recreates a pod; each start appends a
    ``---- start`` line and its output to the log."""

    START = "---- start"

    def __init__(self, name: str, tf_config: str, args: list[str], cwd):
        self.name = name
        self.exited_at = None  # time.monotonic() when poll() first saw it ended
        super().__init__(args, cwd / f"{name}.log", tf_config=tf_config, cwd=cwd, start=False)

    def _open_log(self):
        log = open(self.log, "a")
        log.write(f"{self.START} {time.monotonic():.3f}\n")
        log.flush()
        return log

    def last_run(self) -> str:
        """The log of the latest start."""
        return self.text().split(self.START)[-1]

    def poll(self):
        code = self.process.poll()
        if code is not None and self.exited_at is None:
            self.exited_at = time.monotonic()
        return code


class Tasks(list):
    """The tasks of a hand-made cluster (``conftest.cluster_tasks``), in the order added."""

    def __init__(self, cwd):
        super().__init__()
        self.cwd = cwd

    def add(self, name: str, tf_config: str, args: list[str]) -> Task:
        task = Task(name, tf_config, args, self.cwd)
        self.append(task)
        return task

    def start(self) -> None:
        for task in self:
            task.start()

    def wait_all(self, timeout: float, tasks: Iterable[Task] | None = None) -> None:
        """Until every task (of ``tasks``, default all) has ended, or ``timeout`` seconds."""
        tasks = list(self if tasks is None else tasks)
        deadline = time.monotonic() + timeout
        # Every task is polled each round (not ``any``, which stops at the first one still
        # running): a task's ``exited_at`` is when it ended, not when the tasks before it did.
        while [t for t in tasks if t.poll() is None] and time.monotonic() < deadline:
            time.sleep(0.2)

    def wait_for(self, predicate: Callable[[], object], what: str, timeout: float = 120) -> None:
        """Until ``predicate()`` holds; fails with every task's latest output after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise AssertionError(f"{what} did not happen:\n" +
                             "\n".join(f"== {t.name}\n{t.text()[-1500:]}" for t in self))

    def stop(self) -> None:
        """Kills every task still running."""
        for task in self:
            task.stop()


# --- the launcher -----------------------------------------------------------------------------

_STARTED = re.compile(r"\[cluster\] started (\w+) \(pid (\d+)\)")


def _is_trainer(pid: int) -> bool:
    """Whether ``pid`` still runs one of the package's commands (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"cifar10_estimator" in f.read()
    except OSError:
        return False


def stop_cluster(launcher: subprocess.Popen, log, grace: float = 60) -> None:
    """Ends a launcher (``python -m cifar10_estimator.cluster``) that is still running, and
    every task it started: SIGTERM first (the launcher then stops its tasks in order), SIGKILL
    for whatever is left after ``grace`` seconds (a killed launcher's tasks get SIGTERM from
    the kernel, and one that ignores it would go on training on this machine's two cores)."""
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(grace)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
    text = log.read_text() if os.path.exists(log) else ""
    for _, pid in _STARTED.findall(text):
        if _is_trainer(int(pid)):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_cluster(args: list[str], log, env_extra: dict | None = None) -> subprocess.Popen:
    """``python -m cifar10_estimator.cluster ARGS`` in the background, its output in ``log``;
    end it with ``stop_cluster``."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "cifar10_estimator.cluster", *args],
                                stdout=out, stderr=subprocess.STDOUT, cwd=work_dir(),
                                env=trainer_env(extra=env_extra))


def cluster_pids(log) -> dict[str, int]:
    """The tasks the launcher started, by name: the pid of each one's latest start."""
    return {name: int(pid) for name, pid in _STARTED.findall(log.read_text())}


def run_cluster(args: list[str], log, timeout: float = 240, env_extra: dict | None = None
                ) -> tuple[int, str]:
    """Runs the launcher with ``args`` (and ``env_extra`` in its environment) to its end, its
    output in the file ``log``; returns its exit status and output. A launcher still running
    after ``timeout`` seconds (or a test interrupted meanwhile, by pytest-timeout for one) is
    stopped with every task it started."""
    launcher = start_cluster(args, log, env_extra)
    try:
        code = launcher.wait(timeout)
    finally:
        stop_cluster(launcher, log)
    return code, log.read_text()


class Launcher:
    """A launcher running in the background (``conftest.launch``): its output in ``log``."""

    def __init__(self, args: list[str], log, env_extra: dict | None = None):
        self.log = log
        self.process = start_cluster(args, log, env_extra)

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, *patterns: str, since: int = 0, timeout: float = 150) -> int:
        """Until every pattern (multi-line mode: ``^`` is a line's start) is in the output
        from offset ``since`` on, while the launcher runs; returns the output's length then."""
        deadline = time.monotonic() + timeout
        while not all(re.search(p, self.text()[since:], re.M) for p in patterns):
            assert self.process.poll() is None and time.monotonic() < deadline, (
                f"no {patterns} in:\n{self.text()[-4000:]}")
            time.sleep(0.1)
        return len(self.text())

    def pids(self) -> dict[str, int]:
        return cluster_pids(self.log)

    def running(self) -> list[str]:
        """The tasks whose latest start still runs a command of the package."""
        return [name for name, pid in self.pids().items() if _is_trainer(pid)]

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def stop(self) -> None:
        stop_cluster(self.process, self.log)


# --- what the logs say --------------------------------------------------------------------------

def task_lines(output: str, task: str) -> list[str]:
    """A launcher's output lines of one task (``[chief] ...``), without the prefix."""
    prefix = f"[{task}] "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def one(pattern: re.Pattern, lines: list[str]) -> int:
    """The number the one line that matches ``pattern`` has in its group 1."""
    found = [int(m.group(1)) for m in map(pattern.search, lines) if m]
    assert len(found) == 1, (pattern.pattern, found)
    return found[0]


def exports(job_dir) -> list[str]:
    """The job's exports: the entries of JOB_DIR/export."""
    return os.listdir(os.path.join(job_dir, "export"))
