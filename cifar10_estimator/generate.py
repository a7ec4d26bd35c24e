"""CIFAR-10 python batches -> ``train/validation/eval.tfrecords``: the data generator.

``generate_tfrecords`` finds the source (the extracted ``cifar-10-batches-py/`` folder, else the
``cifar-10-python.tar.gz`` archive, else a download), loads every batch through the safe loader
of ``batches`` and writes the splits of ``cifar10.SPLITS`` with ``cifar10.encode_example``.

All-or-nothing: every batch is loaded and validated before anything is written; then all three
files are written under temporary names and renamed only once all are complete, so an error or
an interruption leaves the previous outputs (if any) untouched and no new final-named file. If a
rename itself fails part-way, the files already renamed by this run are removed again. The
metadata file (``cifar10.write_metadata``) is written last.

``main`` is the command line (``tools/generate_tfrecords.py``, ``cifar10-generate-tfrecords``).
"""


import argparse
import contextlib
import os
import sys
import time
from typing import Callable, Iterator, NamedTuple, Sequence, TextIO

from cifar10_estimator import batches, cifar10, download, fsutil, logs, sample_data
from cifar10_estimator.download import ARCHIVE_NAME, DEFAULT_MD5, DEFAULT_URL
from cifar10_estimator.errors import UserError, run_cli

PROG = "generate_tfrecords"


def _locate_source(data_dir: str, source_url: str, source_md5: str, log: Callable[[str], None],
                   progress: TextIO | None, timeout: float,
                   spec: download.Archive = download.CIFAR10) -> tuple[str, str]:
    """Returns (the extracted batches folder, a description of where it came from)."""
    batches_dir = os.path.join(data_dir, spec.folder)
    if os.path.isdir(batches_dir):
        title = "CIFAR-10" if spec is download.CIFAR10 else "CIFAR-100"
        description = (sample_data.describe(batches_dir)
                       or f"{title} python batches in {os.path.abspath(batches_dir)}")
        return batches_dir, description
    if os.path.lexists(batches_dir):
        raise UserError(f"{batches_dir} exists but is not a folder; remove it")
    archive = os.path.join(data_dir, spec.name)
    if os.path.isfile(archive):
        log(f"Checking {archive}")
        download.verify_md5(archive, source_md5)
        description = f"{os.path.abspath(archive)} (MD5 {source_md5.lower()})"
    else:
        download.download(source_url, archive, source_md5, timeout=timeout, progress=progress)
        description = f"{source_url} (MD5 {source_md5.lower()})"
    log(f"Extracting {archive}")
    return download.extract_batches(archive, data_dir, spec), description


@contextlib.contextmanager
def _all_or_nothing(final_paths: Sequence[str]) -> Iterator[list[str]]:
    """Temporary paths for ``final_paths``, all renamed into place only if the block succeeds."""
    renamed: list[str] = []

    def note_renamed(path: str) -> Callable[..., None]:
        def exit_(exc_type: object, exc: object, tb: object) -> None:
            if exc_type is None:
                renamed.append(path)
        return exit_

    try:
        with contextlib.ExitStack() as stack:
            temps = []
            for path in final_paths:
                # Pushed before its atomic_path, so it runs just after that one's rename.
                stack.push(note_renamed(path))
                temps.append(stack.enter_context(fsutil.atomic_path(path)))
            yield temps
    except BaseException:
        # Non-empty only if a rename failed part-way: take back what this run put in place.
        for path in renamed:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        raise


class Source(NamedTuple):
    """The loaded, validated batches of every split and a description of their origin."""

    splits: dict[str, list[batches.Batch]]
    description: str
    label_names: tuple[str, ...] | None = None  # from batches.meta, when it has them
    dataset: str = "cifar10"  # the metadata's name for it: cifar10, cifar100-fine, ...


def _cifar100_source(batches_dir: str, description: str, label_mode: str) -> Source:
    """CIFAR-100's ``train`` (its last fifth held out for validation) and ``test``.

    The real ``train`` file has 50,000 images: train = the first 40,000, validation = the last
    10,000, as CIFAR-10's batch 5 is held out; smaller files are split in the same 4:1 ratio.
    """
    key, classes = (("fine_labels", 100) if label_mode == "fine" else ("coarse_labels", 20))
    loaded = {}
    for name in ("train", "test"):
        path = os.path.join(batches_dir, name)
        loaded[name] = batches.validate_batch(batches.load_pickle(path), path, key, classes)
    train = loaded["train"]
    cut = len(train.labels) - len(train.labels) // 5
    splits = {"train": [batches.Batch(train.data[:cut], train.labels[:cut])],
              "validation": [batches.Batch(train.data[cut:], train.labels[cut:])],
              "eval": [loaded["test"]]}
    names = batches.load_label_names(os.path.join(batches_dir, "meta"), f"{label_mode}_label_names",
                                     classes) or tuple(f"class {i}" for i in range(classes))
    return Source(splits, f"{description}, {label_mode} labels", names,
                  f"cifar100-{label_mode}")


def load_source(data_dir: str, source_url: str | None = None, source_md5: str | None = None,
                log: Callable[[str], None] | None = None, progress: TextIO | None = None,
                timeout: float = 60.0, dataset: str = "cifar10",
                label_mode: str = "fine") -> Source:
    """Finds, fetches if needed, extracts and loads every split of ``dataset``.

    ``dataset`` is ``cifar10`` (splits of ``cifar10.SPLITS``) or ``cifar100`` (with
    ``label_mode`` fine or coarse). No TensorFlow is needed; any problem with the input is a
    ``UserError`` raised before anything is written apart from a downloaded archive and its
    extraction.
    """
    log = log or print
    spec = download.ARCHIVES[dataset]
    source_url = source_url or spec.url
    source_md5 = source_md5 or spec.md5
    if not download.is_md5(source_md5):
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
    splits = {split: [batches.load_batch(os.path.join(batches_dir, name)) for name in names]
              for split, names in cifar10.SPLITS.items()}
    label_names = batches.load_label_names(os.path.join(batches_dir, "batches.meta"))
    return Source(splits, description, label_names)


def write_tfrecords(source: Source, output_dir: str,
                    log: Callable[[str], None] | None = None) -> dict[str, int]:
    """Writes the splits of ``source`` as TFRecords plus the metadata file, all or nothing."""
    import tensorflow as tf

    log = log or print
    if os.path.lexists(output_dir) and not os.path.isdir(output_dir):
        raise UserError(f"--output-dir {output_dir} exists and is not a folder")
    os.makedirs(output_dir, exist_ok=True)
    splits = list(source.splits)
    finals = [cifar10.record_path(output_dir, split) for split in splits]
    for path in finals:
        if os.path.isdir(path):
            raise UserError(f"{path} is a folder; remove it so that the records can be written")
    facts: dict[str, cifar10.SplitFacts] = {}
    with _all_or_nothing(finals) as temps:
        for split, final, tmp in zip(splits, finals, temps):
            log(f"Generating {final}")
            count = 0
            with tf.io.TFRecordWriter(tmp) as writer:
                for batch in source.splits[split]:
                    for image, label in zip(batch.data, batch.labels.tolist()):
                        writer.write(cifar10.encode_example(image.tobytes(), label))
                    count += len(batch.labels)
            # Size and SHA-256 of what was written, for the trainer's check before training.
            facts[split] = cifar10.file_facts(tmp, count)
            log(f"  {split}: {count:,} records")
    # A split this source does not have (an image folder without validation/) must not leave
    # an older run's file beside metadata that no longer describes it.
    for split in cifar10.SPLITS:
        stale = cifar10.record_path(output_dir, split)
        if split not in facts and os.path.isfile(stale):
            os.remove(stale)
    cifar10.write_metadata(output_dir, facts, source.description, source.label_names,
                           source.dataset)
    return {split: f.records for split, f in facts.items()}


def generate_tfrecords(data_dir: str, output_dir: str | None = None,
                       source_url: str | None = None, source_md5: str | None = None,
                       log: Callable[[str], None] | None = None,
                       progress: TextIO | None = None,
                       timeout: float = 60.0, dataset: str = "cifar10",
                       label_mode: str = "fine") -> dict[str, int]:
    """Converts CIFAR-10's python batches under ``data_dir`` to TFRecords; returns the counts.

    Source, in order: ``data_dir/cifar-10-batches-py/``; else ``data_dir/cifar-10-python.tar.gz``
    (its MD5 must be ``source_md5``), extracted safely; else the archive downloaded from
    ``source_url`` (MD5-checked, kept in ``data_dir``). Writes ``train``, ``validation`` and
    ``eval.tfrecords`` (see ``cifar10.SPLITS``) and the metadata file to ``output_dir``
    (default ``data_dir``). ``log`` receives progress lines (default: ``print``); download
    progress goes to ``progress`` (default ``sys.stderr``); ``timeout`` bounds network waits.
    """
    log = log or print
    start = time.monotonic()
    source = load_source(data_dir, source_url, source_md5, log, progress, timeout, dataset,
                         label_mode)
    output_dir = output_dir or data_dir
    counts = write_tfrecords(source, output_dir, log)
    log(_summary(counts, output_dir, source.description, time.monotonic() - start))
    return counts


def _summary(counts: dict[str, int], output_dir: str, description: str, seconds: float) -> str:
    return (f"Done: {sum(counts.values()):,} records ("
            + ", ".join(f"{split} {n:,}" for split, n in counts.items())
            + f") in {os.path.abspath(output_dir)} from {description}, {seconds:.1f} s")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Convert CIFAR-10's python batches to train/validation/eval.tfrecords. "
                    "Uses DATA_DIR/cifar-10-batches-py/ if present, else "
                    f"DATA_DIR/{ARCHIVE_NAME}, else downloads it. With --sample, writes the "
                    "built-in synthetic sample dataset into DATA_DIR first.")
    parser.add_argument("--data-dir", required=True,
                        help="folder of the python batches or archive (created for a "
                             "download); also the default output folder")
    parser.add_argument("--dataset", choices=("cifar10", "cifar100"), default="cifar10",
                        help="which python archive: cifar10 (default) or cifar100")
    parser.add_argument("--label-mode", choices=("fine", "coarse"), default=None,
                        help="CIFAR-100's labels: fine (100 classes, default) or coarse (20)")
    parser.add_argument("--image-folder", default=None, metavar="DIR",
                        help="convert your own images instead: DIR/train/<class>/*, "
                             "DIR/test/<class>/* (and optionally DIR/validation/<class>/*); "
                             "PNG, JPEG, GIF or BMP of any size, resized to 32x32 RGB")
    parser.add_argument("--output-dir", default=None,
                        help="folder for the .tfrecords files and metadata (default: --data-dir)")
    parser.add_argument("--source-url", default=None,
                        help=f"where to download the archive from (default: {DEFAULT_URL})")
    parser.add_argument("--source-md5", default=None,
                        help=f"the archive's expected MD5 (default: {DEFAULT_MD5})")
    parser.add_argument("--sample", action="store_true",
                        help="write the built-in synthetic sample dataset (10 learnable shape "
                             "classes, CIFAR-10's exact layout) into DATA_DIR, then convert it")
    parser.add_argument("--sample-size", type=int, default=None,
                        help="sample images per batch file, "
                             f"{sample_data.MIN_IMAGES_PER_BATCH}.."
                             f"{sample_data.MAX_IMAGES_PER_BATCH} (default "
                             f"{sample_data.DEFAULT_IMAGES_PER_BATCH}; 6 batch files)")
    parser.add_argument("--seed", type=int, default=None,
                        help=f"random seed of the sample data (default {sample_data.DEFAULT_SEED})")
    return parser


def _run(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.label_mode is not None and args.dataset != "cifar100":
        raise UserError("--label-mode applies only with --dataset cifar100")
    if args.image_folder is not None:
        for flag, value in (("--sample", args.sample or None), ("--source-url", args.source_url),
                            ("--source-md5", args.source_md5), ("--label-mode", args.label_mode)):
            if value is not None:
                raise UserError(f"{flag} cannot be combined with --image-folder")
        if args.dataset != "cifar10":
            raise UserError("--dataset cannot be combined with --image-folder")
        from cifar10_estimator import image_folder

        started = time.monotonic()
        logs.import_tensorflow_quietly()
        source = image_folder.load_image_folder(args.image_folder)
        output_dir = args.output_dir or args.data_dir
        counts = write_tfrecords(source, output_dir)
        print(_summary(counts, output_dir, source.description, time.monotonic() - started))
        return 0
    if args.sample and args.dataset != "cifar10":
        raise UserError("--sample writes CIFAR-10-style sample data; it cannot be combined with "
                        "--dataset cifar100")
    if not args.sample:
        for flag, value in (("--sample-size", args.sample_size), ("--seed", args.seed)):
            if value is not None:
                raise UserError(f"{flag} applies only with --sample")
    else:
        for flag, value in (("--source-url", args.source_url), ("--source-md5", args.source_md5)):
            if value is not None:
                raise UserError(f"{flag} cannot be combined with --sample (sample data is "
                                "made locally, nothing is downloaded)")
    spec = download.ARCHIVES[args.dataset]
    source_url = args.source_url or spec.url
    source_md5 = args.source_md5 or spec.md5
    if not download.is_md5(source_md5):
        raise UserError(f"--source-md5 {source_md5!r} is not an MD5 digest (32 hex digits)")

    if args.sample:
        size = (sample_data.DEFAULT_IMAGES_PER_BATCH if args.sample_size is None
                else args.sample_size)
        seed = sample_data.DEFAULT_SEED if args.seed is None else args.seed
        sample_data.check_size(size)
        batches_dir = os.path.join(args.data_dir, cifar10.BATCHES_DIRNAME)
        if os.path.lexists(batches_dir):
            if not sample_data.matches(batches_dir, size, seed):
                marker = sample_data.read_marker(batches_dir)
                found = ("real or other CIFAR-10 batches" if marker is None else
                         f"sample data made with --sample-size {marker.get('images_per_batch')} "
                         f"--seed {marker.get('seed')}")
                raise UserError(f"{batches_dir} already holds {found}, not sample data made "
                                f"with --sample-size {size} --seed {seed}; use another "
                                "--data-dir or remove that folder")
            print(f"Sample data already in {batches_dir} (seed {seed}, {size} images per batch)")
        else:
            started = time.monotonic()
            sample_data.write_sample_data(args.data_dir, size, seed)
            print(f"Wrote sample data to {batches_dir} (seed {seed}, {size} images per batch, "
                  f"{6 * size:,} images) in {time.monotonic() - started:.1f} s")

    started = time.monotonic()
    source = load_source(args.data_dir, source_url, source_md5, dataset=args.dataset,
                         label_mode=args.label_mode or "fine")
    # Only now, with the input known good, load TensorFlow: its C++ log level must be set
    # before its first import (keeping a level the user chose).
    logs.import_tensorflow_quietly()
    output_dir = args.output_dir or args.data_dir
    counts = write_tfrecords(source, output_dir)
    print(_summary(counts, output_dir, source.description, time.monotonic() - started))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``generate_tfrecords --data-dir DIR [--output-dir D] [--sample ...]``."""
    return run_cli(lambda: _run(argv), PROG)


if __name__ == "__main__":
    sys.exit(main())
