"""What every command's command line shares, built on ``argparse``.

- The name it was run as: a console script's (``cifar10-train``), the generator script's
  (``generate_tfrecords.py``), else the module's (``python -m cifar10_estimator.predict``).
  Usage lines and error prefixes use it (``errors.invoked_as``, re-exported here: the
  foundations import one way, errors before storage before cli).
- Help that shows each flag's default (unless its help already says it), groups of flags, and
  examples at the end; ``--version``.
- ``@FILE`` reads flags from a file: one or more per line, quoted as in a shell, ``#`` starts a
  comment. Flags after it on the command line win over the file's. A file that includes
  itself, or a pipe, socket or device in its place, is refused (``storage.open_regular``, the
  one way the package opens a local file it reads).
- No abbreviations: ``--num-l`` is not ``--num-layers``, so a flag added later cannot change
  what an old command line means.
- A bad command line gets one line, not the usage: ``<name>: error: <what>; see --help``, with
  the closest flag for an unknown one (``did you mean --num-layers?``), and exit status 2.

No TensorFlow here: command lines are parsed before it loads.
"""

import argparse
import difflib
import os
import re
import shlex
import sys
import textwrap
from typing import Sequence

from cifar10_estimator import __version__
from cifar10_estimator.errors import error_prefix, invoked_as  # noqa: F401 (cli's names too)
from cifar10_estimator.storage.regular_files import open_regular

HELP_WIDTH = 79
# @FILEs read for one command line, nested ones included: more is a loop of inclusions.
MAX_FLAG_FILES = 1000


def split_at_dashes(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """A command's own flags, and the ones after ``--`` that it hands on (a launcher's or a
    sweep's trainer flags)."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    return argv[:cut], argv[cut + 1:]


def shown(value) -> str:
    """A default as a user would type it: ``82,123,300``, ``true``, ``0.0002``."""
    if isinstance(value, (tuple, list)):
        return ",".join(shown(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


# A help that states its default already: "(default 600 unless ...)", "default: demo-run".
_STATES_DEFAULT = re.compile(r"\(default\b|\bdefault:")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Adds ``(default: X)`` to each flag's help, unless the help states it or there is none
    to state (an unset flag, a switch that is off)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (not action.option_strings or _STATES_DEFAULT.search(text) or default is None
                or default is argparse.SUPPRESS or default is False):  # --help, --version: SUPPRESS
            return text
        return f"{text} (default: {shown(default).replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` with the package's conventions (see the module)."""

    def __init__(self, module: str, *, description: str, examples: Sequence[str] = (),
                 **kwargs):
        epilog = ("examples:\n" + "\n".join(f"  {line}" for line in examples)
                  if examples else None)
        # The description is wrapped here: the formatter keeps the examples' lines as they are.
        super().__init__(prog=kwargs.pop("prog", invoked_as(module)),
                         description=textwrap.fill(description, HELP_WIDTH), epilog=epilog,
                         formatter_class=_Formatter, allow_abbrev=False,
                         fromfile_prefix_chars="@", **kwargs)
        self.error_name = error_prefix(module)
        self.add_argument("--version", action="version",
                          version=f"cifar10_estimator {__version__}")

    def parse_known_args(self, args=None, namespace=None):
        # An unknown flag is named before anything else is checked (a required flag it was
        # perhaps meant to be, say), with the closest known one.
        self._flag_files_read = 0
        args = self._read_args_from_files(list(sys.argv[1:] if args is None else args))
        for token in args:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            if name.startswith("--") and name not in self._option_string_actions:
                self.error(f"unrecognized arguments: {token}")
        return super().parse_known_args(args, namespace)

    def expand_flag_files(self, args: Sequence[str]) -> list[str]:
        """``args`` with each ``@FILE`` replaced by the flags it holds, read as parsing reads
        them: for a command that hands flags on to processes that run elsewhere (a sweep's
        trials), where a relative ``@FILE`` would name another file or none."""
        self._flag_files_read = 0
        return self._read_args_from_files(list(args))

    def convert_arg_line_to_args(self, line: str) -> list[str]:
        return shlex.split(line, comments=True)

    def error(self, message: str):
        self.exit(2, f"{self.error_name}: error: {message}{self._closest(message)}; "
                     f"see --help\n")

    def _read_args_from_files(self, arg_strings):
        # One @FILE at a time, so that an error names the file it is in; read here rather than
        # by argparse, whose plain open() waits forever on a FIFO. A file that
        # includes itself, directly or through others, would recurse until RecursionError;
        # files that include each other many times over would multiply without end.
        reading = self.__dict__.setdefault("_flag_files_reading", [])
        expanded = []
        for arg in arg_strings:
            if not arg or arg[0] not in self.fromfile_prefix_chars:
                expanded.append(arg)
                continue
            name = arg[1:]
            try:
                key = os.path.realpath(name)
            except ValueError as e:  # a NUL in the name
                self.error(f"the flag file {name!r} cannot be read ({e})")
            if key in reading:
                self.error(f"the flag file {name} includes itself (through "
                           f"{' -> '.join(reading[reading.index(key):])}); remove that @line")
            self._flag_files_read = getattr(self, "_flag_files_read", 0) + 1
            if self._flag_files_read > MAX_FLAG_FILES:
                self.error(f"the flag file {name}: flag files were read more than "
                           f"{MAX_FLAG_FILES} times for one command line; include each once")
            try:
                with open_regular(name, "r") as file:
                    lines = file.read().splitlines()
            except OSError as e:
                self.error(f"the flag file {name} cannot be read ({e.strerror or e})")
            except ValueError as e:  # not text in this locale's encoding
                self.error(f"the flag file {name} cannot be read ({e})")
            reading.append(key)
            try:
                # As argparse's own reading: each line split as a shell would, then the
                # @FILEs these lines name, read by this method again.
                found = [token for line in lines for token in self.convert_arg_line_to_args(line)]
                expanded.extend(self._read_args_from_files(found))
            except ValueError as e:  # a NUL, or shlex: an unclosed quote
                self.error(f"the flag file {name} cannot be read ({e})")
            finally:
                reading.pop()
        return expanded

    def _closest(self, message: str) -> str:
        """`` (did you mean --x?)`` for the first unknown flag in argparse's message."""
        if not message.startswith("unrecognized arguments: "):
            return ""
        # Compared without the dashes, which every flag shares.
        known = [o[2:] for o in self._option_string_actions if o.startswith("--")]
        for token in message.split(": ", 1)[1].split():
            if token.startswith("--"):
                close = difflib.get_close_matches(token[2:].split("=")[0], known, n=1,
                                                  cutoff=0.6)
                if close:
                    return f" (did you mean --{close[0]}?)"
        return ""
