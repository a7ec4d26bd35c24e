"""The main job on the built-in sample data: ``python -m cifar10_estimator.demo``.

Makes the synthetic sample dataset and its TFRecords (unless already there), trains a ResNet-20
on the CPU, evaluates it, exports the SavedModel and classifies a few held-out images written
as PNG files, the way a user would with their own pictures; where LiteRT or ONNX Runtime is
installed (the ``litert`` and ``onnx`` extras), it converts the export to an int8 file, gated by
its eval accuracy, and classifies the same pictures with it. Every step is the public command
line of the package, so the demo shows exactly what a user would type.

The run is sized to finish within 5 minutes on the slower kind of machine this project runs on
(2 cores of an AVX2-only AMD Zen 3, ~265 images/s with oneDNN): 400 steps of batch 128 (6.4
epochs of the 8,000 sample training images) reach >= 99 % on the sample data. The tutorial's
learning-rate drops at epochs 82/123/300 assume hundreds of epochs, so the demo drops after 60 %
and 85 % of its run. ``--precision auto`` trains in bf16 on CPUs with native bf16 (~1.6x
faster), else fp32. The wall time of every stage is printed at the end.
"""

import os
import time
from typing import Optional, Sequence

from cifar10_estimator import cli
from cifar10_estimator.config.settings import TUTORIAL_BATCH
from cifar10_estimator.data import sample_data
from cifar10_estimator.errors import UserError, entry_point, run_cli
from cifar10_estimator.platform.process import prepare_process


MODULE = "cifar10_estimator.demo"


class _Stages:
    """Announces each stage and keeps its wall time for the summary at the end."""

    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = []
        self._current: Optional[tuple[str, float]] = None
        self._start = time.monotonic()

    def begin(self, title: str) -> None:
        self.end()
        print(f"\n== {title}", flush=True)
        self._current = (title, time.monotonic())

    def end(self) -> None:
        if self._current:
            title, started = self._current
            self.times.append((title, time.monotonic() - started))
            self._current = None

    def summary(self) -> str:
        self.end()
        width = max(len(title) for title, _ in self.times)
        lines = [f"  {title:<{width}}  {seconds:6.1f} s" for title, seconds in self.times]
        lines.append(f"  {'total':<{width}}  {time.monotonic() - self._start:6.1f} s")
        return "wall time per stage:\n" + "\n".join(lines)


def write_example_images(data_dir: str, out_dir: str, count: int) -> list[str]:
    """Writes the first ``count`` eval records as PNG files named by label; returns the paths."""
    import tensorflow as tf

    from cifar10_estimator import storage
    from cifar10_estimator.data import metadata, pipeline, schema

    os.makedirs(out_dir, exist_ok=True)
    names = metadata.dataset_info(data_dir).class_names
    records = tf.data.TFRecordDataset(schema.record_path(data_dir, "eval")).take(count)
    paths = []
    for serialized in records.batch(count):
        images, labels = pipeline.parse_batch(serialized)
        for j, (image, label) in enumerate(zip(images, labels.numpy())):
            path = os.path.join(out_dir, f"eval{j:02d}_{names[label]}.png")
            storage.write_bytes_atomic(path, tf.io.encode_png(image).numpy())
            paths.append(path)
    return paths


def _run(argv: Optional[Sequence[str]]) -> int:
    parser = cli.Parser(
        MODULE, description="Sample data -> TFRecords -> train ResNet-20 -> evaluate -> export "
                            "-> classify, on the CPU in a few minutes. Run again, it skips what "
                            "is done: the records, and the training once it reached "
                            "--train-steps.")
    parser.add_argument("--work-dir", default="demo-run",
                        help="folder for data, checkpoints and the export")
    parser.add_argument("--train-steps", type=int, default=400,
                        help=f"training steps at batch {TUTORIAL_BATCH}")
    parser.add_argument("--sample-size", type=int, default=sample_data.DEFAULT_IMAGES_PER_BATCH,
                        help="sample images per CIFAR batch file")
    args = parser.parse_args(argv)
    if args.train_steps < 1:
        raise UserError(f"--train-steps must be 1 or more, got {args.train_steps}")
    data_dir = os.path.join(args.work_dir, "data")
    job_dir = os.path.join(args.work_dir, "job")
    prepare_process(os.environ)  # before TensorFlow loads
    stages = _Stages()

    from cifar10_estimator import generate, predict, train
    from cifar10_estimator.data import metadata, schema

    stages.begin("1. sample data and TFRecords")
    if all(os.path.exists(schema.record_path(data_dir, s)) for s in schema.SPLITS):
        print(f"records already in {data_dir}")
    else:
        status = generate.main(["--data-dir", data_dir, "--sample",
                                "--sample-size", str(args.sample_size)])
        if status:
            return status

    stages.begin("2. train ResNet-20 on the CPU, evaluate, export")
    # The rate drops after 60 % and 85 % of the run (the tutorial's drops, at epochs 82 and
    # 123 of its ~228, 80,000 steps of 128 on 45,000 images (config/overlays.py), sit at 36 %
    # and 54 %; a run this short needs a longer first phase).
    epochs = args.train_steps * TUTORIAL_BATCH / metadata.split_size(data_dir, "train")
    boundaries = ",".join(f"{epochs * f:.2f}" for f in (0.6, 0.85))
    train_flags = ["--data-dir", data_dir, "--job-dir", job_dir, "--num-layers", "20",
                   "--train-steps", str(args.train_steps), "--train-batch-size", str(TUTORIAL_BATCH),
                   "--eval-batch-size", "250", "--lr-boundary-epochs", boundaries,
                   "--lr-decay-factors", "1,0.1,0.01", "--save-checkpoints-steps", "500",
                   "--eval-throttle-secs", "60", "--seed", "1", "--precision", "auto"]
    print("python -m cifar10_estimator " + " ".join(train_flags), flush=True)
    # A rerun of a finished demo trains and exports nothing: the trainer reports its result.
    result = train.run(train_flags)
    accuracy = result.eval_metrics["accuracy"] if result.eval_metrics else None
    saved_model = result.export_path

    stages.begin("3. classify a few held-out images with the SavedModel")
    images = write_example_images(data_dir, os.path.join(args.work_dir, "images"), 5)
    print("python -m cifar10_estimator.predict --saved-model " + saved_model + " " +
          " ".join(images), flush=True)
    status = predict.main(["--saved-model", saved_model, *images])
    converted = None
    if not status:
        converted = _int8_file(stages, saved_model, data_dir, images)
    print(f"\n{stages.summary()}")
    shown = "not evaluated" if accuracy is None else f"{accuracy:.2%}"
    print(f"eval accuracy of ResNet-20 after {args.train_steps} steps: {shown} "
          f"(SavedModel: {saved_model})")
    if converted:
        print(converted)
    return status


def _int8_runtime() -> Optional[str]:
    """The int8 format the demo converts to: LiteRT's where its interpreter is installed, else
    ONNX Runtime's where it and tf2onnx are; None without either (the extras install them)."""
    import importlib.util

    from cifar10_estimator.serving import formats

    def installed(*modules: str) -> bool:
        return all(importlib.util.find_spec(m.split(".")[0]) for m in modules)

    if installed(formats.MODULES[formats.LITERT]):
        return "litert-int8"
    if installed(formats.MODULES[formats.ONNX], "tf2onnx"):
        return "onnx-int8"
    return None


def _int8_file(stages: _Stages, saved_model: str, data_dir: str,
               images: list[str]) -> Optional[str]:
    """Stage 4 where a runtime is installed: the export as an int8 file (converted once, gated
    by its eval accuracy), classifying the same pictures; returns the closing line about it."""
    from cifar10_estimator import convert, predict
    from cifar10_estimator.serving import formats

    key = _int8_runtime()
    if key is None:
        print("\n(LiteRT and ONNX Runtime are not installed: pip install -e '.[litert,onnx]' "
              "and the demo also converts its export to an int8 file)")
        return None
    fmt = formats.FORMATS[key]
    stages.begin(f"4. convert the export to {fmt.runtime} int8 and classify the same images")
    path = os.path.join(formats.converted_dir(saved_model), fmt.file_name)
    entry = formats.manifest_entry(path)
    if entry:
        print(f"already converted: {path}")
    else:
        flags = [saved_model, "--data-dir", data_dir, "--formats", key]
        print("python -m cifar10_estimator.convert " + " ".join(flags), flush=True)
        if convert.main(flags):
            return f"{fmt.runtime} int8: not kept (the accuracy gate above says why)"
        entry = formats.manifest_entry(path)
    print(f"python -m cifar10_estimator.predict --model {path} " + " ".join(images), flush=True)
    if predict.main(["--model", path, *images]):
        return None
    return (f"eval accuracy of the {fmt.runtime} int8 file: {entry['accuracy']:.2%}, "
            f"{entry['delta_points']:+.2f} points against the SavedModel, "
            f"{entry['bytes']:,} bytes ({path})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    return run_cli(lambda: _run(argv), MODULE)


command = entry_point(main)  # the console script's and python -m's


if __name__ == "__main__":
    command()
