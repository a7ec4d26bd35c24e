"""End to end: train_and_evaluate from the command line, export, serve, resume."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.data import schema
from cifar10_estimator.config import overlays
from cifar10_estimator.config import plan
from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import Settings
from trainer_fixtures import checkpoint_step, run_module, trainer_args

pytestmark = pytest.mark.slow  # every test here trains

_SERVE_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
images = np.load(sys.argv[2])
examples = [l.encode("latin1") for l in json.load(open(sys.argv[3]))]
a = model.signatures["serving_default"](images=tf.constant(images))
b = model.signatures["serving_examples"](examples=tf.constant(examples))
np.savez(sys.argv[4], p_images=a["probabilities"].numpy(), c_images=a["classes"].numpy(),
         p_examples=b["probabilities"].numpy())
"""


def test_train_evaluate_export_and_serve_in_a_fresh_process(tiny_records, tmp_path):
    data_dir, rows = tiny_records
    job_dir = str(tmp_path / "job")
    result = train.run(trainer_args(data_dir, job_dir, "--num-cpu-towers", "2",
                                    "--train-steps", "12", "--save-checkpoints-steps", "6",
                                    "--eval-throttle-secs", "1", "--seed", "3",
                                    "--batch-norm-decay", "0.5"))
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == 12
    assert result.eval_metrics["global_step"] == 12
    assert 0.0 <= result.eval_metrics["accuracy"] <= 1.0
    assert os.path.isfile(os.path.join(result.export_path, "saved_model.pb"))
    with open(os.path.join(result.export_path, "assets.extra", "class_names.txt")) as f:
        assert tuple(f.read().split()) == schema.CLASS_NAMES  # records without metadata
    assert os.listdir(os.path.dirname(result.export_path)) == [
        os.path.basename(result.export_path)]  # no temporary folders left behind

    # The Estimator's own predictions for the first eval images...
    images_chw, _ = rows["eval"]
    images = images_chw[:6].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float32)
    config = Settings.of(data_dir=data_dir, job_dir=job_dir, num_layers=8,
                         num_cpu_towers=2, batch_norm_decay=0.5)
    from cifar10_estimator.training.estimator.model_fn import make_model_fn
    from cifar10_estimator.model.model_settings import ModelSettings
    settings = ModelSettings.of(plan.resolve(Role(), config.model, config.schedule,
                                             config.devices, config.cluster, dataset="cifar10",
                                             class_names=schema.CLASS_NAMES, train_records=96,
                                             precision="fp32"),
                                config.model, config.data.data_dir)
    estimator = tf.estimator.Estimator(make_model_fn(settings), model_dir=job_dir)
    expected = np.stack([p["probabilities"] for p in estimator.predict(
        lambda: tf.data.Dataset.from_tensor_slices({"image": images}).batch(6))])

    # ...equal the SavedModel's, loaded in a fresh process, through both signatures.
    np.save(tmp_path / "images.npy", images)
    examples = [schema.encode_example(r.tobytes(), 0).decode("latin1") for r in images_chw[:6]]
    (tmp_path / "examples.json").write_text(json.dumps(examples))
    subprocess.run([sys.executable, "-c", _SERVE_SCRIPT, result.export_path,
                    str(tmp_path / "images.npy"), str(tmp_path / "examples.json"),
                    str(tmp_path / "served.npz")], check=True, capture_output=True,
                   cwd=tmp_path, timeout=300)
    served = np.load(tmp_path / "served.npz")
    np.testing.assert_allclose(served["p_images"], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(served["p_examples"], expected, rtol=1e-4, atol=1e-5)
    assert np.array_equal(served["c_images"], expected.argmax(axis=1))

    # saved_model_cli sees both signatures and runs the default one.
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    shown = subprocess.run([cli, "show", "--dir", result.export_path, "--all"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert "signature_def['serving_default']" in shown
    assert "signature_def['serving_examples']" in shown
    ran = subprocess.run([cli, "run", "--dir", result.export_path, "--tag_set", "serve",
                          "--signature_def", "serving_default",
                          "--inputs", f"images={tmp_path / 'images.npy'}"],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert "probabilities" in ran and "classes" in ran

    # The predict command names CIFAR classes for an image file of another size.
    png = tmp_path / "big.png"
    png.write_bytes(tf.io.encode_png(np.full((70, 50, 3), 128, np.uint8)).numpy())
    proc = run_module("cifar10_estimator.predict", "--saved-model", result.export_path,
                      str(png))
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(rf"{re.escape(str(png))}: (\w+ \d+\.\d%, ){{2}}\w+ \d+\.\d%\n",
                        proc.stdout)
    assert proc.stdout.split(": ")[1].split()[0] in schema.CLASS_NAMES


def test_the_fast_recipe_without_a_length_trains_its_own_for_the_training_file(
        tiny_records, tmp_path):
    # 96 records at batch 8: 12 steps an epoch; the recipe's length for 96 records.
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    epochs = overlays.recipe_epochs("fast", 96)
    steps = int(12 * epochs)
    proc = run_module("cifar10_estimator", *trainer_args(
        data_dir, job_dir, "--recipe", "fast", "--precision", "fp32", "--test-time-mirror",
        "true", "--eval-throttle-secs", "100000"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"12 steps per epoch, {steps} steps in all ({epochs:g} epochs, the fast recipe's "
            f"length for 96 records)") in proc.stderr
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == steps
    assert re.search(rf"evaluation at step {steps}: accuracy = ", proc.stderr)
    # The export mirrors too: a picture and its mirror get the same probabilities.
    export = re.search(r"SavedModel: (\S+)", proc.stdout + proc.stderr)
    assert export, proc.stderr[-2000:]
    model = tf.saved_model.load(export.group(1))
    pictures = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
    served = model.signatures["serving_default"](images=tf.constant(
        np.concatenate([pictures, pictures[:, :, ::-1]])))["probabilities"].numpy()
    np.testing.assert_allclose(served[:2], served[2:], rtol=1e-5, atol=1e-6)


def test_train_epochs_sets_the_length_and_a_recipe_gives_defaults_that_flags_override(
        tiny_records, tmp_path):
    # 96 records at batch 8: 12 steps an epoch, so 1.5 epochs are 18 global steps.
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    proc = run_module("cifar10_estimator", *trainer_args(
        data_dir, job_dir, "--train-epochs", "1.5", "--recipe", "fast", "--lr-schedule",
        "cosine", "--warmup-epochs", "0.5"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The recipe's values are logged; the flags given win and are marked.
    fast = overlays.RECIPES["fast"]
    line = next(x for x in proc.stderr.splitlines() if "recipe fast: " in x)
    assert "--lr-schedule cosine (given)" in line and "--train-batch-size 8 (given)" in line
    assert "--warmup-epochs 0.5 (given)" in line
    assert f"--label-smoothing {fast['label_smoothing']:g}," in line
    assert f"--lr-reference-batch {fast['lr_reference_batch']}," in line
    # The peak scales linearly with the batch: the recipe's rate at its reference batch.
    peak = fast["learning_rate"] * 8 / fast["lr_reference_batch"]
    assert (f"12 steps per epoch, 18 steps in all (1.5 epochs), cosine learning rate peaking at "
            f"{peak:.4g}") in proc.stderr
    with open(os.path.join(job_dir, "settings.json")) as f:
        recorded = json.load(f)["settings"]
    assert recorded["label_smoothing"] == fast["label_smoothing"]
    assert recorded["lr_schedule"] == "cosine" and recorded["train_batch_size"] == 8
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == 18
    assert re.search(r"evaluation at step 18: accuracy = ", proc.stderr)
