"""Your own images as a dataset: ``DIR/train/<class>/*``, ``DIR/test/<class>/*`` to batches.

The layout is the one Keras' ``image_dataset_from_directory`` and torchvision's
``ImageFolder`` read: one subfolder per class, class ids by sorted folder name (the names of
``train/``; ``test/`` and ``validation/`` may lack a class but not add one). ``train`` becomes
the train split, ``test`` the eval split, and ``validation/`` (optional) the validation
split; without it no validation file is written.

Files are taken by their extension (``.png .jpg .jpeg .gif .bmp``, any case), as Keras does;
other files (``.txt``, ``.DS_Store``, ...) are left out and counted in the summary. A file with
an image extension that does not decode, or whose header promises more pixels than Pillow
decodes safely (``images.check_file``), stops the run with one line naming it: a dataset that
silently loses pictures is worse than one more fix. Images of any size and mode are decoded
and resized by TensorFlow's own ops, in parallel, with ``images.to_cifar_pixels``, the
conversion ``predict`` uses, and stored as CIFAR's raw CHW bytes (``schema.encode_example``).
"""

import os
from typing import Sequence

import numpy as np

from cifar10_estimator.data import images, pickles, schema
from cifar10_estimator.data.pipeline import without_autotuning
from cifar10_estimator.data.sources import Source
from cifar10_estimator.errors import UserError

EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")
# Folder -> split of the records.
FOLDERS = {"train": "train", "validation": "validation", "test": "eval"}
_BATCH = 256  # images decoded per step of the pipeline


def _class_folders(split_dir: str) -> list[str]:
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir()
                  and not e.name.startswith("."))


def scan(root: str) -> tuple[tuple[str, ...], dict[str, list[tuple[str, int]]], int]:
    """(class names, split -> [(path, label)], files left out) of an image folder.

    Raises:
      UserError: the layout is not DIR/train/<class>/..., DIR/test/<class>/...
    """
    if not os.path.isdir(root):
        raise UserError(f"--image-folder {root} is not a folder")
    for required in ("train", "test"):
        if not os.path.isdir(os.path.join(root, required)):
            raise UserError(f"--image-folder {root} has no {required}/ folder; expected "
                            f"{root}/train/<class>/*.png and {root}/test/<class>/*.png")
    names = tuple(_class_folders(os.path.join(root, "train")))
    if len(names) < 2:
        raise UserError(f"{os.path.join(root, 'train')} has {len(names)} class folder(s); a "
                        f"classifier needs at least 2 (one subfolder per class)")
    label_of = {name: i for i, name in enumerate(names)}
    files: dict[str, list[tuple[str, int]]] = {}
    left_out = 0
    for folder, split in FOLDERS.items():
        split_dir = os.path.join(root, folder)
        if not os.path.isdir(split_dir):
            continue
        entries = []
        for name in _class_folders(split_dir):
            if name not in label_of:
                raise UserError(f"{os.path.join(split_dir, name)} is a class that "
                                f"{os.path.join(root, 'train')} does not have; every class "
                                f"needs training images")
            class_dir = os.path.join(split_dir, name)
            for entry in sorted(os.scandir(class_dir), key=lambda e: e.name):
                if entry.is_file() and entry.name.lower().endswith(EXTENSIONS):
                    entries.append((entry.path, label_of[name]))
                elif entry.is_file():
                    left_out += 1
        if not entries:
            raise UserError(f"{split_dir} has no .png, .jpg, .jpeg, .gif or .bmp files")
        files[split] = entries
    return names, files, left_out


def _first_bad(paths: Sequence[str]) -> str:
    """The first file that does not decode (searched one by one, only after a failure)."""
    import tensorflow as tf

    for path in paths:
        try:
            images.to_cifar_pixels(tf.io.read_file(path))
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
            return path
    return paths[0]


def decode_files(paths: Sequence[str], parallel: int | None = None) -> np.ndarray:
    """uint8 CHW rows [N, 3072] of the image files, decoded and resized in parallel."""
    import tensorflow as tf

    for path in paths:
        images.check_file(path, path)
    parallel = parallel or os.cpu_count() or 1
    pixels = without_autotuning(  # fixed parallelism, as the training pipelines
        tf.data.Dataset.from_tensor_slices(list(paths))
        .map(lambda p: images.to_cifar_pixels(tf.io.read_file(p)), num_parallel_calls=parallel)
        .batch(_BATCH).prefetch(1))
    rows = []
    try:
        for batch in pixels:
            # HWC -> CIFAR's channel-major rows.
            rows.append(np.transpose(batch.numpy(), (0, 3, 1, 2)).reshape(len(batch), -1))
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        raise UserError(f"{_first_bad(paths)} is not a readable {images.KINDS} image; "
                        f"remove or replace it") from None
    return np.concatenate(rows) if rows else np.zeros((0, schema.IMAGE_BYTES), np.uint8)


def load_image_folder(root: str, log=print) -> Source:
    """The splits of an image folder as validated batches, ready for ``write_tfrecords``."""
    names, files, left_out = scan(root)
    splits = {}
    for split, entries in files.items():
        paths = [p for p, _ in entries]
        labels = np.array([label for _, label in entries], np.int64)
        log(f"Decoding {len(paths):,} images of {os.path.join(root, _folder(split))}")
        splits[split] = [pickles.Batch(decode_files(paths), labels)]
    note = f", {left_out} non-image file(s) left out" if left_out else ""
    return Source(splits, f"image folder {os.path.abspath(root)} ({len(names)} classes{note})",
                  names, "image-folder")


def _folder(split: str) -> str:
    return next(folder for folder, s in FOLDERS.items() if s == split)
