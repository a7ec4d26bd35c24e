"""Using an export from Python: load it, and classify image files with it (what ``predict`` runs),
or with a file converted from it for LiteRT or ONNX Runtime (``runtimes``).

Image files of any size and mode are converted to 32x32 RGB exactly as the image-folder
generator converts training pictures (``images.to_cifar_pixels``), after Pillow has checked
their headers (``images.check_file``); the SavedModel's ``serving_default`` signature gives the
probabilities, and the export's ``assets.extra/class_names.txt`` the names (CIFAR-10's for a
10-class export without it).
"""

import io
from typing import Sequence

import numpy as np
import tensorflow as tf

from cifar10_estimator import storage
from cifar10_estimator.data import images, schema
from cifar10_estimator.errors import UserError
from cifar10_estimator.serving import formats, runtimes
from cifar10_estimator.serving.export import CLASS_NAMES_FILE
from cifar10_estimator.serving.signatures import IMAGES_SIGNATURE
from cifar10_estimator.serving.trust import SAVED_MODEL_FILE, check_export


def load_image(path: str) -> tf.Tensor:
    """Decodes one image file to float32 [32, 32, 3] in 0..255 (RGB), as the records hold it."""
    try:
        data = storage.read_bytes(path)
    except OSError as e:
        raise UserError(f"cannot read image {path}: {e.strerror}") from None
    images.check_file(io.BytesIO(data), path)
    try:
        pixels = images.to_cifar_pixels(tf.constant(data))
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        raise UserError(f"{path} is not a readable {images.KINDS} image; remove or replace "
                        f"it") from None
    return tf.cast(pixels, tf.float32)


def newest_export(folder: str) -> str:
    """``folder`` if it is a SavedModel, else its newest numbered version (as TensorFlow
    Serving picks from a base folder); UserError if it is neither."""
    try:
        if storage.isfile(storage.join(folder, SAVED_MODEL_FILE)):
            return folder
        names = storage.listdir(folder)
        # A numbered folder counts once its saved_model.pb is there: on object storage an
        # export's files arrive one by one, that one last (export.py).
        # ASCII digits only ("²".isdigit() too), and the name kept as it is ("007").
        versions = [n for n in names if n.isascii() and n.isdigit()
                    and storage.isfile(storage.join(folder, n, SAVED_MODEL_FILE))]
    except OSError as e:
        raise UserError(f"{folder} cannot be read as an export ({e.strerror}); pass a "
                        f"SavedModel folder or the export folder above them") from None
    if not versions:
        raise UserError(f"{folder} is not a SavedModel folder (no {SAVED_MODEL_FILE}) and "
                        f"holds no numbered versions with one; pass JOB_DIR/export or "
                        f"JOB_DIR/export/<version>")
    return storage.join(folder, max(versions, key=int))


def load_model(saved_model_dir: str, trusted: bool = False):
    """Loads the SavedModel and its serving_default signature; UserError if it is not one.

    Unless ``trusted``, the SavedModel is first checked to hold only what this package's
    exports hold (``trust.check_export``): loading one runs its init ops, and calling a
    signature runs whatever ops it holds.
    """
    try:
        found = storage.isfile(storage.join(saved_model_dir, SAVED_MODEL_FILE))
    except OSError as e:
        raise UserError(f"{saved_model_dir} cannot be read ({e.strerror})") from None
    if not found:
        raise UserError(f"{saved_model_dir} is not a SavedModel folder (no {SAVED_MODEL_FILE}); "
                        f"pass a numbered folder under the trainer's --export-dir")
    if not trusted:
        check_export(saved_model_dir)
    try:
        model = tf.saved_model.load(saved_model_dir)
        signature = model.signatures[IMAGES_SIGNATURE]
    # RuntimeError: the graph names an op this TensorFlow lacks (a damaged or foreign graph).
    except (KeyError, ValueError, OSError, RuntimeError, tf.errors.OpError) as e:
        raise UserError(f"{saved_model_dir} is not a usable SavedModel of this package "
                        f"({type(e).__name__})") from None
    return model, signature


def class_names(saved_model_dir: str, num_classes: int) -> tuple[str, ...]:
    """The export's class names (``assets.extra/class_names.txt``).

    Falls back to CIFAR-10's names for a 10-class model without the file, and to
    ``class 0``, ``class 1``, ... for any other model whose file is missing or does not match.
    """
    try:
        text = storage.read_text(storage.join(saved_model_dir, CLASS_NAMES_FILE))
        names = tuple(line.strip() for line in text.splitlines() if line.strip())
    except (OSError, UnicodeDecodeError):
        names = ()
    if len(names) == num_classes:
        return names
    if num_classes == schema.NUM_CLASSES:
        return schema.CLASS_NAMES
    return schema.placeholder_class_names(num_classes)


def classify(model_path: str, image_paths: Sequence[str], top: int = 3,
             trusted: bool = False) -> list[list[tuple[str, float]]]:
    """Top ``top`` (class name, probability) pairs for each image, best first, by a SavedModel
    folder or a converted ``.tflite`` or ``.onnx`` file on its own runtime (``runtimes``;
    ``trusted``: see ``load_model`` and ``runtimes.load``)."""
    pictures = tf.stack([load_image(p) for p in image_paths])
    if formats.runtime_of(model_path):
        model = runtimes.load(model_path, runtimes.default_threads(), trusted)
        probabilities = model.probabilities(pictures.numpy())
        names = formats.class_names(model_path, probabilities.shape[1])
    else:
        _, signature = load_model(model_path, trusted)
        probabilities = signature(images=pictures)["probabilities"].numpy()
        names = class_names(model_path, probabilities.shape[1])
    results = []
    for row in probabilities:
        best = np.argsort(-row)[:top]
        results.append([(names[i], float(row[i])) for i in best])
    return results
