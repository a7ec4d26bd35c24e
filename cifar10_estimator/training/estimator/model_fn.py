"""The Estimator ``model_fn``: what ``model.graph`` builds, as Estimator's ``EstimatorSpec``s.

``make_model_fn(ModelSettings(...))`` returns a ``model_fn(features, labels, mode)``. It reads
top down by mode: the towers (``graph.build_towers``) give logits (and, with labels, each
tower's loss and gradients); PREDICT returns the predictions with their export output; EVAL
adds the metrics and, with a weights' moving average, reads the averaged weights; TRAIN adds
one update, and the ``SyncReplicasOptimizer``'s hook with ``sync_replicas``.
"""

from typing import Optional

import tensorflow as tf

from cifar10_estimator.model import graph
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.training.estimator import sync_replicas

PREDICT_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY


def make_model_fn(s: ModelSettings):
    """Returns the Estimator model_fn for these settings."""

    # Under a tf.distribute strategy Estimator converts the model_fn with autograph: a rewrite
    # of the network's source (seconds per graph, docs/performance.md "End of training")
    # that finds nothing to convert, as every branch here is on Python values, and would try
    # (and warn about) converting the file checks and metadata reads.
    @tf.autograph.experimental.do_not_convert
    def build(features, labels, mode):
        images = features["image"] if isinstance(features, dict) else features
        built = graph.build_towers(images, labels, s, training=mode == tf.estimator.ModeKeys.TRAIN,
                                   predicting=mode == tf.estimator.ModeKeys.PREDICT)
        with tf.compat.v1.device(graph.consolidation_device(s)):
            out = graph.outputs(built)
            if mode == tf.estimator.ModeKeys.PREDICT:
                return tf.estimator.EstimatorSpec(
                    mode, predictions=out.predictions, scaffold=_averaged_weights_scaffold(s),
                    export_outputs={PREDICT_SIGNATURE:
                                    tf.estimator.export.PredictOutput(out.predictions)})
            loss = graph.loss(built)
            if mode == tf.estimator.ModeKeys.EVAL:
                weight = features.get("weight") if isinstance(features, dict) else None
                metric_ops = graph.eval_metrics(built, labels, out.classes, weight, s)
                return tf.estimator.EstimatorSpec(
                    mode, predictions=out.predictions, loss=loss, eval_metric_ops=metric_ops,
                    scaffold=_averaged_weights_scaffold(s))
            update = graph.train(built, labels, out.classes, loss, s)
            # Every worker needs the hook (the chief's also applies the aggregated gradients).
            # No initial tokens: TensorFlow's default puts one per replica in the queue, which
            # lets a chief that starts first fill the first steps with its own gradients
            # alone; with none, step 1 waits for every worker.
            hooks = ([sync_replicas.sync_replicas_hook(update.sync_optimizer, s.is_chief,
                                                       num_tokens=0)]
                     if update.sync_optimizer is not None else [])
            return tf.estimator.EstimatorSpec(mode, predictions=out.predictions,
                                              loss=update.loss, train_op=update.op,
                                              training_hooks=hooks)

    def model_fn(features, labels, mode):  # the argument names Estimator checks for
        return build(features, labels, mode)

    return model_fn


def make_train_step(s: ModelSettings):
    """Returns ``(features, labels) -> EstimatorSpec``: the model_fn of these settings in
    training mode, whose ``train_op`` is one step (what the precision probe times, from a
    room that knows nothing of Estimator)."""
    model_fn = make_model_fn(s)
    return lambda features, labels: model_fn(features, labels, tf.estimator.ModeKeys.TRAIN)


def _averaged_weights_scaffold(s: ModelSettings) -> Optional[tf.compat.v1.train.Scaffold]:
    """Evaluation and prediction read the averaged weights into the model's variables (as the
    original CIFAR-10 tutorial's cifar10_eval.py did); None without an average."""
    average = graph.moving_average(s)
    if average is None:
        return None
    return tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver(
        average.variables_to_restore(), sharded=True))
