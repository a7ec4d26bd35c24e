"""Fixtures for the trainer's tests: tiny record sets in the real schema, tiny configs, the
trainer's flags (``trainer_args``, ``ENDLESS``, ``NO_EVAL``) and its processes (``run_trainer``
to the end, ``Trainer`` in the background; warm-started where they can be, ``warm_start``),
which never run in the checkout; artefacts built once for the whole run (``built_once``:
``tiny_export``); the job-dir lock's file as a holder writes it (``write_lock_file``).
Clusters: ``cluster_fixtures``."""

import fcntl
import importlib.util
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.data import schema
from cifar10_estimator.model import resnet
from cifar10_estimator.model.checkpoints import checkpoint_step  # noqa: F401  (for the tests)
import warm_start

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ResNet-8, batch 8: the smallest network with every kind of block (stride and channel
# changes in stages 2 and 3), so the tests stay fast on two cores.
TINY_BATCHES = ["--train-batch-size", "8", "--eval-batch-size", "8"]
TINY_FLAGS = ["--num-layers", "8", *TINY_BATCHES]


def trainer_args(data_dir, job_dir, *extra: str, tiny: list[str] = TINY_FLAGS) -> list[str]:
    """The trainer's flags for a tiny run: ``--data-dir``, ``--job-dir``, ``tiny`` (the tiny
    ResNet's, ``TINY_FLAGS``; ``TINY_BATCHES`` for a model without ``--num-layers``), then the
    test's own ``extra`` flags (later flags win, so ``extra`` may also change a size)."""
    return ["--data-dir", str(data_dir), "--job-dir", str(job_dir), *tiny, *extra]


# The session's temporary work folder (set by conftest's ``work_folder`` fixture): the current
# folder of every process the suite starts, so that none runs in the checkout.
_WORK_DIR: list[str] = []


def set_work_dir(folder: str | None) -> None:
    _WORK_DIR[:] = [folder] if folder else []


def work_dir() -> str:
    """The folder the suite's processes run in: a temporary one, never the checkout."""
    assert _WORK_DIR, "conftest's work_folder fixture sets the work folder"
    return _WORK_DIR[0]


def learnable_images(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """CHW uint8 rows whose brightness encodes the label (a network learns it in a few steps)."""
    base = (labels[:, None] * 24 + 8).astype(np.int32)
    noise = rng.integers(-8, 9, size=(len(labels), schema.IMAGE_BYTES))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def write_records(data_dir: str, sizes: dict, seed: int = 0) -> dict:
    """Writes train/validation/eval.tfrecords with the package's encoder; returns the rows."""
    import tensorflow as tf

    os.makedirs(data_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = {}
    for split, n in sizes.items():
        labels = np.arange(n) % schema.NUM_CLASSES
        rng.shuffle(labels)
        images = learnable_images(labels, rng)
        with tf.io.TFRecordWriter(schema.record_path(data_dir, split)) as writer:
            for image, label in zip(images, labels):
                writer.write(schema.encode_example(image.tobytes(), int(label)))
        rows[split] = (images, labels)
    return rows


@pytest.fixture(scope="session")
def tiny_records(tmp_path_factory):
    """A data dir with 96 train, 16 validation and 37 eval records (37: a partial last batch)."""
    data_dir = str(tmp_path_factory.mktemp("records"))
    rows = write_records(data_dir, {"train": 96, "validation": 16, "eval": 37})
    return data_dir, rows


def built_once(tmp_path_factory, name: str, build) -> str:
    """A folder that ``build(folder)`` fills, built once for the whole test run and copied for
    this test process, whose tests may change their copy.

    Under pytest-xdist the first worker that asks builds it, in the run's temporary folder,
    which every worker sees (the others wait on a file lock meanwhile); a build that fails
    leaves nothing behind, and the next worker that asks tries again. Without xdist it is
    built in this session's temporary folder."""
    mine = tmp_path_factory.mktemp(name)
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        build(str(mine))
        return str(mine)
    run_root = tmp_path_factory.getbasetemp().parent  # shared by the run's workers
    shared = run_root / f"built-once-{name}"
    with open(run_root / f"built-once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not shared.exists():
            partial = run_root / f"built-once-{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            build(str(partial))
            os.rename(partial, shared)
    shutil.copytree(shared, mine, symlinks=True, dirs_exist_ok=True)
    return str(mine)


@pytest.fixture(scope="session")
def tiny_export(tiny_records, tmp_path_factory) -> str:
    """The SavedModel folder of a tiny ResNet trained 3 steps on ``tiny_records`` (its job dir
    is two folders up), shared by the tests that only read an export. Trained once for the
    whole run (``built_once``: under pytest-xdist by the first worker that asks, on its own
    ``tiny_records``, which hold the same records in every worker); each test process reads a
    copy of its own."""
    from cifar10_estimator import train

    data_dir, _ = tiny_records

    def build(folder: str) -> None:
        # Seeded: the same network every run, so the tests that read its classes (the int8
        # gate's needs more than two across brightness levels) do not hang on an unseeded draw.
        result = train.run(trainer_args(data_dir, os.path.join(folder, "job"), "--train-steps",
                                        "3", "--eval-throttle-secs", "100000", "--seed", "1"))
        with open(os.path.join(folder, "export-path"), "w") as f:  # job/export/<version>
            f.write(os.path.relpath(result.export_path, folder))

    folder = built_once(tmp_path_factory, "tiny-export", build)
    with open(os.path.join(folder, "export-path")) as f:
        return os.path.join(folder, f.read())


def run_module(module: str, *args: str, env_extra: dict | None = None, timeout: int = 300,
               env: dict | None = None, cwd=None, cold: bool = False
               ) -> subprocess.CompletedProcess:
    """Runs ``python -m module args`` in a fresh process; returns the completed process.

    The process gets ``env`` (default: this one's environment) plus ``env_extra``, and runs in
    ``cwd`` (default: the session's temporary work folder). The trainer, ``predict`` and
    ``evaluate`` are warm-started where they can be (``warm_start``) unless ``cold``.
    """
    base = os.environ if env is None else env
    env = {k: v for k, v in base.items() if k != "TF_CONFIG"}  # never a stray cluster
    env.update(env_extra or {})
    cwd = cwd or work_dir()
    if not cold and warm_start.can_start_warm(module, list(args), env, work_dir()):
        return _run_warm(module, list(args), env, cwd, timeout)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def _run_warm(module: str, args: list, env: dict, cwd, timeout: float
              ) -> subprocess.CompletedProcess:
    """``run_module``, warm-started (``warm_start``)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=work_dir()) as streams:
        out, err = os.path.join(streams, "stdout"), os.path.join(streams, "stderr")
        process = warm_start.start(module, args, env, cwd, out, err)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        with open(out, errors="replace") as o, open(err, errors="replace") as e:
            return subprocess.CompletedProcess([sys.executable, "-m", module, *args],
                                               process.returncode, o.read(), e.read())


def checkpoint_of(num_layers: int, folder, name: str = "model.ckpt") -> str:
    """A real checkpoint of a ResNet of this depth (initial weights, no training), named and
    holding a global step as Estimator's are (``name-0``)."""
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("resnet"):
            resnet.resnet_cifar(tf.zeros([1, 32, 32, 3]), is_training=False,
                                num_layers=num_layers)
        step = tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(sess, os.path.join(str(folder), name),
                                                   global_step=step)


def bomb_png(width: int, height: int) -> bytes:
    """A small, well-formed PNG whose header promises ``width`` x ``height`` pixels: the start of
    a decompression bomb (its image data is a few bytes of zeros)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def trainer_env(tf_config: str | None = None, extra: dict | None = None) -> dict:
    """This environment without a stray TF_CONFIG (or with the given one), unbuffered, plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONUNBUFFERED"] = "1"
    # The suite's Ray clusters are its own, on this host. Ray 2.60's `ray start` turns token
    # authentication on when ~/.ray/auth_token exists (any local `ray.init()` writes one), and
    # its clients then fail without the mode set: off, explicitly, whatever the home holds.
    env.setdefault("RAY_AUTH_MODE", "disabled")
    if tf_config:
        env["TF_CONFIG"] = tf_config
    env.update(extra or {})
    return env


# A run that trains until a test stops it, and the line that shows it training (a progress
# line: the task has run a step; with --progress-secs 1, a second after its first step).
ENDLESS = ("--progress-secs", "1", "--train-steps", "100000")
TRAINING = r"step \d+/100000"
# No evaluation during training (the final one still runs).
NO_EVAL = ("--eval-throttle-secs", "100000")


def run_trainer(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """``python -m cifar10_estimator ARGS`` to its end in a fresh process (``run_module``)."""
    return run_module("cifar10_estimator", *args, **kwargs)


def run_concurrently(*calls):
    """Calls each of ``calls`` (functions of no arguments, such as a command run to its end)
    in a thread of its own, all at once, and returns their results in order once every call
    has returned; the first exception among them, if any, is raised then."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
    return [future.result() for future in futures]


# s3:// needs tensorflow-io, which only the s3 extra's pair has (TensorFlow 2.15 on Python
# 3.11: docs/versions.md); elsewhere the tests of s3:// give way to its one-line refusal.
HAS_S3 = importlib.util.find_spec("tensorflow_io") is not None
NEEDS_S3 = pytest.mark.skipif(not HAS_S3, reason="s3:// needs tensorflow-io: the s3 extra "
                              "(TensorFlow 2.15 on Python 3.11, .ci/run's second leg)")

# TensorFlow's C++ log lines (absl's format: severity, date, time, thread, file:line]), and the
# notice absl prints before its first one. Which appear depends on the release and the wheel
# (2.21's CUDA wheel, oneDNN's type notices), so tests that compare logs leave them out.
CPP_LOG_LINE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] |"
                          r"WARNING: All log messages before absl::InitializeLog\(\))")


def without_cpp_log(text: str) -> str:
    """``text`` without TensorFlow's C++ log lines."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not CPP_LOG_LINE.match(line))


def one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Asserts a user-error exit: status 2, no traceback, a last line on stderr naming every
    fragment; returns that line."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    for fragment in fragments:
        assert fragment in last, last
    return last


def last_line(text: str) -> str:
    """The last line of a command's output (its error line, when it failed)."""
    return text.strip().splitlines()[-1]


def wait_until(condition, what: str, timeout: float = 30, interval: float = 0.01) -> None:
    """Until ``condition()`` holds; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(interval)


class Trainer:
    """``python -m cifar10_estimator ARGS`` in the background, its output in the file ``log``,
    running in ``cwd`` (default: the session's work folder); ``tf_config`` makes it a
    cluster's task. Started at once unless ``start`` is false (then ``start()``); warm-started
    where it can be (``warm_start``) unless ``cold``."""

    def __init__(self, args: list[str], log, tf_config: str | None = None,
                 env_extra: dict | None = None, cwd=None, start: bool = True,
                 cold: bool = False):
        self.args, self.log, self.tf_config, self.env_extra = list(args), log, tf_config, env_extra
        self.cwd, self.cold = cwd, cold
        self.process: subprocess.Popen | warm_start.WarmProcess | None = None
        if start:
            self.start()

    def _open_log(self):
        return open(self.log, "w")

    def start(self) -> None:
        env, cwd = trainer_env(self.tf_config, self.env_extra), self.cwd or work_dir()
        with self._open_log() as out:
            if not self.cold and warm_start.can_start_warm(warm_start.TRAINER, self.args, env,
                                                           work_dir()):
                out.flush()
                self.process = warm_start.start(warm_start.TRAINER, self.args, env, cwd,
                                                self.log, append=True)
                return
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cifar10_estimator", *self.args], stdout=out,
                stderr=subprocess.STDOUT, cwd=cwd, env=env)

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        """Until ``pattern`` is in the log; fails if the process ends first."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text()):
            assert self.process.poll() is None, self.text()[-3000:]
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n{self.text()[-3000:]}"
            time.sleep(0.1)

    def send(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL, and waits for the end: no chance to save or release anything."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """Kills the process if it still runs (a test's clean-up)."""
        if self.process is not None and self.process.poll() is None:
            self.kill()

    def finish(self, timeout: float = 60) -> int:
        """Its exit status, waiting up to ``timeout`` seconds; killed if it runs longer."""
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()


# A job-dir lock's heartbeat that never comes during a test (an hour).
NO_BEAT = 3600.0


def write_lock_file(path, **holder) -> None:
    """Writes a holder's job-dir lock file as a trainer does: whole, by an atomic rename (a
    reader, the heartbeat thread included, never sees it half-written). The holder is this
    process unless ``holder`` says otherwise (``host``, ``pid``, ...)."""
    import json
    import socket

    from cifar10_estimator.jobdir import lock as job_lock

    body = {"host": socket.gethostname(), "boot_id": job_lock._boot_id(), "pid": os.getpid(),
            "start_ticks": job_lock._start_ticks(os.getpid()), "since": "2026-01-01T00:00:00",
            "beat": 0}
    body.update(holder)
    partial = path.with_name(path.name + ".writing")
    partial.write_text(json.dumps(body))
    os.replace(partial, path)
