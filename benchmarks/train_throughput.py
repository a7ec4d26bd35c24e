"""Training throughput of the CLI trainer against its peers, end to end and step for step.

Every trainer is timed two ways, each in its own process, all in one alternating loop (A B C
A B C ...) so that a noisy machine moves them alike:

- **end to end**, as a user runs it. Ours is ``python -m cifar10_estimator`` (TFRecords from the
  sample data, augmentation, hooks and summaries on): the median of the images/s of its progress
  lines (every 2 s) after the first three, so start-up, the first checkpoint and the final
  evaluation are left out. The Keras peer (``keras_resnet.py --data-dir``) runs ``model.fit`` on
  the same TFRecords with the same augmentation through ``tf.data``; the PyTorch peer
  (``torch_resnet.py --records``) reads the same pictures (decoded from the records into an
  .npz, as torchvision's CIFAR10 holds them in memory) through a Dataset and DataLoader that
  augment the same way, eager and with ``torch.compile``.
- **bare step**: fixed in-memory batches, no input pipeline, no augmentation. Ours is the
  model_fn's train op in a session configured as the trainer's (``step_profile.py``'s harness);
  the peers are ``keras_resnet.py`` and ``torch_resnet.py`` without data.

One table per precision, with each peer's release; the ratio columns are ours over the peer,
so above 1.00x ours is ahead. Keras runs with oneDNN forced on (``TF_ENABLE_ONEDNN_OPTS=1``),
its best on every CPU, as our command line runs itself. bf16 is measured only on CPUs with
native bf16 (``cpu.py``); there ``auto`` runs too (end to end), with a cache folder of its own
(the first ``auto`` run probes, the later ones read the cache), and the table says what it
picked and how its speed compares with the faster of fp32 and bf16 (the goal: at least 0.95x).
To see what an AVX2-only CPU's oneDNN kernels do on an AVX-512 machine, run under
``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN's dispatcher cap; the Eigen kernels are unaffected).
``--pythons`` compares TensorFlow releases side by side: each interpreter (a virtualenv with
the package and its TensorFlow) runs ours and the Keras peer; ``--keras-pythons`` adds Keras
peers alone (Keras 2 from a TF 2.15 virtualenv beside Keras 3 from 2.21).

    python benchmarks/train_throughput.py --depths 20 --keras-pythons TF215/bin/python \
        --torch-python /tmp/torch-venv/bin/python
    python benchmarks/train_throughput.py --depths 20,44 --runs 3 --modes e2e
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
STEP_HARNESS = os.path.join(HERE, "step_profile.py")
CURRENT = re.compile(r"step \d+/\d+ \([\d.]+%\).*?: ([\d.]+) images/s")
PICKED = re.compile(r"^[\d:]+ precision auto: (\w+) .*?(measured now: .*? ([\d.]+) s)?$", re.M)
ENV_WORD = re.compile(r"^[A-Z][A-Z0-9_]*=")
MODES = {"e2e": "end to end", "bare": "bare step"}
auto_picks: dict[tuple, list[str]] = {}
# Each row's release, from its runs' JSON lines (row -> "keras 3.15.1, TF 2.21.0").
releases: dict[str, str] = {}


def ours(data_dir: str, work: str, depth: int, steps: int, extra: list[str],
         python: str = sys.executable) -> float:
    job_dir = tempfile.mkdtemp(dir=work)
    env = {**os.environ, "XDG_CACHE_HOME": os.path.join(work, "cache")}
    # A variant's NAME=VALUE words are environment variables of its run, not flags.
    env.update(word.split("=", 1) for word in extra if ENV_WORD.match(word))
    extra = [word for word in extra if not ENV_WORD.match(word)]
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


def peer(cmd: list[str], row: str) -> float:
    """Runs one peer (or our bare step), notes its release, returns its images/s."""
    env = {**os.environ, cpu.ONEDNN_ENV: "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode:
        raise SystemExit(f"{os.path.basename(cmd[1])} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "keras" in result:
        releases[row] = f"{result['keras']}, TF {result['tensorflow']}"
    elif "torch" in result:
        releases[row] = f"torch {result['torch']}"
    elif "tensorflow" in result:
        releases[row] = f"TF {result['tensorflow']}"
    return result["images_per_sec"]


def records_npz(data_dir: str, work: str) -> str:
    """The training pictures of ``data_dir`` as an .npz (uint8 images [N,32,32,3], labels) for
    the PyTorch peer, decoded by the package's own parser: the same pictures as ours reads."""
    import numpy as np
    import tensorflow as tf

    from cifar10_estimator.data import pipeline, schema

    images, labels = [], []
    for batch in tf.data.TFRecordDataset(schema.record_path(data_dir, "train")).batch(1000):
        decoded, classes = pipeline.parse_batch(batch)
        images.append(decoded.numpy())
        labels.append(classes.numpy())
    path = os.path.join(work, "train.npz")
    np.savez(path, images=np.concatenate(images), labels=np.concatenate(labels))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="20,44")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200,
                        help="training steps per run of ours (end to end and bare)")
    parser.add_argument("--seconds", type=float, default=25, help="timed seconds per peer run")
    parser.add_argument("--precisions",
                        default="fp32,bf16,auto" if cpu.read_cpu_info().as_seen_by_onednn(
                            os.environ.get(cpu.ONEDNN_CAP_ENV)).native_bf16 else "fp32,auto")
    parser.add_argument("--modes", default="e2e,bare",
                        help="e2e (end to end, as users run it), bare (the step on in-memory "
                             "batches), or both")
    parser.add_argument("--no-keras", action="store_true", help="leave out the Keras peers")
    parser.add_argument("--keras-pythons", default="",
                        help="more interpreters with TensorFlow (and the package) whose Keras "
                             "runs as a peer, beside those of --pythons")
    parser.add_argument("--torch-python", help="a Python with torch 2.13 for the PyTorch peer")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave out the torch.compile rows of the PyTorch peer")
    parser.add_argument("--extra", default="", help="more trainer flags, e.g. '--xla'")
    parser.add_argument("--variants", default="",
                        help="settings of ours to compare side by side, each NAME=FLAGS, "
                             "separated by ';', e.g. 'base=;inter-1=--num-inter-threads 1': "
                             "each runs (after --extra) in the same alternating loop; a word "
                             "VAR=VALUE among the flags sets an environment variable, e.g. "
                             "'fpmath=TF_SET_ONEDNN_FPMATH_MODE=BF16'")
    parser.add_argument("--data-dir", help="TFRecords to train on (default: the sample data's)")
    parser.add_argument("--pythons", default=sys.executable,
                        help="comma-separated interpreters, each with the package and a "
                             "TensorFlow release: ours and the Keras peer run under each")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: e2e, bare or both, got {args.modes!r}")
    print_machine_line()
    pythons = args.pythons.split(",")
    labels = {python: (f"TF {tensorflow_version(python)} " if len(pythons) > 1 else "")
              for python in pythons}
    keras_pythons = [] if args.no_keras else pythons + [
        p for p in args.keras_pythons.split(",") if p and p not in pythons]

    work = tempfile.mkdtemp(prefix="c10bench.")
    data_dir = args.data_dir or make_sample_records(work)
    npz = records_npz(data_dir, work) if args.torch_python and "e2e" in modes else None
    variants = dict(v.split("=", 1) for v in args.variants.split(";") if v) or {"": ""}
    rows = []
    for depth in map(int, args.depths.split(",")):
        # (row, mode, precision) -> a call returning images/s
        contenders = {}
        for python, label in labels.items():
            for p in args.precisions.split(","):
                for variant, flags in variants.items():
                    row = f"{label}cifar10_estimator{' ' + variant if variant else ''}"
                    if "e2e" in modes:
                        contenders[row, "e2e", p] = lambda p=p, py=python, f=flags: ours(
                            data_dir, work, depth, args.steps,
                            ["--precision", p, *args.extra.split(), *f.split()], py)
                    if "bare" in modes and p != "auto" and not (args.extra or flags):
                        contenders[row, "bare", p] = lambda p=p, py=python, r=row: peer(
                            [py, STEP_HARNESS, "--child", "ours", "--depth", str(depth),
                             "--steps", str(args.steps), "--trace-steps", "0",
                             "--precision", p], r)
        for p in args.precisions.split(","):
            if p == "auto":
                continue  # peers have no auto
            common = ["--depth", str(depth), "--seconds", str(args.seconds), "--precision", p]
            inputs = {"e2e": ["--data-dir", data_dir], "bare": []}
            for python in keras_pythons:
                row = f"keras model.fit ({python})"
                for mode in modes:
                    contenders[row, mode, p] = lambda c=common + inputs[mode], py=python, r=row: \
                        peer([py, KERAS_PEER, *c], r)
            if args.torch_python:
                torch_inputs = {"e2e": ["--records", npz or ""], "bare": []}
                for compiled in ([False] if args.no_compile else [False, True]):
                    row = f"pytorch {'torch.compile' if compiled else 'eager'}"
                    for mode in modes:
                        cmd = [args.torch_python, TORCH_PEER, "--memory-format",
                               "channels_last", *common, *torch_inputs[mode],
                               *(["--compile"] if compiled else [])]
                        contenders[row, mode, p] = lambda c=cmd, r=row: peer(c, r)
        results = {key: [] for key in contenders}
        for run in range(args.runs):
            for key, fn in contenders.items():
                results[key].append(fn())
                row, mode, p = key
                print(f"ResNet-{depth} run {run + 1}: {row} {p} {MODES[mode]} "
                      f"{results[key][-1]:.0f} images/s", file=sys.stderr, flush=True)
        rows.append((depth, results))

    for depth, results in rows:
        print_tables(depth, results, args.runs)
    print(f"(images/s, batch 128 unless the flags say otherwise, medians of {args.runs} "
          f"alternating runs (min-max), machine: {os.cpu_count()} cores; 'ours / it': our "
          f"trainer's median over this row's, in the same mode and precision, above 1.00x ours "
          f"is faster; for auto: against the faster of our fp32 and bf16)")
    for (python, depth), picks in auto_picks.items():
        print(f"ResNet-{depth} {labels[python]}auto picked, run by run: {'; '.join(picks)}")


def print_tables(depth: int, results: dict, runs: int) -> None:
    """One table per precision: a row per trainer, end to end and bare step side by side."""
    precisions = list(dict.fromkeys(p for _, _, p in results))
    row_names = list(dict.fromkeys(row for row, _, _ in results))
    for p in precisions:
        print(f"\nResNet-{depth}, {p}:")
        print(f"{'trainer':<44} {'end to end':>20} {'ours / it':>9} {'bare step':>20} "
              f"{'ours / it':>9}")
        for row in row_names:
            if not any((row, mode, p) in results for mode in MODES):
                continue
            # Against ours: a peer against our first row, a variant of ours against the first
            # variant of its release (the label before "cifar10_estimator").
            label = row[:row.index("cifar10_estimator")] if "cifar10_estimator" in row else ""
            own = next((r for r in row_names if r.startswith(label + "cifar10_estimator")),
                       next((r for r in row_names if "cifar10_estimator" in r), None))
            cells = []
            for mode in MODES:
                values = results.get((row, mode, p))
                if not values:
                    cells.append(f"{'-':>20} {'':>9}")
                    continue
                median = statistics.median(values)
                spread = f"{median:,.0f} ({min(values):,.0f}-{max(values):,.0f})"
                if p == "auto":
                    fixed = [statistics.median(v) for (r, m, q), v in results.items()
                             if r == row and m == mode and q != "auto"]
                    ratio = f"{median / max(fixed):.2f}x" if fixed else "-"
                else:
                    theirs = results.get((own, mode, p))
                    ratio = (f"{statistics.median(theirs) / median:.2f}x"
                             if theirs and own != row else "")
                cells.append(f"{spread:>20} {ratio:>9}")
            name = row.split(" (")[0] if row.startswith("keras") else row
            release = releases.get(row)
            print(f"{name + (f' ({release})' if release else ''):<44} {' '.join(cells)}")


def tensorflow_version(python: str) -> str:
    """The TensorFlow release installed for ``python``, read from its metadata (no import)."""
    return subprocess.run([python, "-c", "import importlib.metadata as m; "
                           "print(m.version('tensorflow'))"], capture_output=True, text=True,
                          check=True).stdout.strip()


if __name__ == "__main__":
    main()
