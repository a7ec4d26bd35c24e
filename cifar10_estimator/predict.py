"""Classify image files with an exported SavedModel: ``python -m cifar10_estimator.predict``.

Reads PNG, JPEG, GIF or BMP files of any size, converts them to 32x32 RGB exactly as the
image-folder generator converts training images (``images.to_cifar_pixels``), runs
the SavedModel's ``serving_default`` signature and prints the top classes with their names
(the export's ``assets.extra/class_names.txt``, CIFAR-10's by default) and probabilities, one
line per image.
"""

import argparse
import os
import sys
from typing import Optional, Sequence

from cifar10_estimator import cpu, images, logs
from cifar10_estimator.errors import UserError, run_cli

def load_image(path: str):
    """Decodes one image file to float32 [32, 32, 3] in 0..255 (RGB), as the records hold it.

    The conversion is ``images.to_cifar_pixels``, the one the image-folder generator uses.
    """
    import tensorflow as tf

    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"cannot read image {path}: {e.strerror}") from None
    reason = images.too_large(data[:images.HEADER_BYTES])
    if reason:
        raise UserError(f"{path} {reason}")
    try:
        pixels = images.to_cifar_pixels(tf.constant(data))
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        raise UserError(f"{path} is not a PNG, JPEG, GIF or BMP image") from None
    return tf.cast(pixels, tf.float32)


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
    cpu.prefer_onednn(os.environ)  # before TensorFlow loads, as every command does
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
