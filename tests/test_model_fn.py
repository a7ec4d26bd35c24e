"""model_fn in every mode, and the learning-rate schedule."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.config import plan
from cifar10_estimator.config.plan import global_batch
from cifar10_estimator.config.settings import ClusterSection, ModelSection, ScheduleSection
from cifar10_estimator.data import schema
from cifar10_estimator.model import graph as model_graph
from cifar10_estimator.training.estimator import model_fn
from cifar10_estimator.model import schedules

# The default settings' schedule with epochs of 10 global steps.
TEN_STEP_EPOCHS = plan.schedule_of(ScheduleSection(), steps_per_epoch=10, total_steps=1,
                                   global_batch=128)
SETTINGS = model_fn.ModelSettings(ModelSection(num_layers=8), schedule=TEN_STEP_EPOCHS)
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
        per_class = {f"per_class_accuracy/{name}" for name in schema.CLASS_NAMES}
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


def test_evaluation_and_prediction_fold_batch_norm_as_the_export_does_and_training_does_not():
    def batch_norms(mode):
        with tf.Graph().as_default() as graph:
            _spec(mode, with_labels=mode != ModeKeys.PREDICT)
            return [op for op in graph.get_operations() if op.type == "FusedBatchNormV3"]

    # ResNet v1: every batch norm follows a convolution, so none is left outside training.
    assert not batch_norms(ModeKeys.EVAL) and not batch_norms(ModeKeys.PREDICT)
    assert len(batch_norms(ModeKeys.TRAIN)) == 7  # ResNet-8: the stem and 3 blocks of 2


def test_train_mode_with_two_cpu_towers_updates_batch_norm_from_tower_0_only():
    settings = model_fn.ModelSettings(ModelSection(num_layers=8), schedule=TEN_STEP_EPOCHS,
                                      devices=("/cpu:0", "/cpu:1"))
    with tf.Graph().as_default():
        spec = _spec(ModeKeys.TRAIN, settings=settings)
        assert spec.loss.dtype == tf.float32 and spec.loss.shape == ()
        update_inputs = [op for op in spec.train_op.control_inputs]
        names = " ".join(op.name for op in update_inputs)
        assert "tower_0" in names and "tower_1" not in names
        # The progress hook (outside the model) finds the loss and the rate by name.
        graph = tf.compat.v1.get_default_graph()
        assert graph.get_tensor_by_name(model_graph.LOSS_TENSOR) is spec.loss
        assert graph.get_tensor_by_name(model_graph.LEARNING_RATE_TENSOR).shape == ()


def _rates(schedule: ScheduleSection, steps, steps_per_epoch=10, total_steps=1000,
           global_batch=128):
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        lr = schedules.learning_rate(step, plan.schedule_of(schedule, steps_per_epoch,
                                                            total_steps, global_batch))
        with tf.compat.v1.Session() as sess:
            return [float(sess.run(lr, {step: s})) for s in steps]


def test_learning_rate_is_piecewise_at_epoch_boundaries():
    got = _rates(ScheduleSection(learning_rate=0.1), (0, 820, 821, 1230, 1231, 3000, 3001))
    np.testing.assert_allclose(got, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.0002], rtol=1e-6)


def test_the_peak_scales_linearly_with_the_global_batch_when_a_reference_batch_is_set():
    # Goyal et al. 2017: 0.1 at 128 is 0.4 at 512, warm-up and schedule alike.
    scaled = ScheduleSection(learning_rate=0.1, lr_reference_batch=128, warmup_epochs=1)
    np.testing.assert_allclose(_rates(scaled, (4, 10, 821), global_batch=512),
                               [0.2, 0.4, 0.04], rtol=1e-6)
    assert _rates(ScheduleSection(learning_rate=0.1), (0,), global_batch=512) == [
        pytest.approx(0.1)]
    # With --sync the global batch is every worker's; asynchronously one worker's.
    assert global_batch(64, ClusterSection(sync=True), 4) == 256
    assert global_batch(64, ClusterSection(), 4) == 64


def test_warm_up_rises_linearly_to_the_peak_then_the_schedule_runs():
    # 2 warm-up epochs of 10 steps: (step + 1) / 20 of the peak, the peak from step 19 on.
    got = _rates(ScheduleSection(learning_rate=0.4, warmup_epochs=2), (0, 9, 19, 500, 821))
    np.testing.assert_allclose(got, [0.02, 0.2, 0.4, 0.4, 0.04], rtol=1e-6)


def test_cosine_spans_the_run_from_the_peak_to_zero_after_its_warm_up():
    params = ScheduleSection(learning_rate=0.2, lr_schedule="cosine", warmup_epochs=1)
    got = _rates(params, (4, 10, 505, 1000), total_steps=1000)
    # Warm-up over 10 steps, then half a cosine over the remaining 990.
    np.testing.assert_allclose(got, [0.1, 0.2, 0.1, 0.0], rtol=1e-5, atol=1e-7)


def test_one_cycle_rises_from_a_25th_of_the_peak_and_ends_near_zero():
    params = ScheduleSection(learning_rate=0.5, lr_schedule="one-cycle")
    # 30 % of 1,000 steps rising: 0.02 at step 0, 0.5 at 300, halfway down at 650.
    got = _rates(params, (0, 150, 300, 650, 1000), total_steps=1000)
    end = 0.5 / 250_000
    np.testing.assert_allclose(got, [0.02, 0.26, 0.5, (0.5 + end) / 2, end], rtol=1e-5)
    # --warmup-epochs sets the rise: 5 epochs of 10 steps.
    assert _rates(ScheduleSection(learning_rate=0.5, lr_schedule="one-cycle", warmup_epochs=5),
                  (50,))[0] == pytest.approx(0.5)


def test_label_smoothing_spreads_the_target_in_training_only():
    e, num = 0.1, 10
    labels = np.array([1, 3, 5, 7], np.int32)
    images = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype(np.float32)
    settings = model_fn.ModelSettings(ModelSection(num_layers=8, label_smoothing=e))
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("resnet"):
            logits, smoothed, _ = model_graph._tower(images, tf.constant(labels), True, settings,
                                                  0.9)
        with tf.compat.v1.variable_scope("resnet", reuse=True):
            eval_logits, plain, _ = model_graph._tower(images, tf.constant(labels), False,
                                                    settings, 0.9)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got = sess.run({"logits": logits, "smoothed": smoothed, "eval_logits": eval_logits,
                            "plain": plain})

    def log_softmax(x):
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    # The target: 1 - e on the true class plus e spread evenly over all classes.
    target = np.full((4, num), e / num)
    target[np.arange(4), labels] += 1 - e
    np.testing.assert_allclose(got["smoothed"], -(target * log_softmax(got["logits"])).sum(1),
                               rtol=1e-5)
    # Evaluation reports the plain cross-entropy of the true class.
    np.testing.assert_allclose(got["plain"],
                               -log_softmax(got["eval_logits"])[np.arange(4), labels], rtol=1e-5)


def test_the_weights_moving_average_follows_a_numpy_ema_over_real_steps():
    decay = 0.8
    settings = model_fn.ModelSettings(ModelSection(num_layers=8, moving_average_decay=decay),
                                      schedule=TEN_STEP_EPOCHS)
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (8, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    with tf.Graph().as_default():
        spec = model_fn.make_model_fn(settings)({"image": tf.constant(images)},
                                                tf.constant(labels), ModeKeys.TRAIN)
        by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
        weight = by_name["resnet/dense/bias"]
        shadow = by_name["resnet/dense/bias/ExponentialMovingAverage"]
        step = tf.compat.v1.train.get_global_step()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            expected = sess.run(weight)  # the shadow starts at the weight's initial value
            np.testing.assert_allclose(sess.run(shadow), expected)
            for _ in range(4):
                sess.run(spec.train_op)
                t, w, got = sess.run([step, weight, shadow])
                # ExponentialMovingAverage with num_updates=global step: the decay warms up.
                d = min(decay, (1 + t) / (10 + t))
                expected = d * expected + (1 - d) * w
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
            assert not np.allclose(got, w)  # an average, not the weight itself


def test_precise_batch_norm_sets_the_statistics_to_the_batches_statistics():
    from cifar10_estimator.training.estimator.precise_bn import PreciseBatchNorm

    settings = model_fn.ModelSettings(ModelSection(num_layers=8), schedule=TEN_STEP_EPOCHS)
    images = np.random.default_rng(0).uniform(0, 255, (8, 32, 32, 3)).astype(np.float32)
    with tf.Graph().as_default() as graph:
        model_fn.make_model_fn(settings)({"image": tf.constant(images)},
                                         tf.zeros([8], tf.int32), ModeKeys.TRAIN)
        # The stem's batch norm: its statistics of this batch, and its moving statistics.
        fused = graph.get_operation_by_name("resnet/tower_0/FusedBatchNormV3")  # the stem's
        by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
        moving = by_name["resnet/stem_bn/moving_mean"], by_name["resnet/stem_bn/moving_variance"]
        precise = PreciseBatchNorm(batches=3, final_step=5)
        precise.begin()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            start = sess.run(moving)
            # The save at the session's start keeps the statistics as restored.
            assert not precise.before_save(sess, 0)
            np.testing.assert_array_equal(sess.run(moving[0]), start[0])
            assert precise.before_save(sess, 5)
            batch_mean, batch_variance = sess.run(fused.outputs[1:3])
            got_mean, got_variance = sess.run(moving)
            signalled = PreciseBatchNorm(batches=3, final_step=5, skip=lambda: True)
            signalled.begin()
            signalled.before_save(sess, 0)
            assert not signalled.before_save(sess, 6)  # a save for a signal stays quick
    # The same batch three times: the mean of its statistics is its statistics, whatever the
    # moving averages held before (zeros and ones).
    np.testing.assert_allclose(got_mean, batch_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_variance, batch_variance, rtol=1e-4, atol=1e-5)
    assert not np.allclose(got_mean, start[0]) and precise.seconds is not None


def test_triangular_rises_from_a_fifth_of_the_peak_then_falls_to_zero_at_the_end():
    # airbench's: peak x0.2 at step 0, the peak at 20 % of the run, 0 at its last step.
    params = ScheduleSection(learning_rate=0.5, lr_schedule="triangular")
    got = _rates(params, (0, 100, 200, 600, 1000), total_steps=1000)
    np.testing.assert_allclose(got, [0.1, 0.3, 0.5, 0.25, 0.0], rtol=1e-5, atol=1e-7)
    # --warmup-epochs sets the rise: 5 epochs of 10 steps.
    assert _rates(ScheduleSection(learning_rate=0.5, lr_schedule="triangular", warmup_epochs=5),
                  (50,))[0] == pytest.approx(0.5)
