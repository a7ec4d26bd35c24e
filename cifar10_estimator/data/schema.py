"""CIFAR-10's facts and the TFRecord schema: the one place the writer and the reader agree on.

The generator (``writer``) writes records with ``encode_example``; the input pipeline
(``pipeline``) and the serving signatures read them with ``FEATURE_SPEC`` and ``decode_images``.
The schema is the original TensorFlow tutorial's, so files move both ways: one
``tf.train.Example`` per image with ``image`` = the 3,072 raw bytes exactly as CIFAR stores them
(channel-major, "CHW": 1,024 red, 1,024 green, 1,024 blue, each 32x32 row-major) and ``label`` =
an int64 class id.

TensorFlow is imported on first use, not at import time: the generator's source handling, the
sample data and the batch loader use the constants here without paying for (or being logged at
by) a TensorFlow import, and commands can set TensorFlow's log level first. ``FEATURE_SPEC`` is
built on first access (PEP 562 module ``__getattr__``).
"""

import os
from typing import TYPE_CHECKING, Any, Mapping

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



def placeholder_class_names(count: int) -> tuple[str, ...]:
    """Names for classes a source does not name: ``class 0``, ``class 1``, ..."""
    return tuple(f"class {i}" for i in range(count))


# Which python batches make each split. The original tutorial's mapping: batch 5 is held out
# as validation, the official test batch is "eval".
SPLITS: Mapping[str, tuple[str, ...]] = {
    "train": ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4"),
    "validation": ("data_batch_5",),
    "eval": ("test_batch",),
}
# Every batch file of the python version, in order.
BATCH_FILES = tuple(name for names in SPLITS.values() for name in names)
BATCHES_DIRNAME = "cifar-10-batches-py"

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


def encode_example(image: bytes, label: int) -> bytes:
    """Serializes one image (3,072 CHW bytes) and its label as a ``tf.train.Example``.

    Deterministically: the features are a protobuf map, whose entries the upb runtime writes in
    an order that changes from process to process (its hash seed), so without it the same
    pictures would give other bytes, and another sha256 in the metadata, at every conversion.
    """
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    })).SerializeToString(deterministic=True)


def decode_images(raw: "tf.Tensor") -> "tf.Tensor":
    """Turns raw image strings of any batch shape ``S`` into uint8 images of shape S + (32, 32, 3).

    The bytes are channel-major (CHW) as CIFAR stores them; the result is HWC.
    """
    import tensorflow as tf

    pixels = tf.io.decode_raw(raw, tf.uint8)
    batch_shape = tf.shape(raw)
    chw = tf.reshape(pixels, tf.concat([batch_shape, [CHANNELS, HEIGHT, WIDTH]], axis=0))
    # CHW -> HWC: the channels unstacked and stacked again last, the same bytes a transpose
    # gives. A uint8 Transpose in a graph makes TensorFlow 2.21's oneDNN pass log an
    # error-level line on every CPU, once per process, before it runs on Eigen anyway ("oneDNN
    # supports DT_UINT8 only on platforms with AVX-512"); casting to float first does not avoid
    # it, grappler moves the cast back behind the transpose.
    return tf.stack(tf.unstack(chw, num=CHANNELS, axis=raw.shape.rank), axis=-1)
