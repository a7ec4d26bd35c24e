"""What a sweep costs beyond its trials: N tiny trials through ``cifar10_estimator.sweep`` on a
Ray cluster, against the same N trainer runs started one after another by hand.

Both sides train the same trials (ResNet-8, batch 8 by default, a grid of N learning rates on
the sample data) to their export, one at a time: the sweep with ``--max-concurrent 1`` and
each trial asking for every core (as a trainer started by hand uses them), so the difference
is the sweep's own work: its start (flags, TensorFlow for the HParams summaries, joining Ray,
Ray Tune's start), each trial's actor and its records, and its end. The Ray cluster is one node
on this host that the script starts first (``--ray ADDRESS`` takes another), as a user's
cluster would be running already. The sides alternate over ``--runs``; the table gives the
wall time of each side and per trial.

    python benchmarks/sweep_overhead.py --trials 4 --runs 1
"""

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from distributed_bench import LocalRay
from machine import print_machine_line
from sample_records import make_sample_records


def trainer_flags(data_dir: str, args) -> list[str]:
    return ["--data-dir", data_dir, "--num-layers", "8", "--train-batch-size", "8",
            "--eval-batch-size", "8", "--train-steps", str(args.train_steps),
            "--precise-bn-batches", "0", "--eval-throttle-secs", "100000"]


def learning_rates(count: int) -> list[str]:
    return [f"{0.01 * (i + 1):g}" for i in range(count)]


def by_hand(work: str, data_dir: str, args) -> float:
    """The trials one after another, each ``python -m cifar10_estimator``: wall seconds."""
    started = time.monotonic()
    for i, rate in enumerate(learning_rates(args.trials)):
        subprocess.run([sys.executable, "-m", "cifar10_estimator",
                        *trainer_flags(data_dir, args), "--learning-rate", rate,
                        "--job-dir", os.path.join(work, f"hand-{i}")],
                       check=True, capture_output=True)
    return time.monotonic() - started


def swept(work: str, data_dir: str, address: str, args) -> float:
    """The same trials through the sweep command: wall seconds."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cifar10_estimator.sweep", "--ray", address, "--sweep-dir",
         os.path.join(work, "sweep"), "--vary",
         f"learning-rate={','.join(learning_rates(args.trials))}", "--max-concurrent", "1",
         "--cpus-per-trial", str(os.cpu_count()), "--", *trainer_flags(data_dir, args)],
        capture_output=True, text=True)
    secs = time.monotonic() - started
    if proc.returncode:
        raise RuntimeError(f"the sweep failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return secs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1, help="runs of each side, alternating")
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--ray", metavar="ADDRESS",
                        help="a running Ray cluster (default: one node on this host)")
    args = parser.parse_args()
    # The benchmark's Ray is its own, on this host: without token authentication, which Ray
    # 2.60's `ray start` turns on once ~/.ray/auth_token exists (docs/distributed.md, "Ray").
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    print_machine_line()
    with contextlib.ExitStack() as stack:
        work = tempfile.mkdtemp(prefix="sweep-bench-")
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        data_dir = make_sample_records(work)
        address = args.ray or stack.enter_context(LocalRay())
        times: dict[str, list[float]] = {"by hand": [], "sweep": []}
        for run in range(args.runs):
            for side in (("by hand", "sweep") if run % 2 == 0 else ("sweep", "by hand")):
                folder = tempfile.mkdtemp(dir=work)
                secs = (by_hand(folder, data_dir, args) if side == "by hand"
                        else swept(folder, data_dir, address, args))
                times[side].append(secs)
                print(f"run {run + 1}, {side}: {secs:.1f} s for {args.trials} trials",
                      flush=True)
    print(f"\n{args.trials} trials of ResNet-8, batch 8, {args.train_steps} steps each, one at "
          f"a time; medians of {args.runs} run(s)")
    print("| side | wall time | per trial |\n|---|---|---|")
    for side, values in times.items():
        median = statistics.median(values)
        print(f"| {side} | {median:.1f} s | {median / args.trials:.1f} s |")
    hand, sweep = (statistics.median(times[s]) for s in ("by hand", "sweep"))
    print(f"\nthe sweep's cost: {(sweep - hand) / args.trials:+.1f} s per trial "
          f"({sweep / hand:.2f}x)")


if __name__ == "__main__":
    main()
