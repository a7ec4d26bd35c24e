"""The predict command: ``python -m cifar10_estimator.predict`` (``cifar10-predict``).

Prints the top classes of image files with an exported SavedModel, or a LiteRT or ONNX file
converted from one, one line per image, with the class names of the dataset it was trained on
(``serving.client`` does the work). The model is checked before it is loaded
(``serving.trust``, ``serving.runtime_trust``), unless ``--trust-export``.
"""

import json
import os
from typing import Optional, Sequence

from cifar10_estimator import cli, logs
from cifar10_estimator.errors import UserError, entry_point, run_cli
from cifar10_estimator.platform.process import prepare_process
from cifar10_estimator.serving.trust import TRUST_FLAG, TRUST_HELP

MODULE = "cifar10_estimator.predict"
# TensorFlow's C++ log while this command runs: none (its output is the answer; errors
# reach the user as one-line errors).
CPP_LOG_LEVEL = "3"


def _run(argv: Optional[Sequence[str]]) -> int:
    prog = cli.invoked_as(MODULE)
    parser = cli.Parser(
        MODULE, examples=(f"{prog} --saved-model cifar10-job/export cat.jpg dog.png",
                          f"{prog} --saved-model cifar10-job/export/1700000000 --json *.png"),
        description="Print the top classes of image files with an exported SavedModel, with "
                    "the class names of the dataset it was trained on.")
    parser.add_argument("--saved-model", "--model", required=True, metavar="PATH",
                        help="a SavedModel folder written by the trainer (JOB_DIR/export/<n>), "
                             "the export folder above the numbered ones, whose newest "
                             "version is used, as TensorFlow Serving does, or a .tflite or "
                             ".onnx file converted from one (cifar10-convert), run on LiteRT or "
                             "ONNX Runtime")
    parser.add_argument("--top", type=int, default=3, help="classes to show per image")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per image: its file and its top classes "
                             "with names and probabilities")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    parser.add_argument("images", nargs="+", help="PNG/JPEG/GIF/BMP files of any size")
    args = parser.parse_args(argv)
    if args.top < 1:
        raise UserError(f"--top must be 1 or more, got {args.top}")
    prepare_process(os.environ, cpp_log_level=CPP_LOG_LEVEL)  # before TensorFlow loads
    logs.import_tensorflow_quietly()
    from cifar10_estimator.serving import client

    from cifar10_estimator.serving import formats

    folder = (args.saved_model if formats.runtime_of(args.saved_model)
              else client.newest_export(args.saved_model))
    for path, ranked in zip(args.images, client.classify(folder, args.images, args.top,
                                                            trusted=args.trust_export)):
        if args.json:
            print(json.dumps({"file": path, "saved_model": folder,
                              "top": [{"class_name": name, "probability": round(p, 6)}
                                      for name, p in ranked]}))
        else:
            print(f"{path}: " + ", ".join(f"{name} {p:.1%}" for name, p in ranked))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    return run_cli(lambda: _run(argv), MODULE)


command = entry_point(main)  # the console script's and python -m's


if __name__ == "__main__":
    command()
