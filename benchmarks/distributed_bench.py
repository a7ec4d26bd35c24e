"""What each way of distributing costs and gains on this host: images/s, and accuracy after the
same number of images on real pictures; and a model of the gradient traffic at 8-256 workers.

Runs the trainer as users would, through the local launcher (``cifar10_estimator.cluster``):

- ``local``: ``python -m cifar10_estimator`` without TF_CONFIG (no gRPC): the baseline;
- ``1``: chief + 1 ps; ``2a``, ``2s``: chief + 1 worker + 1 ps, asynchronous and ``--sync``;
- ``r1``, ``r2``: collective all-reduce (``--distribution-strategy multi-worker-mirrored``),
  chief alone and chief + 1 worker, no ps;
- ``ray2``: ``r2``'s job launched on a Ray cluster (``cifar10_estimator.cluster --ray``): the
  one at ``--ray ADDRESS``, or a one-node Ray cluster the bench starts on this host (and
  stops), so that it runs on the same cores as ``r2``. Each task asks for every core
  (``--cpus-per-task``, the node offering twice its cores): Ray sets a task's
  ``OMP_NUM_THREADS`` to the CPUs it asked for, which bounds TensorFlow's oneDNN threads, and
  ``r2``'s tasks, like any two processes on a host, may each use every core.

"to 1st step" is the wall time from the launch to the chief's first progress line: start-up
(TensorFlow loading, the cluster's tasks meeting, the graph), and for ``ray2`` what Ray adds
(placing the actors, starting the trainers through them).

Every line a task logs is time-stamped on arrival. Each trainer's progress lines carry the
global step, so the global step rate is measured over the window in which every training task
is already past its first logged interval (start-up, graph building and the staggered start
are excluded) until the first of them logs its last interval. Aggregate images/s = global
steps/s x images per global step (one batch asynchronously, one batch per worker in sync and
all-reduce jobs). Every configuration trains the same number of images (``--images``), so its
global steps differ; the accuracy is ``evaluate``'s on the final checkpoint, over every test
picture. Configurations alternate (A B C ... A B C ...) so a noisy, shared machine affects them
alike; the table shows medians (and the spread of the accuracy over the seeds).

    .venv/bin/python benchmarks/distributed_bench.py --fashion-mnist --images 120000
    .venv/bin/python benchmarks/distributed_bench.py --configs local,2s,r2 --repeats 3

On one host the tasks share the same cores, so more workers cannot add compute; this shows the
overhead of the parameter server, the all-reduce and the gRPC hops, not the scaling of a real
cluster: the traffic model at the end says where each design stops scaling.

--fashion-mnist needs Debian's dataset-fashion-mnist (``apt-get install dataset-fashion-mnist``).
"""

import argparse
import contextlib
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

from cifar10_estimator.launch import host_processes, layout, loop  # noqa: E402

import precise_bn_bench as fashion_mnist  # noqa: E402
from machine import print_machine_line  # noqa: E402

RATE_LINE = re.compile(r"step (\d+)/\d+ \(")  # a progress line
ACCURACY = re.compile(r"accuracy = ([0-9.]+)")
ALL_REDUCE = ["--distribution-strategy", "multi-worker-mirrored"]
CONFIGS = {  # key: (label, training tasks, trainer flags, parameter servers)
    "local": ("local (no cluster)", 0, [], 0),
    "1": ("1 worker + 1 ps", 1, [], 1),
    "2a": ("2 workers async + 1 ps", 2, [], 1),
    "2s": ("2 workers sync + 1 ps", 2, ["--sync"], 1),
    "r1": ("1 worker all-reduce", 1, ALL_REDUCE, 0),
    "r2": ("2 workers all-reduce", 2, ALL_REDUCE, 0),
    "ray2": ("2 workers all-reduce, Ray", 2, ALL_REDUCE, 0),
}
# He et al. 2015's CIFAR ResNets: trainable parameters per depth (model/resnet.py's docstring).
PARAMETERS = {20: 269_722, 32: 464_154, 44: 658_586, 56: 853_018, 110: 1_727_962}


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


def trainer_flags(args, data_dir: str, job_dir: str, steps: int, extra: list[str]) -> list[str]:
    return ["--data-dir", data_dir, "--job-dir", job_dir, "--num-layers", str(args.num_layers),
            "--train-batch-size", str(args.batch), "--eval-batch-size", "100",
            "--train-steps", str(steps), "--save-checkpoints-steps", "100000",
            "--max-worker-delay-secs", "0", "--eval-throttle-secs", "100000",
            "--progress-secs", "0.5", "--seed", str(args.seed), "--precise-bn-batches", "0",
            "--lr-schedule", args.lr_schedule, *extra]


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


def run_on_ray(address: str, trainers: int, flags: list[str], recorder: Recorder) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    proc = subprocess.Popen([sys.executable, "-m", "cifar10_estimator.cluster", "--ray", address,
                             "--num-workers", str(trainers), "--cpus-per-task",
                             str(os.cpu_count()), "--", *flags], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)
    for line in proc.stdout:
        recorder.write(line)
    if proc.wait():
        raise RuntimeError("the Ray cluster failed:\n" + "\n".join(
            line for _, line in recorder.lines[-40:]))


class LocalRay:
    """A one-node Ray cluster on this host, in a process group of its own (``ray stop`` would
    end every Ray process on the machine)."""

    def __enter__(self) -> str:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        self.temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        self.proc = subprocess.Popen(
            [ray, "start", "--head", f"--port={port}", "--temp-dir", self.temp,
             f"--num-cpus={2 * os.cpu_count()}", "--include-dashboard=false",
             "--disable-usage-stats", "--block"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        try:
            while subprocess.run([sys.executable, "-c", "import ray; ray.init(address=%r)"
                                  % self.address], capture_output=True).returncode:
                if time.monotonic() > deadline:
                    raise RuntimeError("the Ray head did not start")
                time.sleep(1)
        except BaseException:  # a head that no client joins is still running: stop it too
            self.__exit__(None, None, None)
            raise
        return self.address

    def __exit__(self, *exc) -> None:
        import shutil
        import signal

        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.temp, ignore_errors=True)


def first_step_secs(recorder: Recorder, started: float) -> float:
    """From the launch to the chief's first progress line."""
    return next(t for t, line in recorder.lines
                if line.startswith("[chief] ") and RATE_LINE.search(line)) - started


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


def images_per_step(args, key: str) -> int:
    _, trainers, extra, _ = CONFIGS[key]
    together = "--sync" in extra or extra == ALL_REDUCE
    return args.batch * (max(trainers, 1) if together else 1)


def evaluate(job_dir: str, data_dir: str) -> float:
    """``evaluate``'s accuracy of the job's final checkpoint on every test picture."""
    proc = subprocess.run([sys.executable, "-m", "cifar10_estimator.evaluate", job_dir,
                           "--data-dir", data_dir, "--report",
                           os.path.join(job_dir, "bench_report.json")],
                          capture_output=True, text=True, cwd=job_dir)
    if proc.returncode:
        raise RuntimeError(f"evaluate failed:\n{proc.stderr[-2000:]}")
    return float(ACCURACY.search(proc.stdout).group(1))


def run_once(args, key: str, data_dir: str, work: str
             ) -> tuple[float, float, int, float, float]:
    _, trainers, extra, num_ps = CONFIGS[key]
    job_dir = tempfile.mkdtemp(prefix=f"job-{key}-", dir=work)
    recorder = Recorder(args.verbose)
    steps = max(1, args.images // images_per_step(args, key))
    flags = trainer_flags(args, data_dir, job_dir, steps, extra)
    started = time.monotonic()
    if trainers == 0:
        run_local(flags, recorder)
        names = ["chief"]
    elif key.startswith("ray"):
        run_on_ray(args.ray, trainers, flags, recorder)
        names = ["chief"] + [f"worker{i}" for i in range(trainers - 1)]
    else:
        tasks = layout.lay_out(num_workers=trainers, num_ps=num_ps, evaluator=False)
        cluster = loop.LaunchLoop(tasks, host_processes.HostProcesses(), flags, os.environ, out=recorder)
        if cluster.run(timeout_secs=7200) != 0:
            raise RuntimeError("the cluster failed:\n" + "\n".join(
                line for _, line in recorder.lines[-40:]))
        names = ["chief"] + [f"worker{i}" for i in range(trainers - 1)]
    steps_per_sec, measured = measure(recorder, names)
    return (steps_per_sec * images_per_step(args, key), steps_per_sec, measured,
            evaluate(job_dir, data_dir), first_step_secs(recorder, started))


def traffic_table(num_layers: int) -> list[str]:
    """Bytes each design moves per global step, from the parameter count (float32 gradients
    and variables), and the steps/s a 10 Gb/s link allows (bandwidth only, no latency)."""
    size = 4 * PARAMETERS[num_layers]  # bytes of one copy of the gradients or the variables
    link = 10e9 / 8  # bytes/s of a 10 Gb/s NIC
    lines = [f"traffic model, ResNet-{num_layers} ({PARAMETERS[num_layers]:,} parameters, "
             f"{size / 1e6:.2f} MB a copy), per global step; max steps/s on 10 Gb/s links:",
             f"{'workers':>8} {'ps: per worker':>15} {'ps: the 1 ps':>13} {'steps/s':>8} "
             f"{'ring all-reduce: per worker':>28} {'hops':>5} {'steps/s':>8}"]
    for n in (8, 16, 32, 64, 128, 256):
        worker = 2 * size  # gradients up, variables down
        ps_total = n * worker  # every worker's traffic meets at the ps
        ring = 2 * (n - 1) / n * size  # reduce-scatter + all-gather, sent (and as much received)
        lines.append(f"{n:>8} {worker / 1e6:>12.2f} MB {ps_total / 1e6:>10.1f} MB "
                     f"{link / ps_total:>8.1f} {ring / 1e6:>25.2f} MB {2 * (n - 1):>5} "
                     f"{link / ring:>8.1f}")
    lines.append("(the ps's link carries every worker's traffic: its steps/s fall as 1/workers, "
                 "shared by M parameter servers as 1/M; a ring's per-worker bytes stay ~2 copies, "
                 "but its 2(N-1) hops add latency per step, which bounds small models first)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="TFRecords to train on (default: fresh sample data)")
    parser.add_argument("--fashion-mnist", action="store_true",
                        help="train on Fashion-MNIST's 60,000 pictures, evaluate on its 10,000")
    parser.add_argument("--num-layers", type=int, default=20, choices=sorted(PARAMETERS))
    parser.add_argument("--batch", type=int, default=64, help="images per step per worker")
    parser.add_argument("--images", type=int, default=19_200,
                        help="training images per run, the same for every configuration")
    parser.add_argument("--repeats", type=int, default=1, help="runs per configuration, each "
                                                               "with its own seed")
    parser.add_argument("--seed", type=int, default=1, help="the first run's seed")
    parser.add_argument("--configs", default="local,1,2a,2s,r1,r2",
                        help=f"comma-separated subset of {','.join(CONFIGS)}")
    parser.add_argument("--lr-schedule", default="cosine", choices=("cosine", "piecewise"),
                        help="cosine (the default) ends each run at a learning rate near 0, so "
                        "its accuracy is a finished schedule's; piecewise stays at the peak "
                        "rate for short runs, whose accuracy then differs by up to 26 points "
                        "between seeds (docs/performance.md)")
    parser.add_argument("--ray", metavar="ADDRESS", help="the Ray cluster of the ray2 "
                        "configuration (default: a one-node one the bench starts here)")
    parser.add_argument("--verbose", action="store_true", help="echo the tasks' logs")
    args = parser.parse_args()
    keys = [k for k in args.configs.split(",") if k]
    unknown = set(keys) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown --configs {sorted(unknown)}; choose from {sorted(CONFIGS)}")

    print_machine_line()
    print(f"ResNet-{args.num_layers}, batch {args.batch} per worker, {args.lr_schedule} learning "
          f"rate, {args.images:,} training images per run, {args.repeats} run(s) per "
          f"configuration", flush=True)
    results: dict[str, list[tuple[float, float, int, float, float]]] = {k: [] for k in keys}
    first_seed = args.seed
    with contextlib.ExitStack() as stack:
        if any(k.startswith("ray") for k in keys) and not args.ray:
            args.ray = stack.enter_context(LocalRay())
            print(f"a one-node Ray cluster on this host: {args.ray}", flush=True)
        work = stack.enter_context(tempfile.TemporaryDirectory())
        if args.fashion_mnist:
            fashion_mnist.check_source()
            data_dir = os.path.join(work, "fashion-mnist")
            fashion_mnist.make_records(data_dir, None, None)
        else:
            data_dir = args.data_dir or make_sample_records(work)
        for repeat in range(args.repeats):
            args.seed = first_seed + repeat
            for key in keys:
                images, steps_per_sec, measured, accuracy, first = run_once(
                    args, key, data_dir, work)
                results[key].append((images, steps_per_sec, measured, accuracy, first))
                print(f"  run {repeat + 1} (seed {args.seed}): {CONFIGS[key][0]:<26} "
                      f"{images:7.1f} images/s {steps_per_sec:6.2f} global steps/s (over "
                      f"{measured} steps), accuracy {accuracy:.2%}, first step after "
                      f"{first:.1f} s", flush=True)

    print(f"\n{'configuration':<28}{'images/s':>10}{'steps/s':>10}{'vs local':>10}"
          f"{'accuracy':>10}{'spread':>9}{'to 1st step':>13}")
    baseline = (statistics.median(r[0] for r in results["local"]) if "local" in results
                else None)
    for key in keys:
        images = statistics.median(r[0] for r in results[key])
        steps = statistics.median(r[1] for r in results[key])
        accuracies = [r[3] for r in results[key]]
        ratio = f"{images / baseline:9.2f}x" if baseline else ""
        first = statistics.median(r[4] for r in results[key])
        print(f"{CONFIGS[key][0]:<28}{images:10.1f}{steps:10.2f}{ratio:>10}"
              f"{statistics.median(accuracies):>10.2%}"
              f"{max(accuracies) - min(accuracies):>8.2%}{first:>11.1f} s")
    print(f"load average {os.getloadavg()[0]:.2f} at the end (other programs share the cores)")
    print()
    for line in traffic_table(args.num_layers):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
