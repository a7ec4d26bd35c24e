"""A custom ``model_fn`` trained by ``tf.estimator.train_and_evaluate`` on a cluster that
``TF_CONFIG`` describes: a chief, a worker and a parameter server that holds the variables,
and an evaluator beside them, as estimator code ran on TensorFlow 2.15, here on any
TensorFlow from 2.15 to 2.21.

Each task is this script with its own ``TF_CONFIG`` (on Kubernetes, one pod each; the job dir
on storage every task sees):

    TF_CONFIG='{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"],
                "ps": ["host2:2222"]}, "task": {"type": "worker", "index": 0}}' \\
        python custom_model_fn_cluster.py --model-dir /shared/job

``--local-cluster`` starts the four tasks on this machine (ports of 127.0.0.1), waits for the
chief, the worker and the evaluator to end, then stops the parameter server, which serves
until it is stopped (the estimator's parameter servers never end by themselves). The model is
a small softmax regression on synthetic data: the point is the cluster.
"""

import argparse
import json
import os
import socket
import subprocess
import sys

import tf_estimator_compat

tf_estimator_compat.install()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

FEATURES, CLASSES = 8, 3


def data(seed: int, rows: int = 1024):
    """Points whose class is the largest of three fixed linear scores: learnable, seeded."""
    weights = np.random.default_rng(0).normal(size=(FEATURES, CLASSES)).astype(np.float32)
    x = np.random.default_rng(seed).normal(size=(rows, FEATURES)).astype(np.float32)
    return x, np.argmax(x @ weights, axis=1).astype(np.int32)


def input_fn(seed: int, train: bool):
    x, y = data(seed)
    dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, y))
    return (dataset.shuffle(1024, seed=seed).repeat() if train else dataset).batch(32)


def model_fn(features, labels, mode, params):
    # Graph-mode code, as a model_fn is: tf.compat.v1 names.
    weights = tf.compat.v1.get_variable("weights", [FEATURES, CLASSES],
                                        initializer=tf.compat.v1.zeros_initializer())
    bias = tf.compat.v1.get_variable("bias", [CLASSES],
                                     initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(features["x"], weights) + bias
    classes = tf.argmax(logits, axis=1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"class": classes})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    accuracy = tf.compat.v1.metrics.accuracy(labels, classes)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(params["learning_rate"]).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      eval_metric_ops={"accuracy": accuracy})


def run_task(model_dir: str, steps: int) -> None:
    """This process's task of the cluster in TF_CONFIG (or a single process without one)."""
    config = tf.estimator.RunConfig(model_dir=model_dir, save_checkpoints_steps=50)
    estimator = tf.estimator.Estimator(model_fn, config=config,
                                       params={"learning_rate": 0.5})
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    seed = 1 + int(task.get("index", 0)) + (10 if task.get("type") == "worker" else 0)
    tf.estimator.train_and_evaluate(
        estimator,
        tf.estimator.TrainSpec(lambda: input_fn(seed, True), max_steps=steps),
        tf.estimator.EvalSpec(lambda: input_fn(99, False), steps=None, start_delay_secs=0,
                              throttle_secs=1))
    if task.get("type") in (None, "chief", "evaluator"):
        result = estimator.evaluate(lambda: input_fn(99, False))
        print(f"{task.get('type', 'local')}: accuracy {result['accuracy']:.4f} at step "
              f"{result['global_step']}", flush=True)


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now (the OS hands out ephemeral ports in
    turn, so three calls give three ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_cluster(model_dir: str, steps: int) -> int:
    chief, worker, ps = (f"127.0.0.1:{free_port()}" for _ in range(3))
    cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
    tasks = {}
    for kind in ("ps", "chief", "worker", "evaluator"):
        env = {**os.environ, "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": kind, "index": 0}})}
        tasks[kind] = subprocess.Popen(
            [sys.executable, __file__, "--model-dir", model_dir, "--steps", str(steps)],
            env=env)
    status = 0
    for kind in ("chief", "worker", "evaluator"):
        code = tasks[kind].wait()
        print(f"{kind}: exit status {code}", flush=True)
        status = status or code
    tasks["ps"].terminate()
    tasks["ps"].wait()
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--local-cluster", action="store_true",
                        help="start the four tasks on this machine")
    args = parser.parse_args()
    if args.local_cluster:
        return local_cluster(args.model_dir, args.steps)
    run_task(args.model_dir, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
