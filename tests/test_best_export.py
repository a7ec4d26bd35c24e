"""--export-best: the export of the best evaluation so far, kept across evaluations and resumes."""

import glob
import json
import logging
import os

import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.training.estimator import model_fn
from cifar10_estimator.config.settings import ModelSection
from cifar10_estimator.serving import best_export, export
from trainer_fixtures import checkpoint_of, trainer_args


def _metrics(path: str) -> dict:
    with open(os.path.join(path, export.EVAL_METRICS_FILE)) as f:
        return json.load(f)


def test_only_a_better_evaluation_replaces_the_best_export_even_after_a_resume(
        tmp_path, caplog):
    checkpoint = checkpoint_of(8, tmp_path)
    out = str(tmp_path / "export")
    best = best_export.BestExport(model_fn.ModelSettings(ModelSection(num_layers=8)), out)
    assert best.best_accuracy() is None
    first = best.consider({"accuracy": 0.5, "global_step": 10}, checkpoint)
    assert first and _metrics(first) == {"accuracy": 0.5, "global_step": 10}
    assert best.consider({"accuracy": 0.4, "global_step": 20}, checkpoint) is None
    assert best.consider({"accuracy": 0.5, "global_step": 30}, checkpoint) is None  # a tie
    with caplog.at_level(logging.INFO, "cifar10_estimator"):
        second = best.consider({"accuracy": 0.625, "global_step": 40}, checkpoint)
    assert os.listdir(best.folder) == [os.path.basename(second)]  # the older one is gone
    assert "best accuracy so far, 62.50%" in caplog.text
    # A resumed job reads the contest's state back from the export.
    again = best_export.BestExport(model_fn.ModelSettings(ModelSection(num_layers=8)), out)
    assert again.best_accuracy() == 0.625
    assert again.consider({"accuracy": 0.6, "global_step": 50}, checkpoint) is None
    # The best export serves like the final one.
    model = tf.saved_model.load(second)
    assert model.signatures["serving_default"](images=tf.zeros([2, 32, 32, 3]))[
        "probabilities"].shape == (2, 10)


def test_a_checkpoint_deleted_before_its_export_is_skipped_with_one_line(tmp_path, caplog):
    checkpoint = checkpoint_of(8, tmp_path)
    for path in glob.glob(checkpoint + ".*"):
        os.remove(path)  # as --keep-checkpoint-max does
    best = best_export.BestExport(model_fn.ModelSettings(ModelSection(num_layers=8)),
                                  str(tmp_path / "export"))
    with caplog.at_level(logging.INFO, "cifar10_estimator"):
        assert best.consider({"accuracy": 0.9}, checkpoint) is None
    assert "was deleted before it could be exported" in caplog.text
    assert not best._versions()


@pytest.mark.slow
def test_a_local_run_exports_its_best_evaluation_and_the_final_export_says_its_metrics(
        tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    result = train.run(trainer_args(data_dir, job_dir, "--train-steps", "9",
                                    "--save-checkpoints-steps", "3", "--eval-throttle-secs", "0",
                                    "--export-best"))
    # Every evaluation Estimator ran, as it wrote them for TensorBoard.
    evaluations = {}
    for path in glob.glob(os.path.join(job_dir, "eval", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == "accuracy":
                    evaluations[event.step] = value.simple_value
    assert len(evaluations) >= 2, evaluations
    versions = os.listdir(os.path.join(job_dir, "export", best_export.BEST_SUBDIR))
    assert len(versions) == 1
    kept = _metrics(os.path.join(job_dir, "export", best_export.BEST_SUBDIR, versions[0]))
    top = max(evaluations.values())
    assert kept["accuracy"] == pytest.approx(top, abs=1e-6)
    # On ties the first evaluation that reached it stays.
    assert kept["global_step"] == min(s for s, a in evaluations.items() if abs(a - top) < 1e-6)
    final = _metrics(result.export_path)
    assert final["global_step"] == 9
    assert final["accuracy"] == pytest.approx(evaluations[9], abs=1e-6)
