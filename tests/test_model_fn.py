"""model_fn in every mode, and the learning-rate schedule."""

import numpy as np
import tensorflow as tf

from cifar10_estimator.model import model_fn, schedules
from cifar10_estimator.model.params import ModelParams

SETTINGS = model_fn.ModelSettings(ModelParams(num_layers=8), steps_per_epoch=10)
ModeKeys = tf.estimator.ModeKeys


def _spec(mode, batch=8, settings=SETTINGS, with_labels=True, weight=None):
    images = tf.zeros([batch, 32, 32, 3])
    features = {"image": images}
    if weight is not None:
        features["weight"] = tf.constant(weight, tf.float32)
    labels = tf.zeros([batch], tf.int32) if with_labels else None
    return model_fn.make_model_fn(settings)(features, labels, mode)


def test_predict_mode_has_predictions_and_export_outputs_and_no_training():
    with tf.Graph().as_default():
        spec = _spec(ModeKeys.PREDICT, batch=5, with_labels=False)
        assert spec.train_op is None and spec.loss is None
        assert spec.predictions["probabilities"].shape.as_list() == [5, 10]
        assert spec.predictions["classes"].dtype == tf.int64
        assert "serving_default" in spec.export_outputs
        assert not [v for v in tf.compat.v1.global_variables() if "Momentum" in v.name]


def test_eval_mode_has_weighted_metrics_and_no_optimizer():
    with tf.Graph().as_default():
        spec = _spec(ModeKeys.EVAL, weight=[1] * 6 + [0, 0])
        per_class = {f"per_class_accuracy/class_{i}" for i in range(10)}
        assert set(spec.eval_metric_ops) == {"accuracy", "cross_entropy", "confusion_matrix",
                                             "confusion_matrix_image"} | per_class
        assert spec.train_op is None and spec.loss.shape == ()
        assert not [v for v in tf.compat.v1.global_variables() if "Momentum" in v.name]
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(),
                      tf.compat.v1.local_variables_initializer()])
            sess.run([op for _, op in spec.eval_metric_ops.values()])
            # The two zero-weight (padding) examples do not count.
            total = [v for v in tf.compat.v1.local_variables() if "accuracy/count" in v.name]
            assert sess.run(total[0]) == 6


def test_train_mode_with_two_cpu_towers_updates_batch_norm_from_tower_0_only():
    settings = model_fn.ModelSettings(ModelParams(num_layers=8), steps_per_epoch=10,
                                      devices=("/cpu:0", "/cpu:1"))
    with tf.Graph().as_default():
        spec = _spec(ModeKeys.TRAIN, settings=settings)
        assert spec.loss.dtype == tf.float32 and spec.loss.shape == ()
        update_inputs = [op for op in spec.train_op.control_inputs]
        names = " ".join(op.name for op in update_inputs)
        assert "tower_0" in names and "tower_1" not in names
        # The progress hook (outside the model) finds the loss and the rate by name.
        graph = tf.compat.v1.get_default_graph()
        assert graph.get_tensor_by_name(model_fn.LOSS_TENSOR) is spec.loss
        assert graph.get_tensor_by_name(model_fn.LEARNING_RATE_TENSOR).shape == ()


def test_learning_rate_is_piecewise_at_epoch_boundaries():
    params = ModelParams(learning_rate=0.1)
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        lr = schedules.learning_rate_schedule(step, params.learning_rate,
                                              params.lr_boundary_epochs,
                                              params.lr_decay_factors, steps_per_epoch=10)
        with tf.compat.v1.Session() as sess:
            got = [sess.run(lr, {step: s}) for s in (0, 820, 821, 1230, 1231, 3000, 3001)]
    np.testing.assert_allclose(got, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.0002], rtol=1e-6)
