"""How a cluster ends and recovers: exit delays with default flags, and ps / chief restarts.

Starts ps, chief, worker and evaluator as separate processes on 127.0.0.1 with Kubeflow-style
TF_CONFIG values (every replica listed, the evaluator included) and stamps every log line as it
arrives. Three scenarios, each printed as it finishes:

- ``default``: default cadence flags (only data, job dir, depth and ``--train-steps``): seconds
  from the chief's last training step to the exit of every task.
- ``ps-restart``: ``kill -9`` the parameter server after the chief's second checkpoint, start
  it again on the same address: training steps lost (global step before the kill minus the
  step the chief restored) and seconds from the restart to the next training step.
- ``chief-restart``: the same for the chief, rerun with its own command.

    python benchmarks/cluster_lifecycle_bench.py --num-layers 8 --train-steps 2000
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from machine import print_machine_line
from sample_records import make_sample_records

from cifar10_estimator.launch import ports

STEP = re.compile(r"step (\d+)/\d+ \(")  # a progress line
RESTORED = re.compile(r"Restoring parameters from .*model\.ckpt-(\d+)")
CHECKPOINT = "Saving checkpoints for"


class Replica:
    """A process with its TF_CONFIG whose log lines are kept with their arrival times."""

    def __init__(self, name: str, tf_config: str, args: list[str]):
        self.name, self.tf_config, self.args = name, tf_config, args
        self.lines: list[tuple[float, str]] = []
        self.process = None
        self.exited_at = None

    def start(self) -> float:
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env.update(TF_CONFIG=self.tf_config, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen([sys.executable, "-m", "cifar10_estimator", *self.args],
                                        env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.exited_at = None
        threading.Thread(target=self._read, args=(self.process,), daemon=True).start()
        return time.monotonic()

    def _read(self, process) -> None:
        for line in process.stdout:
            self.lines.append((time.monotonic(), line))
        process.wait()
        if process is self.process:
            self.exited_at = time.monotonic()

    def kill(self) -> float:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        return time.monotonic()

    def matching(self, text_or_regex, since: float = 0.0) -> list[tuple[float, str]]:
        found = []
        for t, line in list(self.lines):
            if t < since:
                continue
            if (text_or_regex.search(line) if hasattr(text_or_regex, "search")
                    else text_or_regex in line):
                found.append((t, line))
        return found


def _replicas(args, data_dir: str, job_dir: str, default_flags: bool) -> list[Replica]:
    names = ["ps", "chief", "worker", "evaluator"]
    spec = {job: [f"127.0.0.1:{port}"] for job, port in zip(names, ports.free_ports(4))}
    flags = ["--data-dir", data_dir, "--job-dir", job_dir, "--num-layers", str(args.num_layers),
             "--train-steps", str(args.train_steps)]
    if not default_flags:
        flags += ["--save-checkpoints-steps", str(args.checkpoint_steps),
                  "--max-worker-delay-secs", "0", "--eval-throttle-secs", "30",
                  "--progress-secs", "0.5"]
    return [Replica(job, json.dumps({"cluster": spec, "task": {"type": job, "index": 0},
                                     "environment": "cloud"}),
                    [] if job == "ps" else flags) for job in names]


def _wait(replicas: list[Replica], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(r.exited_at is not None for r in replicas):
            return
        time.sleep(0.2)
    for r in replicas:
        if r.process.poll() is None:
            r.process.kill()
    raise SystemExit("a task did not exit in time: " + ", ".join(
        r.name for r in replicas if r.exited_at is None))


def _wait_until(predicate, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out waiting")
        time.sleep(0.05)


def _global_step(replicas: list[Replica], until: float = float("inf")) -> int:
    """The highest global step the trainers logged before ``until`` (every 0.5 s)."""
    steps = [int(m.group(1)) for r in replicas for t, line in list(r.lines)
             for m in [STEP.search(line)] if m and t < until]
    return max(steps, default=0)


def scenario_default(args, data_dir: str, work: str) -> None:
    replicas = _replicas(args, data_dir, tempfile.mkdtemp(dir=work), default_flags=True)
    for r in replicas:
        r.start()
    _wait(replicas, timeout=args.timeout)
    chief = replicas[1]
    last_step = chief.matching("this task ran")[-1][0]
    delays = ", ".join(f"{r.name} {r.exited_at - last_step:+.1f} s" for r in replicas)
    codes = ", ".join(f"{r.name} {r.process.returncode}" for r in replicas)
    print(f"default flags: from the chief's last step to each exit: {delays} "
          f"(exit status: {codes})", flush=True)


def scenario_restart(args, data_dir: str, work: str, victim: str) -> None:
    replicas = _replicas(args, data_dir, tempfile.mkdtemp(dir=work), default_flags=False)
    by_name = {r.name: r for r in replicas}
    for r in replicas:
        r.start()
    chief = by_name["chief"]
    _wait_until(lambda: len(chief.matching(CHECKPOINT)) >= 2)
    time.sleep(2)  # the second checkpoint is written (the line comes before the files)
    target = by_name[victim]
    before = _global_step(replicas)
    target.kill()
    time.sleep(1)
    restarted = target.start()
    # Recovered: the next step of any trainer after a ps restart (all of them stopped); the
    # restarted chief's own next step after a chief restart (the worker never stopped).
    trainers = [chief] if victim == "chief" else [chief, by_name["worker"]]
    _wait_until(lambda: any(r.matching(STEP, since=restarted) for r in trainers))
    first_step = min(r.matching(STEP, since=restarted)[0][0] for r in trainers
                     if r.matching(STEP, since=restarted))
    _wait(replicas, timeout=args.timeout)
    restores = chief.matching(RESTORED, since=restarted)
    restored = int(RESTORED.search(restores[0][1]).group(1))
    # Steps lost: the global step just before the restore (a surviving worker may have gone
    # on while the chief was down) minus the step the chief restored.
    lost = _global_step(replicas, until=restores[0][0]) - restored
    codes = ", ".join(f"{r.name} {r.process.returncode}" for r in replicas)
    print(f"{victim} killed at global step ~{before}, restarted 1 s later: the chief restored "
          f"step {restored} (~{lost} steps lost); next training step "
          f"{first_step - restarted:.1f} s after the restart (exit status: {codes})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--train-steps", type=int, default=2000)
    parser.add_argument("--checkpoint-steps", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--scenarios", default="default,ps-restart,chief-restart")
    args = parser.parse_args()
    print_machine_line()
    print(f"ResNet-{args.num_layers}, batch 128, {args.train_steps} steps; 1 ps, chief, "
          f"1 worker, evaluator on 127.0.0.1", flush=True)
    work = tempfile.mkdtemp(prefix="c10life.")
    data_dir = make_sample_records(work)
    for name in args.scenarios.split(","):
        if name == "default":
            scenario_default(args, data_dir, work)
        else:
            scenario_restart(args, data_dir, work, name.split("-")[0])


if __name__ == "__main__":
    main()
