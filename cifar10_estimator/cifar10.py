"""CIFAR-10 facts and the TFRecord schema: the one place the writer and the reader agree on.

The generator (``generate``) writes records with ``encode_example``; the input pipeline
(``dataset``) and the serving signature (``export``) read them with ``FEATURE_SPEC`` and
``decode_images``. The schema is the original TensorFlow tutorial's, so files move both ways:
one ``tf.train.Example`` per image with ``image`` = the 3,072 raw bytes exactly as CIFAR stores
them (channel-major, "CHW": 1,024 red, 1,024 green, 1,024 blue, each 32x32 row-major) and
``label`` = an int64 class id.

TensorFlow is imported on first use, not at import time: the generator's source handling, the
sample data and the batch loader use the constants here without paying for (or being logged
at by) a TensorFlow import, and command lines can set TensorFlow's log level first.
``FEATURE_SPEC`` is built on first access (PEP 562 module ``__getattr__``).
"""


import functools
import json
import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from cifar10_estimator import fsutil
from cifar10_estimator.errors import UserError

if TYPE_CHECKING:
    import tensorflow as tf

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

GENERATOR_COMMAND = "python tools/generate_tfrecords.py --data-dir DIR (or --sample for built-in sample data)"


def __getattr__(name: str) -> Any:
    # FEATURE_SPEC = {"image": string, "label": int64}, made when first asked for.
    if name == "FEATURE_SPEC":
        import tensorflow as tf

        spec = {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        }
        globals()["FEATURE_SPEC"] = spec
        return spec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def record_path(data_dir: str, split: str) -> str:
    """The TFRecord file of ``split`` ('train', 'validation' or 'eval') in ``data_dir``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLITS)}")
    return os.path.join(data_dir, f"{split}.tfrecords")


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative int64 values as their 64-bit two's complement."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# The two map entries of Features.feature (tensorflow/core/example/{example,feature}.proto):
# entry {1: key, 2: Feature}; Feature {1: BytesList | 3: Int64List}; BytesList {1: value};
# Int64List {1: packed int64 values}.
_IMAGE_KEY = _field(1, b"image")
_LABEL_KEY = _field(1, b"label")


def encode_example(image: bytes, label: int) -> bytes:
    """Serializes one image (3,072 CHW bytes) and its label as a ``tf.train.Example``.

    The bytes are exactly what ``tf.train.Example(features={"image": bytes_list [image],
    "label": int64_list [label]}).SerializeToString()`` returns with the pinned TensorFlow
    2.15 / protobuf 4 (which writes the ``label`` entry before ``image``; tested), written by
    hand because building the message dominates the generator's run time. A reader cannot tell
    the difference: the entries of a protobuf map may come in any order.
    """
    return _example_header(int(label), len(image)) + image


@functools.lru_cache(maxsize=1024)
def _example_header(label: int, image_len: int) -> bytes:
    """Every byte of the serialized Example before the image bytes (the image comes last)."""
    if not -(1 << 63) <= label < (1 << 63):
        raise ValueError(f"label {label} does not fit in int64")
    label_entry = _field(1, _LABEL_KEY + _field(2, _field(3, _field(1, _varint(label)))))
    image_entry = _field(1, _IMAGE_KEY + _field(2, _field(1, _field(1, b"\0" * image_len))))
    example = _field(1, label_entry + image_entry)
    return example[:len(example) - image_len]


def decode_images(raw: "tf.Tensor") -> "tf.Tensor":
    """Turns raw image strings of any batch shape ``S`` into uint8 images of shape S + (32, 32, 3).

    The bytes are channel-major (CHW) as CIFAR stores them; the result is HWC.
    """
    import tensorflow as tf

    pixels = tf.io.decode_raw(raw, tf.uint8)
    batch_shape = tf.shape(raw)
    chw = tf.reshape(pixels, tf.concat([batch_shape, [CHANNELS, HEIGHT, WIDTH]], axis=0))
    rank = raw.shape.rank
    perm = list(range(rank)) + [rank + 1, rank + 2, rank]
    return tf.transpose(chw, perm)


def write_metadata(data_dir: str, counts: Mapping[str, int], source: str,
                   label_names: Sequence[str] | None = None) -> None:
    """Records the true split sizes, their origin and class names beside the records (atomically)."""
    body = {"format": 1, "counts": dict(counts), "source": source,
            "label_names": list(label_names or CLASS_NAMES)}
    fsutil.write_bytes_atomic(os.path.join(data_dir, METADATA_FILENAME),
                              (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())


def _read_metadata(data_dir: str) -> dict:
    try:
        with open(os.path.join(data_dir, METADATA_FILENAME)) as f:
            body = json.load(f)
        return body if isinstance(body, dict) else {}
    except (OSError, ValueError):
        return {}


def label_names(data_dir: str) -> tuple[str, ...]:
    """The class names of the records in ``data_dir`` (CIFAR-10's unless the metadata differs)."""
    names = _read_metadata(data_dir).get("label_names")
    if isinstance(names, list) and len(names) == NUM_CLASSES and all(
            isinstance(n, str) for n in names):
        return tuple(names)
    return CLASS_NAMES


def count_records(path: str) -> int:
    """Counts the records of one TFRecord file by reading it (used when no metadata exists)."""
    import tensorflow as tf

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
    counts = _read_metadata(data_dir).get("counts")
    meta_path = os.path.join(data_dir, METADATA_FILENAME)
    # Trust the metadata only if it is at least as new as the records it describes.
    if (isinstance(counts, dict) and isinstance(counts.get(split), int)
            and os.path.getmtime(meta_path) >= os.path.getmtime(path)):
        return counts[split]
    return count_records(path)
