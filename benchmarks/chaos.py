"""Chaos: real jobs of the cluster launcher and real sweeps, hit by a seeded schedule of mixed
faults, with invariants checked after each job (issue 76).

Each job is ``python -m cifar10_estimator.cluster`` as a user starts it, training ResNet-8 on
the built-in sample data: ``--engines ps`` a chief, a worker, a parameter server and an
evaluator; ``allreduce`` the same with ``--distribution-strategy multi-worker-mirrored`` (no
parameter server); ``ray`` the all-reduce job on a Ray cluster of two nodes of this host
(``ray start``, each in a process group of its own) with the records and the job dir in a
bucket of moto's S3 server on 127.0.0.1 (run this script with a Python whose TensorFlow has
s3://: 2.15 with tensorflow-io, the ``s3`` and ``ray`` extras); ``sweep`` ``python -m
cifar10_estimator.sweep`` on such a Ray cluster, ``--sweep-trials`` trials drawn at random
(the learning rate), ASHA with rungs at epochs 1 and 3, two trials at a time, its sweep dir a
folder both nodes see: its tasks are its trials' trainers, its launcher the sweep's driver
(the ``ray`` extra only). A job's job dir (a sweep's sweep dir) on this host is a tmpfs of its
own (``--disk-mb``, a sweep's per trial), which the ``disk`` fault fills. While it runs, a
schedule seeded by ``--seed`` waits ``--gap`` seconds (uniform) and draws one fault from
``--kinds`` (those its engine has):

- ``kill``, ``term``: SIGKILL or SIGTERM to a random task (the launcher starts a task a signal
  ended again, as Kubernetes' ExitCode restart policy does);
- ``stop``: SIGSTOP to a random task, SIGCONT after ``--hold`` seconds;
- ``launcher``: SIGKILL to the launcher itself (the local engine's lost node): its tasks get
  their parent-death signal from the kernel, and the user runs the same command again;
- ``node`` (Ray, sweep): SIGKILL to every process of the Ray node (not the head) that runs a
  random task, as a machine that goes away; a new node joins at once, as an autoscaler's;
- ``s3`` (Ray): the S3 server stopped (SIGSTOP) for ``--hold`` seconds, then continued;
- ``links``: the packets to and from a random task's port dropped for ``--hold`` seconds, with
  ``tc`` (``u32`` filters on the port into an ``htb`` class of 8 bits a second) on the
  loopback of the cluster's own network namespace, entered with ``nsenter``;
- ``disk``: the job dir filled (a file of zeros) for ``--hold`` seconds, then freed; a task
  that finds no room stops with its one-line error, and the user, once space is free, runs
  the same command again;
- ``save``, ``eval``, ``export``: SIGKILL timed inside a checkpoint save (the chief, once a
  ``model.ckpt-N_temp`` folder appears), an evaluation (the evaluator, on its "Restoring
  parameters" line) or an export (whoever writes a ``.N.tmp`` folder under ``export/``).

A job ends when its launcher exits 0; a launcher that ends otherwise (killed, a task that
failed) is run again with the same command once its tasks are gone and any fault on the disk
or the links is undone, at most ``--reruns`` times. After each job, these invariants (a table):

- **end**: exit 0, the final checkpoint at ``--train-steps`` (or a step or two past it: the
  steps asynchronous workers had in flight), an export and the report; a sweep's: every trial
  finished or stopped early by ASHA, none failed, each finished one at its last step with its
  export and report, the best named;
- **accuracy**: the final evaluation within noise of an undisturbed job of the same seed run
  first; the noise is measured: the largest difference from that job's accuracy of
  undisturbed jobs at ``--noise-seeds`` other seeds (a resumed job reads its pictures in
  another order from its checkpoint on, as another seed would); with 0 of them, 3 binomial
  standard errors of the difference of two accuracies on the evaluation split; a sweep's:
  its best trial's accuracy within that binomial noise of the undisturbed sweep's best;
- **checkpoints**: every checkpoint left in the job dir loads (its variables read back);
- **one chief**: never two chief processes alive at once (sampled at every tick) and no
  refusal of a second trainer on the job dir; a sweep's: of two trainers of one trial alive at
  once, the younger ends first (the job dir's lock refused it);
- **redone** (not for a sweep, whose trainers resume from a checkpoint an epoch): per
  restart of the chief, the highest global step any task logged before it
  minus the step it resumed from; held when at most the checkpoint interval plus the steps
  the cluster trained while the chief could not save (stopped, or gone);
- **left**: no process of the job, no ``_temp`` checkpoint folder and no ``.tmp`` export left;
- **quiet**: no traceback, no thread's exception, no error-level line of TensorFlow's (C++
  ``E``/``F`` lines, Python ``ERROR``) in any task's output; an error a task ended with is one
  ``cifar10_estimator: error:`` line.

Runs as root (``mount``, ``nsenter``, ``tc``); a kind the machine cannot do is left out, and
the first lines say which.

    python benchmarks/chaos.py --engines ps,allreduce --minutes 60 --seed 1
    PY=.venv-tf2.15/bin/python; $PY benchmarks/chaos.py --engines ray --minutes 60 --seed 1
    python benchmarks/chaos.py --engines sweep --minutes 60 --seed 2
    python benchmarks/chaos.py --engines ps --minutes 3 --seed 7 --gap 5,15   # CI's slice
"""

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Optional

from machine import print_machine_line
from sample_records import make_sample_records

TIMED = ("save", "eval", "export")  # kinds armed now, landed when their moment comes
KINDS = ("kill", "term", "stop", "launcher", "links", "disk", "save", "eval", "export", "node",
         "s3")
LOCAL_KINDS = KINDS[:9]
ENGINES = {
    "ps": ["--num-workers", "2", "--num-ps", "1", "--evaluator"],
    "allreduce": ["--num-workers", "2", "--evaluator"],
    "ray": ["--num-workers", "2", "--evaluator", "--cpus-per-task", "1"],
    "sweep": [],  # SweepJob's own command
}
ENGINE_TRAINER_FLAGS = {
    "ps": [],
    "allreduce": ["--distribution-strategy", "multi-worker-mirrored"],
    "ray": ["--distribution-strategy", "multi-worker-mirrored"],
    "sweep": [],
}
ENGINE_KINDS = {"ps": LOCAL_KINDS, "allreduce": LOCAL_KINDS,
                "ray": ("kill", "term", "stop", "launcher", "node", "s3"),
                # A sweep's trainers have no ports and evaluate in their own process.
                "sweep": ("kill", "term", "stop", "launcher", "disk", "save", "export", "node")}
# Ray: two nodes of this many CPUs each, so that either one holds the whole job (3 tasks of
# --cpus-per-task 1) when the other is lost.
RAY_NODE_CPUS = 3
STARTED = re.compile(r"^\[cluster\] started (\w+) \(pid (\d+)[^)]*\)", re.M)
CLUSTER = re.compile(r"^\[cluster\] cluster (\{.*\})$", re.M)
TASK_LINE = re.compile(r"^\[(\w+)\] (.*)$")
STEP = re.compile(r"(?:\bstep (\d+)/\d+ |Saving checkpoints for (\d+) into)")
RESUMED = re.compile(r"resuming from \S*model\.ckpt-(\d+)")
FINAL = re.compile(r"final evaluation at step (\d+): accuracy = ([0-9.]+)")
# TensorFlow's C++ log lines of error or fatal level, and Python logging's default format.
ERROR_LINE = re.compile(r"^(?:[EF]\d{4} |ERROR:)")
OUR_ERROR = "cifar10_estimator: error:"
IN_USE = "is in use by another trainer"  # jobdir/lock.py's refusal
METADATA = "cifar10_records.json"  # the generator's (data/metadata.py), with each split's count
PROGRESS_SECS = 1  # the tasks' --progress-secs: how stale a task's last logged step can be
TICK = 0.02  # seconds between the schedule's looks at the job (a save of ResNet-8 takes ~0.1 s)
SCAN_SECS = 0.5  # seconds between a sweep's looks through /proc for its trials' trainers
SWEEP_RECORD = "sweep.json"  # a sweep's record of its trials (sweeps/records.RECORD_FILE)


@dataclasses.dataclass
class Fault:
    kind: str
    at: float  # seconds into the job
    target: str = ""
    undo_at: Optional[float] = None
    undo: Optional[object] = None  # a callable that undoes it
    landed: bool = False  # a timed kind whose moment came (a save, an evaluation, an export)
    since: Optional[int] = None  # eval: where in the output an evaluation must start


@dataclasses.dataclass
class Run:
    """One launcher process of a job and what it printed."""
    process: subprocess.Popen
    log: str
    pids: dict = dataclasses.field(default_factory=dict)  # task -> latest pid
    chiefs: list = dataclasses.field(default_factory=list)  # every chief pid started

    def text(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def _job_processes(job_dir: str) -> list[int]:
    """Every process of this machine whose command line names ``job_dir``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if job_dir.encode() in f.read() and _alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            pass
    return found


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


class Links:
    """Drops every packet to and from one port on the loopback of the network namespace of
    process ``pid``, until ``restore``. The namespace is held open from the start, so that the
    cut is undone in it even after that process has ended (a restarted task joins it again)."""

    def __init__(self, pid: int, port: int):
        self.namespace = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        self.port = port

    def _tc(self, *args: str) -> None:
        subprocess.run(["nsenter", f"--net=/proc/self/fd/{self.namespace}", "tc", *args],
                       check=True, capture_output=True, timeout=10, pass_fds=(self.namespace,))

    def cut(self) -> None:
        # Kernels without netem, prio or tc actions (this one's) still have htb and u32: the
        # port's packets go to a class of 8 bits a second whose queue holds one packet, so all
        # but a packet a minute are dropped; the rest of the loopback's traffic goes as before.
        self._tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "10",
                 "r2q", "100000")
        self._tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:10", "htb", "rate",
                 "10gbit")
        self._tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb", "rate",
                 "8bit", "ceil", "8bit", "burst", "1", "cburst", "1")
        self._tc("qdisc", "add", "dev", "lo", "parent", "1:20", "handle", "20:", "pfifo",
                 "limit", "1")
        for way in ("dport", "sport"):
            self._tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio",
                     "1", "u32", "match", "ip", way, str(self.port), "0xffff", "flowid", "1:20")

    def restore(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._tc("qdisc", "del", "dev", "lo", "root")
        os.close(self.namespace)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {timeout:g} s")
        time.sleep(0.2)


def _listens(port: int) -> bool:
    with contextlib.suppress(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    return False


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("PPid:")).split()[1])


class RayWorld:
    """The Ray engines' world: two Ray nodes of this host, each a ``ray start --block`` in a
    process group of its own (``ray stop`` would end every Ray process of the machine); with
    ``bucket``, moto's S3 server on 127.0.0.1 with a bucket that holds the sample records (the
    ``ray`` engine's jobs live there), else the records stay in their folder, which both nodes
    see (the ``sweep`` engine's sweep dir is a folder too)."""

    BUCKET = "chaos"

    def __init__(self, work: str, data_dir: str, bucket: bool = True):
        s3_port, self.ray_port = _free_ports(2)
        self.bucket = bucket
        self.env = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
                    # Ray 2.60 turns token authentication on once ~/.ray/auth_token exists.
                    "RAY_AUTH_MODE": "disabled", "RAY_memory_monitor_refresh_ms": "0"}
        self.address = f"127.0.0.1:{self.ray_port}"
        self.work, self.data_dir = work, data_dir
        self.nodes: list[subprocess.Popen] = []
        self.s3: Optional[subprocess.Popen] = None
        # A short folder of its own: Ray's socket paths must fit in 107 bytes.
        self.temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        try:
            if bucket:
                self._serve_bucket(s3_port, data_dir)
            self.nodes.append(self._node(head=True))
            _wait_for(lambda: _listens(self.ray_port), 90, "the Ray head")
            self.nodes.append(self._node())
            if self.wait_for_nodes(2) < 2:
                raise RuntimeError("the second Ray node did not join within 90 s")
        except BaseException:
            self.close()
            raise

    def _serve_bucket(self, s3_port: int, data_dir: str) -> None:
        import boto3

        self.endpoint = f"http://127.0.0.1:{s3_port}"
        # What a user sets for an S3-compatible server (docs/storage.md).
        self.env.update({"S3_ENDPOINT": self.endpoint, "S3_USE_HTTPS": "0",
                         "S3_VERIFY_SSL": "0", "AWS_REGION": "us-east-1",
                         "AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "chaos"})
        with open(os.path.join(self.work, "moto.log"), "w") as out:
            self.s3 = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                        "-p", str(s3_port)], stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        _wait_for(lambda: _listens(s3_port), 60, "moto's S3 server")
        self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                   aws_access_key_id="chaos", aws_secret_access_key="chaos")
        self.client.create_bucket(Bucket=self.BUCKET)
        for name in os.listdir(data_dir):  # the records and their metadata
            if os.path.isfile(os.path.join(data_dir, name)):
                self.client.upload_file(os.path.join(data_dir, name), self.BUCKET,
                                        f"data/{name}")
        self.data_dir = f"s3://{self.BUCKET}/data"

    def _node(self, head: bool = False) -> subprocess.Popen:
        where = (["--head", f"--port={self.ray_port}", "--temp-dir", self.temp,
                  "--include-dashboard=false"] if head else [f"--address={self.address}"])
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        return subprocess.Popen([ray, "start", *where, "--num-cpus", str(RAY_NODE_CPUS),
                                 "--disable-usage-stats", "--block"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, cwd=self.work, env=self.env)

    def wait_for_nodes(self, count: int, timeout: float = 90) -> int:
        """Until ``count`` nodes are alive, at most ``timeout`` seconds; how many are."""
        import ray

        # This process joins as a driver for the wait only (with the nodes' environment:
        # Ray 2.60's token authentication off).
        os.environ["RAY_AUTH_MODE"] = self.env["RAY_AUTH_MODE"]
        ray.init(address=self.address, logging_level="ERROR")
        try:
            deadline = time.monotonic() + timeout
            while True:
                alive = sum(node["Alive"] for node in ray.nodes())
                if alive >= count or time.monotonic() > deadline:
                    return alive
                time.sleep(0.2)
        finally:
            ray.shutdown()

    def node_of(self, pid: int) -> Optional[int]:
        """Which node (an index of ``nodes``, 0 the head) runs trainer ``pid``: its parent is
        its task's actor, whose parent is the node's raylet, in the node's process group."""
        with contextlib.suppress(OSError, StopIteration, ValueError):
            group = os.getpgid(_parent(_parent(pid)))
            return next(i for i, node in enumerate(self.nodes) if node.pid == group)
        return None

    def lose_node(self, index: int) -> None:
        """SIGKILL at once to every process of node ``index`` (a machine gone): its process
        group and every descendant of its ``ray start``, the raylet's workers (which Ray puts
        in groups of their own, and which would otherwise outlive their raylet for seconds,
        their trainers with them) included; a new node joins in its place (an
        autoscaler's), without waiting for it."""
        node = self.nodes.pop(index)
        doomed = _descendants(node.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        for pid in doomed:
            _signal(pid, signal.SIGKILL)
        node.wait(30)
        self.nodes.append(self._node())

    def job_files(self, prefix: str, into: str) -> None:
        """Copies the bucket's objects under ``prefix`` into folder ``into``."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.BUCKET,
                                                                      Prefix=prefix + "/")
        for page in pages:
            for item in page.get("Contents", ()):
                target = os.path.join(into, os.path.relpath(item["Key"], prefix))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                self.client.download_file(self.BUCKET, item["Key"], target)

    def close(self) -> None:
        for node in reversed(self.nodes):  # these nodes only: their process groups
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGTERM)
            try:
                node.wait(10)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
        self.nodes = []
        if self.s3:
            _signal(self.s3.pid, signal.SIGCONT)
            self.s3.kill()
            self.s3.wait(30)
        shutil.rmtree(self.temp, ignore_errors=True)


def _descendants(root: int) -> list[int]:
    """Every live process below ``root`` (by the kernel's parent links)."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, StopIteration, ValueError):
                children[_parent(int(entry))].append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


# The titles of the Ray engines' actors: the launcher's tasks (ray_node.TaskRunner) and Ray
# Tune's function trainables, which run a sweep's trials (Ray's ImplicitFunc, in
# ray/tune/trainable/function_trainable.py).
ACTOR_TITLES = (b"ray::TaskRunner", b"ray::ImplicitFunc")


def _actor_processes() -> list[int]:
    """This machine's processes of the Ray engines' task and trial actors."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().startswith(ACTOR_TITLES) and _alive(int(entry)):
                        found.append(int(entry))
    return found


class Job:
    """One job of an engine: its command, its runs, the faults that hit it."""

    def __init__(self, engine: str, number: int, args, data_dir: str, work: str,
                 rng: random.Random, kinds: tuple, disturbed: bool, seed: Optional[int] = None,
                 world: Optional[RayWorld] = None):
        self.engine, self.args, self.rng = engine, args, rng
        self.kinds = tuple(k for k in kinds if k in ENGINE_KINDS[engine])
        self.disturbed, self.world = disturbed, world
        name = (f"{engine}-{number}" if disturbed else
                f"{engine}-undisturbed-{args.seed if seed is None else seed}")
        self.folder = os.path.join(work, name)
        os.makedirs(self.folder)
        self.mounted = False
        seed = args.seed if seed is None else seed
        if world and world.bucket:  # in the bucket; copied into local_dir for the checks
            self.job_dir, data_dir = f"s3://{world.BUCKET}/{name}/job", world.data_dir
            self.local_dir = os.path.join(self.folder, "job-copy")
        else:
            self.job_dir = self.local_dir = os.path.join(self.folder, "job")
            os.makedirs(self.job_dir)
            if "disk" in self.kinds:
                size = args.disk_mb * (args.sweep_trials if engine == "sweep" else 1)
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}m", "tmpfs",
                                self.job_dir], check=True, capture_output=True)
                self.mounted = True
        self.command = self._command(data_dir, seed)
        self.runs: list[Run] = []
        self.faults: list[Fault] = []
        self.two_chiefs = 0
        self.started = time.monotonic()

    def _command(self, data_dir: str, seed: int) -> list[str]:
        launcher = ["--ray", self.world.address] if self.world else []
        return [sys.executable, "-m", "cifar10_estimator.cluster", *launcher,
                *ENGINES[self.engine],
                "--", "--data-dir", data_dir, "--job-dir", self.job_dir,
                "--num-layers", "8", "--train-batch-size", "8", "--eval-batch-size",
                "8", "--train-steps", str(self.args.train_steps), "--save-checkpoints-steps",
                str(self.args.checkpoint_steps), "--progress-secs", str(PROGRESS_SECS),
                "--seed", str(seed), "--max-worker-delay-secs", "0",
                *ENGINE_TRAINER_FLAGS[self.engine]]

    # --- the runs -------------------------------------------------------------------------

    def _start_run(self) -> Run:
        log = os.path.join(self.folder, f"run-{len(self.runs)}.log")
        env = self.world.env if self.world else {k: v for k, v in os.environ.items()
                                                 if k != "TF_CONFIG"}
        with open(log, "w") as out:
            process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=self.folder, env=env,
                                       start_new_session=True)
        run = Run(process, log)
        self.runs.append(run)
        return run

    def _refresh(self, run: Run) -> None:
        for name, pid in STARTED.findall(run.text()):
            run.pids[name] = int(pid)
            if name == "chief" and int(pid) not in run.chiefs:
                run.chiefs.append(int(pid))

    def _left(self) -> list[int]:
        """The job's processes still alive (and the Ray engine's task actors)."""
        return _job_processes(self.job_dir) + (_actor_processes() if self.world else [])

    def _wait_gone(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self._left() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self._left():  # what would not end: counted as left over
            _signal(pid, signal.SIGKILL)

    def run(self, deadline: float) -> int:
        """Runs the job to its end (reruns included); returns the last launcher's status."""
        next_fault = self._next_gap()
        for _ in range(self.args.reruns + 1):
            run = self._start_run()
            while run.process.poll() is None:
                time.sleep(TICK)
                now = time.monotonic() - self.started
                self._refresh(run)
                self._count_chiefs()
                self._undo_due(now)
                if self.disturbed and now >= next_fault and time.monotonic() < deadline:
                    if self._hit(run, now):
                        next_fault = now + self._next_gap()
                self._watch_timed(run, now)
                if time.monotonic() > deadline + self.args.overrun:
                    _signal(run.process.pid, signal.SIGTERM)
            status = run.process.wait()
            self._undo_all()  # a stopped task continues, so that it can end
            self._wait_gone()
            if status == 0:
                return 0
        return status

    def _count_chiefs(self) -> None:
        alive = sum(_alive(pid) for run in self.runs for pid in run.chiefs)
        self.two_chiefs += alive > 1

    def _next_gap(self) -> float:
        low, high = self.args.gap
        return self.rng.uniform(low, high)

    # --- the faults -----------------------------------------------------------------------

    def _hit(self, run: Run, now: float) -> bool:
        """Draws and starts a fault; False while the job has no task to hit yet."""
        tasks = {name: pid for name, pid in run.pids.items() if _alive(pid)}
        if not tasks or any(f.undo is not None or (f.kind in TIMED and f.kind != "export"
                                                    and not f.landed and f.undo_at > now)
                            for f in self.faults):
            return False  # one fault on at a time: each one's effect is its own
        # The export comes once, at the end: armed at most once a job, it waits for it while
        # the other faults go on.
        armed = any(f.kind == "export" for f in self.faults)
        kind = self.rng.choice([k for k in self.kinds if not (armed and k == "export")]
                               or self.kinds)
        fault = Fault(kind, now)
        name = self.rng.choice(sorted(tasks))
        hold = self.rng.uniform(*self.args.hold)
        if kind in ("kill", "term"):
            fault.target = name
            _signal(tasks[name], signal.SIGKILL if kind == "kill" else signal.SIGTERM)
        elif kind == "stop":
            fault.target = name
            pid = tasks[name]
            _signal(pid, signal.SIGSTOP)
            fault.undo_at, fault.undo = now + hold, lambda: _signal(pid, signal.SIGCONT)
        elif kind == "launcher":
            fault.target = "launcher"
            _signal(run.process.pid, signal.SIGKILL)
        elif kind == "links":
            # Only inside the cluster's own namespace (the launcher's first line says where);
            # the evaluator has no port.
            ports = self._ports(run)
            if "network: private" not in run.text() or not set(ports) & set(tasks):
                return False
            name = self.rng.choice(sorted(set(ports) & set(tasks)))
            fault.target = name
            links = Links(tasks[name], ports[name])
            links.cut()
            fault.undo_at, fault.undo = now + hold, links.restore
        elif kind == "node":
            # A node that runs a task, not the head (whose loss ends the Ray cluster).
            lost = sorted({i for i in map(self.world.node_of, tasks.values()) if i})
            if not lost:
                return False
            index = self.rng.choice(lost)
            fault.target = "node " + ",".join(sorted(
                n for n, pid in tasks.items() if self.world.node_of(pid) == index))
            self.world.lose_node(index)
        elif kind == "s3":
            fault.target = "S3 server"
            pid = self.world.s3.pid
            _signal(pid, signal.SIGSTOP)
            fault.undo_at, fault.undo = now + hold, lambda: _signal(pid, signal.SIGCONT)
        elif kind == "disk":
            fault.target = "job dir"
            filler = os.path.join(self.job_dir, "filler")
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"],
                           capture_output=True)
            fault.undo_at = now + hold
            fault.undo = lambda: os.path.exists(filler) and os.remove(filler)
        else:  # TIMED: armed now, landed by _watch_timed
            fault.target = {"save": "chief", "eval": "evaluator", "export": "chief"}[kind]
            # Given up on after the longest gap; the export comes once, at the job's end.
            fault.undo_at = now + (math.inf if kind == "export" else self.args.gap[1])
        self.faults.append(fault)
        return True

    def _ports(self, run: Run) -> dict[str, int]:
        cluster = json.loads(CLUSTER.findall(run.text())[-1])
        ports = {}
        for job, addresses in cluster.items():
            for index, address in enumerate(addresses):
                name = job if job in ("chief", "evaluator") else f"{job}{index}"
                ports[name] = int(address.rpartition(":")[2])
        return ports

    def _watch_timed(self, run: Run, now: float) -> None:
        for fault in self.faults:
            if fault.kind not in TIMED or fault.landed or now > fault.undo_at:
                continue
            pid = None
            if fault.kind == "save":
                if any(n.endswith("_temp") for n in os.listdir(self.job_dir)):
                    pid = run.pids.get("chief")
            elif fault.kind == "export":
                export = os.path.join(self.job_dir, "export")
                if os.path.isdir(export) and any(n.endswith(".tmp") for n in os.listdir(export)):
                    pid = self._exporter(run)
            elif fault.since is None or fault.since > len(run.text()):
                fault.since = len(run.text())  # an evaluation that starts from now on
            elif re.search(r"^\[evaluator\] .*Restoring parameters from",
                           run.text()[fault.since:], re.M):
                pid = run.pids.get("evaluator")
            if pid and _signal(pid, signal.SIGKILL):
                fault.landed, fault.at = True, now

    def _exporter(self, run: Run) -> Optional[int]:
        # The chief exports at the end (docs/distributed.md); an evaluator exports only with
        # --export-best, which these jobs do not ask for.
        return run.pids.get("chief")

    def _undo_due(self, now: float) -> None:
        for fault in self.faults:
            if fault.undo is not None and fault.undo_at is not None and now >= fault.undo_at:
                fault.undo()
                fault.undo = None

    def _undo_all(self) -> None:
        for fault in self.faults:
            if fault.undo is not None:
                fault.undo()
                fault.undo = None

    def close(self) -> None:
        self._wait_gone()
        if self.mounted:  # its logs and records kept, to look into after the campaign
            shutil.copytree(self.job_dir, os.path.join(self.folder, "job-logs"),
                            ignore=lambda folder, names: [
                                n for n in names if not n.endswith((".log", ".json"))
                                and not os.path.isdir(os.path.join(folder, n))])
            subprocess.run(["umount", "-l", self.job_dir], capture_output=True)

    # --- the invariants -------------------------------------------------------------------

    def check(self, status: int, reference: Optional[float], noise: float = 0.0) -> dict:
        import tensorflow as tf

        texts = [run.text() for run in self.runs]
        if self.world and self.world.bucket:
            self.world.job_files(self.job_dir.split("/", 3)[3], self.local_dir)
        job_dir = self.local_dir
        row = {"engine": self.engine, "job": os.path.basename(self.folder),
               "minutes": (time.monotonic() - self.started) / 60, "runs": len(self.runs),
               "faults": collections.Counter(f.kind for f in self.faults
                                             if f.kind not in TIMED or f.landed)}
        # end
        # The state file's newest entry (a bucket's names its checkpoints by their URL).
        state = (tf.train.get_checkpoint_state(job_dir) if os.path.isdir(job_dir) else None)
        latest = state.model_checkpoint_path if state else None
        step = int(latest.rsplit("-", 1)[1]) if latest else -1
        export = os.path.join(job_dir, "export")
        versions = [v for v in os.listdir(export) if v.isdigit()] if os.path.isdir(export) else []
        report = os.path.exists(os.path.join(job_dir, "eval_report.json"))
        # Asynchronous workers may each add a step in flight past the last one.
        row["end"] = (status == 0 and step >= self.args.train_steps and bool(versions)
                      and report)
        row["step"] = step
        # accuracy
        finals = [(int(s), float(a)) for text in texts for s, a in FINAL.findall(text)]
        accuracy = finals[-1][1] if finals else None
        row["accuracy"] = accuracy
        if reference is None or accuracy is None:
            row["accuracy ok"] = accuracy is not None
        else:
            row["accuracy ok"] = abs(accuracy - reference) <= noise + 1e-9
        # checkpoints
        broken = []
        for name in sorted(os.listdir(job_dir)) if os.path.isdir(job_dir) else []:
            if name.startswith("model.ckpt-") and name.endswith(".index"):
                prefix = os.path.join(job_dir, name[:-len(".index")])
                try:
                    reader = tf.train.load_checkpoint(prefix)
                    for variable in reader.get_variable_to_shape_map():
                        reader.get_tensor(variable)
                except Exception as e:  # noqa: BLE001  (what is broken is the finding)
                    broken.append(f"{name}: {str(e).splitlines()[0]}")
        row["checkpoints ok"], row["broken"] = not broken, broken
        # one chief
        row["one chief"] = self.two_chiefs == 0 and not any(IN_USE in t for t in texts)
        # redone
        row["redone"], row["redone ok"] = self._redone(texts)
        # left
        left = self._left()
        temps = [n for n in os.listdir(job_dir) if n.endswith("_temp")] if os.path.isdir(
            job_dir) else []
        temps += [n for n in (os.listdir(export) if os.path.isdir(export) else [])
                  if n.endswith(".tmp")]
        row["left ok"], row["left"] = not left and not temps, left + temps
        # quiet
        stray = []
        for text in texts:
            for line in text.splitlines():
                match = TASK_LINE.match(line)
                body = match.group(2) if match else line
                if ("Traceback" in body or "Exception in thread" in body
                        or ERROR_LINE.match(body)):
                    stray.append(line)
        row["quiet ok"], row["stray"] = not stray, stray[:5]
        row["held"] = all(row[k] for k in ("end", "accuracy ok", "checkpoints ok", "one chief",
                                           "redone ok", "left ok", "quiet ok"))
        return row

    def _redone(self, texts: list[str]) -> tuple[list[int], bool]:
        """Per resume of the chief: the highest global step any task logged before it minus
        the step it resumed from; and whether each is at most the checkpoint interval plus
        what the others trained past the chief's own last logged step (the chief saves; while
        it is stopped, cut off or gone the others train on, and that is lost with a parameter
        server) plus a progress interval's steps in flight."""
        redone, ok, highest, chief_seen = [], True, 0, 0
        for text in texts:
            for line in text.splitlines():
                match = TASK_LINE.match(line)
                if not match:
                    continue
                task, body = match.groups()
                found = STEP.search(body)
                if found:
                    step = int(found.group(1) or found.group(2))
                    highest = max(highest, step)
                    if task == "chief":
                        chief_seen = max(chief_seen, step)
                resumed = RESUMED.search(body) if task == "chief" else None
                if resumed:
                    lost = max(highest - int(resumed.group(1)), 0)
                    redone.append(lost)
                    bound = (self.args.checkpoint_steps + (highest - chief_seen)
                             + self.args.max_rate * PROGRESS_SECS)
                    ok = ok and lost <= bound
                    chief_seen = int(resumed.group(1))
        return redone, ok


class SweepJob(Job):
    """A sweep of the ``sweep`` engine: ``cifar10-sweep`` as a user starts it on the Ray world
    (random draws of the learning rate, ASHA, two trials at a time), its sweep dir a folder
    both nodes see (a tmpfs of its own for the ``disk`` fault). Its tasks are its trials'
    trainers, by trial name; its launcher is the sweep's driver. Rerun as a user would: the
    same command again (after a killed driver, or trials that failed)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trainers: dict[str, dict[int, int]] = {}  # trial -> {pid: start time}
        self.overlaps: set[tuple[int, int]] = set()
        self.last_alive: dict[int, float] = {}
        self._next_scan = 0.0

    def _command(self, data_dir: str, seed: int) -> list[str]:
        return [sys.executable, "-m", "cifar10_estimator.sweep", "--ray", self.world.address,
                "--sweep-dir", self.job_dir, "--search", "random",
                "--num-trials", str(self.args.sweep_trials), "--seed", str(seed),
                # Learning rates ResNet-8 learns the sample data with, some better than others
                # (0.25 and 0.41 diverged in a trial run: chance at every seed, no test of it).
                "--vary", "learning-rate=loguniform:0.003:0.2", "--scheduler", "asha",
                "--grace-epochs", "1", "--cpus-per-trial", "1", "--max-concurrent", "2",
                "--", "--data-dir", data_dir, "--num-layers", "8", "--train-batch-size", "8",
                "--eval-batch-size", "100", "--train-epochs", str(self.args.sweep_epochs),
                "--progress-secs", str(PROGRESS_SECS), "--seed", str(seed)]

    def _trainers(self) -> list[tuple[int, str]]:
        """The live trainer processes of this sweep's trials: (pid, trial name)."""
        mark = b"--job-dir\0" + self.job_dir.encode() + b"/"
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    line = f.read()
                if b"-m\0cifar10_estimator\0" in line and mark in line:
                    name = line.split(mark, 1)[1].split(b"\0", 1)[0].decode()
                    found.append((int(entry), name))
        return found

    def _refresh(self, run: Run) -> None:
        now = time.monotonic()
        if now >= self._next_scan:  # all of /proc: not at every tick
            self._next_scan = now + SCAN_SECS
            for pid, name in self._trainers():
                run.pids[name] = pid
                self.trainers.setdefault(name, {}).setdefault(pid, _start_time(pid))

    def _count_chiefs(self) -> None:
        """Per trial, two trainers alive at once: recorded (older, younger) with the time each
        was last seen alive. The job dir's lock refuses a second trainer at its start, so the
        younger of such a pair must end first (the trial then runs it again)."""
        now = time.monotonic()
        for pids in self.trainers.values():
            alive = sorted((start, pid) for pid, start in pids.items() if _alive(pid))
            for _, pid in alive:
                self.last_alive[pid] = now
            for (_, older), (_, younger) in zip(alive, alive[1:]):
                self.overlaps.add((older, younger))

    def _watch_timed(self, run: Run, now: float) -> None:
        for fault in self.faults:
            if fault.kind not in TIMED or fault.landed or now > fault.undo_at:
                continue
            for name, pid in sorted(run.pids.items()):
                folder = os.path.join(self.job_dir, name)
                if fault.kind == "export":
                    folder = os.path.join(folder, "export")
                ending = "_temp" if fault.kind == "save" else ".tmp"
                try:
                    hit = any(n.endswith(ending) for n in os.listdir(folder))
                except OSError:
                    continue
                if hit and _alive(pid) and _signal(pid, signal.SIGKILL):
                    fault.landed, fault.at, fault.target = True, now, name
                    break

    def _trial_dirs(self) -> list[str]:
        return sorted(n for n in os.listdir(self.job_dir) if n.startswith("trial-")
                      and os.path.isdir(os.path.join(self.job_dir, n)))

    def check(self, status: int, reference, noise: float = 0.0) -> dict:
        import tensorflow as tf

        texts = [run.text() for run in self.runs]
        row = {"engine": self.engine, "job": os.path.basename(self.folder),
               "minutes": (time.monotonic() - self.started) / 60, "runs": len(self.runs),
               "faults": collections.Counter(f.kind for f in self.faults
                                             if f.kind not in TIMED or f.landed)}
        try:
            with open(os.path.join(self.job_dir, SWEEP_RECORD)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            record = {}
        trials = [t for t in record.get("trials", ()) if t.get("in_grid", True)]
        statuses = collections.Counter(t["status"] for t in trials)
        row["statuses"] = statuses
        # end: every trial finished or stopped early, none failed; each finished one at its
        # last step with its export and report; the best named.
        planned = self.args.sweep_epochs * self.args.train_records // 8
        finished, ends, steps = {}, [], []
        for trial in trials:
            job = os.path.join(self.job_dir, trial["name"])
            if trial["status"] != "finished":
                continue
            finished[trial["name"]] = trial.get("value")
            state = tf.train.get_checkpoint_state(job)
            step = (int(state.model_checkpoint_path.rsplit("-", 1)[1]) if state else -1)
            steps.append(step)
            export = os.path.join(job, "export")
            versions = ([v for v in os.listdir(export) if v.isdigit()]
                        if os.path.isdir(export) else [])
            ends.append(step >= planned and bool(versions)
                        and os.path.exists(os.path.join(job, "eval_report.json")))
        row["end"] = (status == 0 and len(trials) == self.args.sweep_trials
                      and set(statuses) <= {"finished", "stopped"} and bool(finished)
                      and all(ends) and bool(record.get("best")))
        row["step"] = min(steps, default=-1)
        # accuracy: the best trial's, within 3 binomial standard errors of the difference of
        # two accuracies on the evaluation split of the undisturbed sweep's best. (Which trial
        # is best, and which trials ASHA stops, may differ: its rungs compare the trials in
        # the order they report, which faults change. And a trial near the learning rates
        # that diverge ends far from its undisturbed self on any resume, as another seed.)
        row["accuracy"] = finished.get(record.get("best"))
        row["accuracies"] = finished
        best = max((a for a in (reference or {}).values() if a is not None), default=None) \
            if isinstance(reference, dict) else None
        row["far"] = []
        if best is None or row["accuracy"] is None:
            row["accuracy ok"] = row["accuracy"] is not None
        else:
            bound = 3 * math.sqrt(2 * best * (1 - best) / self.args.eval_records)
            row["accuracy ok"] = abs(row["accuracy"] - best) <= bound + 1e-9
            if not row["accuracy ok"]:
                row["far"] = [f"best {row['accuracy']:.4f} against {best:.4f} (+-{bound:.4f})"]
        # checkpoints, in every trial's job dir
        broken = []
        for name in self._trial_dirs():
            job = os.path.join(self.job_dir, name)
            for file in sorted(os.listdir(job)):
                if file.startswith("model.ckpt-") and file.endswith(".index"):
                    try:
                        reader = tf.train.load_checkpoint(os.path.join(job, file[:-6]))
                        for variable in reader.get_variable_to_shape_map():
                            reader.get_tensor(variable)
                    except Exception as e:  # noqa: BLE001  (what is broken is the finding)
                        broken.append(f"{name}/{file}: {str(e).splitlines()[0]}")
        row["checkpoints ok"], row["broken"] = not broken, broken
        # one trainer per trial: of two alive at once, the younger ended first (refused)
        bad = [(o, y) for o, y in self.overlaps
               if self.last_alive.get(y, 0) > self.last_alive.get(o, 0) + SCAN_SECS]
        row["one chief"], row["two trainers"] = not bad, bad
        # redone: a trial's trainer resumes from its last checkpoint, at most an epoch back;
        # each trial's log holds only its last trainer's lines, so it is not measured here.
        row["redone"], row["redone ok"] = [], True
        # left
        left = self._left()
        temps = []
        for name in self._trial_dirs():
            job = os.path.join(self.job_dir, name)
            temps += [f"{name}/{n}" for n in os.listdir(job) if n.endswith("_temp")]
            export = os.path.join(job, "export")
            temps += [f"{name}/export/{n}" for n in (os.listdir(export) if os.path.isdir(
                export) else []) if n.endswith(".tmp")]
        row["left ok"], row["left"] = not left and not temps, left + temps
        # quiet: the driver's output and every trial's log
        logs = []
        for name in self._trial_dirs():
            with contextlib.suppress(OSError):
                with open(os.path.join(self.job_dir, name, "trial.log"), errors="replace") as f:
                    logs.append(f.read())
        stray = [line for text in texts + logs for line in text.splitlines()
                 if "Traceback" in line or "Exception in thread" in line
                 or ERROR_LINE.match(line)]
        row["quiet ok"], row["stray"] = not stray, stray[:5]
        row["held"] = all(row[k] for k in ("end", "accuracy ok", "checkpoints ok", "one chief",
                                           "redone ok", "left ok", "quiet ok"))
        return row


def _start_time(pid: int) -> int:
    """A process's start time, in clock ticks since boot (proc(5), stat's 22nd field)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    return 0


JOBS = {"sweep": SweepJob}  # the engines whose jobs are not Job's


def _undisturbed(args, engine, data_dir, work, seed: int, world: Optional[RayWorld]):
    """An undisturbed job's final accuracy (a sweep's: its finished trials', by name)."""
    job = JOBS.get(engine, Job)(engine, 0, args, data_dir, work, random.Random(0), args.kinds,
                                disturbed=False, seed=seed, world=world)
    try:
        status = job.run(time.monotonic() + 3600)
        row = job.check(status, None)
    finally:
        job.close()
    print(f"{engine}: undisturbed job, seed {seed}: exit {status}, accuracy "
          f"{row.get('accuracies', row['accuracy'])}, {row['minutes']:.1f} min", flush=True)
    return row.get("accuracies", row["accuracy"])


def _reference(args, engine, data_dir, work, world: Optional[RayWorld]
               ) -> tuple[Optional[float], float]:
    """The undisturbed job's accuracy at ``--seed``, and the noise a disturbed job's may differ
    from it by: the largest difference from it of undisturbed jobs at ``--noise-seeds`` other
    seeds (a job resumed from a checkpoint reads its pictures in another order from there, as
    another seed would), else 3 binomial standard errors of the difference of two accuracies
    on the evaluation split (the evaluation's own noise alone). A sweep's: its finished
    trials' accuracies, each the reference of the same trial (``SweepJob.check``)."""
    if args.no_reference:
        return None, 0.0
    reference = _undisturbed(args, engine, data_dir, work, args.seed, world)
    if engine == "sweep":
        return reference, 0.0
    others = [_undisturbed(args, engine, data_dir, work, args.seed + k, world)
              for k in range(1, args.noise_seeds + 1)]
    others = [a for a in others if a is not None]
    if reference is None:
        return None, 0.0
    if others:
        noise = max(abs(a - reference) for a in others)
        how = f"the largest difference of {len(others)} other seeds' undisturbed jobs"
    else:
        noise = 3 * math.sqrt(2 * reference * (1 - reference) / args.eval_records)
        how = "3 binomial standard errors of the evaluation split"
    print(f"{engine}: accuracy {reference:.4f} at seed {args.seed}, noise {noise:.4f} ({how})",
          flush=True)
    return reference, noise


def _can(kind: str, work: str) -> str:
    """'' if this machine can do fault ``kind``, else why not."""
    if os.geteuid() != 0 and kind in ("disk", "links"):
        return "needs root"
    if kind == "links" and not (shutil.which("tc") and shutil.which("nsenter")):
        return "no tc or nsenter"
    if kind == "disk":
        probe = os.path.join(work, "probe")
        os.makedirs(probe, exist_ok=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe],
                          capture_output=True).returncode:
            return "cannot mount a tmpfs"
        subprocess.run(["umount", probe], capture_output=True)
    return ""


def _table(rows: list[dict]) -> None:
    columns = ("engine", "job", "minutes", "runs", "faults", "step", "accuracy", "end",
               "accuracy ok", "checkpoints ok", "one chief", "redone", "left ok", "quiet ok",
               "held")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = []
        for c in columns:
            value = row[c]
            if isinstance(value, bool):
                value = "yes" if value else "**no**"
            elif isinstance(value, float):
                value = f"{value:.2f}" if c == "minutes" else f"{value:.4f}"
            elif isinstance(value, collections.Counter):
                value = ", ".join(f"{k} {n}" for k, n in sorted(value.items())) or "none"
            elif isinstance(value, list):
                value = ",".join(map(str, value)) or "-"
            cells.append(str(value))
        print("| " + " | ".join(cells) + " |")
    for row in rows:
        for key in ("broken", "left", "stray", "far", "two trainers"):
            if row.get(key):
                print(f"{row['job']}: {key}: {row[key]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="ps,allreduce",
                        help=f"comma-separated, of {', '.join(ENGINES)}")
    parser.add_argument("--minutes", type=float, default=60,
                        help="minutes of faults per engine (jobs start until then)")
    parser.add_argument("--seed", type=int, default=1, help="the schedule's and jobs' seed")
    parser.add_argument("--kinds", default=",".join(KINDS), help="faults to draw from")
    parser.add_argument("--gap", default="10,60", help="seconds between faults: LOW,HIGH")
    parser.add_argument("--hold", default="10,30",
                        help="seconds a stop, a cut link or a full disk lasts: LOW,HIGH")
    parser.add_argument("--train-steps", type=int, default=3000)
    parser.add_argument("--checkpoint-steps", type=int, default=200)
    parser.add_argument("--disk-mb", type=int, default=64,
                        help="the size of a job dir's tmpfs (a sweep's: per trial)")
    parser.add_argument("--sweep-trials", type=int, default=6,
                        help="the sweep engine's trials, drawn at --seed")
    parser.add_argument("--sweep-epochs", type=int, default=3,
                        help="the sweep engine's trials' epochs (ASHA's rungs at 1 and 3)")
    parser.add_argument("--reruns", type=int, default=20,
                        help="times a job's command is run again before it counts as failed")
    parser.add_argument("--overrun", type=float, default=900,
                        help="seconds a job may run past --minutes before it is stopped")
    parser.add_argument("--max-rate", type=float, default=60,
                        help="global steps a second the cluster trains at most: the steps in "
                             "flight the redone invariant allows")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the undisturbed job (accuracy then only has to exist)")
    parser.add_argument("--noise-seeds", type=int, default=3,
                        help="undisturbed jobs at other seeds that measure the accuracy's noise "
                             "(0: the evaluation's binomial noise alone)")
    parser.add_argument("--work-dir", default=None)
    args = parser.parse_args()
    args.gap = tuple(float(v) for v in args.gap.split(","))
    args.hold = tuple(float(v) for v in args.hold.split(","))
    engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        parser.error(f"--engines: unknown {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    import importlib.util

    for engine, needs, how in (
            ("ray", ("ray", "moto", "boto3", "tensorflow_io"),
             "run it with TensorFlow 2.15's (pip install -e '.[test,s3,ray]')"),
            ("sweep", ("ray",), "pip install -e '.[test,ray]'")):
        lacking = [m for m in needs if importlib.util.find_spec(m) is None]
        if engine in engines and lacking:
            parser.error(f"--engines {engine}: this Python lacks {', '.join(lacking)}: {how}")
    work = args.work_dir or tempfile.mkdtemp(prefix="c10chaos.")
    kinds = []
    print_machine_line()
    for kind in args.kinds.split(","):
        if kind not in KINDS:
            parser.error(f"--kinds: unknown {kind}; choose from {', '.join(KINDS)}")
        why = _can(kind, work)
        if why:
            print(f"left out: {kind} ({why})")
        else:
            kinds.append(kind)
    args.kinds = tuple(kinds)
    data_dir = make_sample_records(work)
    with open(os.path.join(data_dir, METADATA)) as f:
        counts = json.load(f)["counts"]
    args.eval_records, args.train_records = counts["eval"], counts["train"]
    print(f"seed {args.seed}; faults from {', '.join(args.kinds)} every {args.gap[0]:g}-"
          f"{args.gap[1]:g} s; ResNet-8, {args.train_steps} steps, a checkpoint every "
          f"{args.checkpoint_steps} (a sweep: {args.sweep_trials} trials of "
          f"{args.sweep_epochs} epochs, a checkpoint an epoch); {args.eval_records} "
          f"evaluation pictures", flush=True)
    rows, worlds = [], []
    try:
        for engine in engines:
            world = (RayWorld(work, data_dir, bucket=engine == "ray")
                     if engine in ("ray", "sweep") else None)
            worlds.append(world)
            reference, noise = _reference(args, engine, data_dir, work, world)
            rng = random.Random(f"{args.seed}-{engine}")
            deadline = time.monotonic() + args.minutes * 60
            number = 1
            while time.monotonic() < deadline:
                job = JOBS.get(engine, Job)(engine, number, args, data_dir, work, rng,
                                            args.kinds, True, world=world)
                try:
                    status = job.run(deadline)
                    row = job.check(status, reference, noise)
                finally:
                    job.close()
                rows.append(row)
                print(f"{engine} job {number}: exit {status}, {len(job.faults)} faults "
                      f"({dict(row['faults'])}), {row['runs']} runs, held: {row['held']}",
                      flush=True)
                number += 1
    finally:
        for world in worlds:
            if world:
                world.close()
        held = bool(rows) and all(r["held"] for r in rows)
        if args.work_dir is None and held:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"the jobs' folders and logs: {work}")
    _table(rows)
    for engine in engines:
        done = [r for r in rows if r["engine"] == engine]
        faults = sum((r["faults"] for r in done), collections.Counter())
        redone = [n for r in done for n in r["redone"]]
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(faults.items()))
        print(f"{engine}: {sum(r['minutes'] for r in done):.1f} min, {len(done)} jobs, "
              f"{sum(faults.values())} faults ({kinds}), "
              f"{sum(r['held'] for r in done)} held; steps redone per resume: "
              f"median {sorted(redone)[len(redone) // 2] if redone else 0}, "
              f"max {max(redone, default=0)}")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
