"""The Estimator ``model_fn``: towers, loss, learning-rate schedule, optimizer, metrics, export.

``make_model_fn(ModelSettings(...))`` returns a ``model_fn(features, labels, mode)``. It reads top
down by mode: logits and predictions, an early return for PREDICT with export outputs, the loss,
then (TRAIN) gradients averaged over towers and one optimizer update, or (EVAL) metrics.
"""

import dataclasses
import re
from typing import Optional, Sequence

import tensorflow as tf

from cifar10_estimator import cifar10, confusion_image, hooks, resnet, towers

PREDICT_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
# Marks the check_numerics failure of a NaN or infinite loss (see guards.training_errors).
NAN_LOSS_MESSAGE = "training loss is NaN or infinite"


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """Everything the model_fn needs, resolved by the driver (no flags, no environment)."""

    num_layers: int = 44
    resnet_version: int = 1
    data_format: str = "channels_last"
    batch_norm_decay: float = 0.997
    batch_norm_epsilon: float = 1e-5
    weight_decay: float = 2e-4
    momentum: float = 0.9
    learning_rate: float = 0.1
    lr_boundary_epochs: Sequence[float] = (82, 123, 300)
    lr_decay_factors: Sequence[float] = (1.0, 0.1, 0.01, 0.002)
    # Global steps per epoch = train records // (worker batch x workers); drives the schedule.
    steps_per_epoch: int = 1
    train_batch_size: int = 128  # per worker, all its towers together
    devices: Sequence[str] = ("/cpu:0",)  # one compute device per tower
    variable_strategy: str = "CPU"
    num_workers: int = 1
    sync: bool = False
    is_chief: bool = True
    compute_dtype: str = "float32"
    num_classes: int = 10  # width of the logits: the dataset's class count (its metadata)
    # Names of the classes (label order) for per-class evaluation metrics; () for class_<i>.
    class_names: Sequence[str] = ()
    train_steps: int = 0  # the global step training stops at (for progress and ETA)
    progress_secs: float = 15.0  # wall time between two progress lines
    summary_dir: Optional[str] = None  # chief: where throughput summaries go
    summary_steps: int = 100  # global steps between two summaries


def learning_rate_schedule(global_step: tf.Tensor, s: ModelSettings) -> tf.Tensor:
    """Piecewise-constant learning rate: base x factor[i] from epoch boundary[i-1] on.

    The tutorial took tensorpack's cifar10-resnet schedule: x1, 0.1, 0.01, 0.002 at epochs 82,
    123 and 300 (82 and 123 epochs are the paper's 32k and 48k iterations at batch 128 on 45k
    images, He et al. 2015, section 4.2).
    """
    boundaries = [int(s.steps_per_epoch * e) for e in s.lr_boundary_epochs]
    values = [s.learning_rate * f for f in s.lr_decay_factors]
    return tf.compat.v1.train.piecewise_constant(global_step, boundaries, values)


def batch_norm_decay_schedule(global_step: tf.Tensor, decay: float) -> tf.Tensor:
    """The batch-norm moving-average decay at this step: min(decay, (1 + t) / (10 + t)).

    The moving statistics start at mean 0 and variance 1. With a fixed decay of 0.997 they
    still hold 0.997^t of those start values after t steps (15 % after 624 steps), which
    ruins evaluation after short runs on images whose activations are far from that start
    (e.g. mostly black pictures); CIFAR's zero-centred inputs hide it. A decay that grows with
    the step, as ``tf.compat.v1.train.ExponentialMovingAverage`` does with ``num_updates``,
    forgets the start values within a few steps and equals ``decay`` from t = (10 decay - 1)
    / (1 - decay) on (2,990 steps for 0.997), so long runs are unchanged.
    """
    t = tf.cast(global_step, tf.float32)
    return tf.minimum(tf.constant(decay, tf.float32), (1.0 + t) / (10.0 + t),
                      name="batch_norm_decay")


def _tower(images, labels, is_training, s: ModelSettings, bn_decay):
    """One tower: logits, and in training/eval the loss (cross-entropy + weight decay)."""
    logits = resnet.resnet_cifar(
        images, is_training=is_training, num_layers=s.num_layers, version=s.resnet_version,
        data_format=s.data_format, batch_norm_decay=bn_decay,
        batch_norm_epsilon=s.batch_norm_epsilon, num_classes=s.num_classes,
        compute_dtype=tf.as_dtype(s.compute_dtype))
    if labels is None:
        return logits, None, None
    xent = tf.compat.v1.losses.sparse_softmax_cross_entropy(
        labels, logits, reduction=tf.compat.v1.losses.Reduction.NONE)
    params = tf.compat.v1.trainable_variables()
    # The tutorial's L2 term covers every trainable variable (batch-norm scales and the dense
    # bias included); l2_loss is half the squared norm.
    l2 = s.weight_decay * tf.math.add_n([tf.nn.l2_loss(v) for v in params])
    return logits, xent, l2


def metric_name(name: str) -> str:
    """A class name as a TensorBoard tag part: letters, digits, ``_ . -`` kept, rest ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def per_class_metrics(labels, classes, weight, names: Sequence[str]) -> dict:
    """Accuracy of each class (its recall: right among its own images), and the confusion
    matrix (rows: true class, columns: predicted; weighted counts) as a [C, C] metric."""
    num = len(names)
    labels = tf.cast(labels, tf.int64)
    weight = tf.ones_like(labels, tf.float32) if weight is None else weight
    metrics = {}
    for c, name in enumerate(names):
        mine = weight * tf.cast(tf.equal(labels, c), tf.float32)
        metrics[f"per_class_accuracy/{metric_name(name)}"] = tf.compat.v1.metrics.accuracy(
            labels, classes, weights=mine)
    counts = tf.compat.v1.get_local_variable(
        "confusion_matrix_counts", [num, num], tf.float32,
        initializer=tf.compat.v1.zeros_initializer(),
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
                     tf.compat.v1.GraphKeys.METRIC_VARIABLES])
    update = tf.compat.v1.assign_add(counts, tf.math.confusion_matrix(
        labels, classes, num_classes=num, weights=weight, dtype=tf.float32))
    metrics["confusion_matrix"] = (tf.identity(counts), update)
    # The labelled picture for TensorBoard's image tab; Estimator writes a metric whose value
    # is a serialized Summary as that summary.
    metrics["confusion_matrix_image"] = (
        tf.compat.v1.summary.image("confusion_matrix", confusion_image.draw(counts, names),
                                   collections=[]),
        tf.no_op())
    # The class names in full and in order (the picture cuts long ones), as text.
    metrics["confusion_matrix_classes"] = (tf.compat.v1.summary.text(
        "confusion_matrix_classes",
        tf.constant([f"{i}: {n}" for i, n in enumerate(names)]), collections=[]), tf.no_op())
    return metrics


def make_model_fn(s: ModelSettings):
    """Returns the Estimator model_fn for these settings."""

    def model_fn(features, labels, mode):
        is_training = mode == tf.estimator.ModeKeys.TRAIN
        images = features["image"] if isinstance(features, dict) else features
        # Serving and prediction use one tower on the first device: requests have any size.
        devices = list(s.devices) if mode != tf.estimator.ModeKeys.PREDICT else [s.devices[0]]
        consolidation = towers.consolidation_device(s.variable_strategy, devices)
        setters = towers.make_device_setters(devices, s.variable_strategy)
        image_shards = towers.split_batch(images, len(devices))
        label_shards = (towers.split_batch(labels, len(devices)) if labels is not None
                        else [None] * len(devices))

        bn_decay = s.batch_norm_decay
        if is_training:
            with tf.compat.v1.device(consolidation):
                bn_decay = batch_norm_decay_schedule(
                    tf.compat.v1.train.get_or_create_global_step(), s.batch_norm_decay)

        tower_logits, tower_xent, tower_grads, tower_losses, tower_l2 = [], [], [], [], []
        update_ops = []
        for i, (setter, x, y) in enumerate(zip(setters, image_shards, label_shards)):
            with tf.compat.v1.variable_scope("resnet", reuse=i > 0):
                with tf.name_scope(f"tower_{i}") as scope:
                    with tf.compat.v1.device(setter):
                        logits, xent, l2 = _tower(x, y, is_training, s, bn_decay)
                        tower_logits.append(logits)
                        if xent is None:
                            continue
                        tower_xent.append(xent)
                        tower_l2.append(l2)
                        loss = tf.reduce_mean(xent) + l2
                        tower_losses.append(loss)
                        if is_training:
                            params = tf.compat.v1.trainable_variables()
                            grads = tf.gradients(loss, params)
                            tower_grads.append(list(zip(grads, params)))
                    if i == 0:
                        # Only tower 0 updates the batch-norm moving statistics: every tower
                        # sees a random shard of the same distribution, so one tower's
                        # statistics converge to the same values, and the update stays cheap.
                        update_ops = tf.compat.v1.get_collection(
                            tf.compat.v1.GraphKeys.UPDATE_OPS, scope)

        with tf.compat.v1.device(consolidation):
            logits = tf.concat(tower_logits, axis=0) if len(tower_logits) > 1 else tower_logits[0]
            probabilities = tf.nn.softmax(logits, name="probabilities")
            classes = tf.argmax(logits, axis=1, name="classes")
            predictions = {"classes": classes, "probabilities": probabilities}

            if mode == tf.estimator.ModeKeys.PREDICT:
                return tf.estimator.EstimatorSpec(
                    mode, predictions=predictions,
                    export_outputs={PREDICT_SIGNATURE:
                                    tf.estimator.export.PredictOutput(predictions)})

            # Tensors are named *_value so that the summaries below (and Estimator's own "loss")
            # get the plain tags: an op named "loss" would turn the summary's tag into "loss_1".
            loss = tf.reduce_mean(tower_losses, name="loss_value")

            if mode == tf.estimator.ModeKeys.EVAL:
                all_xent = tf.concat(tower_xent, axis=0)
                weight = features.get("weight") if isinstance(features, dict) else None
                metrics = {
                    "accuracy": tf.compat.v1.metrics.accuracy(labels, classes, weights=weight),
                    "cross_entropy": tf.compat.v1.metrics.mean(all_xent, weights=weight),
                }
                names = list(s.class_names) or [f"class_{i}" for i in range(s.num_classes)]
                metrics.update(per_class_metrics(labels, classes, weight, names))
                return tf.estimator.EstimatorSpec(mode, predictions=predictions, loss=loss,
                                                  eval_metric_ops=metrics)

            global_step = tf.compat.v1.train.get_or_create_global_step()
            learning_rate = tf.identity(learning_rate_schedule(global_step, s),
                                        name="learning_rate_value")
            accuracy = tf.reduce_mean(tf.cast(tf.equal(classes, tf.cast(labels, tf.int64)),
                                              tf.float32), name="train_accuracy_value")
            cross_entropy = tf.reduce_mean(tf.concat(tower_xent, axis=0),
                                           name="cross_entropy_value")
            tf.compat.v1.summary.scalar("learning_rate", learning_rate)
            tf.compat.v1.summary.scalar("train_accuracy", accuracy)
            # The two parts of the loss (tower 0's weight decay: the same in every tower).
            tf.compat.v1.summary.scalar("cross_entropy", cross_entropy)
            tf.compat.v1.summary.scalar("weight_decay", tower_l2[0])

            optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate, s.momentum)
            training_hooks = []
            if s.sync:
                optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
                    optimizer, replicas_to_aggregate=s.num_workers,
                    total_num_replicas=s.num_workers)
                # Every worker needs the hook (the chief's also applies the aggregated
                # gradients). No initial tokens: TensorFlow's default puts one per replica in
                # the queue, which lets a chief that starts first fill the first steps with
                # its own gradients alone; with none, step 1 waits for every worker.
                training_hooks.append(hooks.sync_replicas_hook(optimizer, s.is_chief,
                                                               num_tokens=0))
            gradvars = towers.average_gradients(tower_grads)
            # A NaN or infinite loss fails the step before the update is applied, so the
            # variables (and every checkpoint saved later) keep their last finite values.
            # Estimator's own NanTensorHook checks only after the step, when the chief's
            # checkpoint hook (which runs first) may already have saved the NaN weights.
            with tf.control_dependencies([tf.debugging.check_numerics(loss, NAN_LOSS_MESSAGE)]):
                apply_op = optimizer.apply_gradients(gradvars, global_step=global_step)
            train_op = tf.group(apply_op, *update_ops)

        per_global_step = None
        if s.num_workers > 1:
            per_global_step = s.train_batch_size * (s.num_workers if s.sync else 1)
        training_hooks.append(hooks.ProgressHook(
            s.train_batch_size, s.train_steps, loss, learning_rate, per_global_step,
            every_secs=s.progress_secs, summary_dir=s.summary_dir if s.is_chief else None,
            summary_steps=s.summary_steps))
        return tf.estimator.EstimatorSpec(mode, predictions=predictions, loss=loss,
                                          train_op=train_op, training_hooks=training_hooks)

    return model_fn
