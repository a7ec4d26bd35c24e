"""Keras peer for the training-throughput comparison: our ResNet trained with ``model.fit``.

Builds the network of ``cifar10_estimator/model/resnet.py`` (ResNet v1 for CIFAR-10, He et al.
2015, arXiv:1512.03385, section 4.2) as a ``tf.keras`` functional model, trains it with the
package's optimizer settings on synthetic images held in memory, and reports the steady-state
training rate: the steps after a warm-up (graph tracing, Grappler, oneDNN primitive creation)
timed for ``--seconds``. There is no input pipeline to speak of and no augmentation, so this is
what Keras' own training loop gets out of the machine for the same model, the yardstick that
``train_throughput.py`` holds our trainer against.

The first line printed is the machine (``machine.py``); the last is one JSON object with
``images_per_sec``, ``depth``, ``precision`` and ``params`` (the trainable parameter count,
checked against ours before anything is timed).

    python benchmarks/keras_resnet.py --depth 20 --seconds 20
    python benchmarks/keras_resnet.py --depth 44 --precision bf16 --jit

``build_resnet`` is also what ``serving_bench.py`` serves, so the Keras network exists once in
benchmarks/. Importing this module neither imports TensorFlow nor touches the environment.
"""

import argparse
import json
import os
import sys
import time

from machine import print_machine_line

from cifar10_estimator.errors import UserError, run_cli
from cifar10_estimator.config import settings as params
from cifar10_estimator.data import schema
from cifar10_estimator.platform import cpu
from cifar10_estimator.platform.precision import resolve_precision

# Stem, then stages 1-3 (He et al. 2015, section 4.2: 16, 32, 64 filters on 32x32, 16x16, 8x8
# feature maps; the first block of stages 2 and 3 halves the map with a stride of 2).
STEM_FILTERS = 16
STAGES = ((16, 1), (32, 2), (64, 2))
# The package's defaults (config/settings.py's ModelSection and ScheduleSection), which are the
# TensorFlow CIFAR-10 estimator tutorial's: batch-norm decay and epsilon, L2 coefficient on
# 0.5 * ||w||^2, SGD momentum and the learning rate of the first phase of the schedule. Batch
# 128, momentum 0.9 and learning rate 0.1 are also the paper's (section 4.2).
BN_MOMENTUM = 0.997
BN_EPSILON = 1e-5
WEIGHT_DECAY = 2e-4
MOMENTUM = 0.9
LEARNING_RATE = 0.1
BATCH_SIZE = 128
NUM_CLASSES = 10
# Keras dtype policies for --precision: bf16 keeps float32 variables and casts them to bfloat16
# for the convolutions, as our --precision bf16 does.
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16"}


def blocks_per_stage(depth: int) -> int:
    """n for a ResNet of depth 6n+2 (the package's rule); UserError naming --depth else."""
    try:
        return params.blocks_per_stage(depth)
    except ValueError as e:
        raise UserError(f"--depth: {e}") from None


def expected_params(depth: int) -> int:
    """Trainable parameters of our ResNet at ``depth``, counted from the layer shapes alone.

    3x3 kernels without bias, gamma and beta per batch norm, a dense layer with bias; option-A
    shortcuts have no parameters. This is independent of any framework, so it catches a Keras
    model that drifts from ours: 269,722 for ResNet-20 and 658,586 for ResNet-44, the counts
    resnet.py's docstring gives.
    """
    n = blocks_per_stage(depth)
    total = 3 * 3 * 3 * STEM_FILTERS + 2 * STEM_FILTERS
    channels = STEM_FILTERS
    for filters, _ in STAGES:
        for _ in range(n):
            # Two 3x3 convolutions, and two batch norms with gamma and beta each.
            total += 3 * 3 * channels * filters + 3 * 3 * filters * filters + 2 * 2 * filters
            channels = filters
    return total + channels * NUM_CLASSES + NUM_CLASSES


def check_precision(precision: str, *, onednn: bool) -> None:
    """Refuses bf16 where our trainer refuses it (``training.precision``): without native
    bfloat16 instructions, as oneDNN sees the CPU, or without oneDNN."""
    if precision == "bf16":
        info = cpu.read_cpu_info().as_seen_by_onednn(os.environ.get(cpu.ONEDNN_CAP_ENV))
        resolve_precision("bf16", info, onednn=onednn)


def build_resnet(depth: int, *, precision: str = "fp32", input_dtype: str = "uint8",
                 probabilities: bool = False, weight_decay: float = 0.0):
    """Our ResNet v1 as a Keras functional model: images 0..255 in, logits (or softmax) out.

    Layer names follow the variable scopes of our builder with ``.`` for ``/`` (``stem``,
    ``stem_bn``, ``stage2.block0.conv1``, ``stage2.block0.bn1``, ``dense``), so a checkpoint of
    ours maps onto the layers by name. Batch norm follows Keras' training flag: batch statistics
    in ``fit``, the moving averages in ``predict`` or when called with ``training=False``.

    Args:
      depth: 6n+2.
      precision: 'fp32' or 'bf16' (the ``mixed_bfloat16`` policy for everything between the
        input scaling and the pooling; those two and the dense layer stay float32, as in ours).
      input_dtype: dtype of the image input; uint8 for training on raw pixels, float32 for
        serving code that feeds float images.
      probabilities: end with a softmax (the SavedModel's ``probabilities``) instead of logits.
      weight_decay: adds weight_decay * l2_loss(w) for every trainable weight to the loss, as
        our model_fn does: batch-norm gamma and beta and the dense bias included. ``l2_loss`` is
        half the squared norm, so each weight gets Keras' ``L2(weight_decay / 2)``. Through
        the layers' regularizers, which Keras 2 (TF 2.15) and Keras 3 (TF 2.16 on) both take
        (Keras 3's functional models have no ``add_loss``); Keras computes them from the
        float32 weights under ``mixed_bfloat16`` too.
    """
    import tensorflow as tf

    n = blocks_per_stage(depth)
    layers = tf.keras.layers
    policy = POLICIES[precision]
    decay = tf.keras.regularizers.L2(weight_decay / 2) if weight_decay else None

    def he_init():
        # He et al. 2015 ("Delving Deep into Rectifiers", arXiv:1502.01852) initialisation,
        # drawn from a truncated normal as resnet.py does: variance 2 / fan_in. A new instance
        # per layer: one unseeded instance shared by layers gives them all the same values.
        return tf.keras.initializers.VarianceScaling(2.0, "fan_in", "truncated_normal")

    def conv_bn(x, filters, stride, conv_name, bn_name):
        if stride > 1:
            # As resnet.py: pad one pixel on every side and convolve VALID. Keras' "same" at
            # stride 2 pads only the bottom and right of an even-sized map.
            x = layers.ZeroPadding2D(1, dtype=policy, name=f"{conv_name}.pad")(x)
        x = layers.Conv2D(filters, 3, stride, "valid" if stride > 1 else "same", use_bias=False,
                          kernel_initializer=he_init(), kernel_regularizer=decay, dtype=policy,
                          name=conv_name)(x)
        return layers.BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, dtype=policy,
                                         gamma_regularizer=decay, beta_regularizer=decay,
                                         name=bn_name)(x)

    def shortcut(x, filters, stride, name):
        # Option A (He et al. 2015, section 3.3): no parameters. Average-pool by the stride,
        # then zero-pad the new channels, half before and half after the existing ones.
        if stride > 1:
            x = layers.AveragePooling2D(stride, stride, "valid", dtype=policy,
                                        name=f"{name}.pool")(x)
        extra = filters - x.shape[-1]
        if extra:
            pads = [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]]
            x = layers.Lambda(lambda t: tf.pad(t, pads), dtype=policy, name=f"{name}.pad")(x)
        return x

    images = tf.keras.Input((32, 32, 3), dtype=input_dtype, name="images")
    # 0..255 to [-1, 1): x / 128 - 1, in float32 before the cast to the compute dtype.
    x = layers.Rescaling(1 / 128.0, offset=-1.0, dtype="float32", name="scale")(images)
    x = layers.ReLU(dtype=policy, name="stem_relu")(
        conv_bn(x, STEM_FILTERS, 1, "stem", "stem_bn"))
    for stage, (filters, first_stride) in enumerate(STAGES, start=1):
        for i in range(n):
            name = f"stage{stage}.block{i}"
            stride = first_stride if i == 0 else 1
            y = conv_bn(x, filters, stride, f"{name}.conv1", f"{name}.bn1")
            y = layers.ReLU(dtype=policy, name=f"{name}.relu1")(y)
            y = conv_bn(y, filters, 1, f"{name}.conv2", f"{name}.bn2")
            y = layers.Add(dtype=policy, name=f"{name}.add")(
                [y, shortcut(x, filters, stride, f"{name}.shortcut")])
            x = layers.ReLU(dtype=policy, name=f"{name}.relu2")(y)
    x = layers.GlobalAveragePooling2D(dtype="float32", name="pool")(x)
    outputs = layers.Dense(NUM_CLASSES, activation="softmax" if probabilities else None,
                           kernel_regularizer=decay, bias_regularizer=decay, dtype="float32",
                           name="dense")(x)
    return tf.keras.Model(images, outputs, name=f"resnet{depth}")


def keras_version() -> str:
    """The release of the Keras that ``tf.keras`` is: the ``keras`` distribution (Keras 2 with
    TF 2.15, Keras 3 from 2.16) or ``tf-keras`` (under ``TF_USE_LEGACY_KERAS=1``)."""
    import importlib.metadata

    import tensorflow as tf

    distribution = tf.keras.__name__.split(".")[0].replace("_", "-")
    return f"{distribution} {importlib.metadata.version(distribution)}"


def trainable_params(model) -> int:
    return sum(int(w.shape.num_elements()) for w in model.trainable_weights)


def _stopwatch(warmup_steps: int, seconds: float, min_steps: int):
    """A callback that starts its clock at the end of step ``warmup_steps`` and stops training
    once ``seconds`` have passed and at least ``min_steps`` steps were timed."""
    import tensorflow as tf

    class Stopwatch(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.steps_done = 0
            self.started = None
            self.timed_steps = 0
            self.elapsed = 0.0

        def on_train_batch_end(self, batch, logs=None):
            # A step's tf.function call returns once the step has run (eager execution is
            # synchronous on the CPU), so this clock reads finished steps.
            now = time.perf_counter()
            self.steps_done += 1
            if self.steps_done == warmup_steps:
                self.started = now
            elif self.started is not None:
                self.timed_steps = self.steps_done - warmup_steps
                self.elapsed = now - self.started
                if self.elapsed >= seconds and self.timed_steps >= min_steps:
                    self.model.stop_training = True

    return Stopwatch()


def synthetic_batches(batch_size: int, num_batches: int, seed: int = 0):
    """A dataset cycling over ``num_batches`` fixed batches of random uint8 images and labels."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (num_batches, batch_size, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, NUM_CLASSES, (num_batches, batch_size), dtype=np.int32)
    # Already batched, so the only per-step input work is handing over a tensor.
    return tf.data.Dataset.from_tensor_slices((images, labels)).repeat().prefetch(2)


def record_batches(data_dir: str, batch_size: int, seed: int = 0):
    """``DATA_DIR/train.tfrecords`` as a Keras user feeds ``model.fit``: shuffled and repeated,
    parsed and augmented one picture at a time with ``tf.image`` ops, batched and prefetched,
    ``tf.data.AUTOTUNE`` choosing the parallelism (the tf.data performance guide's pattern).

    The augmentation is ours (``data.pipeline``'s ``pad-crop-flip``, He et al. 2015, section
    4.2): 4 pixels of zeros on every side, a random 32x32 window, a left-right flip with
    probability 1/2. Images stay uint8 until the model's rescaling, as in ours.
    """
    import tensorflow as tf

    from cifar10_estimator.data import pipeline

    def parse_and_augment(serialized):
        features = tf.io.parse_single_example(serialized, schema.FEATURE_SPEC)
        image = schema.decode_images(features["image"])
        size = schema.HEIGHT + 2 * pipeline.PAD
        image = tf.image.resize_with_crop_or_pad(image, size, size)
        image = tf.image.random_crop(image, [schema.HEIGHT, schema.WIDTH, schema.CHANNELS])
        image = tf.image.random_flip_left_right(image)
        return image, tf.cast(features["label"], tf.int32)

    path = schema.record_path(data_dir, "train")
    records = tf.data.TFRecordDataset(path)
    count = sum(1 for _ in records)  # the whole file in the shuffle buffer, as ours has it
    return (records.shuffle(count, seed=seed, reshuffle_each_iteration=True).repeat()
            .map(parse_and_augment, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))


def peer_parser(description: str) -> argparse.ArgumentParser:
    """The flags every peer takes: depth, batch size, timed seconds, warm-up steps."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--depth", type=int, default=20, help="6n+2 (default 20)")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="timed seconds of steady state, after the warm-up")
    parser.add_argument("--warmup-steps", type=int, default=10,
                        help="first steps left out of the timing (the first traces the graph)")
    return parser


def main() -> int:
    parser = peer_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=tuple(POLICIES), default="fp32")
    parser.add_argument("--jit", action="store_true", help="compile the train step with XLA")
    parser.add_argument("--data-dir",
                        help="train on DATA_DIR/train.tfrecords, augmented as ours is, through "
                             "tf.data (end to end); default: fixed in-memory batches, no "
                             "augmentation (the bare step)")
    args = parser.parse_args()
    if args.warmup_steps < 1 or args.batch_size < 1 or args.seconds <= 0:
        raise UserError("--warmup-steps and --batch-size must be 1 or more, --seconds above 0")
    if args.data_dir and not os.path.isfile(schema.record_path(args.data_dir, "train")):
        raise UserError(f"--data-dir: no train.tfrecords in {args.data_dir!r}; make the "
                        "records with tools/generate_tfrecords.py --data-dir DIR (--sample "
                        "for sample data)")
    expected = expected_params(args.depth)

    # Before TensorFlow loads, as our command lines do (cpu.py says why).
    cpu.prefer_onednn(os.environ)
    print_machine_line()
    import tensorflow as tf

    check_precision(args.precision, onednn=cpu.onednn_enabled())

    model = build_resnet(args.depth, precision=args.precision, weight_decay=WEIGHT_DECAY)
    params = trainable_params(model)
    print(f"ResNet-{args.depth}: {params:,} trainable parameters (ours: {expected:,})",
          flush=True)
    if params != expected:
        raise SystemExit(f"the Keras model has drifted from ours: {params:,} trainable "
                         f"parameters, ours has {expected:,}")
    model.compile(optimizer=tf.keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=args.jit)

    stopwatch = _stopwatch(args.warmup_steps, args.seconds, min_steps=5)
    batches = (record_batches(args.data_dir, args.batch_size) if args.data_dir
               else synthetic_batches(args.batch_size, num_batches=16))
    model.fit(batches, epochs=1,
              steps_per_epoch=10**9, verbose=0, callbacks=[stopwatch])
    images_per_sec = stopwatch.timed_steps * args.batch_size / stopwatch.elapsed
    print(json.dumps({"images_per_sec": round(images_per_sec, 1), "depth": args.depth,
                      "precision": args.precision, "params": params,
                      "batch_size": args.batch_size, "jit": args.jit,
                      "input": "tfrecords" if args.data_dir else "in-memory",
                      "keras": keras_version(), "tensorflow": tf.__version__,
                      "timed_steps": stopwatch.timed_steps,
                      "timed_seconds": round(stopwatch.elapsed, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "keras_resnet.py"))
