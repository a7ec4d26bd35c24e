"""The trainer's command line: flags -> ``TrainConfig`` -> ``train.train_and_evaluate``.

The only module that builds trainer flags: one per ``TrainConfig`` field, generated from the
field's name, type and help. It also owns process-level set-up that a library must not do:
TensorFlow's log levels (Estimator on TF 2.15 prints pages of deprecation notices that bury the
training log), and turning user mistakes into one-line errors with exit status 2.
"""

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import typing
from typing import Optional, Sequence

from cifar10_estimator.config import TrainConfig, flag, validate
from cifar10_estimator.errors import UserError, run_cli

log = logging.getLogger("cifar10_estimator")

_TRUE = {"1", "true", "yes", "on", "t", "y"}
_FALSE = {"0", "false", "no", "off", "f", "n"}

# TensorFlow log lines that say nothing a user can act on (shown with --verbose).
_NOISE = (
    "is deprecated and will be removed", "deprecated", "Instructions for updating",
    "Calling model_fn", "Done calling model_fn", "Create CheckpointSaverHook",
    "Graph was finalized", "Running local_init_op", "Done running local_init_op",
    "Using config:", "Not using Distribute Coordinator", "Running training and evaluation",
    "Start train and evaluate loop", "Calling checkpoint listeners", "Starting evaluation at",
    "Inference Time :", "Evaluation [", "Saving 'checkpoint_path'",
    "Using default config", "Skipping training since max_steps", "No assets to ",
    "SavedModel written to", "Assets written to",
)


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _scalar_type(tp):
    if tp is bool:
        return parse_bool
    return tp


def _tuple_parser(item_type):
    def parse(text):
        try:
            return tuple(item_type(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {item_type.__name__} values, got {text!r}") from None
    return parse


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field; booleans accept --x, --x=false and --no-x."""
    parser = argparse.ArgumentParser(
        prog="python -m cifar10_estimator",
        description="Train, evaluate and export a CIFAR-10 ResNet with tf.estimator. The task's "
                    "role in a cluster comes from the TF_CONFIG environment variable.")
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        tp = hints[field.name]
        if typing.get_origin(tp) is typing.Union:  # Optional[X]
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        kwargs = {"dest": field.name, "default": field.default, "help": field.metadata["help"]}
        if "choices" in field.metadata:
            kwargs["choices"] = field.metadata["choices"]
        if tp is bool:
            parser.add_argument(flag(field.name), type=parse_bool, nargs="?", const=True,
                                metavar="BOOL", **kwargs)
            parser.add_argument("--no-" + flag(field.name)[2:], dest=field.name,
                                action="store_false", help=argparse.SUPPRESS)
        elif typing.get_origin(tp) is tuple:
            parser.add_argument(flag(field.name), type=_tuple_parser(typing.get_args(tp)[0]),
                                metavar="A,B,...", **kwargs)
        else:
            parser.add_argument(flag(field.name), type=_scalar_type(tp), **kwargs)
    parser.add_argument("--verbose", action="store_true",
                        help="show all of TensorFlow's log, deprecation notices included")
    return parser


@contextlib.contextmanager
def _native_stderr_silenced():
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(n in message for n in _NOISE)


def setup_logging(verbose: bool) -> None:
    """Readable logs: our lines and TensorFlow's progress lines, without its noise."""
    # Must precede the first TensorFlow import: C++ INFO/WARNING lines (oneDNN, CPU features).
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # TF 2.15's CPU wheel prints three harmless "Unable to register cuDNN/cuFFT/cuBLAS
        # factory" errors while importing (tensorflow/tensorflow#62075); hide the import's
        # native stderr only.
        with _native_stderr_silenced():
            import tensorflow as tf
    import tensorflow as tf

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    if not verbose:
        handler.addFilter(_QuietFilter())
    for name in ("tensorflow", "cifar10_estimator"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
    # absl's own handler would print every line a second time.
    tf.get_logger().handlers[:] = [handler]


def _task_type() -> Optional[str]:
    try:
        return json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {}).get("type")
    except (ValueError, AttributeError):
        raise UserError("TF_CONFIG is not valid JSON with a 'task' object; see the README "
                        "section on clusters") from None


def run(argv: Optional[Sequence[str]] = None):
    """Parses ``argv``, validates, sets up logging and trains; returns the ``TrainResult``.

    Raises UserError for user mistakes (``main`` prints them as one line).
    """
    args = build_parser().parse_args(argv)
    verbose = args.__dict__.pop("verbose")
    config = TrainConfig(**vars(args))
    task_type = _task_type()
    setup_logging(verbose)
    import tensorflow as tf

    validate(config, num_visible_gpus=len(tf.config.list_physical_devices("GPU")),
             needs_data=task_type != "ps")
    from cifar10_estimator import train

    log.info("task: %s", task_type or "local (no TF_CONFIG)")
    result = train.train_and_evaluate(config)
    if result.eval_metrics:
        shown = ", ".join(f"{k} = {v:.4g}" for k, v in sorted(result.eval_metrics.items())
                          if k != "global_step")
        log.info("final evaluation at step %d: %s", result.eval_metrics.get("global_step", -1),
                 shown)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    def train_only() -> int:
        run(argv)
        return 0
    return run_cli(train_only, "cifar10_estimator")


if __name__ == "__main__":
    sys.exit(main())
