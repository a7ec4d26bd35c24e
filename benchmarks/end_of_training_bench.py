"""Seconds from the final evaluation to the written SavedModel, over several trainer runs.

TF 2.15's tf.data autotuning thread could hold ``Session.close`` for 10-60 s at the end of
training (see ``data.pipeline.without_autotuning``). This runs ``python -m cifar10_estimator`` as a
user would (augmentation on), stamps every log line as it arrives, and prints per run the
seconds from the final evaluation's result line to the "exported SavedModel" line, plus the
number of tf.data autotuning log lines (``TF_CPP_VMODULE=model=2``: zero once autotuning is
off). ``--repo`` runs another checkout of the package (e.g. a ``git worktree`` of an older
commit) to measure a before/after pair with the same script.

    python benchmarks/end_of_training_bench.py --runs 5 --train-steps 600
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from machine import print_machine_line
from sample_records import make_sample_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINAL_EVAL = re.compile(r"\bevaluation at step (\d+)")
EXPORTED = "exported SavedModel to"
# tensorflow/core/framework/model.cc: the autotuning model's log lines at VLOG level 2.
AUTOTUNE_LOG = "model.cc:"


def run_once(repo: str, data_dir: str, work: str, args) -> tuple[float, float, int]:
    """Returns (seconds from final eval to export, whole run seconds, autotune log lines)."""
    job_dir = tempfile.mkdtemp(dir=work)
    env = {**os.environ, "PYTHONPATH": repo, "TF_CPP_VMODULE": "model=2",
           "TF_CPP_MIN_LOG_LEVEL": "0"}
    env.pop("TF_CONFIG", None)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cifar10_estimator", "--data-dir", data_dir, "--job-dir",
         job_dir, "--num-layers", str(args.num_layers), "--train-steps", str(args.train_steps),
         "--train-batch-size", "128", "--eval-batch-size", "100",
         "--save-checkpoints-steps", str(args.train_steps), "--eval-throttle-secs", "100000"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=repo, env=env)
    stamps: dict[str, float] = {}
    autotune_lines = 0
    for line in proc.stderr:
        now = time.monotonic()
        if AUTOTUNE_LOG in line:
            autotune_lines += 1
        match = FINAL_EVAL.search(line)
        if match and int(match.group(1)) >= args.train_steps:
            # The first such line: the run summary repeats it after the export.
            stamps.setdefault("final_eval", now)
        if EXPORTED in line:
            stamps["export"] = now
    if proc.wait():
        raise SystemExit(f"trainer failed with status {proc.returncode}")
    if set(stamps) != {"final_eval", "export"}:
        raise SystemExit(f"missing log lines: found {sorted(stamps)}")
    return stamps["export"] - stamps["final_eval"], time.monotonic() - started, autotune_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--train-steps", type=int, default=600)
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--repo", default=REPO, help="checkout whose package to run")
    args = parser.parse_args()
    print_machine_line()
    print(f"package from {os.path.abspath(args.repo)}; ResNet-{args.num_layers}, "
          f"{args.train_steps} steps of batch 128, augmentation on", flush=True)
    work = tempfile.mkdtemp(prefix="c10end.")
    data_dir = make_sample_records(work)
    stalls = []
    for run in range(args.runs):
        stall, total, autotune_lines = run_once(args.repo, data_dir, work, args)
        stalls.append(stall)
        print(f"run {run + 1}: {stall:5.1f} s from final evaluation to SavedModel "
              f"(whole run {total:.0f} s; {autotune_lines} tf.data autotuning log lines)",
              flush=True)
    print(f"median {statistics.median(stalls):.1f} s, max {max(stalls):.1f} s over "
          f"{args.runs} runs")


if __name__ == "__main__":
    main()
