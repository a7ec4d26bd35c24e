"""Fixtures for the trainer's tests: tiny record sets in the real schema, tiny configs."""

import os
import re
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
TINY_FLAGS = ["--num-layers", "8", "--train-batch-size", "8", "--eval-batch-size", "8"]


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


def run_module(module: str, *args: str, env_extra: dict | None = None, timeout: int = 300,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs ``python -m module args`` in a fresh process; returns the completed process.

    The process gets ``env`` (default: this one's environment) plus ``env_extra``.
    """
    base = os.environ if env is None else env
    env = {k: v for k, v in base.items() if k != "TF_CONFIG"}  # never a stray cluster
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, env=env)


def checkpoint_of(num_layers: int, folder, name: str = "model.ckpt") -> str:
    """A real checkpoint of a ResNet of this depth (initial weights, no training)."""
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("resnet"):
            resnet.resnet_cifar(tf.zeros([1, 32, 32, 3]), is_training=False,
                                num_layers=num_layers)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(sess, os.path.join(str(folder), name))


def bomb_png(width: int, height: int) -> bytes:
    """A small, well-formed PNG whose header promises ``width`` x ``height`` pixels: the start of
    a decompression bomb (its image data is a few bytes of zeros)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def trainer_env(tf_config: str | None = None) -> dict:
    """This environment without a stray TF_CONFIG (or with the given one), unbuffered."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONUNBUFFERED"] = "1"
    if tf_config:
        env["TF_CONFIG"] = tf_config
    return env


class Trainer:
    """``python -m cifar10_estimator`` in the background, its log in a file."""

    def __init__(self, args: list[str], log, tf_config: str | None = None):
        self.log = log
        with open(log, "w") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "cifar10_estimator", *args],
                                            stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                            env=trainer_env(tf_config))

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
