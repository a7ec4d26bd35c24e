"""The rules of the fuzzing campaign, shared by ``tests/test_fuzz.py`` (a short deterministic
slice, in CI) and ``benchmarks/fuzz_campaign.py`` (the long campaign).

A ``Kind`` is one sort of input the package reads (a CIFAR pickle, a tar archive, a picture,
a TFRecord file, a serving request, ...): a Hypothesis strategy that draws cases (generated and
mutated inputs) and a ``check`` that hands one case to the package's own reader and returns
what became of it:

- ``ACCEPTED``: read, and what was read is sound (each kind checks what that means);
- ``REFUSED``: a ``UserError`` whose message is one line naming the input (``refused``),
  which a command prints without a traceback and exits with status 2;
- ``SKIPPED``: left out by a documented rule, and counted (a damaged picture in a folder).

Anything else breaks the property: an exception that is not a ``UserError`` (a command would
print a traceback), a refusal of several lines or one that does not name the input, output left
half-written, code run from the input, or a case that takes longer than the kind's
``time_limit`` (``run_case``). A check raises ``Violation`` for the broken rules it tests
itself; any other exception that escapes it is a bug found.
"""

import dataclasses
import os
import resource
import shutil
import signal
import tempfile
import time
from typing import Any, Callable, Optional

from hypothesis import strategies as st

from cifar10_estimator.errors import UserError

ACCEPTED, REFUSED, SKIPPED = "accepted", "refused", "skipped"
OUTCOMES = (ACCEPTED, REFUSED, SKIPPED)


class Violation(AssertionError):
    """A case broke the property (see the module)."""


@dataclasses.dataclass(frozen=True)
class Kind:
    """One sort of input: how to draw cases and how to check one.

    ``check(case, scratch, context)`` gets a fresh empty folder ``scratch`` to write the case's
    files in, and ``context``, what ``start(folder)`` returned (once per run, e.g. a serving
    process; ``stop(context)`` ends it). ``regressions`` are minimal cases of failures found
    and fixed, run first in every slice.
    """

    name: str
    reader: str  # what reads it, for docs/faults.md: "data.pickles.load_batch"
    tried: str  # what the strategy draws, for docs/faults.md
    strategy: st.SearchStrategy
    check: Callable[[Any, str, Any], str]
    start: Optional[Callable[[str], Any]] = None
    stop: Optional[Callable[[Any], None]] = None
    time_limit: float = 10.0
    regressions: tuple = ()


@dataclasses.dataclass
class Result:
    outcome: str
    seconds: float
    peak_growth_kib: int  # how far the process's peak resident memory rose during the case


def one_line(error: BaseException, *names: str) -> str:
    """``REFUSED`` for a ``UserError`` whose message is one non-empty line naming each of
    ``names``; raises ``Violation`` for any other refusal."""
    if not isinstance(error, UserError):
        raise Violation(f"refused with {type(error).__name__} instead of a UserError: {error}")
    message = str(error).strip()
    if not message or "\n" in message:
        raise Violation(f"a refusal must be one line, got {message!r}")
    missing = [n for n in names if n not in message]
    if missing:
        raise Violation(f"the refusal {message!r} does not name {missing}")
    return REFUSED


def refused(read: Callable[[], Any], *names: str) -> tuple[str, Any]:
    """Runs ``read``: (``ACCEPTED``, its value), or (``REFUSED``, None) after a ``UserError``
    checked by ``one_line``. Other exceptions escape: they are the bugs a campaign looks for."""
    try:
        return ACCEPTED, read()
    except UserError as e:
        return one_line(e, *names), None


def assert_absent_or_whole(path: str, whole: Callable[[str], bool]) -> None:
    """Output at ``path`` after a case is either missing or ``whole(path)``; no temporary
    siblings are left behind (the package writes to a temporary name, then renames)."""
    if os.path.lexists(path) and not whole(path):
        raise Violation(f"half-written output left at {path}")
    parent = os.path.dirname(path) or "."
    base = os.path.basename(path)
    leftovers = [n for n in os.listdir(parent) if n != base and base in n]
    if leftovers:
        raise Violation(f"temporary files left beside {path}: {leftovers}")


class _TimeLimit(Exception):
    pass


def _alarm(signum, frame):
    raise _TimeLimit()


def run_case(kind: Kind, case: Any, context: Any, scratch_root: str) -> Result:
    """Checks one case in a fresh folder under ``scratch_root`` within ``kind.time_limit``
    seconds (a hang is a ``Violation``; only Python code can be interrupted, so a case stuck
    in native code is caught by the campaign's per-kind process time limit instead)."""
    scratch = tempfile.mkdtemp(dir=scratch_root)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, kind.time_limit)
    started = time.monotonic()
    try:
        outcome = kind.check(case, scratch, context)
    except _TimeLimit:
        raise Violation(f"{kind.name}: no answer within {kind.time_limit:g} s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - started
    if outcome not in OUTCOMES:
        raise Violation(f"{kind.name}: check returned {outcome!r}, not one of {OUTCOMES}")
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return Result(outcome, seconds, growth)


# ---------------------------------------------------------------------------------------------
# Mutations every kind can apply to bytes: the damage files meet on disks and in transfers.


@st.composite
def mutated(draw, original: bytes) -> bytes:
    """``original`` damaged in one to four ways: cut short, bits flipped, bytes overwritten,
    inserted or deleted, a stretch repeated, or emptied."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(("truncate", "flip", "overwrite", "insert", "delete",
                                    "repeat", "empty")))
        size = len(data)
        at = draw(st.integers(0, size)) if size else 0
        if how == "truncate":
            del data[at:]
        elif how == "flip" and size:
            at = min(at, size - 1)
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "overwrite" and size:
            chunk = draw(st.binary(min_size=1, max_size=8))
            data[at:at + len(chunk)] = chunk
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif how == "delete":
            del data[at:at + draw(st.integers(1, 64))]
        elif how == "repeat" and size:
            end = min(size, at + draw(st.integers(1, 256)))
            data[at:at] = data[at:end] * draw(st.integers(1, 8))
        elif how == "empty":
            data.clear()
    return bytes(data)
