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


import dataclasses
import functools
import hashlib
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


@dataclasses.dataclass(frozen=True)
class SplitFacts:
    """What the generator knows of one written record file: records, bytes and SHA-256."""

    records: int
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """The dataset a data dir holds, from the generator's metadata (CIFAR-10 without it)."""

    dataset: str
    class_names: tuple[str, ...]
    splits: Mapping[str, SplitFacts]  # empty without metadata (or with format 1's)
    counts: Mapping[str, int]  # record counts, also from format 1 metadata

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def file_facts(path: str, records: int) -> SplitFacts:
    """Size and SHA-256 of a written record file (~0.25 s for CIFAR-10's 123 MB train file)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return SplitFacts(records, size, digest.hexdigest())


def write_metadata(data_dir: str, splits: Mapping[str, SplitFacts], source: str,
                   class_names: Sequence[str] | None = None, dataset: str = "cifar10") -> None:
    """Writes what the records hold beside them (atomically): the metadata file.

    Format 2: dataset, class names and, per split, records, bytes and SHA-256. The format 1
    keys (``counts``, ``label_names``) are kept, so older readers still find the counts.
    """
    names = list(class_names or CLASS_NAMES)
    body = {"format": 2, "dataset": dataset, "num_classes": len(names), "class_names": names,
            "source": source,
            "splits": {k: {"records": v.records, "bytes": v.size, "sha256": v.sha256}
                       for k, v in splits.items()},
            "counts": {k: v.records for k, v in splits.items()}, "label_names": names}
    fsutil.write_bytes_atomic(os.path.join(data_dir, METADATA_FILENAME),
                              (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())


def _read_metadata(data_dir: str) -> dict:
    try:
        with open(os.path.join(data_dir, METADATA_FILENAME)) as f:
            body = json.load(f)
        return body if isinstance(body, dict) else {}
    except (OSError, ValueError):
        return {}


def _split_facts(raw: Any) -> dict[str, SplitFacts]:
    facts = {}
    if not isinstance(raw, dict):
        return facts
    for split, v in raw.items():
        if (isinstance(v, dict) and isinstance(v.get("records"), int)
                and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)):
            facts[split] = SplitFacts(v["records"], v["bytes"], v["sha256"])
    return facts


def dataset_info(data_dir: str) -> DatasetInfo:
    """What ``data_dir`` holds, from its metadata; CIFAR-10 for records without metadata.

    Files made by the original tutorial's generator have no metadata file: they are CIFAR-10.
    """
    body = _read_metadata(data_dir)
    names = body.get("class_names", body.get("label_names"))
    if not (isinstance(names, list) and len(names) >= 2
            and all(isinstance(n, str) and n for n in names)):
        names = list(CLASS_NAMES)
    counts = body.get("counts")
    counts = {k: v for k, v in counts.items() if isinstance(v, int)} if isinstance(
        counts, dict) else {}
    return DatasetInfo(str(body.get("dataset", "cifar10")), tuple(names),
                       _split_facts(body.get("splits")), counts)


def label_names(data_dir: str) -> tuple[str, ...]:
    """The class names of the records in ``data_dir``, in label order."""
    return dataset_info(data_dir).class_names


def verify_split(data_dir: str, split: str) -> None:
    """Checks a record file against the generator's metadata before it is used.

    TensorFlow's record reader takes a partial record header at the end of a file for the end
    of the file, so a file cut inside a header (or exactly between records) reads as a shorter,
    valid one. The size catches every cut; the SHA-256 catches changed bytes.

    Raises:
      UserError: the file is missing or differs from what the generator wrote.
    """
    path = record_path(data_dir, split)
    if not os.path.exists(path):
        raise UserError(f"{path} not found; generate the records with {GENERATOR_COMMAND}")
    expected = dataset_info(data_dir).splits.get(split)
    if expected is None:
        return  # no metadata (the original tutorial's files), or format 1: nothing to check
    size = os.path.getsize(path)
    if size != expected.size:
        raise UserError(f"{path} is {size:,} bytes but the generator wrote {expected.size:,} "
                        f"({METADATA_FILENAME}): it is truncated or was replaced; regenerate it "
                        f"with {GENERATOR_COMMAND}")
    if file_facts(path, expected.records).sha256 != expected.sha256:
        raise UserError(f"{path} has the size the generator wrote but other bytes (SHA-256 "
                        f"differs from {METADATA_FILENAME}): it is corrupt or was replaced; "
                        f"regenerate it with {GENERATOR_COMMAND}")


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
    info = dataset_info(data_dir)
    facts = info.splits.get(split)
    if facts is not None and os.path.getsize(path) == facts.size:
        return facts.records  # verify_split checks the bytes before training
    meta_path = os.path.join(data_dir, METADATA_FILENAME)
    # Format 1 metadata has only counts: trust them if at least as new as the records.
    if (facts is None and split in info.counts
            and os.path.getmtime(meta_path) >= os.path.getmtime(path)):
        return info.counts[split]
    return count_records(path)
