"""The main job on the built-in sample data: ``python -m cifar10_estimator.demo``.

Makes the synthetic sample dataset and its TFRecords (unless already there), trains a ResNet-20
on the CPU, evaluates it, exports the SavedModel and classifies a few held-out images written
as PNG files, the way a user would with their own pictures. Every step is the public command
line of the package, so the demo shows exactly what a user would type.

The schedule is compressed for a few minutes on two cores: the tutorial's learning-rate drops
at epochs 82/123/300 assume hundreds of epochs, so the demo drops at epochs 14 and 20 of ~24.
"""

import argparse
import os
import sys
from typing import Optional, Sequence

from cifar10_estimator.errors import UserError, run_cli


def _step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def write_example_images(data_dir: str, out_dir: str, count: int) -> list[str]:
    """Writes the first ``count`` eval records as PNG files named by label; returns the paths."""
    import tensorflow as tf

    from cifar10_estimator import cifar10, dataset, fsutil

    os.makedirs(out_dir, exist_ok=True)
    names = cifar10.label_names(data_dir)
    records = tf.data.TFRecordDataset(cifar10.record_path(data_dir, "eval")).take(count)
    paths = []
    for serialized in records.batch(count):
        images, labels = dataset.parse_batch(serialized)
        for j, (image, label) in enumerate(zip(images, labels.numpy())):
            path = os.path.join(out_dir, f"eval{j:02d}_{names[label]}.png")
            fsutil.write_bytes_atomic(path, tf.io.encode_png(image).numpy())
            paths.append(path)
    return paths


def _run(argv: Optional[Sequence[str]]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cifar10_estimator.demo",
        description="Sample data -> TFRecords -> train ResNet-20 -> evaluate -> export -> "
                    "classify, on the CPU in a few minutes.")
    parser.add_argument("--work-dir", default="demo-run",
                        help="folder for data, checkpoints and the export (default: demo-run)")
    parser.add_argument("--train-steps", type=int, default=1500,
                        help="training steps at batch 128 (default 1500)")
    parser.add_argument("--sample-size", type=int, default=2000,
                        help="sample images per CIFAR batch file (default 2000)")
    args = parser.parse_args(argv)
    if args.train_steps < 1:
        raise UserError(f"--train-steps must be 1 or more, got {args.train_steps}")
    data_dir = os.path.join(args.work_dir, "data")
    job_dir = os.path.join(args.work_dir, "job")

    from cifar10_estimator import cifar10, generate, main, predict

    _step("1. sample data and TFRecords")
    if all(os.path.exists(cifar10.record_path(data_dir, s)) for s in cifar10.SPLITS):
        print(f"records already in {data_dir}")
    else:
        status = generate.main(["--data-dir", data_dir, "--sample",
                                "--sample-size", str(args.sample_size)])
        if status:
            return status

    _step("2. train ResNet-20 on the CPU, evaluate, export")
    train_flags = ["--data-dir", data_dir, "--job-dir", job_dir, "--num-layers", "20",
                   "--train-steps", str(args.train_steps), "--train-batch-size", "128",
                   "--eval-batch-size", "250", "--lr-boundary-epochs", "14,20",
                   "--lr-decay-factors", "1,0.1,0.01", "--save-checkpoints-steps", "500",
                   "--eval-throttle-secs", "60", "--seed", "1"]
    print("python -m cifar10_estimator " + " ".join(train_flags), flush=True)
    result = main.run(train_flags)
    accuracy = result.eval_metrics["accuracy"] if result.eval_metrics else float("nan")

    _step("3. classify a few held-out images with the SavedModel")
    export_dir = os.path.join(job_dir, "export")
    versions = sorted((v for v in os.listdir(export_dir) if v.isdigit()), key=int)
    saved_model = os.path.join(export_dir, versions[-1])
    images = write_example_images(data_dir, os.path.join(args.work_dir, "images"), 5)
    print("python -m cifar10_estimator.predict --saved-model " + saved_model + " " +
          " ".join(images), flush=True)
    status = predict.main(["--saved-model", saved_model, *images])
    print(f"\neval accuracy of ResNet-20 after {args.train_steps} steps: {accuracy:.2%} "
          f"(SavedModel: {saved_model})")
    return status


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    return run_cli(lambda: _run(argv), "demo")


if __name__ == "__main__":
    sys.exit(main())
