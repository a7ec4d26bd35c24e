"""Images/s of the input pipeline alone (read, shuffle, parse, augment, batch).

Iterates ``Cifar10DataSet('train', use_distortion=True).make_batch(128)`` over the sample data
with nothing else running and prints the median of several timed passes next to a training
step's consumption (``--consumption``, images/s, from ``train_throughput.py``), so the margin
is visible. The pipeline should outrun training by a wide factor: on two cores every cycle it
spends is taken from the training step. ``--subset eval`` times the evaluation pipeline (one
ordered pass, repeated to ``--batches`` batches per run) instead.

    python benchmarks/input_pipeline_bench.py --batches 400 --runs 5 --consumption 900
    python benchmarks/input_pipeline_bench.py --subset eval --batch-size 100 --runs 5
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

from machine import print_machine_line
from sample_records import make_sample_records


def _eval_with_autotune(data_dir: str, batch_size: int):
    """The evaluation pipeline before autotuning was switched off (for comparison only)."""
    import tensorflow as tf

    from cifar10_estimator.data import schema
    from cifar10_estimator.data.pipeline import parse_batch

    def parse(serialized):
        images, labels = parse_batch(serialized)
        return {"image": tf.cast(images, tf.float32)}, labels

    return (tf.data.TFRecordDataset(schema.record_path(data_dir, "eval"), buffer_size=8 << 20)
            .batch(batch_size).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--consumption", type=float, default=None,
                        help="images/s a training step consumes, for the ratio")
    parser.add_argument("--subset", choices=("train", "eval", "eval-autotune"), default="train",
                        help="eval-autotune: the evaluation pipeline as it was before "
                             "(AUTOTUNE map and prefetch, autotuning on), for comparison")
    args = parser.parse_args()
    print_machine_line()

    work = tempfile.mkdtemp(prefix="c10pipe.")
    data_dir = make_sample_records(work)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from cifar10_estimator.data.pipeline import Cifar10DataSet

    rates = []
    for run in range(args.runs):
        if args.subset.startswith("eval"):
            ds = Cifar10DataSet(data_dir, "eval", use_distortion=False).make_batch(
                args.batch_size)
            if args.subset == "eval-autotune":
                ds = _eval_with_autotune(data_dir, args.batch_size)
            start, images = time.perf_counter(), 0
            while images < args.batches * args.batch_size:
                for features, labels in ds:  # whole passes, as evaluations make
                    images += int(labels.shape[0])
            rates.append(images / (time.perf_counter() - start))
            print(f"run {run + 1}: {rates[-1]:.0f} images/s", file=sys.stderr, flush=True)
            continue
        ds = Cifar10DataSet(data_dir, "train", use_distortion=True).make_batch(args.batch_size)
        iterator = iter(ds)
        for _ in range(20):  # fill the shuffle buffer and warm the parallel map
            next(iterator)
        start = time.perf_counter()
        for _ in range(args.batches):
            features, _ = next(iterator)
        features["image"].numpy()
        rates.append(args.batches * args.batch_size / (time.perf_counter() - start))
        print(f"run {run + 1}: {rates[-1]:.0f} images/s", file=sys.stderr, flush=True)
    median = statistics.median(rates)
    what = {"train": "train, distortion on", "eval": "eval, fixed parallelism",
            "eval-autotune": "eval, AUTOTUNE as before"}[args.subset]
    print(f"\ninput pipeline ({what}, batch {args.batch_size}): "
          f"median {median:,.0f} images/s over {args.runs} runs "
          f"(min {min(rates):,.0f}, max {max(rates):,.0f}); TF {tf.__version__}, "
          f"{os.cpu_count()} cores")
    if args.consumption:
        print(f"a training step consumes {args.consumption:,.0f} images/s: the pipeline is "
              f"{median / args.consumption:.1f}x faster")


if __name__ == "__main__":
    main()
