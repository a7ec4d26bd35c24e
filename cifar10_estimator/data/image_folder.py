"""Your own images as a dataset: ``DIR/train/<class>/*``, ``DIR/test/<class>/*`` to batches.

The layout is the one Keras' ``image_dataset_from_directory`` and torchvision's
``ImageFolder`` read: one subfolder per class, class ids by sorted folder name (the names of
``train/``; ``test/`` and ``validation/`` may lack a class but not add one). ``train`` becomes
the train split, ``test`` the eval split, and ``validation/`` (optional) the validation
split; without it no validation file is written.

Files are taken by their extension (``.png .jpg .jpeg .gif .bmp``, any case), as Keras does;
other files (``.txt``, ``.DS_Store``, ...) are left out and counted in the summary. A damaged
picture, a file with an image extension that does not decode or whose header promises more
pixels than Pillow decodes safely (``images.check_file``), or a pipe, socket or device named
like a picture (which no reader should wait on), is left out too, counted in the summary with
the first one named: one bad file among 50,000 should not cost the other 49,999. A split
left with no readable picture stops the run with one line naming its folder.
Images of any size and mode are decoded and resized by TensorFlow's own ops, in parallel, with
``images.to_cifar_pixels``, the conversion ``predict`` uses, and stored as CIFAR's raw CHW
bytes (``schema.encode_example``).

Links are followed, to files and to folders, as users link datasets together. A link inside a
class folder that leads nowhere (dangling, or a loop) is a damaged picture; where a class
folder is expected it stops the run with one line naming it, as does a class folder whose name
holds control characters or bytes that are not text (it would become a broken class name).
"""

import os
import unicodedata
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


def _entries(folder: str) -> list[os.DirEntry]:
    try:
        return sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        raise UserError(f"cannot read the folder {folder} ({e.strerror}); check its "
                        f"permissions") from None


def _class_folders(split_dir: str) -> list[str]:
    names = []
    for entry in _entries(split_dir):
        if entry.name.startswith("."):
            continue
        try:
            is_dir = entry.is_dir()
        except OSError:  # a link loop (ELOOP): is_dir() only swallows "no such file"
            is_dir, leads_nowhere = False, True
        else:
            leads_nowhere = not is_dir and entry.is_symlink() and not os.path.exists(entry.path)
        if leads_nowhere:
            raise UserError(f"{entry.path} is a link that leads nowhere (dangling, or a loop); "
                            f"fix or remove it")
        if not is_dir:
            continue
        if any(unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") for c in entry.name):
            # It would become a class name: printed, and one line of class_names.txt.
            raise UserError(f"{split_dir} has a class folder named {entry.name!r}, with "
                            f"control characters or bytes that are not text; rename it")
        names.append(entry.name)
    return names


def _is_file(entry: os.DirEntry) -> bool:
    try:
        return entry.is_file()
    except OSError:  # a link loop
        return False


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a link loop
        return False


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
            for entry in _entries(class_dir):
                if entry.name.lower().endswith(EXTENSIONS):
                    # A link that leads nowhere is kept here, to be counted as damaged.
                    if not _is_dir(entry):
                        entries.append((entry.path, label_of[name]))
                elif _is_file(entry):
                    left_out += 1
        if not entries:
            raise UserError(f"{split_dir} has no .png, .jpg, .jpeg, .gif or .bmp files")
        files[split] = entries
    return names, files, left_out


def decode_pictures(paths: Sequence[str],
                    parallel: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 CHW rows [N, 3072] of the pictures that decode, decoded and resized in parallel;
    the indices into ``paths`` of those N pictures). The others, damaged, are left out: those
    ``images.check_file`` refuses (not a regular file, or on their header), and those
    TensorFlow fails to decode. Only files ``check_file`` found regular reach TensorFlow's
    ``read_file``, which would wait forever on a FIFO."""
    import tensorflow as tf

    readable = []
    for i, path in enumerate(paths):
        try:
            images.check_file(path, path)
            readable.append(i)
        except UserError:
            pass
    parallel = parallel or os.cpu_count() or 1
    # Each picture carries its index, so that ignore_errors() drops a picture that fails to
    # decode without decoding the rest one by one, and the survivors are known.
    pixels = without_autotuning(  # fixed parallelism, as the training pipelines
        tf.data.Dataset.from_tensor_slices(
            (tf.constant(readable, tf.int64),
             # As bytes: a file name need not be UTF-8 (os.fsencode undoes surrogateescape).
             tf.constant([os.fsencode(paths[i]) for i in readable], tf.string)))
        .map(tf.autograph.experimental.do_not_convert(  # plain TensorFlow ops: nothing to convert
            lambda i, p: (i, images.to_cifar_pixels(tf.io.read_file(p)))),
             num_parallel_calls=parallel)
        .ignore_errors()
        .batch(_BATCH).prefetch(1))
    rows, kept = [], []
    for index, batch in pixels:
        # HWC -> CIFAR's channel-major rows.
        rows.append(np.transpose(batch.numpy(), (0, 3, 1, 2)).reshape(len(batch), -1))
        kept.append(index.numpy())
    if not rows:
        return np.zeros((0, schema.IMAGE_BYTES), np.uint8), np.zeros(0, np.int64)
    return np.concatenate(rows), np.concatenate(kept)


def decode_files(paths: Sequence[str], parallel: int | None = None) -> np.ndarray:
    """uint8 CHW rows [N, 3072] of the image files that decode (``decode_pictures``)."""
    return decode_pictures(paths, parallel)[0]


def _shown(path: str) -> str:
    """``path`` as it can be printed on one line (quoted if it holds line breaks or bytes that
    are not text)."""
    return path if path.isprintable() else repr(path)


def load_image_folder(root: str, log=print) -> Source:
    """The splits of an image folder as validated batches, ready for ``write_tfrecords``."""
    names, files, left_out = scan(root)
    splits = {}
    damaged: list[str] = []
    for split, entries in files.items():
        paths = [p for p, _ in entries]
        labels = np.array([label for _, label in entries], np.int64)
        split_dir = os.path.join(root, _folder(split))
        log(f"Decoding {len(paths):,} images of {split_dir}")
        rows, kept = decode_pictures(paths)
        if not len(kept):
            raise UserError(f"{split_dir} has no readable picture: all {len(paths):,} are damaged "
                            f"(such as {_shown(paths[0])}); remove or replace them")
        if len(kept) < len(paths):
            lost = sorted(set(range(len(paths))) - set(kept.tolist()))
            damaged += [paths[i] for i in lost]
            log(f"  left out {len(lost):,} damaged picture(s) (first: {_shown(paths[lost[0]])})")
        splits[split] = [pickles.Batch(rows, labels[kept])]
    note = f", {left_out} non-image file(s) left out" if left_out else ""
    if damaged:
        note += (f", {len(damaged)} damaged picture(s) left out (first: "
                 f"{_shown(damaged[0])})")
    return Source(splits, f"image folder {os.path.abspath(root)} ({len(names)} classes{note})",
                  names, "image-folder")


def _folder(split: str) -> str:
    return next(folder for folder, s in FOLDERS.items() if s == split)
