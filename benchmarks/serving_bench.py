"""Serving speed of the SavedModel against the same network as a Keras model, side by side.

Trains a tiny run of the real CLI to get a checkpoint and its export, builds the same ResNet
as a Keras functional model (``keras_resnet.py``'s, the training peer's network), loads the
checkpoint's values into it by variable name and checks that both give the same probabilities.
Then, alternating (A B C ..., the order rotated every run), it measures images/s at batch 1, 32
and 256 and p50/p99 latency at batch 1 through:
- each SavedModel signature as ``tf.saved_model.load`` gives it (``serving_default`` images,
  ``serving_bytes`` PNG files, ``serving_examples`` and ``classify`` records);
- ``serving_default`` run the way TensorFlow Serving runs it (the MetaGraph restored into a
  ``Session``, fed and fetched by the signature's tensor names);
- Keras: ``model.predict`` and a ``tf.function`` call;
- with ``--variants``, also ``serving_default`` of further tiny runs' exports, made with the
  same flags and each variant's (``VARIANTS``): ``mirror`` (each picture and its mirror through
  the network, logits averaged), ``multi-crop`` (six views: the mirror and 1-pixel shifts),
  ``whiten`` (the frozen whitening layer in front): what each costs a served picture.
  ``--test-time-mirror`` is ``--variants mirror``.

    python benchmarks/serving_bench.py --depth 20 --runs 3
    python benchmarks/serving_bench.py --depth 20 --runs 3 --variants mirror,multi-crop,whiten
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from keras_resnet import build_resnet
from machine import print_machine_line
from sample_records import make_sample_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The trainer's flags of each further export (docs/training.md, "The fast trainers' levers").
VARIANTS = {
    "mirror": ("--test-time-mirror", "true"),
    "multi-crop": ("--test-time-mirror", "true", "--test-time-shift", "1"),
    "whiten": ("--whitening-patch", "2"),
}


def train_and_export(depth: int, work: str, data_dir: str, name: str = "job",
                     extra: tuple[str, ...] = ()) -> tuple[str, str]:
    job_dir = os.path.join(work, name)
    proc = subprocess.run([sys.executable, "-m", "cifar10_estimator", "--data-dir", data_dir,
                           "--job-dir", job_dir, "--num-layers", str(depth), "--train-steps",
                           "20", "--eval-throttle-secs", "100000", "--seed", "1", *extra],
                          capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    export_root = os.path.join(job_dir, "export")
    return job_dir, os.path.join(export_root, sorted(os.listdir(export_root))[-1])


def keras_resnet(depth: int, checkpoint: str):
    """Our ResNet v1 as a Keras model (``keras_resnet.build_resnet``, softmax output, float
    images in), with the checkpoint's values loaded by variable name."""
    import tensorflow as tf

    model = build_resnet(depth, input_dtype="float32", probabilities=True)
    reader = tf.train.load_checkpoint(checkpoint)
    for layer in model.layers:
        # Layer "stage1.block0.conv1", weight "kernel": "resnet/stage1/block0/conv1/kernel".
        scope = "resnet/" + layer.name.replace(".", "/")
        layer.set_weights([reader.get_tensor(f"{scope}/{w.name.split('/')[-1].split(':')[0]}")
                           for w in layer.weights])
    return model


def rate(fn, batch: int, seconds: float) -> tuple[float, list[float]]:
    fn()  # warm up (graph optimisation, oneDNN primitives)
    latencies, started = [], time.perf_counter()
    while time.perf_counter() - started < seconds or len(latencies) < 5:
        t = time.perf_counter()
        fn()
        latencies.append(time.perf_counter() - t)
    return batch * len(latencies) / sum(latencies), latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per cell")
    parser.add_argument("--batches", default="1,32,256")
    parser.add_argument("--variants", default="",
                        help=f"also serve exports made with these settings, comma-separated: "
                             f"{', '.join(VARIANTS)}")
    parser.add_argument("--test-time-mirror", action="store_true",
                        help="--variants mirror")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if args.test_time_mirror and "mirror" not in variants:
        variants.append("mirror")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    print_machine_line()
    work = tempfile.mkdtemp(prefix="c10serve.")
    data_dir = make_sample_records(work)
    job_dir, saved_model = train_and_export(args.depth, work, data_dir)
    # The same network, seed and steps; the exported graph is what differs, and its speed
    # does not depend on the weights' values.
    further = {name: train_and_export(args.depth, work, data_dir, f"job-{name}",
                                      VARIANTS[name])[1] for name in variants}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from cifar10_estimator.data import schema

    model = tf.saved_model.load(saved_model)
    further_models = {name: tf.saved_model.load(path) for name, path in further.items()}
    keras = keras_resnet(args.depth, tf.train.latest_checkpoint(job_dir))
    keras_fn = tf.function(lambda x: keras(x, training=False))
    session = tf.compat.v1.Session(graph=tf.Graph())
    with session.graph.as_default():
        signature = tf.compat.v1.saved_model.load(session, ["serve"], saved_model).signature_def[
            "serving_default"]
    feed_name = signature.inputs["images"].name
    fetch_name = signature.outputs["probabilities"].name
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (max(map(int, args.batches.split(","))), 32, 32, 3))
    images = images.astype(np.float32)
    ours = model.signatures["serving_default"](images=tf.constant(images[:8]))["probabilities"]
    np.testing.assert_allclose(keras.predict(images[:8], verbose=0), ours, rtol=1e-3, atol=1e-4)
    print(f"ResNet-{args.depth}: Keras copy gives the SavedModel's probabilities (checked)")

    results: dict[tuple[str, int], list[float]] = {}
    latency: dict[str, list[float]] = {}
    for run in range(args.runs):
        for batch in map(int, args.batches.split(",")):
            x = tf.constant(images[:batch])
            pngs = tf.constant([tf.io.encode_png(img.astype(np.uint8)).numpy()
                                for img in images[:batch]])
            records = tf.constant([schema.encode_example(
                img.astype(np.uint8).transpose(2, 0, 1).tobytes(), 0) for img in images[:batch]])
            cells = {
                "SavedModel serving_default": lambda: model.signatures["serving_default"](
                    images=x)["probabilities"].numpy(),
                "SavedModel serving_default, Session": lambda: session.run(
                    fetch_name, {feed_name: images[:batch]}),
                "SavedModel serving_bytes (PNG)": lambda: model.signatures["serving_bytes"](
                    image_bytes=pngs)["probabilities"].numpy(),
                "SavedModel serving_examples": lambda: model.signatures["serving_examples"](
                    examples=records)["probabilities"].numpy(),
                "SavedModel classify (records)": lambda: model.signatures["classify"](
                    inputs=records)["scores"].numpy(),
                "Keras model.predict": lambda: keras.predict(x, batch_size=batch, verbose=0),
                "Keras tf.function": lambda: keras_fn(x).numpy(),
            }
            for name, other in further_models.items():
                cells[f"SavedModel serving_default, {name}"] = (
                    lambda other=other: other.signatures["serving_default"](
                        images=x)["probabilities"].numpy())
            # Rotate the order every run, so no contender is always first after a batch change.
            order = list(cells.items())
            shift = run % len(order)
            for name, fn in order[shift:] + order[:shift]:
                images_per_sec, lat = rate(fn, batch, args.seconds)
                results.setdefault((name, batch), []).append(images_per_sec)
                if batch == 1:
                    latency.setdefault(name, []).extend(lat)
            print(f"run {run + 1}, batch {batch}: " + ", ".join(
                f"{name} {results[(name, batch)][-1]:,.0f}" for name in cells), flush=True)

    names = sorted({name for name, _ in results}, key=lambda n: (not n.startswith("Saved"), n))
    batches = sorted({b for _, b in results})
    print(f"\nimages/s, median of {args.runs} alternating runs (ResNet-{args.depth}, fp32):")
    print(f"{'':38}" + "".join(f"{'batch ' + str(b):>12}" for b in batches)
          + f"{'p50 ms (b1)':>14}{'p99 ms (b1)':>14}")
    for name in names:
        lat = sorted(latency.get(name, [0.0]))
        p50, p99 = lat[len(lat) // 2] * 1e3, lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3
        print(f"{name:38}" + "".join(f"{statistics.median(results[(name, b)]):>12,.0f}"
                                     for b in batches) + f"{p50:>14.2f}{p99:>14.2f}")


if __name__ == "__main__":
    main()
