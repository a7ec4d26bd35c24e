"""Towers: device functions, greedy variable placement, sharding and gradient averaging."""

import numpy as np
import tensorflow as tf

from cifar10_estimator.model import graph as model_graph
from cifar10_estimator.training.estimator import model_fn
from cifar10_estimator.model import towers
from cifar10_estimator.config import plan
from cifar10_estimator.config.settings import DevicesSection, ModelSection, ScheduleSection


def test_tower_devices():
    assert DevicesSection(num_gpus=2).tower_devices == ("/gpu:0", "/gpu:1")
    assert DevicesSection().tower_devices == ("/cpu:0",)
    assert DevicesSection(num_cpu_towers=3).tower_devices == ("/cpu:0", "/cpu:1", "/cpu:2")
    # The logical CPUs the session splits the CPU into: several CPU towers, no GPUs.
    assert DevicesSection(num_cpu_towers=3).logical_cpus == 3
    assert DevicesSection().logical_cpus == DevicesSection(num_gpus=2).logical_cpus == 0


def test_greedy_placement_balances_bytes_from_shape_and_dtype():
    devices = ["/cpu:0", "/cpu:1"]
    with tf.Graph().as_default():
        placed = {}
        setter = towers.make_device_setters(devices, "GPU")[0]
        with tf.compat.v1.device(setter):
            for name, shape, dtype in [("big", [1000], tf.float32), ("a", [10], tf.float32),
                                       ("b", [600], tf.float64), ("c", [100], tf.float32)]:
                v = tf.compat.v1.get_variable(name, shape, dtype)
                placed[name] = v.device
    # big (4000 B) -> cpu:0; a (40 B) -> cpu:1; b (4800 B) -> cpu:1 (40 < 4000);
    # c -> cpu:0 (4000 < 4840). Sizing by the resource handle (0 bytes) would put all on cpu:0.
    assert [placed[k][-5:] for k in ("big", "a", "b", "c")] == ["CPU:0", "CPU:1", "CPU:1",
                                                              "CPU:0"]


def test_device_setter_places_compute_on_the_tower_and_variables_on_the_cpu():
    with tf.Graph().as_default():
        setter = towers.make_device_setters(["/cpu:1"], "CPU")[0]
        with tf.compat.v1.device(setter):
            v = tf.compat.v1.get_variable("w", [2])
            y = v * 2.0
            with tf.compat.v1.device("/cpu:0"):  # an explicit inner device wins
                z = y + 1.0
    assert v.device.endswith("CPU:0") and y.device.endswith("CPU:1")
    assert z.device.endswith("CPU:0")


def test_split_batch_is_contiguous():
    shards = towers.split_batch(tf.range(6), 2)
    assert [s.numpy().tolist() for s in shards] == [[0, 1, 2], [3, 4, 5]]


def test_averaged_gradient_of_two_cpu_towers_equals_mean_of_per_shard_gradients():
    rng = np.random.default_rng(1)
    images = rng.uniform(0, 255, (8, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    schedule = ScheduleSection(learning_rate=0.1, momentum=0.9)
    settings = model_fn.ModelSettings(
        ModelSection(num_layers=8), plan.optimizer_of(schedule), devices=("/cpu:0", "/cpu:1"),
        schedule=plan.schedule_of(schedule, steps_per_epoch=10, total_steps=1,
                                  global_batch=128))
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    with tf.Graph().as_default() as graph:
        tf.compat.v1.set_random_seed(0)
        spec = model_fn.make_model_fn(settings)(
            {"image": tf.constant(images)}, tf.constant(labels), tf.estimator.ModeKeys.TRAIN)
        params = tf.compat.v1.trainable_variables()
        # Reference: the same network, one shard at a time, with the same variables.
        reference = []
        for lo, hi in ((0, 4), (4, 8)):
            with tf.compat.v1.variable_scope("resnet", reuse=True):
                _, xent, l2 = model_graph._tower(tf.constant(images[lo:hi]),
                                              tf.constant(labels[lo:hi]), True, settings,
                                              settings.model.batch_norm_decay)
            reference.append(tf.gradients(tf.reduce_mean(xent) + l2, params))
        tower1_ops = [op for op in graph.get_operations() if op.name.startswith("resnet_1/tower_1/")
                      and op.type == "Conv2D"]
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            before, grads_a, grads_b = sess.run([params, reference[0], reference[1]])
            sess.run(spec.train_op)
            after = sess.run(params)
    assert tower1_ops and all(op.device.endswith("CPU:1") for op in tower1_ops)
    # First momentum step: w -= lr * g, with g the average over the towers.
    for w0, w1, ga, gb in zip(before, after, grads_a, grads_b):
        np.testing.assert_allclose((w0 - w1) / 0.1, (ga + gb) / 2, rtol=2e-3, atol=2e-5)
