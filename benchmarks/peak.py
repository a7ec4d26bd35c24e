"""The limit: this CPU's measured rate for the convolutions ResNet-20 runs, and for a large
matmul, in fp32 and bf16, and the training step's rate as a share of it.

A training step of the CIFAR ResNet (He et al. 2015, arXiv:1512.03385, section 4.2) is almost
all 3x3 convolutions: each runs forward, backward to its input (all but the stem, whose input
is the picture) and backward to its filter, each of the three the same multiply-adds. This
script times each distinct convolution shape of the network at the training batch, alone, as
TensorFlow runs it (oneDNN's kernels, in a ``tf.function``), and a large square matmul, the
practical ceiling of the CPU's arithmetic. From the shapes' rates it computes the **convolution
ceiling**: the images/s of a step that did nothing but its convolutions, each at its measured
standalone rate. ``--images-per-sec`` (a step's measured rate, e.g. from
``train_throughput.py``'s bare-step column) prints that rate as a share of the ceiling and of
the matmul peak.

Each call runs ``CALLS_PER_BATCH`` copies of the operation on distinct inputs (so nothing is
merged and the call's own overhead is spread), and its rate is the median over ``--rounds``
alternating rounds (every shape and precision once per round).

    python benchmarks/peak.py --depth 20 --batch-size 128
    python benchmarks/peak.py --images-per-sec fp32=700,bf16=1050
"""

import argparse
import json
import os
import statistics
import sys
import time

from machine import print_machine_line

from keras_resnet import STAGES, STEM_FILTERS  # the network's filters and strides, once

from cifar10_estimator.config.plan import DTYPES
from cifar10_estimator.config.settings import blocks_per_stage
from cifar10_estimator.data.schema import CHANNELS, HEIGHT
from cifar10_estimator.logs import import_tensorflow_quietly
from cifar10_estimator.platform import cpu

KERNEL = 3  # every convolution of the network is 3x3 (He et al. 2015, section 4.2)
# Distinct inputs per timed call: enough that a 0.3 ms convolution outweighs the ~50 us a
# tf.function call costs, few enough to stay in the L3 cache of these CPUs with the outputs.
CALLS_PER_BATCH = 4
MATMUL = 4096  # the large matmul's side: 137 GFLOP a call, far past any cache


def conv_shapes(depth: int) -> list[dict]:
    """The network's distinct convolutions, each with how often a step runs it.

    A stride-2 convolution pads one pixel on every side and convolves VALID, as resnet.py does,
    so its input here is the padded map. ``backprop_input`` is False for the stem: nothing
    needs the gradient of the picture.
    """
    n = blocks_per_stage(depth)
    shapes = [dict(name="stem", size=HEIGHT, cin=CHANNELS, cout=STEM_FILTERS, stride=1,
                   count=1, backprop_input=False)]
    size, cin = HEIGHT, STEM_FILTERS
    for stage, (cout, stride) in enumerate(STAGES, start=1):
        repeats = 2 * n
        if stride > 1:
            shapes.append(dict(name=f"stage{stage} first", size=size, cin=cin, cout=cout,
                               stride=stride, count=1, backprop_input=True))
            size //= stride
            repeats -= 1
        shapes.append(dict(name=f"stage{stage}", size=size, cin=cout, cout=cout, stride=1,
                           count=repeats, backprop_input=True))
        cin = cout
    return shapes


def conv_flops(shape: dict, batch: int) -> float:
    """FLOPs (2 x multiply-adds) of one pass of the convolution over the batch."""
    out = shape["size"] // shape["stride"]
    return 2.0 * batch * out * out * shape["cout"] * KERNEL * KERNEL * shape["cin"]


def _conv_calls(shape: dict, batch: int, dtype: str):
    """tf.functions for the forward and the two backward passes of ``shape`` in ``dtype``."""
    import tensorflow as tf

    rng = tf.random.Generator.from_seed(0)
    stride = shape["stride"]
    pad = 1 if stride > 1 else 0
    size_in = shape["size"] + 2 * pad
    size_out = shape["size"] // stride
    padding = "VALID" if stride > 1 else "SAME"
    in_shape = [batch, size_in, size_in, shape["cin"]]
    filter_shape = [KERNEL, KERNEL, shape["cin"], shape["cout"]]
    out_shape = [batch, size_out, size_out, shape["cout"]]

    def tensors(dims):
        return [tf.cast(rng.normal(dims), dtype) for _ in range(CALLS_PER_BATCH)]

    inputs, filters, grads = tensors(in_shape), tensors(filter_shape), tensors(out_shape)

    def one_element_each(results):
        # One element of each result: the ops must run, and the call returns almost nothing.
        return tf.add_n([tf.cast(r[(0,) * r.shape.rank], tf.float32) for r in results])

    @tf.function
    def forward():
        return one_element_each([tf.nn.conv2d(x, w, stride, padding)
                                 for x, w in zip(inputs, filters)])

    @tf.function
    def backprop_input():
        return one_element_each([tf.nn.conv2d_transpose(g, w, in_shape, stride, padding)
                                 for g, w in zip(grads, filters)])

    @tf.function
    def backprop_filter():
        return one_element_each([tf.compat.v1.nn.conv2d_backprop_filter(
            x, filter_shape, g, [1, stride, stride, 1], padding)
            for x, g in zip(inputs, grads)])

    calls = {"forward": forward, "backprop filter": backprop_filter}
    if shape["backprop_input"]:
        calls["backprop input"] = backprop_input
    return calls


def _matmul_call(dtype: str):
    import tensorflow as tf

    rng = tf.random.Generator.from_seed(1)
    a = tf.cast(rng.normal([MATMUL, MATMUL]), dtype)
    b = tf.cast(rng.normal([MATMUL, MATMUL]), dtype)

    @tf.function
    def matmul():
        return tf.cast(tf.linalg.matmul(a, b)[0, 0], tf.float32)

    return matmul


def _rate(call, flops: float, seconds: float) -> float:
    """GFLOP/s of ``call`` over ``seconds`` (at least 3 calls), after one untimed call."""
    call().numpy()
    calls, started = 0, time.perf_counter()
    while True:
        call().numpy()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds and calls >= 3:
            return flops * calls / elapsed / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per call kind")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16" if cpu.read_cpu_info()
                        .as_seen_by_onednn(os.environ.get(cpu.ONEDNN_CAP_ENV)).native_bf16
                        else "fp32")
    parser.add_argument("--images-per-sec", default="",
                        help="a step's measured rate per precision, e.g. fp32=700,bf16=1050: "
                             "printed as a share of the ceiling and of the matmul peak")
    args = parser.parse_args()
    precisions = args.precisions.split(",")
    if set(precisions) - set(DTYPES):
        parser.error(f"--precisions: fp32, bf16 or both, got {args.precisions!r}")
    try:
        measured = {p: float(v) for p, v in
                    (item.split("=") for item in args.images_per_sec.split(",") if item)}
    except ValueError:
        parser.error(f"--images-per-sec: PRECISION=IMAGES_PER_SEC pairs, got "
                     f"{args.images_per_sec!r}")
    cpu.prefer_onednn(os.environ)  # before TensorFlow loads, as the commands do
    print_machine_line()
    import_tensorflow_quietly()
    import tensorflow as tf

    shapes = conv_shapes(args.depth)
    calls, flops = {}, {}
    for p in precisions:
        for shape in shapes:
            per_batch = conv_flops(shape, args.batch_size) * CALLS_PER_BATCH
            for kind, call in _conv_calls(shape, args.batch_size, DTYPES[p]).items():
                calls[shape["name"], kind, p] = call
                flops[shape["name"], kind, p] = per_batch
        calls["matmul", "", p] = _matmul_call(DTYPES[p])
        flops["matmul", "", p] = 2.0 * MATMUL ** 3
    rates = {key: [] for key in calls}
    for _ in range(args.rounds):
        for key, call in calls.items():
            rates[key].append(_rate(call, flops[key], args.seconds))
    gflops = {key: statistics.median(values) for key, values in rates.items()}

    print(f"\nResNet-{args.depth} convolutions at batch {args.batch_size}, GFLOP/s (TensorFlow "
          f"{tf.__version__}, medians of {args.rounds} rounds):")
    header = f"{'convolution':<14} {'input':>10} {'out':>4} {'per step':>8}"
    for p in precisions:
        header += "".join(f" {p + ' ' + kind.split()[-1]:>14}"
                          for kind in ("forward", "backprop input", "backprop filter"))
    print(header)
    for shape in shapes:
        size = f"{shape['size']}x{shape['size']}x{shape['cin']}"
        line = f"{shape['name']:<14} {size:>10} {shape['cout']:>4} {shape['count']:>8}"
        for p in precisions:
            for kind in ("forward", "backprop input", "backprop filter"):
                value = gflops.get((shape["name"], kind, p))
                line += f" {value:>14,.0f}" if value else f" {'-':>14}"
        print(line)
    summary = {"depth": args.depth, "batch_size": args.batch_size,
               "tensorflow": tf.__version__, "cpu": cpu.read_cpu_info().describe()}
    for p in precisions:
        # Seconds a step's convolutions take at their standalone rates, then images/s.
        step_flops = step_secs = 0.0
        for shape in shapes:
            for kind in ("forward", "backprop input", "backprop filter"):
                if (shape["name"], kind, p) in gflops:
                    one = conv_flops(shape, args.batch_size) * shape["count"]
                    step_flops += one
                    step_secs += one / (gflops[shape["name"], kind, p] * 1e9)
        ceiling = args.batch_size / step_secs
        matmul = gflops["matmul", "", p]
        line = (f"{p}: matmul {MATMUL}x{MATMUL} {matmul:,.0f} GFLOP/s; the convolutions "
                f"{step_flops / args.batch_size / 1e6:,.1f} MFLOP an image, at "
                f"{step_flops / step_secs / 1e9:,.0f} GFLOP/s: a ceiling of {ceiling:,.0f} "
                f"images/s ({args.batch_size * matmul * 1e9 / step_flops:,.0f} at the "
                f"matmul's rate)")
        if p in measured:
            share = measured[p] / ceiling
            line += (f"; {measured[p]:,.0f} images/s measured is {share:.0%} of the ceiling, "
                     f"{measured[p] * step_flops / args.batch_size / 1e9 / matmul:.0%} of the "
                     f"matmul peak")
        print(line)
        summary[p] = {"matmul_gflops": round(matmul, 1),
                      "conv_gflops": round(step_flops / step_secs / 1e9, 1),
                      "ceiling_images_per_sec": round(ceiling, 1),
                      "conv_mflop_per_image": round(step_flops / args.batch_size / 1e6, 2)}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
