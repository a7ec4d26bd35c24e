"""The fixed cost of a run: what a trainer run spends outside its training steps, phase by phase,
in fresh processes, as a user runs it.

Each run is ``python -m cifar10_estimator --recipe fast`` (ResNet-20 unless ``--num-layers``)
for ``--train-steps`` steps on Fashion-MNIST records made as ``convergence.py`` makes them
(``--per-class`` training pictures of each class; the evaluation file is the 10,000 test
pictures, what a user's final evaluation reads). Every line of its log is stamped as it
arrives, and the run's wall time is cut at these lines:

- **start**: from the process's start to the step-0 checkpoint's line: the imports, the data
  checks, the precision probe (from its cache after the first run on a machine), the graph and
  the session;
- **training**: to the line that counts the steps run (the steps, the first one's graph
  optimisation among them);
- **precise BN and save**: to the final checkpoint's line;
- **final evaluation**: to its result line (the evaluation graph, the restore, every
  evaluation picture);
- **export**: to the SavedModel's line;
- **exit**: to the process's end (the report, the summary, TensorFlow's teardown).

The fixed cost is the wall time less the training phase's steps at the run's own steady speed
(the training phase's seconds less ``--train-steps`` times the median step time of the
progress lines; the first step's extra time is part of the fixed cost). The first run uses an
empty precision cache (``XDG_CACHE_HOME`` in the work folder), as a user's first run on a
machine does, and is printed apart; the medians are over the runs after it, which find the
cache. It also counts tf.data's autotuning log lines (``TF_CPP_VMODULE=model=2``; zero while
autotuning is off: docs/performance.md, "End of training").

``--repo`` runs another checkout of the package (a ``git worktree`` of an older commit) and
``--variant`` this one with more trainer flags; the runs of each alternate with the plain
runs', so that a before/after pair shares the machine's state.

    python benchmarks/fixed_cost.py --runs 3
    python benchmarks/fixed_cost.py --runs 3 --repo /tmp/before
    python benchmarks/fixed_cost.py --runs 3 --variant="--eval-batch-size 500"
"""

import argparse
import collections
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import convergence
from machine import print_machine_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The lines that end each phase (the package's log), in the order they come.
PHASES = (
    ("start", re.compile(r"Saving checkpoints for 0 into")),
    ("training", re.compile(r"this task ran \d+ training steps")),
    ("precise BN and save", re.compile(r"Saving checkpoints for [1-9]\d* into")),
    ("final evaluation", re.compile(r"\bevaluation at step [1-9]")),
    ("export", re.compile(r"exported SavedModel to")),
)
EXIT = "exit"
PROGRESS = re.compile(r"step (\d+)/\d+ .*: ([\d.]+) images/s")
# tensorflow/core/framework/model.cc: the autotuning model's log lines at VLOG level 2.
AUTOTUNE_LOG = "model.cc:"


def run_once(repo: str, flags: list[str], data_dir: str, job_dir: str, cache_dir: str,
             args) -> dict:
    """One trainer run: each phase's seconds, the steady seconds per step, autotuning lines."""
    env = {**os.environ, "PYTHONPATH": repo, "TF_CPP_VMODULE": "model=2",
           "XDG_CACHE_HOME": cache_dir}
    env.pop("TF_CONFIG", None)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cifar10_estimator", "--data-dir", data_dir, "--job-dir", job_dir,
         "--recipe", "fast", "--num-layers", str(args.num_layers),
         "--train-steps", str(args.train_steps), "--seed", "1", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
        cwd=repo, env=env)
    ends: dict[str, float] = {}
    rates: list[float] = []
    autotune_lines = 0
    tail: collections.deque[str] = collections.deque(maxlen=40)
    batch = None
    for line in proc.stdout:
        now = time.monotonic() - started
        tail.append(line)
        autotune_lines += AUTOTUNE_LOG in line
        for name, pattern in PHASES:
            if name not in ends and pattern.search(line):
                ends[name] = now
                break
        progress = PROGRESS.search(line)
        if progress:
            rates.append(float(progress.group(2)))
        found = re.search(r"--train-batch-size (\d+)", line)
        if found and batch is None:
            batch = int(found.group(1))
    if proc.wait():
        raise SystemExit(f"trainer failed (status {proc.returncode}):\n{''.join(tail)}")
    ends[EXIT] = time.monotonic() - started
    missing = [name for name, _ in PHASES if name not in ends]
    if missing or not rates or batch is None:
        raise SystemExit(f"missing log lines ({', '.join(missing) or 'progress'}); raise "
                         f"--train-steps so that the run logs its speed:\n{''.join(tail)}")
    seconds, before = {}, 0.0
    for name in [name for name, _ in PHASES] + [EXIT]:
        seconds[name] = ends[name] - before
        before = ends[name]
    step = batch / statistics.median(rates)
    fixed = ends[EXIT] - args.train_steps * step
    return {"seconds": seconds, "fixed": fixed, "step": step, "wall": ends[EXIT],
            "autotune": autotune_lines}


def show(label: str, run: dict) -> str:
    phases = ", ".join(f"{name} {s:.1f}" for name, s in run["seconds"].items())
    return (f"{label}: wall {run['wall']:.1f} s, fixed {run['fixed']:.1f} s ({phases}; "
            f"{run['step'] * 1000:.0f} ms a step; {run['autotune']} autotuning lines)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs after the first, per repo")
    parser.add_argument("--train-steps", type=int, default=600)
    parser.add_argument("--num-layers", type=int, default=20)
    parser.add_argument("--per-class", type=int, default=1000,
                        help="training pictures of each class (1,000: 10,000 pictures)")
    parser.add_argument("--repo", action="append", default=[],
                        help="another checkout whose package to run, alternating (repeatable)")
    parser.add_argument("--variant", action="append", default=[],
                        help="more trainer flags for this checkout's runs, alternating "
                             "(repeatable)")
    parser.add_argument("--work-dir", default=None,
                        help="where the records are made and kept (default: a temporary "
                             "folder, removed at the end)")
    args = parser.parse_args()
    variants = [(REPO, "")] + [(os.path.abspath(r), "") for r in args.repo] + [
        (REPO, v) for v in args.variant]
    print_machine_line()
    print(f"ResNet-{args.num_layers}, --recipe fast, {args.train_steps} steps, "
          f"Fashion-MNIST {args.per_class} pictures a class, the 10,000 test pictures "
          f"evaluated", flush=True)
    work = args.work_dir or tempfile.mkdtemp(prefix="c10fixed.")
    data_dir = convergence.prepare_data(work, args.per_class, "test")
    names = [f"{repo}{' ' + flags if flags else ''}" for repo, flags in variants]
    runs: dict[str, list[dict]] = {name: [] for name in names}
    try:
        for index in range(args.runs + 1):
            for number, ((repo, flags), name) in enumerate(zip(variants, names)):
                job_dir = tempfile.mkdtemp(dir=work, prefix="job.")
                cache = os.path.join(work, f"cache-{number}")
                if index == 0:  # each variant's first run on an empty cache, as on a new machine
                    shutil.rmtree(cache, ignore_errors=True)
                run = run_once(repo, shlex.split(flags), data_dir, job_dir, cache, args)
                shutil.rmtree(job_dir)
                if index == 0:
                    label = f"{name}: first run (empty precision cache)"
                else:
                    runs[name].append(run)
                    label = f"{name}: run {index}"
                print(show(label, run), flush=True)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    for name, done in runs.items():
        if not done:
            continue
        median = {name: statistics.median(r["seconds"][name] for r in done)
                  for name in done[0]["seconds"]}
        print(f"{name}: median of {len(done)} runs: fixed "
              f"{statistics.median(r['fixed'] for r in done):.1f} s of "
              f"{statistics.median(r['wall'] for r in done):.1f} s; "
              + ", ".join(f"{name} {s:.1f} s" for name, s in median.items()))


if __name__ == "__main__":
    main()
