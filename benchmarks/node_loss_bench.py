"""What a lost node costs a job under ``cifar10-cluster --ray``: seconds from the kill to
training again, and the steps trained twice.

Starts two Ray nodes on this host (``ray start --head`` and ``ray start --address``, each in a
process group of its own, ended by this script only), runs an all-reduce job of a chief and a
worker on them (``--cpus-per-task 1``: one trainer per node), and once the chief has saved its
second checkpoint kills the node without the head (``SIGKILL`` to its process group, as a
machine that goes away), with one of the trainers on it. Every launcher line is stamped as it
arrives; per run:

- ``detect``: seconds from the kill to the launcher's ``... was lost ...`` line (Ray declares
  the actor dead once its node misses its health checks);
- ``placed``: from the kill to the new placement on the surviving node;
- ``training``: from the kill to the chief's first progress line after the restart;
- ``lost steps``: the highest global step the chief reached before the job was placed again
  (its progress lines and checkpoints) minus the step it resumed from: the steps trained twice.

Each run starts its two nodes anew (one is killed).

    python benchmarks/node_loss_bench.py --runs 3 --num-layers 8
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from machine import print_machine_line
from sample_records import make_sample_records

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
STEP = re.compile(r"\[chief\] .*step (\d+)/\d+ \(")
REACHED = re.compile(r"\[chief\] .*(?:step (\d+)/\d+ \(|Saving checkpoints for (\d+) )")
RESUMED = re.compile(r"\[chief\] .*resuming from .*model\.ckpt-(\d+)")
# Waits until ARGV[2] nodes are alive (one connection to the cluster).
_WAIT_FOR_NODES = """
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR")
while sum(n["Alive"] for n in ray.nodes()) < int(sys.argv[2]):
    time.sleep(0.2)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_nodes(temp: str) -> tuple[str, list[subprocess.Popen]]:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ["--num-cpus", "3", "--disable-usage-stats", "--block"]
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    nodes = [subprocess.Popen([RAY, "start", "--head", f"--port={port}", "--temp-dir", temp,
                               "--include-dashboard=false", *common], **quiet)]
    time.sleep(5)  # the head's GCS up before the second node joins
    nodes.append(subprocess.Popen([RAY, "start", f"--address={address}", *common], **quiet))
    subprocess.run([sys.executable, "-c", _WAIT_FOR_NODES, address, "2"], check=True,
                   timeout=120, capture_output=True)
    return address, nodes


def _stop(nodes: list[subprocess.Popen]) -> None:
    for node in reversed(nodes):
        try:
            os.killpg(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        node.wait(30)


def one_run(data_dir: str, work: str, depth: int, steps: int) -> dict:
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    address, nodes = _start_nodes(temp)
    lines: list[tuple[float, str]] = []
    try:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "cifar10_estimator.cluster", "--ray", address,
             "--num-workers", "2", "--", "--data-dir", data_dir, "--job-dir",
             os.path.join(work, f"job-{time.time_ns()}"), "--num-layers", str(depth),
             "--train-batch-size", "32", "--distribution-strategy", "multi-worker-mirrored",
             "--train-steps", str(steps), "--save-checkpoints-steps", "20",
             "--precise-bn-batches", "0", "--progress-secs", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        reader = threading.Thread(target=lambda: lines.extend(
            (time.monotonic(), line) for line in launcher.stdout), daemon=True)
        reader.start()
        while not any("Saving checkpoints for 40 " in line for _, line in lines):
            if launcher.poll() is not None:
                raise SystemExit("".join(line for _, line in lines)[-4000:])
            time.sleep(0.1)
        killed_at = time.monotonic()
        os.killpg(nodes[1].pid, signal.SIGKILL)
        code = launcher.wait(600)
        reader.join(10)
    finally:
        _stop(nodes)
    if code != 0:
        raise SystemExit("".join(line for _, line in lines)[-4000:])
    after = [(t, line) for t, line in lines if t > killed_at]

    def first(pattern: str) -> float:
        return next(t for t, line in after if re.search(pattern, line)) - killed_at

    resumed = next(int(m.group(1)) for _, line in after if (m := RESUMED.search(line)))
    replaced_at = next(t for t, line in after if re.search(r"\[cluster\] .* was lost ", line))
    before = max(int(m.group(1) or m.group(2)) for t, line in lines
                 if t < replaced_at and (m := REACHED.search(line)))
    return {"detect": first(r"\[cluster\] .* was lost "),
            "placed": first(r"\[cluster\] placed 2 tasks on 1 Ray node"),
            "training": next(t for t, line in after if STEP.search(line)
                             and t > killed_at + first(r"resuming from")) - killed_at,
            "lost steps": before - resumed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--train-steps", type=int, default=200)
    args = parser.parse_args()
    print_machine_line()
    with tempfile.TemporaryDirectory() as work:
        data_dir = make_sample_records(work)
        runs = []
        for i in range(args.runs):
            runs.append(one_run(data_dir, work, args.num_layers, args.train_steps))
            print(f"run {i + 1}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float)
                                               else f"{k} {v}" for k, v in runs[-1].items()),
                  flush=True)
    print("medians: " + ", ".join(f"{k} {statistics.median(r[k] for r in runs):.1f}"
                                  for k in runs[0]))


if __name__ == "__main__":
    main()
