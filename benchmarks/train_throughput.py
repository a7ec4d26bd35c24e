"""Training throughput of the CLI trainer against the reference peers, side by side.

Runs ``python -m cifar10_estimator`` exactly as a user would (TFRecords from the sample data,
augmentation, hooks and summaries on) and reads its steady-state images/s from the
progress lines it logs every 2 s: the median of their images/s after the first intervals, so
start-up, the first checkpoint and the final evaluation are excluded. The peers beside this
file train the same network on in-memory data: ``keras_resnet.py`` (Keras ``model.fit``, always)
and ``torch_resnet.py`` (PyTorch, channels_last, when a Python with torch is given). Each
precision is run by ours and by every peer, in the same loop, alternating (A B C A B C ...), so a
noisy machine moves all of them alike; the ratio column compares each trainer with the best peer
at the same precision. Keras runs with oneDNN forced on (``TF_ENABLE_ONEDNN_OPTS=1``), its best
on every CPU, as our command line runs itself. bf16 is measured only on CPUs with native bf16
(``cpu.py``); there ``auto`` runs too, with a cache folder of its own (the first ``auto`` run
probes, the later ones read the cache), and the table says what it picked and how its speed
compares with the faster of fp32 and bf16 (the goal: at least 0.95x).
To see what an AVX2-only CPU's oneDNN kernels do on an AVX-512 machine, run under
``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's dispatcher cap; the Eigen kernels are unaffected).
``--pythons`` compares TensorFlow releases side by side: each interpreter (a virtualenv with
the package and its TensorFlow) runs ours and the Keras peer, all in the same alternating loop,
and each trainer's ratio is taken against the peers of its own release.

    python benchmarks/train_throughput.py --depths 20,44 --runs 3
    python benchmarks/train_throughput.py --torch-python /tmp/torch-venv/bin/python
    python benchmarks/train_throughput.py --depths 20 --pythons TF215/bin/python,TF221/bin/python
    python benchmarks/train_throughput.py --depths 20 --no-keras --precisions fp32 \
        --extra '--recipe fast' --variants 'base=;xla=--xla'

For the PyTorch peer: ``python3.11 -m venv /tmp/torch-venv && /tmp/torch-venv/bin/pip install
torch==2.13.0 numpy`` (that exact pin takes the CPU wheel; an unpinned torch pulls GBs of CUDA).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from machine import print_machine_line
from sample_records import make_sample_records

from cifar10_estimator.platform import cpu

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
KERAS_PEER = os.path.join(HERE, "keras_resnet.py")
TORCH_PEER = os.path.join(HERE, "torch_resnet.py")
CURRENT = re.compile(r"step \d+/\d+ \([\d.]+%\).*?: ([\d.]+) images/s")
PICKED = re.compile(r"^[\d:]+ precision auto: (\w+) .*?(measured now: .*? ([\d.]+) s)?$", re.M)
auto_picks: dict[int, list[str]] = {}


def ours(data_dir: str, work: str, depth: int, steps: int, extra: list[str],
         python: str = sys.executable) -> float:
    job_dir = tempfile.mkdtemp(dir=work)
    env = {**os.environ, "XDG_CACHE_HOME": os.path.join(work, "cache")}
    proc = subprocess.run(
        [python, "-m", "cifar10_estimator", "--data-dir", data_dir, "--job-dir", job_dir,
         "--num-layers", str(depth), "--train-steps", str(steps), "--train-batch-size", "128",
         "--eval-batch-size", "500", "--save-checkpoints-secs", "100000",
         "--eval-throttle-secs", "100000", "--progress-secs", "2", *extra],
        capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode:
        raise SystemExit(f"trainer failed:\n{proc.stderr[-2000:]}")
    picked = PICKED.search(proc.stderr)
    if picked:
        probe = f" (probe {picked.group(3)} s)" if picked.group(3) else " (cached)"
        auto_picks.setdefault((python, depth), []).append(picked.group(1) + probe)
    current = [float(v) for v in CURRENT.findall(proc.stderr)]
    # Skip the first 3 intervals (2 s each): graph optimisation, the first checkpoint and the
    # input pipeline's warm-up.
    return statistics.median(current[3:])


def peer(cmd: list[str]) -> float:
    env = {**os.environ, cpu.ONEDNN_ENV: "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode:
        raise SystemExit(f"{os.path.basename(cmd[1])} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["images_per_sec"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="20,44")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="training steps per run of ours")
    parser.add_argument("--seconds", type=float, default=25, help="timed seconds per peer run")
    parser.add_argument("--precisions",
                        default="fp32,bf16,auto" if cpu.read_cpu_info().as_seen_by_onednn(
                            os.environ.get(cpu.ONEDNN_CAP_ENV)).native_bf16 else "fp32,auto")
    parser.add_argument("--no-keras", action="store_true", help="leave out the Keras peer")
    parser.add_argument("--torch-python", help="a Python with torch 2.13 for the PyTorch peer")
    parser.add_argument("--extra", default="", help="more trainer flags, e.g. '--xla'")
    parser.add_argument("--variants", default="",
                        help="settings of ours to compare side by side, each NAME=FLAGS, "
                             "separated by ';', e.g. 'base=;inter-1=--num-inter-threads 1': "
                             "each runs (after --extra) in the same alternating loop")
    parser.add_argument("--data-dir", help="TFRecords to train on (default: the sample data's)")
    parser.add_argument("--pythons", default=sys.executable,
                        help="comma-separated interpreters, each with the package and a "
                             "TensorFlow release: ours and the Keras peer run under each")
    args = parser.parse_args()
    print_machine_line()
    pythons = args.pythons.split(",")
    labels = {python: (f"TF {tensorflow_version(python)} " if len(pythons) > 1 else "")
              for python in pythons}

    work = tempfile.mkdtemp(prefix="c10bench.")
    data_dir = args.data_dir or make_sample_records(work)
    variants = dict(v.split("=", 1) for v in args.variants.split(";") if v) or {"": ""}
    rows = []
    for depth in map(int, args.depths.split(",")):
        contenders = {}
        for python, label in labels.items():
            for p in args.precisions.split(","):
                for variant, flags in variants.items():
                    name = f"{label}cifar10_estimator{' ' + variant if variant else ''} {p}"
                    contenders[name] = lambda p=p, py=python, f=flags: ours(
                        data_dir, work, depth, args.steps,
                        ["--precision", p, *args.extra.split(), *f.split()], py)
        for p in args.precisions.split(","):
            if p == "auto":
                continue  # peers have no auto
            common = ["--depth", str(depth), "--seconds", str(args.seconds), "--precision", p]
            if not args.no_keras:
                for python, label in labels.items():
                    contenders[f"{label}keras model.fit {p}"] = lambda c=common, py=python: peer(
                        [py, KERAS_PEER, *c])
            if args.torch_python:
                contenders[f"pytorch channels_last {p}"] = lambda c=common: peer(
                    [args.torch_python, TORCH_PEER, "--memory-format", "channels_last", *c])
        results = {name: [] for name in contenders}
        for run in range(args.runs):
            for name, fn in contenders.items():
                results[name].append(fn())
                print(f"ResNet-{depth} run {run + 1}: {name} {results[name][-1]:.0f} images/s",
                      file=sys.stderr, flush=True)
        for name, values in results.items():
            precision = name.rsplit(" ", 1)[1]
            # The release's own label (or none): its peers, and the PyTorch peer's.
            label = name[:name.index("cifar10_estimator")] if "cifar10_estimator" in name \
                else name[:name.index("keras")] if "keras" in name else ""
            best_peer = max((statistics.median(v) for k, v in results.items()
                             if "cifar10_estimator" not in k and k.endswith(" " + precision)
                             and (k.startswith(label + "keras") or k.startswith("pytorch"))),
                            default=None)
            median = statistics.median(values)
            ratio = f"{median / best_peer:.2f}x" if best_peer else "-"
            if name.endswith(" auto"):
                fixed = [statistics.median(v) for k, v in results.items()
                         if k.startswith(label + "cifar10_estimator")
                         and not k.endswith(" auto")]
                ratio = f"{median / max(fixed):.2f}x fastest" if fixed else "-"
            rows.append((f"ResNet-{depth}", name, median, min(values), max(values), ratio))

    print(f"\n{'model':<10} {'trainer':<38} {'median':>8} {'min':>7} {'max':>7} {'vs best peer':>12}")
    for model, name, median, lo, hi, ratio in rows:
        print(f"{model:<10} {name:<38} {median:>8.0f} {lo:>7.0f} {hi:>7.0f} {ratio:>12}")
    print(f"(images/s, batch 128 unless the flags say otherwise, {args.runs} alternating runs, "
          f"machine: {os.cpu_count()} cores; 'vs best peer': against the fastest peer at the "
          f"same precision; for auto: against the faster of our fp32 and bf16)")
    for (python, depth), picks in auto_picks.items():
        print(f"ResNet-{depth} {labels[python]}auto picked, run by run: {'; '.join(picks)}")


def tensorflow_version(python: str) -> str:
    """The TensorFlow release installed for ``python``, read from its metadata (no import)."""
    return subprocess.run([python, "-c", "import importlib.metadata as m; "
                           "print(m.version('tensorflow'))"], capture_output=True, text=True,
                          check=True).stdout.strip()


if __name__ == "__main__":
    main()
