"""Where the images come from: CIFAR-10's or CIFAR-100's python batches, loaded and validated.

``load_source`` finds the source (the extracted folder, else the archive in the data dir, else a
download), extracts it safely (``archives``), loads every batch through the restricted unpickler
(``pickles``) and returns a ``Source``: the validated batches of every split, their class names
and a description of their origin. No TensorFlow is needed, and any problem with the input is a
``UserError`` raised before anything is written apart from a downloaded archive and its
extraction. ``image_folder`` makes a ``Source`` from users' own pictures; ``writer`` turns any
``Source`` into record files.
"""

import contextlib
import os
from typing import Callable, NamedTuple, TextIO

from cifar10_estimator.data import archives, pickles, sample_data, schema
from cifar10_estimator.errors import UserError


class Source(NamedTuple):
    """The loaded, validated batches of every split and a description of their origin."""

    splits: dict[str, list[pickles.Batch]]
    description: str
    label_names: tuple[str, ...] | None = None  # from batches.meta, when it has them
    dataset: str = "cifar10"  # the metadata's name for it: cifar10, cifar100-fine, ...


def _locate_source(data_dir: str, source_url: str, source_md5: str, log: Callable[[str], None],
                   progress: TextIO | None, timeout: float,
                   spec: archives.Archive = archives.CIFAR10) -> tuple[str, str]:
    """Returns (the extracted batches folder, a description of where it came from)."""
    batches_dir = os.path.join(data_dir, spec.folder)
    if os.path.isdir(batches_dir):
        title = "CIFAR-10" if spec is archives.CIFAR10 else "CIFAR-100"
        description = (sample_data.describe(batches_dir)
                       or f"{title} python batches in {os.path.abspath(batches_dir)}")
        return batches_dir, description
    if os.path.lexists(batches_dir):
        raise UserError(f"{batches_dir} exists but is not a folder; remove it")
    archive = os.path.join(data_dir, spec.name)
    # Not only a regular file: a pipe, socket or device there is refused by verify_md5 rather
    # than replaced by a download.
    if os.path.exists(archive) and not os.path.isdir(archive):
        log(f"Checking {archive}")
        archives.verify_md5(archive, source_md5)
        description = f"{os.path.abspath(archive)} (MD5 {source_md5.lower()})"
    else:
        archives.download(source_url, archive, source_md5, timeout=timeout, progress=progress)
        description = f"{source_url} (MD5 {source_md5.lower()})"
    log(f"Extracting {archive}")
    return archives.extract_batches(archive, data_dir, spec), description


def _cifar100_source(batches_dir: str, description: str, label_mode: str) -> Source:
    """CIFAR-100's ``train`` (its last fifth held out for validation) and ``test``.

    The real ``train`` file has 50,000 images: train = the first 40,000, validation = the last
    10,000, as CIFAR-10's batch 5 is held out; smaller files are split in the same 4:1 ratio.
    """
    key, classes = (("fine_labels", 100) if label_mode == "fine" else ("coarse_labels", 20))
    loaded = {}
    for name in ("train", "test"):
        path = os.path.join(batches_dir, name)
        loaded[name] = pickles.validate_batch(pickles.load_pickle(path), path, key, classes)
    train = loaded["train"]
    cut = len(train.labels) - len(train.labels) // 5
    splits = {"train": [pickles.Batch(train.data[:cut], train.labels[:cut])],
              "validation": [pickles.Batch(train.data[cut:], train.labels[cut:])],
              "eval": [loaded["test"]]}
    names = pickles.load_label_names(os.path.join(batches_dir, "meta"), f"{label_mode}_label_names",
                                     classes) or schema.placeholder_class_names(classes)
    return Source(splits, f"{description}, {label_mode} labels", names,
                  f"cifar100-{label_mode}")


def load_source(data_dir: str, source_url: str | None = None, source_md5: str | None = None,
                log: Callable[[str], None] | None = None, progress: TextIO | None = None,
                timeout: float = 60.0, dataset: str = "cifar10",
                label_mode: str = "fine") -> Source:
    """Finds, fetches if needed, extracts and loads every split of ``dataset``.

    ``dataset`` is ``cifar10`` (splits of ``schema.SPLITS``) or ``cifar100`` (with
    ``label_mode`` fine or coarse). No TensorFlow is needed; any problem with the input is a
    ``UserError`` raised before anything is written apart from a downloaded archive and its
    extraction.
    """
    log = log or print
    spec = archives.ARCHIVES[dataset]
    source_url = source_url or spec.url
    source_md5 = source_md5 or spec.md5
    if not archives.is_md5(source_md5):
        raise UserError(f"--source-md5 {source_md5!r} is not an MD5 digest (32 hex digits)")
    if os.path.lexists(data_dir) and not os.path.isdir(data_dir):
        raise UserError(f"--data-dir {data_dir} exists and is not a folder")
    created = not os.path.lexists(data_dir)
    try:
        batches_dir, description = _locate_source(data_dir, source_url, source_md5, log,
                                                  progress, timeout, spec)
    except BaseException:
        if created:  # leave no empty folder behind a failed download
            with contextlib.suppress(OSError):
                os.rmdir(data_dir)
        raise
    if dataset == "cifar100":
        return _cifar100_source(batches_dir, description, label_mode)
    splits = {split: [pickles.load_batch(os.path.join(batches_dir, name)) for name in names]
              for split, names in schema.SPLITS.items()}
    label_names = pickles.load_label_names(os.path.join(batches_dir, "batches.meta"))
    return Source(splits, description, label_names)


