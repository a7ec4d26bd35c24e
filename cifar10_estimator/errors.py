"""How a command ends when it cannot finish: a user's mistake, or a signal.

Library code raises ``UserError`` with a one-line message that names the file, flag or value
at fault and says how to fix it. Command-line entry points catch it in ``run_cli`` and print
``<command>: error: <message>`` to stderr with exit status 2, without a traceback. ``Stopped`` is a task
that received SIGTERM or SIGINT and stopped where nothing is lost (``training.preemption``); it
has said so in the log, and the command exits with 128 + the signal's number. Anything else is
a bug and keeps its traceback.
"""

import os
import signal
import sys
from typing import Callable, NoReturn, Optional

SCRIPTS_PREFIX = "cifar10-"  # every console script pyproject.toml installs
GENERATOR_SCRIPT = "generate_tfrecords.py"


def invoked_as(module: str) -> str:
    """The command's name as the user ran it (``module`` for ``python -m`` and for calls from
    Python). ``cli`` names the command with it too, in usage lines and argparse's errors."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if name.startswith(SCRIPTS_PREFIX) or name == GENERATOR_SCRIPT:
        return name
    return f"python -m {module}"


def error_prefix(module: str) -> str:
    """What an error line starts with: the name without ``python -m``."""
    return invoked_as(module).removeprefix("python -m ")


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line."""


class Stopped(Exception):
    """The process received SIGTERM or SIGINT (or its parent-death signal) and stopped; it
    exits with 128 + the signal.

    ``why`` says so when the signal came to another task of the job, which stopped with it.
    """

    def __init__(self, signum: int, why: str = ""):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.why = why

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """128 + the signal's number (143 for SIGTERM), as a shell reports it."""
        return 128 + self.signum


def run_cli(main_fn: Callable[[], int | None], module: str) -> int:
    """Runs ``main_fn`` and turns ``UserError``, a signal and Ctrl-C into an exit status (with
    a one-line message for the error, prefixed with the name the command was run as: see
    ``invoked_as``; ``module`` is the command's module)."""
    prog = error_prefix(module)
    try:
        code = int(main_fn() or 0)
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        code = 2
    except Stopped as e:
        code = e.exit_status
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        code = 130
    if "tensorflow_io" in sys.modules:
        end_process(code)
    return code


def close_event_files(timeout: Optional[float] = None) -> None:
    """Closes the event files TensorFlow's summary writers keep open, before an ``os._exit``.

    Estimator keeps its event files open in ``FileWriterCache`` to the end. Closing them writes
    out their last events, and deletes the local copy tensorflow-io's S3 client keeps of each
    open file in /tmp (_s3_filesystem_*), which os._exit would leave behind. With ``timeout``
    (from a signal handler, which may have interrupted this thread inside a writer's lock) they
    are closed in a thread of their own, waited for at most that long."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return

    def close() -> None:
        try:
            tf.compat.v1.summary.FileWriterCache.clear()
        except Exception:  # noqa: BLE001  (the exit status matters more than these files)
            pass

    if timeout is None:
        close()
        return
    import threading

    closer = threading.Thread(target=close, name="close_event_files", daemon=True)
    closer.start()
    closer.join(timeout)


def entry_point(main: Callable[[], int]) -> Callable[[], NoReturn]:
    """A command's process entry point (its console script, ``python -m``): ``main()``, then
    ``end_process`` with its status. ``main`` stays for callers in the same process."""
    def command() -> NoReturn:
        end_process(main())
    return command


def end_process(code: int) -> NoReturn:
    """Ends the process now with ``code``, once its output is out, skipping the interpreter's
    teardown: the commands' own entry points (``python -m`` and the console scripts, never a
    caller in the same process) end so. The teardown of TensorFlow's graphs and runtime took
    about a second after every run (docs/performance.md, "End of training"), and tensorflow-io
    0.36's S3 file system aborts it (SIGABRT, exit 134: tensorflow/io issue 1912), which would
    hide the command's own exit status. Everything the command wrote is closed by now (the
    event files Estimator keeps open are closed here); only the teardown is skipped. No command
    that starts Ray ends so: ``ray.init``'s exit handler stops what it started."""
    import logging
    import os

    # After an error (status 1 or 2) the store itself may be what failed: flushing to it again
    # would add the writer thread's traceback to the one-line error.
    if code == 0 or code > 128:
        close_event_files()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
