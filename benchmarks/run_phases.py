"""Where a training run's seconds go: the start, the training steps, the evaluations, precise
batch norm and the export, read from the logs ``benchmarks/convergence.py`` keeps (each line
of the trainer's output stamped with the seconds since its process started).

It answers what a short run could still save outside its training steps. Each log is one
run; the logs of a row's seeds (``runs/KEY/ROW/seed-N/log.txt``) are summed up as the medians
of the row. Phases, from the trainer's own lines:

- start: process start to the first "Saving checkpoints" (imports, the precision probe or its
  cache, building the graph, initialising the variables);
- training: the rest up to the final checkpoint, less the phases below that interrupt it;
- evaluations: each from the checkpoint it reads to its "evaluation at step N" line (saving
  that checkpoint, building the evaluation graph, restoring, reading the split);
- precise batch norm: the seconds its own line reports;
- export and exit: the final evaluation's line to the process's last line.

    python benchmarks/run_phases.py /work/conv/runs/KEY/fast/seed-*/log.txt \\
        /work/conv/runs/KEY/he/seed-*/log.txt
"""

import argparse
import collections
import os
import re
import statistics
import sys

SAVE = re.compile(r"\bSaving checkpoints for (\d+) into")
# evaluation/report.py's line; train.py repeats the last one as "final evaluation at step N".
EVALUATION = re.compile(r"(?<!final )\bevaluation at step (\d+):")
PRECISE_BN = re.compile(r"\bprecise batch norm: .*\(([0-9.]+) s\)")
PHASES = ("start", "training", "evaluations", "precise batch norm", "export and exit")


def phases(path: str) -> dict[str, float]:
    """The seconds of each of PHASES in one stamped log, and "total"; SystemExit naming the
    file if it is not a finished trainer run's."""
    saves: dict[int, float] = {}
    evaluations: dict[int, float] = {}
    precise = 0.0
    first_save = end = None
    with open(path, errors="replace") as log:  # a damaged byte is not a phase line
        for stamped in log:
            stamp, _, line = stamped.lstrip().partition(" ")
            try:
                end = float(stamp)
            except ValueError:
                continue  # an unstamped line (a traceback's continuation)
            if match := SAVE.search(line):
                first_save = end if first_save is None else first_save
                saves[int(match.group(1))] = end
            elif match := EVALUATION.search(line):
                evaluations.setdefault(int(match.group(1)), end)
            elif match := PRECISE_BN.search(line):
                precise += float(match.group(1))
    if first_save is None or not evaluations or max(evaluations) not in saves:
        raise SystemExit(f"{path}: not a finished trainer run's log (no checkpoint, no "
                         f"evaluation line, or no checkpoint of the last evaluation's step); "
                         f"give the log.txt of a run convergence.py made")
    # Each evaluation from the checkpoint it reads; the last one ends the training.
    costs = {step: at - saves.get(step, at) for step, at in evaluations.items()}
    last_step = max(evaluations)
    seconds = {
        "start": first_save,
        "training": (saves[last_step] - first_save - precise
                     - (sum(costs.values()) - costs[last_step])),
        "evaluations": sum(costs.values()),
        "precise batch norm": precise,
        "export and exit": end - evaluations[last_step],
    }
    seconds["total"] = end
    return seconds


def row_of(path: str) -> str:
    """The row a run's log belongs to: ``ROW`` in ``.../ROW/seed-N/log.txt``, else the path."""
    parent = os.path.dirname(os.path.abspath(path))
    return os.path.basename(os.path.dirname(parent)) if os.path.basename(parent).startswith(
        "seed-") else path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="stamped trainer logs (runs/.../seed-N/log.txt)")
    args = parser.parse_args(argv)
    rows: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    for path in args.logs:
        if not os.path.isfile(path):
            raise SystemExit(f"{path}: no such log; give the log.txt of a run convergence.py "
                             f"made")
        rows[row_of(path)].append(phases(path))
    width = max(len("row"), *map(len, rows))
    print(f"{'row':<{width}} {'runs':>4} " + " ".join(f"{name:>18}" for name in PHASES)
          + f" {'total':>8}")
    for row, runs in rows.items():
        median = {name: statistics.median(run[name] for run in runs)
                  for name in (*PHASES, "total")}
        cells = " ".join(f"{median[name]:>8.1f} s {100 * median[name] / median['total']:>5.1f} %"
                         for name in PHASES)
        print(f"{row:<{width}} {len(runs):>4} {cells} {median['total']:>6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
