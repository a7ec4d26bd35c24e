"""CIFAR-10 facts and the TFRecord schema: the one place the writer and the reader agree on.

The generator (``generate``) writes records with ``encode_example``; the input pipeline
(``dataset``) and the serving signature (``export``) read them with ``FEATURE_SPEC`` and
``decode_images``. The schema is the original TensorFlow tutorial's, so files move both ways:
one ``tf.train.Example`` per image with ``image`` = the 3,072 raw bytes exactly as CIFAR stores
them (channel-major, "CHW": 1,024 red, 1,024 green, 1,024 blue, each 32x32 row-major) and
``label`` = an int64 class id.
"""

import json
import os
from typing import Mapping

import tensorflow as tf

from cifar10_estimator import fsutil
from cifar10_estimator.errors import UserError

# https://www.cs.toronto.edu/~kriz/cifar.html: 32x32 RGB images, 10 classes.
HEIGHT = 32
WIDTH = 32
CHANNELS = 3
IMAGE_BYTES = HEIGHT * WIDTH * CHANNELS  # 3,072
NUM_CLASSES = 10
# Class names in label order, as listed in the dataset's batches.meta.
CLASS_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)

# Which python batches make each split. The original tutorial's mapping: batch 5 is held out
# as validation, the official test batch is "eval".
SPLITS: Mapping[str, tuple[str, ...]] = {
    "train": ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4"),
    "validation": ("data_batch_5",),
    "eval": ("test_batch",),
}
# Record counts of the real dataset (10,000 images per python batch).
REAL_SPLIT_SIZES = {"train": 40_000, "validation": 10_000, "eval": 10_000}

BATCHES_DIRNAME = "cifar-10-batches-py"
METADATA_FILENAME = "cifar10_records.json"

FEATURE_SPEC = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}

GENERATOR_COMMAND = "python tools/generate_tfrecords.py --data-dir DIR (or --sample for built-in sample data)"


def record_path(data_dir: str, split: str) -> str:
    """The TFRecord file of ``split`` ('train', 'validation' or 'eval') in ``data_dir``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLITS)}")
    return os.path.join(data_dir, f"{split}.tfrecords")


def encode_example(image: bytes, label: int) -> bytes:
    """Serializes one image (3,072 CHW bytes) and its label as a ``tf.train.Example``.

    The feature map is built with ``image`` first, then ``label``, as the original generator did,
    so the serialized bytes are identical to its records.
    """
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def decode_images(raw: tf.Tensor) -> tf.Tensor:
    """Turns raw image strings of any batch shape ``S`` into uint8 images of shape S + (32, 32, 3).

    The bytes are channel-major (CHW) as CIFAR stores them; the result is HWC.
    """
    pixels = tf.io.decode_raw(raw, tf.uint8)
    batch_shape = tf.shape(raw)
    chw = tf.reshape(pixels, tf.concat([batch_shape, [CHANNELS, HEIGHT, WIDTH]], axis=0))
    rank = raw.shape.rank
    perm = list(range(rank)) + [rank + 1, rank + 2, rank]
    return tf.transpose(chw, perm)


def write_metadata(data_dir: str, counts: Mapping[str, int], source: str) -> None:
    """Records the true split sizes and where they came from beside the records (atomically)."""
    body = {"format": 1, "counts": dict(counts), "source": source}
    fsutil.write_bytes_atomic(os.path.join(data_dir, METADATA_FILENAME),
                              (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())


def count_records(path: str) -> int:
    """Counts the records of one TFRecord file by reading it (used when no metadata exists)."""
    try:
        return sum(1 for _ in tf.compat.v1.io.tf_record_iterator(path))
    except tf.errors.DataLossError as e:
        raise UserError(f"{path} is truncated or corrupt ({e.message.splitlines()[0]}); "
                        f"regenerate it with {GENERATOR_COMMAND}") from None


def split_size(data_dir: str, split: str) -> int:
    """The number of records in ``split``: from the metadata file if present, else by counting.

    Files made by the original tutorial's generator have no metadata file; they are counted.
    """
    path = record_path(data_dir, split)
    if not os.path.exists(path):
        raise UserError(f"{path} not found; generate the records with {GENERATOR_COMMAND}")
    meta_path = os.path.join(data_dir, METADATA_FILENAME)
    if os.path.exists(meta_path):
        try:
            with open(meta_path) as f:
                counts = json.load(f)["counts"]
            # Trust the metadata only if it is at least as new as the records it describes.
            if (split in counts and
                    os.path.getmtime(meta_path) >= os.path.getmtime(path)):
                return int(counts[split])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return count_records(path)
