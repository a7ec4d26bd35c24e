"""What a job's test-time views (``--test-time-mirror``, ``--test-time-shift``) add to its
accuracy, on the same weights: each job dir's latest checkpoint evaluated twice by the
``evaluate`` command, once as the job recorded it and once from a copy of the job dir whose
recorded settings have the views off.

    python benchmarks/test_time_views.py --data-dir RECORDS JOB_DIR [JOB_DIR ...]

Prints one line per job dir (with and without, in points) and the median difference.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from machine import machine_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The evaluate command's result line (evaluation/offline.py): "... accuracy = 0.8712, ...".
ACCURACY = re.compile(r"\baccuracy = ([0-9.]+)")
# The recorded settings a copy turns off (config/settings.py).
VIEWS_OFF = {"test_time_mirror": False, "test_time_shift": 0}


def evaluate(job_dir: str, data_dir: str, split: str) -> float:
    proc = subprocess.run([sys.executable, "-m", "cifar10_estimator.evaluate", job_dir,
                           "--data-dir", data_dir, "--split", split, "--report",
                           os.path.join(tempfile.gettempdir(), "test-time-views-report.json")],
                          capture_output=True, text=True, cwd=REPO)
    found = ACCURACY.search(proc.stdout)
    if proc.returncode or not found:
        raise SystemExit(f"evaluating {job_dir} failed: {proc.stderr[-2000:]}")
    return float(found.group(1))


def without_views(job_dir: str, folder: str) -> str:
    """A copy of ``job_dir``'s latest checkpoint and settings, the views off."""
    copy = os.path.join(folder, "job")
    shutil.copytree(job_dir, copy, ignore=shutil.ignore_patterns("export", "eval*",
                                                                 "events.*"))
    path = os.path.join(copy, "settings.json")
    with open(path) as f:
        body = json.load(f)
    body["settings"].update(VIEWS_OFF)
    with open(path, "w") as f:
        json.dump(body, f, indent=2)
    return copy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--split", default="eval", choices=("eval", "validation", "train"))
    parser.add_argument("job_dirs", nargs="+")
    args = parser.parse_args()
    print(machine_line(), flush=True)
    gains = []
    for job_dir in args.job_dirs:
        with tempfile.TemporaryDirectory() as folder:
            plain = evaluate(without_views(job_dir, folder), args.data_dir, args.split)
        viewed = evaluate(job_dir, args.data_dir, args.split)
        gains.append(100 * (viewed - plain))
        print(f"{job_dir}: {100 * viewed:.2f} % with its views, {100 * plain:.2f} % without "
              f"({gains[-1]:+.2f} points)", flush=True)
    print(f"median: {statistics.median(gains):+.2f} points over {len(gains)} job dirs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
