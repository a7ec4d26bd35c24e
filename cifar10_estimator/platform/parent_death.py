"""A child process that ends when the process that started it ends: Linux's
``PR_SET_PDEATHSIG`` (prctl(2)), set between fork and exec.

The launchers start each trainer in a session of its own (so that Ctrl-C reaches the launcher,
which stops its tasks in order). Without this, a launcher that is killed (``kill -9``, the
out-of-memory killer, a lost SSH session's SIGHUP) leaves its trainers running: training on,
holding the job dir's lock, refusing the rerun that would resume the job.

The kernel may send the signal more than once. The "parent" is the thread that forked the
child; when a parent with several threads dies, each thread's exit hands the child to another
of its threads and signals it again (measured on Linux 6.18: a child of a process with 8
idle threads got 1 to 5 signals). ``parent_death_signal`` lets the child know which signal is
its parent's death, to take it once.
"""

import ctypes
import os
import signal
import sys
from typing import Callable

# prctl(2)'s option: the signal the kernel sends the calling process when the thread that
# created it ends; it survives the exec of the trainer.
_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2  # ...and the option that reads it back


def end_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` (call it in the parent, before the fork) that has the kernel send the
    child ``signum`` once the thread that forked it ends. A parent already gone by the time
    the child sets it (it died between fork and prctl) is caught too: the child then signals
    itself. Elsewhere than on Linux, nothing."""
    parent = os.getpid()

    def preexec() -> None:
        if not sys.platform.startswith("linux"):
            return
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signum)
    return preexec


def parent_death_signal() -> int:
    """The signal this process gets when its parent ends (``end_with_parent``), 0 for none
    (or elsewhere than on Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    value = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0)
    return value.value
