"""The long fuzzing campaign: thousands of generated and damaged cases for every kind of input
the package reads (tests/fuzz/: CIFAR pickles and archives, pictures and picture folders, record
files and their metadata, settings.json, flag files, TF_CONFIG, exports, serving requests).

Each kind runs in its own process, so a crash in native code (a decoder, a protobuf parser)
ends that kind's process and is counted, not the campaign: the child writes each case to
``WORK/KIND.case`` before trying it, and the parent reports the case the child died on. Every
case must be read soundly, refused in one line naming the input, or skipped by a documented
rule (tests/fuzz/harness.py); any other end of a case is a failure, counted once per distinct
(exception type, place) with the shortest case that raised it.

Printed per kind: cases tried, their outcomes, distinct failures, the slowest case and the
case that raised the process's peak memory most. tests/test_fuzz.py runs a short deterministic
slice of the same kinds in CI.

    python benchmarks/fuzz_campaign.py                       # 10,000 cases per kind
    python benchmarks/fuzz_campaign.py --cases 500 --kinds picture,tf-config --seed 7
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

from machine import machine_line

from cifar10_estimator import storage

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))  # the kinds live with the tests that use them

CASE_CHARS = 160  # how much of a case's repr a report shows


def _short(case) -> str:
    text = repr(case)
    return text if len(text) <= CASE_CHARS else text[:CASE_CHARS] + f"... ({len(text):,} chars)"


def _place(error: BaseException) -> str:
    """Where an exception was raised: the innermost frame in the package, else the innermost."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if "cifar10_estimator" in f.filename] or frames
    if not ours:
        return "?"
    frame = ours[-1]
    return f"{os.path.relpath(frame.filename, REPO)}:{frame.lineno}"


def run_kind(name: str, cases: int, seed: int, work: str) -> dict:
    """In the child: ``cases`` cases of kind ``name``; returns its figures."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from fuzz import all_kinds, harness

    kind = next(k for k in all_kinds() if k.name == name)
    outcomes: collections.Counter = collections.Counter()
    failures: dict[str, dict] = {}
    slowest = {"seconds": 0.0, "case": None}
    largest = {"kib": 0, "case": None}
    current = os.path.join(work, f"{name}.case")
    scratch = tempfile.mkdtemp(dir=work, prefix=f"{name}-")
    context = kind.start(tempfile.mkdtemp(dir=work, prefix=f"{name}-start-")) \
        if kind.start else None
    tried = 0

    def one(case) -> None:
        nonlocal tried
        tried += 1
        with open(current, "w") as f:
            f.write(_short(case))
        try:
            result = harness.run_case(kind, case, context, scratch)
        except Exception as e:  # a failure found: counted, and the campaign goes on
            key = f"{type(e).__name__} at {_place(e)}"
            shown = _short(case)
            seen = failures.get(key)
            if seen is None or len(shown) < len(seen["case"]):
                failures[key] = {"message": str(e).splitlines()[0][:300] if str(e) else "",
                                 "case": shown, "count": (seen or {}).get("count", 0)}
            failures[key]["count"] += 1
            outcomes["failed"] += 1
            return
        outcomes[result.outcome] += 1
        if result.seconds > slowest["seconds"]:
            slowest.update(seconds=result.seconds, case=_short(case))
        if result.peak_growth_kib > largest["kib"]:
            largest.update(kib=result.peak_growth_kib, case=_short(case))

    started = time.monotonic()
    try:
        for case in kind.regressions:
            one(case)
        search = settings(max_examples=cases, database=None, deadline=None,
                          phases=[Phase.generate], suppress_health_check=list(HealthCheck))(
            hypothesis_seed(seed)(given(kind.strategy)(one)))
        search()
    finally:
        if kind.stop:
            kind.stop(context)
    return {"kind": name, "reader": kind.reader, "tried": kind.tried, "cases": tried,
            "outcomes": dict(outcomes), "failures": failures, "slowest": slowest,
            "largest_memory": largest, "seconds": time.monotonic() - started}


def campaign(names: list[str], cases: int, seed: int, limit: float, work: str) -> list[dict]:
    """Each kind in a child process (``--_kind``); a child that dies is reported with the case
    it was on."""
    results = []
    for name in names:
        out = os.path.join(work, f"{name}.json")
        try:
            proc = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--_kind", name, "--cases",
                 str(cases), "--seed", str(seed), "--work", work, "--_out", out],
                cwd=work, capture_output=True, text=True, timeout=limit, check=False)
            ended, said = f"process ended with status {proc.returncode}", proc.stderr
        except subprocess.TimeoutExpired as e:
            proc = None
            ended, said = f"process still running after {limit:g} s", str(e.stderr or "")
        if proc is not None and proc.returncode == 0 and os.path.isfile(out):
            with open(out) as f:
                result = json.load(f)
        else:
            case_file = os.path.join(work, f"{name}.case")
            last = open(case_file).read() if os.path.isfile(case_file) else "?"
            result = {"kind": name, "cases": None, "outcomes": {}, "slowest": {},
                      "largest_memory": {},
                      "failures": {ended: {"message": (said.strip().splitlines() or [""])[-1][:300],
                                           "case": last, "count": 1}}}
        results.append(result)
        report(result)
    return results


def report(result: dict) -> None:
    outcomes = ", ".join(f"{v:,} {k}" for k, v in sorted(result["outcomes"].items()))
    cases = "?" if result["cases"] is None else f"{result['cases']:,}"
    print(f"\n{result['kind']}: {cases} cases ({outcomes}); "
          f"{len(result['failures'])} distinct failure(s)", flush=True)
    if result.get("slowest", {}).get("case") is not None:
        print(f"  slowest: {result['slowest']['seconds']:.3f} s: {result['slowest']['case']}")
    if result.get("largest_memory", {}).get("case") is not None:
        print(f"  peak memory rise: {result['largest_memory']['kib'] / 1024:.1f} MiB: "
              f"{result['largest_memory']['case']}")
    for key, failure in result["failures"].items():
        print(f"  FAILURE {key} ({failure['count']}x): {failure['message']}\n"
              f"    shortest case: {failure['case']}")


def table(results: list[dict]) -> None:
    print(f"\n{'kind':<18} {'cases':>7} {'accepted':>9} {'refused':>8} {'skipped':>8} "
          f"{'failures':>9} {'slowest s':>10} {'peak MiB':>9}")
    for r in results:
        o = r["outcomes"]
        print(f"{r['kind']:<18} {r['cases'] or 0:>7,} {o.get('accepted', 0):>9,} "
              f"{o.get('refused', 0):>8,} {o.get('skipped', 0):>8,} {len(r['failures']):>9} "
              f"{r.get('slowest', {}).get('seconds', 0):>10.3f} "
              f"{r.get('largest_memory', {}).get('kib', 0) / 1024:>9.1f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases per kind (10,000)")
    parser.add_argument("--kinds", default=None, help="comma-separated kinds (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis' seed (default 0)")
    parser.add_argument("--limit-secs", type=float, default=3600,
                        help="wall-time limit of one kind's process (default 3600)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the figures")
    parser.add_argument("--_kind", help=argparse.SUPPRESS)
    parser.add_argument("--_out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._kind:
        result = run_kind(args._kind, args.cases, args.seed, args.work)
        storage.write_bytes_atomic(args._out, json.dumps(result).encode())
        return 0

    from fuzz import all_kinds

    known = [k.name for k in all_kinds()]
    names = known if args.kinds is None else [k.strip() for k in args.kinds.split(",")]
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"--kinds: unknown {unknown}; the kinds are {', '.join(known)}")
    print(machine_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="fuzz-campaign-") as tmp:
        work = os.path.abspath(args.work or tmp)
        os.makedirs(work, exist_ok=True)
        started = time.monotonic()
        results = campaign(names, args.cases, args.seed, args.limit_secs, work)
    table(results)
    print(f"\n{time.monotonic() - started:.0f} s in all; seed {args.seed}")
    if args.json:
        storage.write_bytes_atomic(args.json, (json.dumps(results, indent=1) + "\n").encode())
    return 1 if any(r["failures"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
