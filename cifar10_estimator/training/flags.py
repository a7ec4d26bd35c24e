"""The trainer's command-line flags: the only module that builds them.

One flag per ``TrainConfig`` field, generated from the field's name, type, default and help, so
a setting is declared once (``training.config``, ``model.params``). Booleans accept ``--x``,
``--x=false`` and ``--no-x``; tuples take comma-separated values. ``--verbose`` is the one flag
that is not a setting: it changes what the log shows.

``--model`` and ``--recipe`` change defaults: a setting takes the flag's value if the flag is
given, else the recipe's (``training.recipes``), else the model's (``model.params.MODEL_DEFAULTS``),
else the field's default.
"""

import argparse
import dataclasses
import typing
from typing import Optional, Sequence

from cifar10_estimator import cli
from cifar10_estimator.model.params import MODEL_DEFAULTS
from cifar10_estimator.training.config import TrainConfig, flag
from cifar10_estimator.training.recipes import RECIPES

MODULE = "cifar10_estimator"
PROG = f"python -m {MODULE}"
_TRUE = {"1", "true", "yes", "on", "t", "y"}
_FALSE = {"0", "false", "no", "off", "f", "n"}


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _tuple_parser(item_type):
    def parse(text):
        try:
            return tuple(item_type(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {item_type.__name__} values, got {text!r}") from None
    return parse


# The help's groups, in order; every TrainConfig field is in one (tests/test_cli.py checks).
GROUPS = (
    ("data", "the records and how training reads them",
     ("data_dir", "use_distortion_for_training", "eval_batch_size", "seed")),
    ("model", "the network and its regularisation",
     ("model", "num_layers", "resnet_version", "weight_decay", "label_smoothing",
      "batch_norm_decay", "batch_norm_epsilon", "precise_bn_batches", "moving_average_decay")),
    ("schedule", "how long and how fast it trains",
     ("recipe", "train_steps", "train_epochs", "train_batch_size", "learning_rate",
      "lr_reference_batch", "lr_schedule", "warmup_epochs", "lr_boundary_epochs",
      "lr_decay_factors", "momentum")),
    ("devices", "where and in what precision it computes",
     ("num_gpus", "num_cpu_towers", "variable_strategy", "data_format", "precision",
      "serving_precision", "xla",
      "num_intra_threads", "num_inter_threads")),
    ("cluster", "several tasks (their roles come from TF_CONFIG)",
     ("sync", "cluster_timeout_secs", "max_worker_delay_secs")),
    ("output", "the job dir: checkpoints, evaluations, exports",
     ("job_dir", "save_checkpoints_steps", "save_checkpoints_secs", "keep_checkpoint_max",
      "eval_throttle_secs", "export_dir", "export_best", "change_settings")),
    ("logging", "what the log and TensorBoard show",
     ("progress_secs", "save_summary_steps", "log_device_placement")),
)
EXAMPLES = (
    "{prog} --data-dir cifar10-data --job-dir cifar10-job --num-layers 20",
    "{prog} --data-dir cifar10-data --job-dir fast-job --num-layers 20 --recipe fast "
    "--train-epochs 30",
    "{prog} @job.flags --train-steps 2000    # flags from a file, one or more per line",
)


def build_parser(defaults: bool = True) -> argparse.ArgumentParser:
    """One flag per TrainConfig field, in ``GROUPS``; booleans accept --x, --x=false and --no-x.

    With ``defaults=False`` a flag that is not given is left out of the parsed namespace, which
    then holds only what the command line set.
    """
    parser = cli.Parser(
        MODULE, examples=[e.format(prog=cli.invoked_as(MODULE)) for e in EXAMPLES],
        usage="%(prog)s --data-dir DATA --job-dir JOB [FLAG ...] [@FLAGFILE ...]",
        description="Train, evaluate and export a CIFAR-10 classifier (a ResNet, or the original "
                    "tutorial's CNN) with tf.estimator. A task's role in a cluster comes from "
                    "the TF_CONFIG environment variable.")
    hints = typing.get_type_hints(TrainConfig)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for title, description, names in GROUPS:
        group = parser.add_argument_group(title, description)
        for name in names:
            _add(group, fields[name], hints[name], defaults)
        if title == "logging":
            group.add_argument("--verbose", action="store_true",
                               default=False if defaults else argparse.SUPPRESS,
                               help="show all of TensorFlow's log, deprecation notices included")
    return parser


def _add(group, field: dataclasses.Field, tp, defaults: bool) -> None:
    if typing.get_origin(tp) is typing.Union:  # Optional[X]
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    kwargs = {"dest": field.name, "help": field.metadata["help"],
              "default": field.default if defaults else argparse.SUPPRESS}
    if "choices" in field.metadata:
        kwargs["choices"] = field.metadata["choices"]
    if tp is bool:
        group.add_argument(flag(field.name), type=parse_bool, nargs="?", const=True,
                           metavar="BOOL", **kwargs)
        group.add_argument("--no-" + flag(field.name)[2:], dest=field.name,
                           action="store_false", help=argparse.SUPPRESS,
                           default=kwargs["default"])
    elif typing.get_origin(tp) is tuple:
        group.add_argument(flag(field.name), type=_tuple_parser(typing.get_args(tp)[0]),
                           metavar="A,B,...", **kwargs)
    else:
        group.add_argument(flag(field.name), type=tp, **kwargs)


def parse(argv: Optional[Sequence[str]]) -> tuple[TrainConfig, bool]:
    """(the settings, --verbose) from the command line; argparse exits 2 on a bad flag."""
    args = build_parser().parse_args(argv)  # --help, and errors for bad flags, exit here
    given = vars(build_parser(defaults=False).parse_args(argv))
    given.pop("verbose", None)
    values = {**MODEL_DEFAULTS[args.model], **RECIPES[args.recipe], **given}
    return TrainConfig(**values), args.verbose
