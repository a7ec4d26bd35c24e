"""Fixtures for the trainer's tests: tiny record sets in the real schema, tiny configs, the
trainer's flags (``trainer_args``) and its processes, which never run in the checkout."""

import os
import re
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


@pytest.fixture(scope="session")
def tiny_export(tiny_records, tmp_path_factory) -> str:
    """The SavedModel folder of a tiny ResNet trained 3 steps on ``tiny_records`` (its job dir
    is two folders up), shared by the tests that only read an export."""
    from cifar10_estimator import train

    data_dir, _ = tiny_records
    job_dir = tmp_path_factory.mktemp("tiny-export") / "job"
    result = train.run(trainer_args(data_dir, job_dir, "--train-steps", "3",
                                    "--eval-throttle-secs", "100000"))
    return result.export_path


def run_module(module: str, *args: str, env_extra: dict | None = None, timeout: int = 300,
               env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Runs ``python -m module args`` in a fresh process; returns the completed process.

    The process gets ``env`` (default: this one's environment) plus ``env_extra``, and runs in
    ``cwd`` (default: the session's temporary work folder).
    """
    base = os.environ if env is None else env
    env = {k: v for k, v in base.items() if k != "TF_CONFIG"}  # never a stray cluster
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd or work_dir(), env=env)


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
    if tf_config:
        env["TF_CONFIG"] = tf_config
    env.update(extra or {})
    return env


class Trainer:
    """``python -m cifar10_estimator`` in the background, its log in a file."""

    def __init__(self, args: list[str], log, tf_config: str | None = None,
                 env_extra: dict | None = None):
        self.log = log
        with open(log, "w") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "cifar10_estimator", *args],
                                            stdout=out, stderr=subprocess.STDOUT,
                                            cwd=work_dir(),
                                            env=trainer_env(tf_config, env_extra))

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, pattern: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text()):
            assert self.process.poll() is None, self.text()[-3000:]
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n{self.text()[-3000:]}"
            time.sleep(0.1)

    def finish(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()


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
    for whatever is left after ``grace`` seconds. Its tasks run in their own sessions, so a
    killed launcher alone would leave them training on this machine's two cores."""
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(grace)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
    text = log.read_text() if os.path.exists(log) else ""
    for pid in re.findall(r"\[cluster\] started \w+ \(pid (\d+)\)", text):
        if _is_trainer(int(pid)):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def start_cluster(args: list[str], log) -> subprocess.Popen:
    """``python -m cifar10_estimator.cluster ARGS`` in the background, its output in ``log``;
    end it with ``stop_cluster``."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "cifar10_estimator.cluster", *args],
                                stdout=out, stderr=subprocess.STDOUT, cwd=work_dir(),
                                env=trainer_env())


def cluster_pids(log) -> dict[str, int]:
    """The tasks the launcher started, by name: the pid of each one's latest start."""
    return {name: int(pid) for name, pid in
            re.findall(r"\[cluster\] started (\w+) \(pid (\d+)\)", log.read_text())}


def run_cluster(args: list[str], log, timeout: float = 240) -> tuple[int, str]:
    """Runs the launcher with ``args`` to its end, its output in the file ``log``; returns its
    exit status and output. A launcher still running after ``timeout`` seconds (or a test
    interrupted meanwhile, by pytest-timeout for one) is stopped with every task it started."""
    launcher = start_cluster(args, log)
    try:
        code = launcher.wait(timeout)
    finally:
        stop_cluster(launcher, log)
    return code, log.read_text()
