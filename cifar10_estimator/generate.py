"""The generator's command line: ``python tools/generate_tfrecords.py``, also installed as
the console script ``cifar10-generate-tfrecords``.

Turns CIFAR-10's python batches (or CIFAR-100's, the built-in sample data, or a folder of the
user's own pictures) into ``train``, ``validation`` and ``eval.tfrecords`` plus their metadata,
through ``data.sources`` / ``data.image_folder`` and ``data.writer``. This module owns the flags,
their combinations and what the command prints.
"""

import argparse
import os
import time
from typing import Sequence

from cifar10_estimator import cli, logs
from cifar10_estimator.data import archives, sample_data, schema, writer
from cifar10_estimator.data.sources import load_source
from cifar10_estimator.errors import UserError, entry_point, run_cli
from cifar10_estimator.platform.process import prepare_process

MODULE = "cifar10_estimator.generate"


def _parser() -> argparse.ArgumentParser:
    prog = cli.invoked_as(MODULE)
    parser = cli.Parser(
        MODULE, examples=(f"{prog} --data-dir cifar10-data",
                          f"{prog} --data-dir cifar100-data --dataset cifar100",
                          f"{prog} --image-folder PICTURES --output-dir my-data",
                          f"{prog} --data-dir sample-data --sample"),
        description="Convert CIFAR-10's python batches to train/validation/eval.tfrecords. "
                    "Uses DATA_DIR/cifar-10-batches-py/ if present, else "
                    f"DATA_DIR/{archives.ARCHIVE_NAME}, else downloads it. With --sample, writes "
                    "the built-in synthetic sample dataset into DATA_DIR first. With "
                    "--image-folder, converts your own pictures.")
    parser.add_argument("--data-dir", default=None,
                        help="folder of the python batches or archive (created for a "
                             "download); also the default output folder (required, except "
                             "with --image-folder and --output-dir)")
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
                        help="where to download the archive from (default: "
                             f"{archives.DEFAULT_URL})")
    parser.add_argument("--source-md5", default=None,
                        help=f"the archive's expected MD5 (default: {archives.DEFAULT_MD5})")
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


def _refuse_combinations(args: argparse.Namespace) -> None:
    """UserError for flags that do not go together."""
    if args.label_mode is not None and args.dataset != "cifar100":
        raise UserError("--label-mode applies only with --dataset cifar100")
    if args.data_dir is None and (args.image_folder is None or args.output_dir is None):
        raise UserError("--data-dir is required (with --image-folder, --output-dir alone will "
                        "do)")
    if args.image_folder is not None:
        for flag, value in (("--sample", args.sample or None), ("--source-url", args.source_url),
                            ("--source-md5", args.source_md5), ("--label-mode", args.label_mode)):
            if value is not None:
                raise UserError(f"{flag} cannot be combined with --image-folder")
        if args.dataset != "cifar10":
            raise UserError("--dataset cannot be combined with --image-folder")
        return
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


def _write_sample_data(data_dir: str, size: int, seed: int) -> None:
    """Writes the sample batches into ``data_dir`` unless the same ones are already there."""
    sample_data.check_size(size)
    batches_dir = os.path.join(data_dir, schema.BATCHES_DIRNAME)
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
        return
    started = time.monotonic()
    sample_data.write_sample_data(data_dir, size, seed)
    print(f"Wrote sample data to {batches_dir} (seed {seed}, {size} images per batch, "
          f"{6 * size:,} images) in {time.monotonic() - started:.1f} s")


def _load(args: argparse.Namespace):
    """The source the flags name, loaded and validated."""
    if args.image_folder is not None:
        logs.import_tensorflow_quietly()  # decoding needs TensorFlow; quiet before it loads
        from cifar10_estimator.data import image_folder

        return image_folder.load_image_folder(args.image_folder)
    if args.sample:
        _write_sample_data(
            args.data_dir,
            sample_data.DEFAULT_IMAGES_PER_BATCH if args.sample_size is None else args.sample_size,
            sample_data.DEFAULT_SEED if args.seed is None else args.seed)
    return load_source(args.data_dir, args.source_url, args.source_md5, dataset=args.dataset,
                       label_mode=args.label_mode or "fine")


def _run(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    prepare_process(os.environ)  # before TensorFlow loads (only for what needs it, below)
    _refuse_combinations(args)

    def load():
        source = _load(args)
        # Only now, with the input known good, load TensorFlow: its C++ log level must be set
        # before its first import (keeping a level the user chose).
        logs.import_tensorflow_quietly()
        return source

    writer.generate_tfrecords(load, args.output_dir or args.data_dir)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``generate_tfrecords --data-dir DIR [--output-dir D] [--sample ...]``."""
    return run_cli(lambda: _run(argv), MODULE)


command = entry_point(main)  # the console script's and python -m's


if __name__ == "__main__":
    command()
