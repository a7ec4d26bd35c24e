"""The trainer's command-line flags: the only module that builds them.

One flag per setting (a field of a ``Settings`` section), generated from the field's name,
type, default and metadata (``fields``): its help, its choices; its help group is its section.
Booleans accept ``--x``, ``--x=false`` and ``--no-x``; tuples take comma-separated values.
``--verbose`` is the one flag that is not a setting: it changes what the log shows.

``--model`` and ``--recipe`` change defaults: a setting takes the flag's value if the flag is
given, else the recipe's, else the model's, else the field's default (``overlays``). A flag
given for a model it does not apply to is refused (``checks.check_given``).
"""

import argparse
import dataclasses
import difflib
import typing
from typing import Any, Mapping, Optional, Sequence

from cifar10_estimator import cli
from cifar10_estimator.config import checks, overlays
from cifar10_estimator.config.fields import GROUPS, flag
from cifar10_estimator.config.settings import FIELDS, SECTIONS, Settings
from cifar10_estimator.errors import UserError

MODULE = "cifar10_estimator"
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


EXAMPLES = (
    "{prog} --data-dir cifar10-data --job-dir cifar10-job --num-layers 20",
    "{prog} --data-dir cifar10-data --job-dir fast-job --num-layers 20 --recipe fast "
    "--train-epochs 30",
    "{prog} @job.flags --train-steps 2000    # flags from a file, one or more per line",
)


def build_parser(defaults: bool = True) -> argparse.ArgumentParser:
    """One flag per setting, in its section's help group; booleans accept --x, --x=false and
    --no-x.

    With ``defaults=False`` a flag that is not given is left out of the parsed namespace, which
    then holds only what the command line set.
    """
    parser = cli.Parser(
        MODULE, examples=[e.format(prog=cli.invoked_as(MODULE)) for e in EXAMPLES],
        usage="%(prog)s --data-dir DATA --job-dir JOB [FLAG ...] [@FLAGFILE ...]",
        description="Train, evaluate and export a CIFAR-10 classifier (a ResNet, or the original "
                    "tutorial's CNN) with tf.estimator. A task's role in a cluster comes from "
                    "the TF_CONFIG environment variable.")
    for (title, description), (_, section) in zip(GROUPS, SECTIONS):
        group = parser.add_argument_group(title, description)
        hints = typing.get_type_hints(section)
        for field in dataclasses.fields(section):
            _add(group, field, hints[field.name], defaults)
        if title == "logging":
            group.add_argument("--verbose", action="store_true",
                               default=False if defaults else argparse.SUPPRESS,
                               help="show all of TensorFlow's log, deprecation notices included")
    return parser


def _add(group, field: dataclasses.Field, tp, defaults: bool) -> None:
    if typing.get_origin(tp) is typing.Union:  # Optional[X]
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    help = field.metadata["help"]
    if field.name == "recipe":  # what each recipe sets: the overlays know
        help = f"{help} ({overlays.recipe_help()})"
    kwargs = {"dest": field.name, "help": help,
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
        group.add_argument(flag(field.name), *field.metadata.get("aliases", ()), type=tp,
                           **kwargs)


def to_argv(settings: Mapping[str, Any]) -> list[str]:
    """The command line that gives ``settings`` (setting name -> value, as ``Settings.flat``
    gives them: ``{"num_layers": 20, "sync": True, "lr_boundary_epochs": (2, 4)}``), so that a
    library caller's settings go through the same parsing and checks as flags; ``verbose`` too;
    None leaves a setting at its default. A name that is no setting is a ``UserError`` naming
    it."""
    names = {field.name for field in FIELDS} | {"verbose"}
    argv = []
    for name, value in settings.items():
        if name not in names:
            close = difflib.get_close_matches(str(name), sorted(names), n=1)
            raise UserError(f"{name!r} is not a setting of the trainer"
                            + (f"; did you mean {close[0]!r}?" if close else ""))
        if name == "verbose":
            argv += ["--verbose"] if value else []
        elif isinstance(value, bool):
            argv.append(f"{flag(name)}={'true' if value else 'false'}")
        elif isinstance(value, (tuple, list)):
            argv.append(f"{flag(name)}={','.join(str(v) for v in value)}")
        elif value is not None:
            argv.append(f"{flag(name)}={value}")
    return argv


def handed_on_parser(command: str) -> cli.Parser:
    """The trainer's parser for the flags another command (a launcher, a sweep) hands on after
    ``--``: a mistyped flag is caught once, there, and its error names that command."""
    parser = build_parser()
    parser.error_name = f"{cli.error_prefix(command)} (trainer flags)"
    return parser


def parse(argv: Optional[Sequence[str]], under: Optional[Mapping[str, Any]] = None
          ) -> tuple[Settings, bool]:
    """(the settings, --verbose) from the command line; argparse exits 2 on a bad flag, and a
    flag given for another model is a ``UserError``. ``under`` holds values that a flag given
    overrides and that override the recipe's and the model's (an engine's folders,
    ``engines.settings``).

    Argparse reads the line twice: once with the defaults, which --help shows, and once
    without, to learn which flags were given (the recipe's value stays under those only)."""
    verbose = build_parser().parse_args(argv).verbose  # --help and bad flags exit here
    given = vars(build_parser(defaults=False).parse_args(argv))
    given.pop("verbose", None)
    given = {**(under or {}), **given}
    settings = overlays.build(**given)
    checks.check_given(settings, given)
    return settings, verbose
