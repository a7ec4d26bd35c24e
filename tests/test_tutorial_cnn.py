"""The original tutorial's CNN (``--model tutorial-cnn``), its input recipe, and the ``evaluate``
command on a trained job dir and its export."""

import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import evaluate
from cifar10_estimator.data import metadata, pipeline
from cifar10_estimator.model import networks, tutorial_cnn
from cifar10_estimator.config.settings import TUTORIAL_CNN, ModelSection
from cifar10_estimator.config import flags, plan
from trainer_fixtures import TINY_BATCHES, checkpoint_step, run_module, trainer_args

CNN = ModelSection(model=TUTORIAL_CNN)


def _build(num_classes: int, size: int = 32):
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope(networks.SCOPES[TUTORIAL_CNN]):
            logits = networks.logits(tf.zeros([2, size, size, 3]), CNN, is_training=True,
                                     num_classes=num_classes)
        shapes = {v.op.name: v.shape.as_list() for v in tf.compat.v1.trainable_variables()}
        decayed = [v.op.name for v in networks.decayed_weights(
            CNN, tf.compat.v1.trainable_variables())]
    return logits.shape.as_list(), shapes, decayed


@pytest.mark.parametrize("size", [32, 24])
def test_the_network_has_the_tutorials_layers_and_parameter_count(size):
    logits, shapes, decayed = _build(10, size)
    assert logits == [2, 10]
    assert shapes == {
        "tutorial_cnn/conv1/weights": [5, 5, 3, 64], "tutorial_cnn/conv1/biases": [64],
        "tutorial_cnn/conv2/weights": [5, 5, 64, 64], "tutorial_cnn/conv2/biases": [64],
        "tutorial_cnn/local3/weights": [6 * 6 * 64, 384], "tutorial_cnn/local3/biases": [384],
        "tutorial_cnn/local4/weights": [384, 192], "tutorial_cnn/local4/biases": [192],
        "tutorial_cnn/softmax_linear/weights": [192, 10],
        "tutorial_cnn/softmax_linear/biases": [10]}
    count = sum(int(np.prod(s)) for s in shapes.values())
    assert count == 1_068_298  # the tutorial's network
    # Weight decay on the two hidden layers' weights only, as the tutorial's.
    assert sorted(decayed) == ["tutorial_cnn/local3/weights", "tutorial_cnn/local4/weights"]
    _, shapes100, _ = _build(100)
    # Only the output layer grows: 90 more classes of 192 weights and a bias each.
    assert sum(int(np.prod(s)) for s in shapes100.values()) == 1_068_298 + 90 * 193


def test_the_model_brings_the_tutorials_defaults_and_flags_still_win():
    config, _ = flags.parse(["--model", "tutorial-cnn"])
    model, schedule = config.model, config.schedule
    assert (model.weight_decay, schedule.momentum, model.moving_average_decay) == (
        0.004, 0.0, 0.9999)
    assert schedule.lr_boundary_epochs == (350.0,) and schedule.lr_decay_factors == (1.0, 0.1)
    assert plan.data_format(model.model, config.devices) == "channels_last"
    config, _ = flags.parse(["--model", "tutorial-cnn", "--moving-average-decay", "0.99"])
    assert config.model.moving_average_decay == 0.99 and config.model.weight_decay == 0.004
    assert flags.parse([])[0].model.weight_decay == 2e-4  # the ResNet's own


def test_the_network_crops_the_centre_and_standardises_each_picture():
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (3, 32, 32, 3)).astype(np.float32)
    images[1] *= 0.1  # a dark picture
    got = tutorial_cnn.standardise(tf.constant(images)).numpy()
    assert got.shape == (3, 24, 24, 3)
    np.testing.assert_allclose(got.mean(axis=(1, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(got.std(axis=(1, 2, 3)), 1, atol=1e-3)
    # The central window: a 24x24 picture is left as it is, a 32x32 one loses 4 pixels a side.
    centre = images[:, 4:28, 4:28]
    np.testing.assert_allclose(
        got, tutorial_cnn.standardise(tf.constant(centre)).numpy(), atol=1e-5)


def test_the_input_recipe_crops_24_flips_and_shifts_brightness_and_contrast_in_range():
    # Columns alternate 0 and 100: every 24-wide window, flipped or not, has mean 50 and a
    # spread of 100, so brightness shows in the mean and contrast in the spread.
    row = np.tile([0.0, 100.0], 16)
    images = np.broadcast_to(row[None, None, :, None], (256, 32, 32, 3)).astype(np.float32)
    got = pipeline.tutorial_distort_batch(tf.constant(images),
                                          tf.constant([7, 1], tf.int64)).numpy()
    assert got.shape == (256, 24, 24, 3)
    shift = got.mean(axis=(1, 2, 3)) - 50.0
    factor = (got.max(axis=(1, 2, 3)) - got.min(axis=(1, 2, 3))) / 100.0
    assert np.all(np.abs(shift) <= pipeline.TUTORIAL_BRIGHTNESS + 1e-3)
    assert shift.min() < -40 and shift.max() > 40  # drawn per picture across the range
    low, high = pipeline.TUTORIAL_CONTRAST
    assert np.all((factor >= low - 1e-4) & (factor <= high + 1e-4))
    assert factor.min() < 0.5 and factor.max() > 1.5
    # The same seed gives the same pictures.
    again = pipeline.tutorial_distort_batch(tf.constant(images), tf.constant([7, 1], tf.int64))
    np.testing.assert_array_equal(got, again.numpy())


def _evaluate(capsys, *args) -> tuple[int, str, str]:
    status = evaluate.main([*args])
    out = capsys.readouterr()
    return status, out.out, out.err


@pytest.mark.slow
def test_it_trains_on_towers_exports_and_evaluate_agrees_with_the_trainer(
        tiny_records, tmp_path, capsys):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    proc = run_module("cifar10_estimator", *trainer_args(
        data_dir, job_dir, "--model", "tutorial-cnn", "--num-cpu-towers", "2",
        "--train-steps", "30", tiny=TINY_BATCHES))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the tutorial CNN, channels_last, towers on /cpu:0, /cpu:1" in proc.stderr
    assert "--moving-average-decay 0.9999," in proc.stderr  # the model's default, logged
    final = re.search(r"final evaluation at step 30: accuracy = ([0-9.]+), cross_entropy = "
                      r"([0-9.]+)", proc.stderr)
    accuracy, cross_entropy = float(final.group(1)), float(final.group(2))

    # The job dir's checkpoint with its recorded settings (averaged weights), then its export:
    # each agrees with the trainer's own evaluation, the cross-entropy to its 4 digits.
    exported = os.path.join(job_dir, "export")
    for model, report in ((job_dir, os.path.join(job_dir, "eval_report_eval_step30.json")),
                          (exported, str(tmp_path / "export-report.json"))):
        extra = ["--report", report] if model == exported else []
        status, out, err = _evaluate(capsys, model, "--data-dir", data_dir, *extra)
        assert status == 0, err
        line = out.splitlines()[0]
        assert "on the eval split" in line and "(37 pictures)" in line
        assert float(re.search(r"accuracy = ([0-9.]+)", line).group(1)) == accuracy
        got = float(re.search(r"cross_entropy = ([0-9.]+)", line).group(1))
        assert got == pytest.approx(cross_entropy, rel=1e-3)
        assert "per-class accuracy at step 30 (cifar10):" in out
        with open(report) as f:
            content = json.load(f)
        assert content["accuracy"] == pytest.approx(accuracy, abs=5e-5)
        assert np.sum(content["confusion_matrix"]) == 37 and content["global_step"] == 30

    # Another split, and a named checkpoint.
    status, out, _ = _evaluate(capsys, job_dir, "--data-dir", data_dir, "--split", "train",
                               "--checkpoint", "30")
    assert status == 0 and "(96 pictures)" in out
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == 30

    # Mistakes: one line each, status 2, no report written.
    other = str(tmp_path / "twenty-classes")
    shutil.copytree(data_dir, other)
    with open(os.path.join(other, metadata.METADATA_FILENAME), "w") as f:
        json.dump({"dataset": "mine", "class_names": [f"c{i}" for i in range(20)]}, f)
    no_validation = str(tmp_path / "no-validation")
    shutil.copytree(data_dir, no_validation,
                    ignore=shutil.ignore_patterns("validation.tfrecords"))
    for args, message in [
            ((job_dir, "--data-dir", other), f"the records in {other} have 20 classes, and "
                                             f"checkpoint"),
            ((str(tmp_path), "--data-dir", data_dir), "is neither a SavedModel export"),
            ((job_dir, "--data-dir", no_validation, "--split", "validation"),
             "validation.tfrecords not found"),
            ((job_dir, "--data-dir", data_dir, "--checkpoint", "7"),
             "keeps the checkpoints of steps")]:
        status, out, err = _evaluate(capsys, *args)
        lines = err.strip().splitlines()
        assert status == 2 and len(lines) == 1 and message in lines[0], err
        assert "Traceback" not in err
    assert sorted(f for f in os.listdir(job_dir) if f.startswith("eval_report_")) == [
        "eval_report_eval_step30.json", "eval_report_train_step30.json"]
