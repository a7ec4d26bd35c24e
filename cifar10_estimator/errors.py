"""The error type for mistakes a user can fix, and how command lines report them.

Library code raises ``UserError`` with a one-line message that names the file, flag or value
at fault and says how to fix it. Command-line entry points catch it (and nothing else) in
``run_cli`` and print ``error: <message>`` to stderr with exit status 2, without a traceback.
Anything else is a bug and keeps its traceback.
"""

import sys
from typing import Callable


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line."""


def run_cli(main_fn: Callable[[], int | None], prog: str) -> int:
    """Runs ``main_fn`` and turns ``UserError`` and Ctrl-C into a one-line message and exit code."""
    try:
        return int(main_fn() or 0)
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
