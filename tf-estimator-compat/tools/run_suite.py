"""Runs tensorflow/estimator's own tests (release 2.15.0, one file per module) on this
Python's TensorFlow, with the layer installed, and records the counts per file; or renders the
records of several releases side by side as a table.

The tests are the 68 files of tensorflow/estimator at v2.15.0, flattened into one folder
(this repository's reference copy is ``../shared/estimator-tests``, with its license). Each
file runs as its own program, ``python FILE_test.py``, as Bazel's ``py_test`` runs it upstream:
its ``__main__`` block sets up what its tests expect (``tf.test.main()`` parses the absl flags
some tests read; some turn TF2 behaviour off first, or start worker processes), and absl's
test runner writes the JUnit report named by ``XML_OUTPUT_FILE``, as it does under Bazel. It
runs in a temporary folder of its own (some tests write into the working folder), in a process
group of its own (killed whole at ``--timeout``), with the layer installed at the interpreter's
start (``TF_ESTIMATOR_COMPAT=1``, the distribution's start hook: every process the tests start
gets it too), ``TF_USE_LEGACY_KERAS=1`` where tf-keras is installed on TensorFlow 2.16 or
later, and tools/suite_sitecustomize.py as the ``sitecustomize`` of every process (what later
Pythons removed and the tests still call, given back on every release alike):

    python tools/run_suite.py run --tests ../shared/estimator-tests --out tf2.21-py3.11.json
    python tools/run_suite.py run --tests DIR --files 'canned_linear_*' --out part.json
    python tools/run_suite.py run --tests DIR --files keras_test.py --update --out tf2.21-py3.11.json
    python tools/run_suite.py table tf2.15-py3.11.json tf2.21-py3.11.json > docs/suite.md

A record holds the TensorFlow, Python, Keras, NumPy and estimator versions, and per file the
passed, failed, errored and skipped tests, the seconds it took, each failure's name and first
line, and whether the file timed out (``--timeout``); with ``--test-timeout``, a file that
timed out runs again one test per program, so that the tests that wait forever are named and
the others counted. ``--update`` runs the files named again into a record of the same versions,
keeping the others. ``table`` compares each record with the first: a file whose counts differ
is marked, and its failures are listed under the table.
"""

import argparse
import fnmatch
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from typing import Optional, Sequence

# The distribution's start hook installs the layer when this is "1" (tf_estimator_compat).
AT_START_VARIABLE = "TF_ESTIMATOR_COMPAT"
COUNTS = ("passed", "failed", "errors", "skipped")
SITECUSTOMIZE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             "suite_sitecustomize.py")


def _versions() -> dict:
    """The versions a record is of, read in a process of its own (this one loads nothing)."""
    probe = ("import json, platform, importlib.metadata as m, tensorflow as tf; "
             "print(json.dumps({'tensorflow': tf.__version__, 'python': "
             "platform.python_version(), 'estimator': m.version('tensorflow-estimator'), "
             "'numpy': m.version('numpy'), "
             "'keras': tf.keras.__name__.split('.')[0] + ' ' + m.version("
             "'tf-keras' if tf.keras.__name__.startswith('tf_keras') else 'keras')}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=_env(), timeout=300)
    if done.returncode != 0:
        sys.exit(f"run_suite.py: error: TensorFlow and the estimator do not load in "
                 f"{sys.executable}: {''.join(done.stderr.strip().splitlines()[-1:])}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _env() -> dict:
    env = {**os.environ, AT_START_VARIABLE: "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    # Keras 2 through tf-keras where TensorFlow's own Keras is 3 (2.16 on); 2.15 runs as shipped,
    # with the Keras 2 it bundles.
    release = (2, 16)  # a TensorFlow under another distribution's name: a new one
    for name in ("tensorflow", "tensorflow-cpu"):
        try:
            release = tuple(int(p) for p in re.findall(
                r"\d+", importlib.metadata.version(name))[:2])
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if release >= (2, 16) and importlib.util.find_spec("tf_keras") is not None:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def _counts(report: str) -> dict:
    """Counts and failures from a JUnit XML report, absl's or pytest's: absl marks a skipped
    test ``status="notrun"``, pytest with a ``skipped`` element."""
    result = {name: 0 for name in COUNTS}
    result["failures"] = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        outcome = next((child for child in case if child.tag in ("failure", "error",
                                                                   "skipped")), None)
        if outcome is not None and outcome.tag != "skipped":
            result["failed" if outcome.tag == "failure" else "errors"] += 1
            first = ((outcome.get("message") or outcome.text or "").strip().splitlines()
                     or [outcome.tag])[0]
            # absl gives the exception's class apart ("<class 'KeyError'>"); pytest, first.
            kind = re.fullmatch(r"<class '([\w.]+)'>", outcome.get("type") or "")
            if kind and not first.startswith(kind.group(1)):
                first = f"{kind.group(1)}: {first}"
            result["failures"].append(f"{name}: {first[:300]}")
        elif outcome is not None or case.get("status") == "notrun":
            result["skipped"] += 1
        else:
            result["passed"] += 1
    return result


# Lists a test file's tests as absl's runner finds them in ``__main__`` ("Class.method" per
# line), the file loaded as a module: its main block does not run.
LIST_TESTS = """
import importlib.util, sys
from absl.testing import absltest
spec = importlib.util.spec_from_file_location("listed", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
pending = [absltest.TestLoader().loadTestsFromModule(module)]
while pending:
    for test in pending.pop():
        if hasattr(test, "__iter__"):
            pending.append(test)
        else:
            print(test.id().partition(".")[2])
"""


def _program(folder: str, name: str, arguments: Sequence[str], timeout: float,
             report: Optional[str] = None) -> tuple:
    """Runs ``python NAME ARGUMENTS`` in ``folder``, in a process group that is killed whole
    when it ends or times out: (its output, whether it timed out)."""
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH")) if p)
    if report:
        env["XML_OUTPUT_FILE"] = report
    with subprocess.Popen([sys.executable, name, *arguments], cwd=folder, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            output, timed_out = "", True
        finally:
            try:  # the test's own worker processes too
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if timed_out:
                process.communicate()
    return output, timed_out


def _reported(folder: str, name: str, arguments: Sequence[str], timeout: float,
              what: str) -> dict:
    """Counts of one run of the file (all of it, or the tests named), from absl's report; a run
    that wrote none is one error named ``what``."""
    report = os.path.join(folder, "report.xml")
    if os.path.exists(report):
        os.remove(report)
    output, timed_out = _program(folder, name, arguments, timeout, report)
    if os.path.exists(report) and os.path.getsize(report):
        return {**_counts(report), "timed_out": timed_out}
    last = output.strip().splitlines()[-1:] or ["no report"]
    return {**{c: 0 for c in COUNTS}, "errors": 1, "timed_out": timed_out, "failures": [
        f"{what}: " + (f"timed out after {timeout:.0f} s" if timed_out else last[0][:300])]}


def run_file(path: str, timeout: float, test_timeout: Optional[float] = None) -> dict:
    """One test file as a program of its own, in a temporary folder. A file that runs past
    ``timeout`` runs again one test per program, each with ``test_timeout``, so that the tests
    that wait forever are named and the others counted."""
    name = os.path.basename(path)
    with tempfile.TemporaryDirectory(prefix="estimator-suite-") as folder:
        shutil.copy(path, folder)
        shutil.copy(SITECUSTOMIZE, os.path.join(folder, "sitecustomize.py"))
        started = time.monotonic()
        result = _reported(folder, name, [], timeout, name)
        if result["timed_out"] and test_timeout:
            listed, listing_timed_out = _program(folder, "-c", [LIST_TESTS, name], 600)
            tests = [] if listing_timed_out else re.findall(r"^\w+\.\w+$", listed, re.M)
            if tests:
                result = {**{c: 0 for c in COUNTS}, "failures": [], "timed_out": True,
                          "one_by_one": True}
                for test in tests:
                    alone = _reported(folder, name, [test], test_timeout,
                                      test.replace(".", "::", 1))
                    for key in (*COUNTS, "failures"):
                        result[key] += alone[key]
        result["seconds"] = round(time.monotonic() - started, 1)
    return result


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            record = json.load(f)
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            raise ValueError("no files in it")
        return record
    except (OSError, ValueError) as e:
        sys.exit(f"run_suite.py: error: {path} cannot be read as a record ({e})")


def run(tests: str, files: Sequence[str], out: str, timeout: float,
        update: bool = False, test_timeout: Optional[float] = None) -> None:
    names = sorted(n for n in os.listdir(tests) if n.endswith("_test.py"))
    if files:
        names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in files)]
    if not names:
        sys.exit(f"run_suite.py: error: no test file in {tests} matches {' '.join(files)}")
    record = {**_versions(), "machine": platform.machine(), "files": {}}
    if update:
        kept = _load(out)
        versions = {k: v for k, v in record.items() if k != "files"}
        if any(kept.get(k) != v for k, v in versions.items()):
            sys.exit(f"run_suite.py: error: {out} is a record of "
                     f"{ {k: kept.get(k) for k in versions} }, not of {versions}: "
                     f"--update only adds to a record of this interpreter's versions")
        record["files"] = kept["files"]
    for name in names:
        record["files"][name] = run_file(os.path.join(tests, name), timeout, test_timeout)
        record["files"] = dict(sorted(record["files"].items()))
        counts = record["files"][name]
        print(f"{name}: " + ", ".join(f"{counts[c]} {c}" for c in COUNTS if counts[c])
              + f" ({counts['seconds']:.0f} s)", flush=True)
        # Written after every file: a long run that is stopped keeps what it measured.
        temporary = out + ".tmp"
        with open(temporary, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(temporary, out)
    totals = {c: sum(f[c] for f in record["files"].values()) for c in COUNTS}
    print("all: " + ", ".join(f"{n} {c}" for c, n in totals.items()))


def _cell(counts: Optional[dict]) -> str:
    if counts is None:
        return "-"
    text = f"{counts['passed']} / {counts['failed'] + counts['errors']} / {counts['skipped']}"
    if counts.get("one_by_one"):
        return text + " (one test per program)"
    return text + (" (timed out)" if counts.get("timed_out") else "")


def _label(record: dict) -> str:
    return f"TF {record['tensorflow']}, Python {record['python']}, {record['keras']}"


def _failures(counts: dict) -> dict:
    """Each failed or errored test's name and its first line."""
    return dict(f.split(": ", 1) if ": " in f else (f, "") for f in counts["failures"])


def table(records: Sequence[str]) -> None:
    loaded = [_load(path) for path in records]
    reference = loaded[0]["files"]
    print("| file | " + " | ".join(_label(r) for r in loaded) + " |")
    print("|---|" + "---|" * len(loaded))
    names = sorted({n for r in loaded for n in r["files"]})
    differing = []  # (record, file, its counts)
    for name in names:
        shown = [_cell(reference.get(name))]
        for record in loaded[1:]:
            counts = record["files"].get(name)
            compared = counts is not None and name in reference  # else nothing to compare
            same = compared and all(counts[c] == reference[name][c] for c in COUNTS)
            shown.append(f"**{_cell(counts)}**" if compared and not same else _cell(counts))
            if compared and not same:
                differing.append((record, name, counts))
        print(f"| `{name}` | " + " | ".join(shown) + " |")
    totals = [{c: sum(f[c] for f in r["files"].values()) for c in COUNTS} for r in loaded]
    print("| all | " + " | ".join(_cell(t) for t in totals) + " |")
    print("\nEach cell: passed / failed or errored / skipped. In bold: counts that differ from "
          "the first column's.")
    if differing:
        print("\nTests that fail where the first column's do not, by file and first line "
              "(the number of tests, and one of them):\n")
    for record, name, counts in differing:
        before = _failures(reference.get(name, {"failures": []}))
        by_line = {}
        for test, line in _failures(counts).items():
            if test not in before:
                by_line.setdefault(line, []).append(test)
        for line, tests in sorted(by_line.items(), key=lambda item: -len(item[1])):
            print(f"- {_label(record)}, `{name}`: {len(tests)} ({tests[0]}): {line}")
        if not by_line:
            print(f"- {_label(record)}, `{name}`: no new failure; "
                  + ", ".join(f"{c} {reference[name][c]} -> {counts[c]}" for c in COUNTS
                              if counts[c] != reference[name][c]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="run the tests, write a record")
    runner.add_argument("--tests", required=True, help="the folder of the 68 test files")
    runner.add_argument("--files", nargs="*", default=[], help="glob patterns of file names")
    runner.add_argument("--out", required=True, help="the record (JSON) to write")
    runner.add_argument("--timeout", type=float, default=3600,
                        help="seconds a file may run before it counts as timed out")
    runner.add_argument("--test-timeout", type=float, default=None,
                        help="a file that times out runs again one test per program, each "
                        "given these seconds (off by default)")
    runner.add_argument("--update", action="store_true",
                        help="run the files again into the record --out, keeping the others")
    tabler = commands.add_parser("table", help="records side by side, as Markdown")
    tabler.add_argument("records", nargs="+", help="records; the first is the reference")
    args = parser.parse_args()
    if args.command == "run":
        if not os.path.isdir(args.tests):
            parser.error(f"--tests {args.tests}: not a folder")
        if args.update and not os.path.isfile(args.out):
            parser.error(f"--update: no record {args.out} to update; run without --update")
        run(args.tests, args.files, args.out, args.timeout, args.update, args.test_timeout)
    else:
        table(args.records)


if __name__ == "__main__":
    main()
