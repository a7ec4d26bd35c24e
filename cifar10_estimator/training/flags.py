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

from cifar10_estimator.model.params import MODEL_DEFAULTS
from cifar10_estimator.training.config import TrainConfig, flag
from cifar10_estimator.training.recipes import RECIPES

PROG = "python -m cifar10_estimator"
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


def build_parser(defaults: bool = True) -> argparse.ArgumentParser:
    """One flag per TrainConfig field; booleans accept --x, --x=false and --no-x.

    With ``defaults=False`` a flag that is not given is left out of the parsed namespace, which
    then holds only what the command line set.
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Train, evaluate and export a CIFAR-10 ResNet with tf.estimator. The task's "
                    "role in a cluster comes from the TF_CONFIG environment variable.")
    hints = typing.get_type_hints(TrainConfig)
    # The two folders first, then the model's parameters and the job's other settings.
    for field in sorted(dataclasses.fields(TrainConfig),
                        key=lambda f: f.name not in ("data_dir", "job_dir")):
        tp = hints[field.name]
        if typing.get_origin(tp) is typing.Union:  # Optional[X]
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        kwargs = {"dest": field.name, "help": field.metadata["help"],
                  "default": field.default if defaults else argparse.SUPPRESS}
        if "choices" in field.metadata:
            kwargs["choices"] = field.metadata["choices"]
        if tp is bool:
            parser.add_argument(flag(field.name), type=parse_bool, nargs="?", const=True,
                                metavar="BOOL", **kwargs)
            parser.add_argument("--no-" + flag(field.name)[2:], dest=field.name,
                                action="store_false", help=argparse.SUPPRESS,
                                default=kwargs["default"])
        elif typing.get_origin(tp) is tuple:
            parser.add_argument(flag(field.name), type=_tuple_parser(typing.get_args(tp)[0]),
                                metavar="A,B,...", **kwargs)
        else:
            parser.add_argument(flag(field.name), type=tp, **kwargs)
    parser.add_argument("--verbose", action="store_true",
                        default=False if defaults else argparse.SUPPRESS,
                        help="show all of TensorFlow's log, deprecation notices included")
    return parser


def parse(argv: Optional[Sequence[str]]) -> tuple[TrainConfig, bool]:
    """(the settings, --verbose) from the command line; argparse exits 2 on a bad flag."""
    args = build_parser().parse_args(argv)  # --help, and errors for bad flags, exit here
    given = vars(build_parser(defaults=False).parse_args(argv))
    given.pop("verbose", None)
    values = {**MODEL_DEFAULTS[args.model], **RECIPES[args.recipe], **given}
    return TrainConfig(**values), args.verbose
