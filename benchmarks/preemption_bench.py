"""Seconds from SIGTERM to the trainer's exit, with the checkpoint of the current step saved.

Kubernetes sends SIGTERM, waits ``terminationGracePeriodSeconds`` (30 s by default) and then
SIGKILL, so a preempted trainer must save and exit well inside that. This runs
``python -m cifar10_estimator`` as a user would (default flags but the depth and the progress
cadence), waits until it has trained for ``--train-secs`` after its first progress line, sends
SIGTERM, and prints per run the seconds to its exit, the exit status and the step it saved.

    python benchmarks/preemption_bench.py --num-layers 44 --runs 3
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from machine import print_machine_line
from sample_records import make_sample_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVED = re.compile(r"received SIGTERM at step (\d+): saved ")


def run_once(data_dir: str, work: str, args) -> tuple[float, int, int]:
    """(seconds from SIGTERM to exit, exit status, step saved)."""
    job_dir = tempfile.mkdtemp(dir=work)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cifar10_estimator", "--data-dir", data_dir, "--job-dir", job_dir,
         "--num-layers", str(args.num_layers), "--progress-secs", "1"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=REPO, env=env)
    first_progress = None
    sent = None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        now = time.monotonic()
        if first_progress is None and re.search(r" step \d+/", line):
            first_progress = now
        if sent is None and first_progress is not None and now - first_progress >= args.train_secs:
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
    status = proc.wait()
    exited = time.monotonic()
    saved = next((int(m.group(1)) for m in map(SAVED.search, lines) if m), -1)
    if sent is None or saved < 0:
        raise SystemExit("the trainer did not train or did not save:\n" + "".join(lines[-20:]))
    return exited - sent, status, saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-layers", type=int, default=44, help="ResNet depth (default 44)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--train-secs", type=float, default=5.0,
                        help="training seconds before the signal (after the first progress line)")
    args = parser.parse_args()
    print_machine_line()
    with tempfile.TemporaryDirectory() as work:
        data_dir = make_sample_records(work)
        seconds = []
        for run in range(1, args.runs + 1):
            took, status, step = run_once(data_dir, work, args)
            seconds.append(took)
            print(f"run {run}: ResNet-{args.num_layers} saved step {step} and exited with "
                  f"status {status} {took:.2f} s after SIGTERM", flush=True)
    print(f"median {statistics.median(seconds):.2f} s from SIGTERM to exit "
          f"(min {min(seconds):.2f}, max {max(seconds):.2f}; {args.runs} runs)")


if __name__ == "__main__":
    main()
