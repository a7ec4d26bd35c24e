"""Serving speed of an export's converted files (LiteRT, ONNX Runtime) against its SavedModel.

For one export (a SavedModel version folder, or the export folder above the numbered ones: its
newest) with a ``converted/`` folder (``python -m cifar10_estimator.convert``; made here, in a
subprocess, when it is missing and ``--data-dir`` is given), it measures the SavedModel through
TensorFlow's ``serving_default`` signature (``client.load_model``) and every file the manifest
lists on its own runtime (``runtimes.load``):

- latency at batch 1: median and p99 over ``--calls`` calls after a warm-up, each call a
  different picture;
- throughput (images/s) at batch 64 and 256, over ``--seconds`` of calls after a warm-up;
- each with threads 1 and threads = every core this process may use. TensorFlow takes its
  intra- and inter-op thread counts (``tf.config.threading``) once, for the whole process,
  before its first op; so every repetition runs each thread count in a child process of its
  own (the thread counts' order alternating between repetitions), and the child loads all the
  models and measures them in one process, alternating: each cell (batch size) runs every
  model in turn, the order rotated every repetition. The runtimes take the same count
  (``runtimes.load(path, threads)``: LiteRT's ``num_threads``, ONNX Runtime's intra-op
  threads).

The pictures are the first 256 of the eval records of ``--data-dir`` (``Cifar10DataSet(...,
"eval").one_pass``), or uniform random pixels without it. Every figure is the median over
``--runs`` repetitions (p99: the median of each repetition's p99); a runtime's ratio to the
SavedModel (batch-1 speed-up: the SavedModel's median latency over the runtime's; batch-256
ratio: the runtime's images/s over the SavedModel's) is the median of each repetition's ratio,
both sides measured in the same process minutes apart. Sizes: the SavedModel's
``saved_model.pb`` and ``variables/``, each file's bytes; accuracy: the manifest's (the convert
command's gate on the eval split; ``savedmodel_accuracy`` for the SavedModel). An export that
computes in bfloat16 (``assets.extra/export.json``) is run as it is served, in bfloat16; its
converted files compute in float32 (``serving.conversion``).

    python benchmarks/runtime_bench.py JOB_DIR/export --data-dir DATA
    python benchmarks/runtime_bench.py JOB_DIR/export/1700000000 --runs 1 --calls 200 --seconds 1
"""

import argparse
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from machine import print_machine_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAVED_MODEL = "SavedModel"
BATCHES = (64, 256)  # the throughput cells; batch 1 is the latency cell
PICTURES = max(BATCHES)
LATENCY_WARMUP_CALLS = 50
THROUGHPUT_WARMUP_CALLS = 2
MIN_THROUGHPUT_CALLS = 3
VERSIONS = ("tensorflow", "onnxruntime", "ai-edge-litert")
EXPORT_INFO = os.path.join("assets.extra", "export.json")  # serving.export.EXPORT_INFO_FILE


def all_threads() -> int:
    """Every core this process may use (``runtimes.default_threads``, what the commands give a
    runtime), without importing TensorFlow into the parent."""
    return len(os.sched_getaffinity(0))


def newest_export(folder: str) -> str:
    """``folder`` if it is a SavedModel, else its newest numbered version (``client.newest_export``
    without TensorFlow)."""
    if os.path.isfile(os.path.join(folder, "saved_model.pb")):
        return os.path.abspath(folder)
    versions = [n for n in os.listdir(folder) if n.isascii() and n.isdigit()
                and os.path.isfile(os.path.join(folder, n, "saved_model.pb"))]
    if not versions:
        raise SystemExit(f"{folder}: neither a SavedModel folder nor an export folder above one")
    return os.path.abspath(os.path.join(folder, max(versions, key=int)))


def ensure_converted(export: str, data_dir: str) -> dict:
    """The export's ``converted/manifest.json``, made by the convert command first when it is
    missing."""
    manifest_path = os.path.join(export, "converted", "manifest.json")
    if not os.path.isfile(manifest_path):
        if not data_dir:
            raise SystemExit(f"{export} has no converted/ folder; pass --data-dir to make it "
                             f"(python -m cifar10_estimator.convert)")
        command = [sys.executable, "-m", "cifar10_estimator.convert", export,
                   "--data-dir", data_dir]
        print("converting: " + " ".join(command), flush=True)
        proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        print(proc.stdout, end="", flush=True)
        # Status 2: some file lost too much accuracy and was not kept; the others were written.
        if proc.returncode and not os.path.isfile(manifest_path):
            raise SystemExit(f"convert failed (status {proc.returncode}):\n"
                             f"{proc.stderr[-3000:]}")
        if proc.returncode:
            print(proc.stderr.strip().splitlines()[-1], flush=True)
    with open(manifest_path) as f:
        return json.load(f)


def savedmodel_bytes(export: str) -> int:
    total = os.path.getsize(os.path.join(export, "saved_model.pb"))
    for root, _, files in os.walk(os.path.join(export, "variables")):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files)
    return total


def compute_dtype(export: str) -> str:
    try:
        with open(os.path.join(export, EXPORT_INFO)) as f:
            return json.load(f).get("compute_dtype", "float32")
    except (OSError, ValueError):
        return "float32"


# --- the child: one thread count, every model, one repetition ---------------------------------

def pictures(data_dir: str) -> np.ndarray:
    """``PICTURES`` float32 [N, 32, 32, 3] pictures in 0..255: the first of the eval records,
    or uniform random pixels."""
    if not data_dir:
        rng = np.random.default_rng(0)
        return rng.integers(0, 256, (PICTURES, 32, 32, 3)).astype(np.float32)
    from cifar10_estimator.data.pipeline import Cifar10DataSet

    features, _ = next(iter(Cifar10DataSet(data_dir, "eval", use_distortion=False)
                            .one_pass(PICTURES)))
    images = features["image"].numpy()[features["weight"].numpy() > 0]
    reps = -(-PICTURES // len(images))  # fewer eval pictures than a batch: repeated
    return np.ascontiguousarray(np.concatenate([images] * reps)[:PICTURES])


def latency(fn, inputs: list, calls: int) -> list[float]:
    """Seconds of each of ``calls`` calls, after a warm-up, cycling through ``inputs``."""
    for i in range(LATENCY_WARMUP_CALLS):
        fn(inputs[i % len(inputs)])
    seconds = []
    for i in range(calls):
        x = inputs[i % len(inputs)]
        started = time.perf_counter()
        fn(x)
        seconds.append(time.perf_counter() - started)
    return seconds


def throughput(fn, x, batch: int, seconds: float) -> float:
    """Images/s over at least ``seconds`` of calls (and ``MIN_THROUGHPUT_CALLS``), after a
    warm-up."""
    for _ in range(THROUGHPUT_WARMUP_CALLS):
        fn(x)
    calls, started = 0, time.perf_counter()
    while calls < MIN_THROUGHPUT_CALLS or time.perf_counter() - started < seconds:
        fn(x)
        calls += 1
    return batch * calls / (time.perf_counter() - started)


def child(args) -> None:
    threads = args.child_threads
    from cifar10_estimator.platform.process import prepare_process

    prepare_process(os.environ)  # the parent did too; a child run by hand as well
    import tensorflow as tf

    # Before TensorFlow's first op: fixed for the process from then on.
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    from cifar10_estimator.serving import client, runtimes

    with open(os.path.join(args.export, "converted", "manifest.json")) as f:
        manifest = json.load(f)
    _, signature = client.load_model(args.export)
    models = {SAVED_MODEL: (lambda x: signature(images=x)["probabilities"].numpy(), tf.constant)}
    for entry in manifest["files"]:
        model = runtimes.load(os.path.join(args.export, "converted", entry["file"]), threads)
        models[entry["format"]] = (model.probabilities, np.ascontiguousarray)
    images = pictures(args.data_dir)

    # Each model's input as it takes it (a tensor for TensorFlow, an array for the runtimes),
    # made before any timing.
    def inputs(convert):
        return ([convert(images[i:i + 1]) for i in range(PICTURES)],
                {b: convert(images[:b]) for b in BATCHES})

    fed = {name: inputs(convert) for name, (_, convert) in models.items()}
    reference = models[SAVED_MODEL][0](fed[SAVED_MODEL][1][PICTURES]).argmax(1)
    agreement = {name: float(np.mean(fn(fed[name][1][PICTURES]).argmax(1) == reference))
                 for name, (fn, _) in models.items()}

    order = list(models)
    shift = args.run_index % len(order)
    order = order[shift:] + order[:shift]
    result = {"threads": threads, "tensorflow": tf.__version__, "agreement": agreement,
              "p50_ms": {}, "p99_ms": {}, **{f"b{b}": {} for b in BATCHES}}
    for name in order:
        ms = np.array(latency(models[name][0], fed[name][0], args.calls)) * 1e3
        result["p50_ms"][name] = float(np.median(ms))
        result["p99_ms"][name] = float(np.percentile(ms, 99))
    for batch in BATCHES:
        for name in order:
            result[f"b{batch}"][name] = throughput(models[name][0], fed[name][1][batch], batch,
                                                   args.seconds)
    with open(args.result, "w") as f:
        json.dump(result, f)


# --- the parent: repetitions, children, the table ----------------------------------------------

def run_child(args, export: str, threads: int, run: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_path = f.name
    command = [sys.executable, os.path.abspath(__file__), export, "--child-threads",
               str(threads), "--run-index", str(run), "--result", result_path,
               "--calls", str(args.calls), "--seconds", str(args.seconds)]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if proc.returncode:
            raise SystemExit(f"child (threads {threads}, run {run + 1}) failed, status "
                             f"{proc.returncode}:\n{proc.stderr[-3000:]}")
        with open(result_path) as f:
            return json.load(f)
    finally:
        os.remove(result_path)


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(rows[0]))) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", help="JOB_DIR/export/<version>, or JOB_DIR/export (its newest)")
    parser.add_argument("--data-dir", default="",
                        help="the records the model was trained on: the pictures come from its "
                             "eval split, and convert runs with it when converted/ is missing "
                             "(without it: uniform random pictures)")
    parser.add_argument("--runs", type=int, default=5, help="repetitions (medians across them)")
    parser.add_argument("--calls", type=int, default=1000,
                        help="timed batch-1 calls per model and repetition (median and p99)")
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="timed seconds per model, batch size and repetition")
    parser.add_argument("--child-threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_threads:
        child(args)
        return
    if args.runs < 1 or args.calls < 1 or args.seconds <= 0:
        parser.error("--runs and --calls must be 1 or more and --seconds above 0")

    from cifar10_estimator.platform.process import prepare_process

    prepare_process(os.environ)  # oneDNN and the log level, for the children to inherit
    print_machine_line()
    load_before = os.getloadavg()
    versions = {}
    for name in VERSIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    print(f"Python {sys.version.split()[0]}; " + ", ".join(f"{k} {v}" for k, v in
                                                          versions.items()), flush=True)
    export = newest_export(args.export)
    manifest = ensure_converted(export, args.data_dir)
    names = [SAVED_MODEL] + [entry["format"] for entry in manifest["files"]]
    dtype = compute_dtype(export)
    print(f"export {export} (computes in {dtype}); converted with TensorFlow "
          f"{manifest.get('versions', {}).get('tensorflow', '?')}: "
          f"{', '.join(e['file'] for e in manifest['files']) or 'no files kept'}; pictures: "
          + (f"the eval records of {args.data_dir}" if args.data_dir else "uniform random"),
          flush=True)
    thread_counts = list(dict.fromkeys((1, all_threads())))

    # results[threads][metric][model]: one value per repetition
    results = {t: {} for t in thread_counts}
    agreement = {}
    for run in range(args.runs):
        shift = run % len(thread_counts)
        for threads in thread_counts[shift:] + thread_counts[:shift]:
            started = time.perf_counter()
            got = run_child(args, export, threads, run)
            for metric in ("p50_ms", "p99_ms", *(f"b{b}" for b in BATCHES)):
                for name in names:
                    results[threads].setdefault(metric, {}).setdefault(name, []).append(
                        got[metric][name])
            agreement = got["agreement"]
            print(f"run {run + 1}, threads {threads} ({time.perf_counter() - started:.0f} s): "
                  "batch-1 median ms " + ", ".join(f"{n} {got['p50_ms'][n]:.3f}" for n in names)
                  + f"; batch {BATCHES[-1]} images/s " + ", ".join(
                      f"{n} {got[f'b{BATCHES[-1]}'][n]:,.0f}" for n in names), flush=True)
    print(f"top-1 agreement with the SavedModel on the {PICTURES} pictures: " + ", ".join(
        f"{n} {agreement[n]:.2%}" for n in names[1:]))

    def median(threads, metric, name):
        return statistics.median(results[threads][metric][name])

    def ratio(threads, metric, name, faster_is_lower):
        pairs = zip(results[threads][metric][name], results[threads][metric][SAVED_MODEL])
        return statistics.median((s / r) if faster_is_lower else (r / s) for r, s in pairs)

    def label(threads):
        return f"{threads} thread" + ("s" if threads != 1 else "")

    header = ["model", "size", "accuracy"]
    for t in thread_counts:
        header += [f"b1 median ms ({label(t)})", f"b1 p99 ms ({label(t)})"]
    for b in BATCHES:
        header += [f"b{b} img/s ({label(t)})" for t in thread_counts]
    header += [f"b1 speed-up ({label(t)})" for t in thread_counts]
    header += [f"b{BATCHES[-1]} ratio ({label(t)})" for t in thread_counts]
    rows = [header]
    entries = {e["format"]: e for e in manifest["files"]}
    for name in names:
        if name == SAVED_MODEL:
            size, acc = savedmodel_bytes(export), f"{manifest['savedmodel_accuracy']:.2%}"
            shown = f"SavedModel ({dtype})"
        else:
            e = entries[name]
            size = os.path.getsize(os.path.join(export, "converted", e["file"]))
            acc = f"{e['accuracy']:.2%} ({e['delta_points']:+.2f})"
            shown = f"{name} ({e['runtime']})"
        row = [shown, f"{size / 1e6:.2f} MB", acc]
        for t in thread_counts:
            row += [f"{median(t, 'p50_ms', name):.3f}", f"{median(t, 'p99_ms', name):.3f}"]
        for b in BATCHES:
            row += [f"{median(t, f'b{b}', name):,.0f}" for t in thread_counts]
        if name == SAVED_MODEL:
            row += ["1.00"] * (2 * len(thread_counts))
        else:
            row += [f"{ratio(t, 'p50_ms', name, True):.2f}" for t in thread_counts]
            row += [f"{ratio(t, f'b{BATCHES[-1]}', name, False):.2f}" for t in thread_counts]
        rows.append(row)
    print(f"\nmedians of {args.runs} repetitions; threads 1 and all = {all_threads()}; "
          f"batch 1: {args.calls} calls, batches {', '.join(map(str, BATCHES))}: "
          f"{args.seconds:g} s each; accuracy: the manifest's on {manifest.get('pictures', '?')} "
          f"{manifest.get('split', 'eval')} pictures (points against the SavedModel); "
          f"speed-up and ratio: against the SavedModel, the median of each repetition's\n")
    print(markdown(rows))
    print("\nload average (1, 5, 15 min): before " + ", ".join(f"{x:.2f}" for x in load_before)
          + "; after " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
