"""The trainer's command line: flags -> ``TrainConfig`` -> ``train.train_and_evaluate``.

The only module that builds trainer flags: one per ``TrainConfig`` field, generated from the
field's name, type and help. It runs the process-level set-up a library must not do (``logs``)
and turns user mistakes into one-line errors with exit status 2.
"""

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
import typing
from typing import Optional, Sequence

from cifar10_estimator import cpu, logs
from cifar10_estimator.config import TrainConfig, flag, validate
from cifar10_estimator.errors import UserError, run_cli

log = logging.getLogger("cifar10_estimator")

_TRUE = {"1", "true", "yes", "on", "t", "y"}
_FALSE = {"0", "false", "no", "off", "f", "n"}

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


def _task_type() -> Optional[str]:
    try:
        return json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {}).get("type")
    except (ValueError, AttributeError):
        raise UserError("TF_CONFIG is not valid JSON with a 'task' object; see the README "
                        "section on clusters") from None


def _resolve_precision(config: TrainConfig, gpus: list, onednn: bool) -> TrainConfig:
    """Replaces ``--precision auto`` by what fits this machine; logs the CPU and the choice."""
    import tensorflow as tf

    info = cpu.read_cpu_info().as_seen_by_onednn(os.environ.get(cpu.ONEDNN_CAP_ENV))
    capabilities = []
    if config.num_gpus:
        for gpu in gpus[:config.num_gpus]:
            details = tf.config.experimental.get_device_details(gpu)
            capabilities.append(tuple(details.get("compute_capability", (0, 0))))
    precision, why = cpu.resolve_precision(config.precision, info, onednn=onednn,
                                           gpu_capabilities=capabilities)
    log.info("CPU: %s; oneDNN %s", info.describe(), "on" if onednn else "off")
    log.info("precision: %s (%s)", precision, why)
    return dataclasses.replace(config, precision=precision)


def run(argv: Optional[Sequence[str]] = None):
    """Parses ``argv``, validates, sets up logging and trains; returns the ``TrainResult``.

    Raises UserError for user mistakes (``main`` prints them as one line).
    """
    args = build_parser().parse_args(argv)
    verbose = args.__dict__.pop("verbose")
    config = TrainConfig(**vars(args))
    task_type = _task_type()
    # Before TensorFlow loads: oneDNN roughly doubles CPU training speed where TF leaves it
    # off (AVX2-only CPUs) and is what runs channels_first on a CPU (see cpu.py).
    cpu.prefer_onednn(os.environ)
    logs.setup_logging(verbose)
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    onednn = cpu.onednn_enabled()
    validate(config, num_visible_gpus=len(gpus), needs_data=task_type != "ps",
             onednn_enabled=onednn)
    if task_type != "ps":
        config = _resolve_precision(config, gpus, onednn)
    from cifar10_estimator import train

    started = time.monotonic()
    start_step = _checkpoint_step(config.job_dir) if task_type != "ps" else 0
    result = train.train_and_evaluate(config)
    if result.eval_metrics:
        shown = ", ".join(f"{k} = {v:.4g}" for k, v in sorted(result.eval_metrics.items())
                          if k in ("accuracy", "cross_entropy", "loss"))
        log.info("final evaluation at step %d: %s", result.eval_metrics.get("global_step", -1),
                 shown)
    if task_type != "ps":
        trained = 0 if task_type == "evaluator" else (
            _checkpoint_step(config.job_dir) - start_step)
        for line in run_summary(config, result, time.monotonic() - started, trained):
            log.info(line)
    return result


def _checkpoint_step(job_dir: str) -> int:
    import tensorflow as tf

    from cifar10_estimator.evaluator import checkpoint_step

    latest = tf.train.latest_checkpoint(job_dir)
    return checkpoint_step(latest) if latest else 0


def run_summary(config: TrainConfig, result, seconds: float, steps: int) -> list[str]:
    """The last lines of a run: what it produced and how to use it."""
    from cifar10_estimator import hooks

    lines = []
    head = f"run summary: wall time {hooks.format_duration(seconds)}"
    if result.eval_metrics and "accuracy" in result.eval_metrics:
        head += (f", final accuracy {100 * result.eval_metrics['accuracy']:.2f}% at step "
                 f"{int(result.eval_metrics.get('global_step', 0))}")
    if steps > 0 and seconds > 0:
        # Over the whole run (start-up and evaluations included), global steps of one batch.
        head += (f", {steps} steps, {steps * config.train_batch_size / seconds:.1f} images/s "
                 f"over the run")
    lines.append(head)
    if result.export_path:
        lines.append(f"  SavedModel: {result.export_path}")
        lines.append(f"  predict:    python -m cifar10_estimator.predict --saved-model "
                     f"{result.export_path} IMAGE...")
        lines.append(f"  serve:      tensorflow_model_server --rest_api_port=8501 "
                     f"--model_name=cifar10 --model_base_path="
                     f"{os.path.abspath(os.path.dirname(result.export_path))}")
    if result.report_path:
        lines.append(f"  report:     {result.report_path}")
    lines.append(f"  TensorBoard: tensorboard --logdir {config.job_dir}")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    def train_only() -> int:
        run(argv)
        return 0
    return run_cli(train_only, "cifar10_estimator")


if __name__ == "__main__":
    sys.exit(main())
