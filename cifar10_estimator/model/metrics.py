"""What an evaluation measures: accuracy, cross-entropy, per-class accuracy, the confusion matrix.

``eval_metrics`` returns the Estimator ``eval_metric_ops``. Every metric is weighted, so the
evaluation pipeline's padding (weight 0) counts for nothing. The confusion matrix (rows: true
class, columns: predicted; weighted counts) is a metric of its own, read back by the report,
and is also drawn as a labelled picture for TensorBoard's image tab (``confusion_image``).
"""

import re
from typing import Optional, Sequence

import tensorflow as tf

from cifar10_estimator.model import confusion_image


def metric_name(name: str) -> str:
    """A class name as a TensorBoard tag part: letters, digits, ``_ . -`` kept, rest ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def _confusion_matrix(labels: tf.Tensor, classes: tf.Tensor, weight: tf.Tensor,
                      names: Sequence[str]) -> dict:
    num = len(names)
    counts = tf.compat.v1.get_local_variable(
        "confusion_matrix_counts", [num, num], tf.float32,
        initializer=tf.compat.v1.zeros_initializer(),
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
                     tf.compat.v1.GraphKeys.METRIC_VARIABLES])
    update = tf.compat.v1.assign_add(counts, tf.math.confusion_matrix(
        labels, classes, num_classes=num, weights=weight, dtype=tf.float32))
    # Estimator writes a metric whose value is a serialized Summary as that summary.
    picture = tf.compat.v1.summary.image("confusion_matrix", confusion_image.draw(counts, names),
                                         collections=[])
    return {"confusion_matrix": (tf.identity(counts), update),
            "confusion_matrix_image": (picture, tf.no_op())}


def eval_metrics(labels: tf.Tensor, classes: tf.Tensor, cross_entropy: tf.Tensor,
                 weight: Optional[tf.Tensor], names: Sequence[str]) -> dict:
    """The evaluation's metric ops.

    Per-class accuracy is each class's recall: right answers among its own images.
    """
    labels = tf.cast(labels, tf.int64)
    weight = tf.ones_like(labels, tf.float32) if weight is None else weight
    metrics = {
        "accuracy": tf.compat.v1.metrics.accuracy(labels, classes, weights=weight),
        "cross_entropy": tf.compat.v1.metrics.mean(cross_entropy, weights=weight),
    }
    for c, name in enumerate(names):
        mine = weight * tf.cast(tf.equal(labels, c), tf.float32)
        metrics[f"per_class_accuracy/{metric_name(name)}"] = tf.compat.v1.metrics.accuracy(
            labels, classes, weights=mine)
    metrics.update(_confusion_matrix(labels, classes, weight, names))
    return metrics
