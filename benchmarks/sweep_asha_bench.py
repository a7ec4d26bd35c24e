"""What early stopping saves a sweep: the same randomly drawn trials run with ASHA and run to
their ends, on a real two-node Ray cluster on this host.

Each repetition draws ``--trials`` trials at random (``--search random``, the repetition's seed)
from a learning rate and a weight decay on log scales, and runs them twice through the sweep
command, as a user would: with ``--scheduler asha --grace-epochs 1`` (every trainer checkpoints
and evaluates once an epoch, which the sweep sets), and without a scheduler (the trainers' own
defaults: one evaluation, at the end). Both rank the trials by ``--metric`` (accuracy, the
sweep's default; ``cross_entropy`` tells apart trials that the sample data's easy pictures
bring level at 100 %, which ASHA keeps). Each Ray node offers one CPU and each trial asks for
one, so two trials run at once, one per core. Reported per run: the trials stopped early, the
trial-seconds (the sum of the trials' wall times, ``sweep.json``'s ``secs``: what a cluster
bills), the sweep's wall time, the best trial's accuracy, and whether the run to the end's
best trial was kept to its end by ASHA. The last lines give the medians over the repetitions,
the ratio of the trial-seconds, and a trial's median seconds by how it ended.

    .venv/bin/python benchmarks/sweep_asha_bench.py --reps 3

The data is the built-in sample data (``--sample-size`` pictures per batch file: 4 train files,
so 4 x that many training pictures), the network ResNet-8. A trial's fixed cost (TensorFlow's
start, the graph, an evaluation, the save or the export) does not shrink when ASHA stops it, so
the saving grows with the epoch's length against it: the default sample size (20,000 training
pictures) makes an epoch take about 15 s on one core of a Zen 5, twice that fixed cost
(docs/performance.md, "Early stopping with ASHA").
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from machine import print_machine_line  # noqa: E402

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
# The search space: the fast recipe's peak (0.4) and the tutorial's weight decay (2e-4) inside.
SPACE = ["learning-rate=loguniform:0.001:1", "weight-decay=loguniform:1e-5:1e-3"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RayNodes:
    """Two Ray nodes on this host, one CPU each, each ``ray start --block`` in a process group
    of its own, ended by that group only (``ray stop`` would end every Ray on the machine)."""

    def __init__(self, work: str):
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths are short
        common = ["--num-cpus", "1", "--disable-usage-stats", "--block"]
        env = {**os.environ, "RAY_memory_monitor_refresh_ms": "0"}
        self.nodes = [subprocess.Popen(
            [RAY, "start", "--head", f"--port={self.port}", "--temp-dir", self.temp,
             "--include-dashboard=false", *common], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, cwd=work, env=env)]
        deadline = time.monotonic() + 90
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the Ray head did not come up")
            time.sleep(0.5)
        self.nodes.append(subprocess.Popen(
            [RAY, "start", f"--address={self.address}", *common], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, cwd=work, env=env))
        time.sleep(10)  # the second node joins

    def close(self) -> None:
        for node in reversed(self.nodes):
            try:
                os.killpg(node.pid, signal.SIGTERM)
                node.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(node.pid, signal.SIGKILL)
        shutil.rmtree(self.temp, ignore_errors=True)


def sweep(address: str, sweep_dir: str, data_dir: str, args, seed: int, asha: bool) -> dict:
    """Runs one sweep; its figures from its ``sweep.json``."""
    command = [sys.executable, "-m", "cifar10_estimator.sweep", "--ray", address,
               "--sweep-dir", sweep_dir, "--search", "random", "--num-trials", str(args.trials),
               "--seed", str(seed), *[t for spec in SPACE for t in ("--vary", spec)],
               "--cpus-per-trial", "1", "--metric", args.metric,
               *(["--scheduler", "asha", "--grace-epochs", "1"] if asha else []), "--",
               "--data-dir", data_dir, "--num-layers", "8", "--train-batch-size",
               str(args.batch), "--train-epochs", str(args.epochs), "--precise-bn-batches",
               "0", "--seed", str(seed)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, cwd=os.path.dirname(sweep_dir))
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"the sweep failed: {(done.stdout + done.stderr)[-3000:]}")
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        record = json.load(f)
    trials = record["trials"]
    best = next(t for t in trials if t["name"] == record["best"])
    return {"wall": wall, "trial_secs": sum(t["secs"] or 0 for t in trials),
            "stopped": sum(t["status"] == "stopped" for t in trials), "best": best["name"],
            "best_accuracy": best["metrics"]["accuracy"],
            "status": {t["name"]: t["status"] for t in trials},
            "secs_by_end": [(_ended(t, asha), t["secs"]) for t in trials]}


def _ended(trial: dict, asha: bool) -> str:
    """How a trial ended, for the per-trial medians."""
    if not asha:
        return "to the end, one evaluation"
    if trial["status"] == "stopped":
        return f"stopped at epoch {trial['epochs']:g}"
    return "kept to the end by ASHA"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--metric", default="accuracy",
                        help="what ranks the trials (the sweep's --metric)")
    parser.add_argument("--sample-size", type=int, default=5000,
                        help="pictures per sample batch file (4 train files)")
    parser.add_argument("--work", default=None, help="folder for the data and the sweeps "
                                                     "(default: a temporary one, removed)")
    args = parser.parse_args()
    # Ray 2.60 asks a cluster for a token once ~/.ray/auth_token exists (a local ray.init
    # writes one): these nodes and the sweeps that join them run without, as the suite's do.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    print_machine_line()
    work = args.work or tempfile.mkdtemp(prefix="sweep-asha-bench-")
    data_dir = os.path.join(work, "data")
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "generate_tfrecords.py"),
                    "--data-dir", data_dir, "--sample", "--sample-size", str(args.sample_size)],
                   check=True, capture_output=True)
    nodes = RayNodes(work)
    rows = []
    try:
        for rep in range(args.reps):
            for asha in (True, False):  # alternating, so a noisy machine affects both alike
                name = f"rep{rep}-{'asha' if asha else 'full'}"
                figures = sweep(nodes.address, os.path.join(work, name), data_dir, args, rep,
                                asha)
                rows.append((rep, asha, figures))
                print(f"{name}: {figures['stopped']} of {args.trials} stopped early, "
                      f"{figures['trial_secs']:.0f} trial-s, wall {figures['wall']:.0f} s, "
                      f"best {figures['best']} {100 * figures['best_accuracy']:.2f}%",
                      flush=True)
            full = rows[-1][2]
            kept = rows[-2][2]["status"].get(full["best"])
            print(f"rep{rep}: the run to the end's best trial, {full['best']}, is {kept} under "
                  f"ASHA; trial-seconds ratio {rows[-2][2]['trial_secs'] / full['trial_secs']:.2f}",
                  flush=True)
    finally:
        nodes.close()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    def median(asha: bool, key: str) -> float:
        return statistics.median(f[key] for _, a, f in rows if a == asha)

    print(f"medians over {args.reps} repetitions ({args.trials} trials, ResNet-8, "
          f"{args.epochs} epochs, batch {args.batch}, ranked by {args.metric}):")
    for asha in (True, False):
        print(f"  {'ASHA (grace 1)' if asha else 'to the end':15} stopped "
              f"{median(asha, 'stopped'):.0f}, trial-seconds {median(asha, 'trial_secs'):.0f}, "
              f"wall {median(asha, 'wall'):.0f} s, best accuracy "
              f"{100 * median(asha, 'best_accuracy'):.2f}%")
    ratios = [a[2]["trial_secs"] / f[2]["trial_secs"] for a, f in zip(rows[::2], rows[1::2])]
    print(f"  trial-seconds ASHA / to the end: median {statistics.median(ratios):.2f} "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")
    by_end: dict[str, list[float]] = {}
    for _, _, figures in rows:
        for end, secs in figures["secs_by_end"]:
            by_end.setdefault(end, []).append(secs)
    for end, secs in sorted(by_end.items()):
        print(f"  a trial {end}: median {statistics.median(secs):.0f} s ({len(secs)} trials)")


if __name__ == "__main__":
    main()
