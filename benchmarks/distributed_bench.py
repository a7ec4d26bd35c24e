"""What distribution costs and gains on this host: 1 vs 2 training tasks, images/s and steps/s.

Runs the trainer as users would, through the local launcher (``cifar10_estimator.cluster``):

- ``local``: ``python -m cifar10_estimator`` without TF_CONFIG (no gRPC, no ps): the baseline;
- ``1 worker``: chief + 1 ps;
- ``2 workers async`` and ``2 workers sync``: chief + 1 worker + 1 ps.

Every line a task logs is time-stamped on arrival. Each trainer's progress lines carry the
global step, so the global step rate is measured over the window in which every training task
is already past its first logged interval (start-up, graph building and the staggered start
are excluded) until the first of them logs its last interval. Aggregate images/s = global
steps/s x images per global step (one batch asynchronously, one batch per worker in sync
mode). Configurations alternate (A B C D A B C D ...) so a noisy, shared machine affects them
alike; the table shows medians.

    .venv/bin/python benchmarks/distributed_bench.py                     # ResNet-20, batch 64
    .venv/bin/python benchmarks/distributed_bench.py --repeats 5 --steps 200 --configs local,1,2a

On one host the tasks share the same cores, so more workers cannot add compute; this shows the
overhead of the parameter server and the gRPC hops, not the scaling of a real cluster.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from sample_records import make_sample_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from cifar10_estimator.training import launcher  # noqa: E402

RATE_LINE = re.compile(r"step (\d+)/\d+ \(")  # a progress line
CONFIGS = {  # key: (label, training tasks, sync)
    "local": ("local (no cluster)", 0, False),
    "1": ("1 worker + 1 ps", 1, False),
    "2a": ("2 workers async + 1 ps", 2, False),
    "2s": ("2 workers sync + 1 ps", 2, True),
}


class Recorder:
    """A text stream that keeps every complete line with its arrival time."""

    def __init__(self, echo: bool):
        self.lines: list[tuple[float, str]] = []
        self.echo = echo
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._partial += text
            *complete, self._partial = self._partial.split("\n")
            self.lines += [(now, line) for line in complete]
        if self.echo:
            sys.stderr.write(text)

    def flush(self) -> None:
        pass


def trainer_flags(args, data_dir: str, job_dir: str, sync: bool) -> list[str]:
    flags = ["--data-dir", data_dir, "--job-dir", job_dir, "--num-layers", str(args.num_layers),
             "--train-batch-size", str(args.batch), "--eval-batch-size", "100",
             "--train-steps", str(args.steps), "--save-checkpoints-steps", "100000",
             "--max-worker-delay-secs", "0", "--eval-throttle-secs", "100000",
             "--progress-secs", "0.5"]
    return flags + (["--sync"] if sync else [])


def run_local(flags: list[str], recorder: Recorder) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "cifar10_estimator", *flags], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)
    for line in proc.stdout:
        recorder.write("[chief] " + line)
    if proc.wait():
        raise RuntimeError("the local run failed:\n" + "\n".join(
            line for _, line in recorder.lines[-30:]))


def measure(recorder: Recorder, trainers: list[str]) -> tuple[float, int]:
    """Global steps/s while every trainer runs: from the moment all of them have logged a
    first interval to the moment the first of them logs its last one. Every trainer's
    progress line carries the global step, so all of them are points of one curve."""
    points: dict[str, list[tuple[float, int]]] = {name: [] for name in trainers}
    for t, line in recorder.lines:
        match = RATE_LINE.search(line)
        for name in trainers:
            if match and line.startswith(f"[{name}] "):
                points[name].append((t, int(match.group(1))))
    missing = [name for name, p in points.items() if not p]
    if missing:
        raise RuntimeError(f"no throughput lines from {missing}; use more --steps")
    start = max(p[0][0] for p in points.values())
    end = min(p[-1][0] for p in points.values())
    window = sorted((t, g) for p in points.values() for t, g in p if start <= t <= end)
    if len(window) < 2 or window[-1][0] - window[0][0] <= 0:
        raise RuntimeError("fewer than 2 measurements while every task ran; use more --steps")
    (t0, g0), (t1, g1) = window[0], window[-1]
    return (g1 - g0) / (t1 - t0), g1 - g0


def run_once(args, key: str, data_dir: str, work: str) -> tuple[float, float, int]:
    _, trainers, sync = CONFIGS[key]
    job_dir = tempfile.mkdtemp(prefix=f"job-{key}-", dir=work)
    recorder = Recorder(args.verbose)
    flags = trainer_flags(args, data_dir, job_dir, sync)
    if trainers == 0:
        run_local(flags, recorder)
        names = ["chief"]
    else:
        tasks = launcher.plan(num_workers=trainers, num_ps=1, evaluator=False)
        if launcher.Cluster(tasks, flags, out=recorder).run(timeout_secs=1800) != 0:
            raise RuntimeError("the cluster failed:\n" + "\n".join(
                line for _, line in recorder.lines[-40:]))
        names = ["chief"] + [f"worker{i}" for i in range(trainers - 1)]
    steps_per_sec, steps = measure(recorder, names)
    per_step = args.batch * (trainers if sync else 1)
    return steps_per_sec * per_step, steps_per_sec, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="TFRecords to train on (default: fresh sample data)")
    parser.add_argument("--num-layers", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="images per step per worker")
    parser.add_argument("--steps", type=int, default=150, help="global steps per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", default="local,1,2a,2s",
                        help=f"comma-separated subset of {','.join(CONFIGS)}")
    parser.add_argument("--verbose", action="store_true", help="echo the tasks' logs")
    args = parser.parse_args()
    keys = [k for k in args.configs.split(",") if k]
    unknown = set(keys) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown --configs {sorted(unknown)}; choose from {sorted(CONFIGS)}")

    print(f"host: {os.cpu_count()} logical CPUs, load average {os.getloadavg()[0]:.2f} at start;"
          f" ResNet-{args.num_layers}, batch {args.batch} per worker, {args.steps} global "
          f"steps per run, {args.repeats} runs per configuration", flush=True)
    results: dict[str, list[tuple[float, float, int]]] = {k: [] for k in keys}
    with tempfile.TemporaryDirectory() as work:
        data_dir = args.data_dir or make_sample_records(work)
        for repeat in range(args.repeats):
            for key in keys:
                images, steps_per_sec, measured = run_once(args, key, data_dir, work)
                results[key].append((images, steps_per_sec, measured))
                print(f"  run {repeat + 1}: {CONFIGS[key][0]:<24} {images:7.1f} images/s "
                      f"{steps_per_sec:6.2f} global steps/s (over {measured} steps)", flush=True)

    print(f"\n{'configuration':<26}{'images/s':>10}{'steps/s':>10}{'vs local':>10}")
    baseline = (statistics.median(r[0] for r in results["local"]) if "local" in results
                else None)
    for key in keys:
        images = statistics.median(r[0] for r in results[key])
        steps = statistics.median(r[1] for r in results[key])
        ratio = f"{images / baseline:9.2f}x" if baseline else ""
        print(f"{CONFIGS[key][0]:<26}{images:10.1f}{steps:10.2f}{ratio:>10}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end (other programs share the cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
