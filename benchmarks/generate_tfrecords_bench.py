#!/usr/bin/env python3
"""How fast the generator converts a full-size CIFAR-10 (6 x 10,000 images) to TFRecords.

Makes full-size data once in a temporary folder (the built-in sample data: same pickle format
and sizes as the real batches), then times ``generate_tfrecords`` on the extracted folder over
several runs: loading + validating the pickles, and writing the three record files. TensorFlow's
import time is measured separately, in fresh processes, since every command-line run pays it
once. Target: 60,000 images in 5 s or less.

    .venv/bin/python benchmarks/generate_tfrecords_bench.py [--runs 5] [--images-per-batch 10000]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from cifar10_estimator.data import sample_data, sources, writer  # noqa: E402
from machine import print_machine_line  # noqa: E402


def tf_import_seconds(runs: int) -> list[float]:
    code = ("import time; t = time.perf_counter(); import tensorflow; "
            "print(time.perf_counter() - t)")
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed conversions (default 5)")
    parser.add_argument("--images-per-batch", type=int, default=10_000,
                        help="images per batch file; 6 files (default 10000, the real size)")
    args = parser.parse_args()
    print_machine_line()
    images = 6 * args.images_per_batch

    imports = tf_import_seconds(3)
    import tensorflow  # noqa: F401  (once, outside the timed region)

    with tempfile.TemporaryDirectory(prefix="gen_bench_") as tmp:
        started = time.perf_counter()
        sample_data.write_sample_data(tmp, args.images_per_batch, seed=0)
        make_seconds = time.perf_counter() - started
        rows = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            source = sources.load_source(tmp, log=lambda _: None)
            t1 = time.perf_counter()
            writer.write_tfrecords(source, os.path.join(tmp, "out"), log=lambda _: None)
            t2 = time.perf_counter()
            rows.append((t1 - t0, t2 - t1, t2 - t0))
            del source

    print(f"generate_tfrecords on {images:,} images (6 batches x {args.images_per_batch:,}), "
          f"{args.runs} runs, {os.cpu_count()} CPUs")
    print(f"{'run':>4} {'load+validate s':>16} {'write s':>9} {'total s':>9} {'images/s':>10}")
    for i, (load, write, total) in enumerate(rows, 1):
        print(f"{i:>4} {load:>16.2f} {write:>9.2f} {total:>9.2f} {images / total:>10,.0f}")
    median = statistics.median(r[2] for r in rows)
    print(f"{'median':>6} {statistics.median(r[0] for r in rows):>14.2f} "
          f"{statistics.median(r[1] for r in rows):>9.2f} {median:>9.2f} "
          f"{images / median:>10,.0f}")
    print(f"TensorFlow import (fresh process, median of {len(imports)}): "
          f"{statistics.median(imports):.2f} s; making the sample data: {make_seconds:.2f} s")
    met = median * 60_000 / images <= 5
    print(f"target <= 5 s for 60,000 images: {'met' if met else 'MISSED'}")


if __name__ == "__main__":
    main()
