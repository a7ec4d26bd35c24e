"""Classify image files with an exported SavedModel: ``python -m cifar10_estimator.predict``.

Reads PNG, JPEG, GIF or BMP files of any size, converts them to 32x32 RGB (grayscale is
replicated to three channels, an alpha channel is dropped) with area-averaging resize, runs
the SavedModel's ``serving_default`` signature and prints the top classes with their names
(the export's ``assets.extra/class_names.txt``, CIFAR-10's by default) and probabilities, one
line per image.
"""

import argparse
import os
import struct
import sys
from typing import Optional, Sequence

from cifar10_estimator import logs
from cifar10_estimator.errors import UserError, run_cli

# Refuse images whose header promises more pixels than this before decoding them: a
# decompression bomb (a small file that decodes to gigabytes) must not exhaust memory.
# 100 megapixels is larger than any camera image and about 400 MB decoded.
MAX_PIXELS = 100_000_000


def _header_size(data: bytes) -> Optional[tuple[int, int]]:
    """Width and height from a PNG or GIF header, or None if not one of those."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    return None


def load_image(path: str):
    """Decodes one image file to float32 [32, 32, 3] in 0..255 (RGB)."""
    import tensorflow as tf

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"cannot read image {path}: {e.strerror}") from None
    size = _header_size(data)
    if size is None and data[:2] == b"\xff\xd8":
        try:
            h, w, _ = tf.image.extract_jpeg_shape(data).numpy()
            size = (w, h)
        except tf.errors.InvalidArgumentError:
            size = None
    if size is not None and size[0] * size[1] > MAX_PIXELS:
        raise UserError(f"{path} is {size[0]}x{size[1]} pixels, more than the "
                        f"{MAX_PIXELS:,} this tool decodes; shrink it first")
    try:
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        raise UserError(f"{path} is not a PNG, JPEG, GIF or BMP image") from None
    image = tf.image.resize(tf.cast(image, tf.float32), [32, 32], method="area")
    return tf.clip_by_value(image, 0.0, 255.0)


def load_model(saved_model_dir: str):
    """Loads the SavedModel's serving_default signature; UserError if it is not one."""
    import tensorflow as tf

    if not os.path.isfile(os.path.join(saved_model_dir, "saved_model.pb")):
        raise UserError(f"{saved_model_dir} is not a SavedModel folder (no saved_model.pb); "
                        f"pass a numbered folder under the trainer's --export-dir")
    try:
        model = tf.saved_model.load(saved_model_dir)
        signature = model.signatures["serving_default"]
    except (KeyError, ValueError, OSError, tf.errors.OpError) as e:
        raise UserError(f"{saved_model_dir} is not a usable SavedModel of this package "
                        f"({type(e).__name__})") from None
    return model, signature


def class_names(saved_model_dir: str, num_classes: int) -> tuple[str, ...]:
    """The export's class names (``assets.extra/class_names.txt``).

    Falls back to CIFAR-10's names for a 10-class model without the file, and to
    ``class 0``, ``class 1``, ... for any other model whose file is missing or does not match.
    """
    from cifar10_estimator import cifar10
    from cifar10_estimator.export import CLASS_NAMES_FILE

    try:
        with open(os.path.join(saved_model_dir, CLASS_NAMES_FILE)) as f:
            names = tuple(line.strip() for line in f if line.strip())
    except (OSError, UnicodeDecodeError):
        names = ()
    if len(names) == num_classes:
        return names
    if num_classes == cifar10.NUM_CLASSES:
        return cifar10.CLASS_NAMES
    return tuple(f"class {i}" for i in range(num_classes))


def classify(saved_model_dir: str, image_paths: Sequence[str], top: int = 3
             ) -> list[list[tuple[str, float]]]:
    """Top ``top`` (class name, probability) pairs for each image, best first."""
    import numpy as np
    import tensorflow as tf

    images = tf.stack([load_image(p) for p in image_paths])
    _, signature = load_model(saved_model_dir)
    probabilities = signature(images=images)["probabilities"].numpy()
    names = class_names(saved_model_dir, probabilities.shape[1])
    results = []
    for row in probabilities:
        best = np.argsort(-row)[:top]
        results.append([(names[i], float(row[i])) for i in best])
    return results


def _run(argv: Optional[Sequence[str]]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cifar10_estimator.predict",
        description="Print the top classes of image files with an exported SavedModel, with "
                    "the class names of the dataset it was trained on.")
    parser.add_argument("--saved-model", required=True,
                        help="a SavedModel folder written by the trainer (JOB_DIR/export/<n>)")
    parser.add_argument("--top", type=int, default=3, help="classes to show per image")
    parser.add_argument("images", nargs="+", help="PNG/JPEG/GIF/BMP files of any size")
    args = parser.parse_args(argv)
    if args.top < 1:
        raise UserError(f"--top must be 1 or more, got {args.top}")
    logs.import_tensorflow_quietly(cpp_level="3")
    for path, ranked in zip(args.images, classify(args.saved_model, args.images, args.top)):
        shown = ", ".join(f"{name} {p:.1%}" for name, p in ranked)
        print(f"{path}: {shown}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    return run_cli(lambda: _run(argv), "predict")


if __name__ == "__main__":
    sys.exit(main())
