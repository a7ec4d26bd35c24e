#!/usr/bin/env python3
"""Measures the walk a reader makes through ``cifar10_estimator.train.run(argv)``: its stays
and its climbs back up, on any checkout.

``python tools/call_walk.py [--repo CHECKOUT] [--list]`` runs ``train.run`` in this process on a
tiny real job and prints ``stays N climbs M`` (and, with ``--list``, the walk).

The job: the built-in sample data (10 pictures per batch file, written by the generator command
in a subprocess), then ``train.run`` with ``--num-layers 8 --train-batch-size 8
--eval-batch-size 8 --train-steps 2 --precision fp32 --seed 1 --eval-throttle-secs 100000``: it
trains, saves, evaluates, exports and writes its report, so the walk covers a whole run. fp32 is
fixed so that the walk does not depend on whether the CPU has native bf16 or on what the user's
precision cache holds; the cache folder is a temporary one all the same.

The definition, exactly:

- A *call* is a ``call`` event of ``sys.setprofile`` on the main thread, while ``train.run``
  runs, of a code object whose file is inside the checkout's package. Not counted: code that
  runs because a module is being imported (a call with a package module's top level on the
  stack: a reader does not walk import-time set-up), and comprehensions, generator
  expressions and lambdas (they belong to the function they are written in). Calls that
  TensorFlow or the standard library make back into the package (``model_fn``, session hooks,
  a dataset's map function) count like any other: a reader follows them too.
- The *walk* is the package functions in the order of their first call, each once.
- A function's *room* is the first name under the package: its subpackage (``training``,
  ``config``, ``storage`` ...) or its top-level module (``train``, ``cli``, ``logs`` ...).
- A *stay* is a maximal run of consecutive walk entries in one room. ``stays`` counts them.
- A *climb back up* is a stay whose room is the room of one of the callers (package frames on
  the stack, nearest or further up) of the last function of the stay before it: the reader
  goes back up to a room they came down from, rather than on down or across. ``climbs``
  counts them.

Calibration: issue 67 reports 98 stays and 35 climbs at 4e194c8 without saying how they were
counted. This definition gives 110 stays and 34 climbs there; the other definitions tried
(functions or modules instead of rooms, climbs as returns to any room seen before or as moves
to a higher layer, only calls between modules, only calls made by package code itself) were
further off. So the numbers compare one checkout with another under this script, not with the
issue's figures.

Nothing is written inside the checkout: the job and the data live in a temporary folder that
is removed at the end, and no bytecode is cached (``sys.dont_write_bytecode``).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import NamedTuple, Optional

PACKAGE = "cifar10_estimator"
DEFAULT_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_SIZE = "10"  # pictures per batch file, the generator's minimum: the data is not the point
TRAIN_FLAGS = ("--num-layers", "8", "--train-batch-size", "8", "--eval-batch-size", "8",
               "--train-steps", "2", "--precision", "fp32", "--seed", "1",
               "--eval-throttle-secs", "100000")
# Code that is not a function a reader stays in: it is read as part of the enclosing one.
_INLINE = frozenset({"<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "<lambda>"})
_TOP_LEVEL = "<module>"


class Call(NamedTuple):
    """One counted call: the function (``module:qualname``) and its package callers, nearest
    first."""
    function: str
    callers: tuple[str, ...]


class Walk(NamedTuple):
    functions: list[Call]  # first calls, in order
    stays: int
    climbs: int


def room(function: str) -> str:
    """``cifar10_estimator.training.driver:_run`` -> ``training``."""
    module = function.partition(":")[0]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


class Recorder:
    """A ``sys.setprofile`` function that keeps the package's calls on one thread."""

    def __init__(self, package_dir: str) -> None:
        self._prefix = os.path.join(package_dir, "")
        self._names: dict = {}  # code object -> (name, kind) or None; one lookup per code
        self._thread = threading.get_ident()
        self.calls: list[Call] = []

    def _name(self, code) -> Optional[tuple[str, str]]:
        try:
            return self._names[code]
        except KeyError:
            pass
        found = None
        if code.co_filename.startswith(self._prefix):
            relative = os.path.relpath(code.co_filename, self._prefix)[:-len(".py")]
            parts = [PACKAGE, *relative.split(os.sep)]
            if parts[-1] == "__init__":
                parts.pop()
            kind = ("top" if code.co_name == _TOP_LEVEL else
                    "inline" if code.co_name in _INLINE else "function")
            found = (f"{'.'.join(parts)}:{code.co_qualname}", kind)
        self._names[code] = found
        return found

    def __call__(self, frame, event, arg) -> None:
        if event != "call" or threading.get_ident() != self._thread:
            return
        named = self._name(frame.f_code)
        if named is None or named[1] != "function":
            return
        callers = []
        outer = frame.f_back
        while outer is not None:
            caller = self._name(outer.f_code)
            if caller is not None:
                if caller[1] == "top":
                    return  # import-time code
                if caller[1] == "function":
                    callers.append(caller[0])
            outer = outer.f_back
        self.calls.append(Call(named[0], tuple(callers)))


def walk_of(calls: list[Call]) -> Walk:
    """The walk, its stays and its climbs, from the calls in the order they were made."""
    seen: set[str] = set()
    functions = []
    for call in calls:
        if call.function not in seen:
            seen.add(call.function)
            functions.append(call)
    stays = climbs = 0
    previous: Optional[Call] = None
    for call in functions:
        here = room(call.function)
        if previous is None or here != room(previous.function):
            stays += 1
            if previous is not None and here in {room(c) for c in previous.callers}:
                climbs += 1
        previous = call
    return Walk(functions, stays, climbs)


def _import_package(repo: str):
    """The checkout's package, whatever else is installed: its folder first on the path."""
    package_dir = os.path.join(repo, PACKAGE)
    if not os.path.isfile(os.path.join(package_dir, "__init__.py")):
        raise SystemExit(f"call_walk: no {PACKAGE} package in {repo}")
    sys.dont_write_bytecode = True  # nothing written inside the checkout
    sys.path.insert(0, repo)
    import cifar10_estimator
    if os.path.dirname(os.path.abspath(cifar10_estimator.__file__)) != package_dir:
        raise SystemExit(f"call_walk: imported {cifar10_estimator.__file__}, not the "
                         f"package in {repo}")
    from cifar10_estimator import train  # imported before the recording: not part of the walk
    return package_dir, train


def measure(repo: str) -> Walk:
    package_dir, train = _import_package(repo)
    work = tempfile.mkdtemp(prefix="call_walk-")
    try:
        data_dir = os.path.join(work, "data")
        env = dict(os.environ, PYTHONPATH=repo, PYTHONDONTWRITEBYTECODE="1")
        generated = subprocess.run(
            [sys.executable, "-m", f"{PACKAGE}.generate", "--data-dir", data_dir, "--sample",
             "--sample-size", SAMPLE_SIZE], env=env, cwd=work, capture_output=True, text=True)
        if generated.returncode:
            raise SystemExit(f"call_walk: the generator failed:\n{generated.stderr}")
        # The precision cache and anything a run writes beside its job dir land in the
        # temporary folder, not in the user's home or the checkout.
        os.environ["XDG_CACHE_HOME"] = os.path.join(work, "cache")
        os.chdir(work)
        argv = ["--data-dir", data_dir, "--job-dir", os.path.join(work, "job"), *TRAIN_FLAGS]
        recorder = Recorder(package_dir)
        sys.setprofile(recorder)
        try:
            train.run(argv)
        finally:
            sys.setprofile(None)
        return walk_of(recorder.calls)
    finally:
        os.chdir("/")
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/call_walk.py",
        description="Stays and climbs back up of the walk through train.run(argv) on a tiny "
                    "job (the definition: this file's docstring).")
    parser.add_argument("--repo", default=DEFAULT_REPO,
                        help="the checkout to measure (default: the one this script is in)")
    parser.add_argument("--list", action="store_true",
                        help="also print the walk: each function (module:qualname) in the "
                             "order of its first call, a blank line between stays, CLIMB "
                             "before a stay that climbs back up")
    args = parser.parse_args(argv)
    walk = measure(os.path.abspath(args.repo))
    if args.list:
        previous = None
        for call in walk.functions:
            here = room(call.function)
            if previous is not None and here != room(previous.function):
                climbed = here in {room(c) for c in previous.callers}
                print("\nCLIMB" if climbed else "")
            print(call.function)
            previous = call
        print()
    print(f"stays {walk.stays} climbs {walk.climbs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
