"""The predict command: ``python -m cifar10_estimator.predict`` (``cifar10-predict``).

Prints the top classes of image files with an exported SavedModel, one line per image, with the
class names of the dataset it was trained on (``serving.client`` does the work).
"""

import argparse
import os
import sys
from typing import Optional, Sequence

from cifar10_estimator import logs
from cifar10_estimator.errors import UserError, run_cli
from cifar10_estimator.training import cpu

PROG = "predict"


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
    from cifar10_estimator.serving import client

    for path, ranked in zip(args.images, client.classify(args.saved_model, args.images, args.top)):
        shown = ", ".join(f"{name} {p:.1%}" for name, p in ranked)
        print(f"{path}: {shown}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    return run_cli(lambda: _run(argv), PROG)


if __name__ == "__main__":
    sys.exit(main())
