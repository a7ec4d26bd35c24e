"""One training step, op by op: ours (the package's ``model_fn``) against the same network in
Keras and in PyTorch compiled, with each one's time put into the same categories.

Ours and Keras' run the same way, so only the graphs differ: a TF1 session configured as our
trainer's, one fixed in-memory batch (no input pipeline), fp32 or bf16, momentum SGD with L2 on
every weight. Each runs in its own process (Keras' graph mode needs eager execution off for the
whole process), times ``--steps`` steps after a warm-up, then traces ``--trace-steps`` steps with
TensorFlow's ``RunMetadata`` (``FULL_TRACE``) and sums each op type's time per step: the sum is
of op time across threads, so it can exceed the wall time of the step. ``--torch-python`` adds
``torch_resnet.py --compile`` on in-memory batches, profiled with ``torch.profiler`` (each
event's self time, inductor's fused kernels by name). ``step_categories.py`` maps both onto
convolutions forward and backward, batch norm, element-wise ops, casts and reorders, the
update and the rest. The input pipeline and the hooks are not in a bare step: they are
``train_throughput.py``'s end-to-end column against its bare-step column.

    python benchmarks/step_profile.py --depth 20 --batch-size 128
    python benchmarks/step_profile.py --no-keras --precision bf16 \
        --torch-python /tmp/torch-venv/bin/python     # on TF 2.16+ (Keras 3): ours only
    python benchmarks/step_profile.py --no-keras --precision bf16 --inter-threads 1
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

import step_categories
from machine import print_machine_line

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_PEER = os.path.join(HERE, "torch_resnet.py")
sys.path.insert(0, os.path.dirname(HERE))


def _ours(depth: int, batch: int, precision: str):
    """The train op of the package's model_fn on a fixed batch, as the trainer builds it."""
    import numpy as np
    import tensorflow as tf

    from cifar10_estimator.training.estimator import model_fn
    from cifar10_estimator.config.plan import DTYPES, schedule_of
    from cifar10_estimator.config.settings import ModelSection, ScheduleSection

    settings = model_fn.ModelSettings(ModelSection(num_layers=depth), schedule=schedule_of(
        ScheduleSection(), steps_per_epoch=312, total_steps=80_000, global_batch=128),
        compute_dtype=DTYPES[precision])
    rng = np.random.default_rng(0)
    images = tf.constant(rng.uniform(0, 255, (batch, 32, 32, 3)).astype(np.float32))
    labels = tf.constant(rng.integers(0, 10, batch).astype(np.int32))
    spec = model_fn.make_model_fn(settings)({"image": images}, labels,
                                            tf.estimator.ModeKeys.TRAIN)
    return spec.train_op


def _keras(depth: int, batch: int, precision: str):
    """The same step with the Keras peer's network (benchmarks/keras_resnet.py)."""
    import numpy as np
    import tensorflow as tf

    version = getattr(tf.keras, "version", None)  # Keras 2 of TF 2.15 has none
    if version and int(version().split(".")[0]) >= 3:
        # Keras 3's variables are not TF1 graph variables: compat.v1 optimizers cannot train them.
        raise SystemExit("step_profile.py: the Keras step needs Keras 2 (TensorFlow 2.15, or "
                         "tf_keras with TF_USE_LEGACY_KERAS=1); or profile ours alone with "
                         "--no-keras")
    from keras_resnet import LEARNING_RATE, MOMENTUM, WEIGHT_DECAY, build_resnet

    model = build_resnet(depth, precision=precision, input_dtype="float32")
    rng = np.random.default_rng(0)
    images = tf.constant(rng.uniform(0, 255, (batch, 32, 32, 3)).astype(np.float32))
    labels = tf.constant(rng.integers(0, 10, batch).astype(np.int32))
    logits = model(images, training=True)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True))
    loss += WEIGHT_DECAY * tf.add_n([tf.nn.l2_loss(w) for w in model.trainable_weights])
    step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = tf.compat.v1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM)
    train = optimizer.minimize(loss, global_step=step, var_list=model.trainable_weights)
    return tf.group(train, *model.get_updates_for(images))


def profile(which: str, depth: int, batch: int, steps: int, trace_steps: int,
            precision: str = "fp32", inter_threads: int = 0) -> dict:
    """Images/s and op time per step by op type, for one of the two steps, in the session
    configuration our trainer uses (threads, soft placement); ``inter_threads`` as the
    trainer's ``--num-inter-threads`` (0: TensorFlow's choice)."""
    import tensorflow as tf

    from cifar10_estimator.config.settings import DevicesSection
    from cifar10_estimator.platform.session import session_config

    tf.compat.v1.disable_eager_execution()
    train_op = (_ours if which == "ours" else _keras)(depth, batch, precision)
    config = session_config(DevicesSection(num_inter_threads=inter_threads))
    with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(10):  # graph optimisation and oneDNN's first kernels
            sess.run(train_op)
        started = time.perf_counter()
        for _ in range(steps):
            sess.run(train_op)
        images_per_sec = steps * batch / (time.perf_counter() - started)
        by_type: collections.Counter = collections.Counter()
        nodes = 0
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        for _ in range(trace_steps):
            metadata = tf.compat.v1.RunMetadata()
            sess.run(train_op, options=options, run_metadata=metadata)
            for device in metadata.step_stats.dev_stats:
                for node in device.node_stats:
                    # "name = OpType(inputs)"; a few internal nodes have no label.
                    label = node.timeline_label
                    kind = (label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label
                            else node.node_name)
                    by_type[kind] += node.op_end_rel_micros - node.op_start_rel_micros
                    nodes += 1
    traced = max(trace_steps, 1)
    return {"images_per_sec": images_per_sec, "ops_per_step": nodes / traced,
            "ms_by_type": {k: v / 1000 / traced for k, v in by_type.items()},
            "tensorflow": tf.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30, help="timed steps (after 10 warm-up)")
    parser.add_argument("--trace-steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per step")
    parser.add_argument("--no-keras", action="store_true", help="profile our step alone")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--inter-threads", type=int, default=0,
                        help="TensorFlow's inter-op threads (0: its choice, as the trainer's "
                             "default). 1 runs one op at a time: then each op's time is its "
                             "own, not stretched by the ops running beside it")
    parser.add_argument("--torch-python",
                        help="a Python with torch 2.13: profile PyTorch's compiled step beside "
                             "(torch_resnet.py --compile, torch.profiler)")
    parser.add_argument("--torch-seconds", type=float, default=15,
                        help="timed seconds of the PyTorch step before it is profiled")
    parser.add_argument("--child", choices=("ours", "keras"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        from cifar10_estimator.platform.process import prepare_process

        prepare_process(os.environ)  # before TensorFlow loads: tf.estimator's compat layer
        print(json.dumps(profile(args.child, args.depth, args.batch_size, args.steps,
                                 args.trace_steps, args.precision, args.inter_threads)))
        return
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as the package's commands do
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print_machine_line()
    commands = {which: [sys.executable, __file__, "--child", which, "--depth",
                        str(args.depth), "--batch-size", str(args.batch_size),
                        "--steps", str(args.steps), "--trace-steps", str(args.trace_steps),
                        "--precision", args.precision, "--inter-threads",
                        str(args.inter_threads)]
                for which in (("ours",) if args.no_keras else ("ours", "keras"))}
    if args.torch_python:
        commands["pytorch compiled"] = [
            args.torch_python, TORCH_PEER, "--compile", "--depth", str(args.depth),
            "--batch-size", str(args.batch_size), "--precision", args.precision,
            "--seconds", str(args.torch_seconds), "--profile-steps", str(args.trace_steps)]
    results: dict[str, list[dict]] = {which: [] for which in commands}
    for _ in range(args.rounds):
        for which, command in commands.items():
            out = subprocess.run(command, capture_output=True, text=True)
            if out.returncode:
                sys.exit(out.stderr.strip().splitlines()[-1] if out.stderr.strip()
                         else f"step_profile.py: the {which} step failed")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            result.setdefault("ms_by_type", result.get("ms_by_name", {}))
            results[which].append(result)
    for which, runs in results.items():
        rates = ", ".join(f"{r['images_per_sec']:.0f}" for r in runs)
        ops = (f"{runs[-1]['ops_per_step']:.0f} ops per traced step" if "ops_per_step"
               in runs[-1] else f"{len(runs[-1]['ms_by_type'])} kinds of profiler event")
        print(f"{which} ({args.precision}): {rates} images/s untraced; {ops}")
    last = {which: runs[-1]["ms_by_type"] for which, runs in results.items()}
    print(f"\nWhere a step's time goes, ms per step ({args.precision}, batch "
          f"{args.batch_size}; op time summed, so concurrent ops can exceed the wall time):")
    print(f"{'':<44}" + "".join(f" {which:>18}" for which in last))
    wall = {which: 1000 * args.batch_size / statistics.median(r["images_per_sec"] for r in runs)
            for which, runs in results.items()}
    print(f"{'the step, wall time untraced':<44}" + "".join(f" {wall[w]:18.1f}" for w in last))
    totals = {which: step_categories.by_category(times) for which, times in last.items()}
    for kind in step_categories.CATEGORIES:
        print(f"{kind:<44}" + "".join(f" {totals[w][kind]:18.1f}" for w in last))
    print()
    types = sorted(set().union(*last.values()),
                   key=lambda k: -max(times.get(k, 0) for times in last.values()))
    print(f"{'op type':<32}" + "".join(f" {which + ' ms/step':>14}" for which in last))
    for kind in types[:25]:
        print(f"{kind:<32}" + "".join(f" {times.get(kind, 0.0):14.2f}"
                                      for times in last.values()))
    print(f"{'all ops':<32}" + "".join(f" {sum(times.values()):14.2f}"
                                       for times in last.values()))

if __name__ == "__main__":
    main()
