"""The examples (``examples/``), each run as a user runs it, in a process of its own: a canned
estimator from a CSV, exported and asked through its SavedModel; a custom model_fn on a local
cluster with a parameter server and an evaluator; a Keras model through model_to_estimator.
Each must learn its data, not only run."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
REMOVED = tuple(int(p) for p in tf.__version__.split(".")[:2]) >= (2, 16)
needs_keras_2 = pytest.mark.skipif(
    REMOVED and importlib.util.find_spec("tf_keras") is None,
    reason="canned estimators and model_to_estimator need Keras 2 on TensorFlow 2.16 and "
           "later: pip install 'tf-estimator-compat[keras]'")

pytestmark = [pytest.mark.slow]


def _run(example: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, example), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


@needs_keras_2
@pytest.mark.timeout(300)
def test_a_canned_estimator_from_a_csv_learns_exports_and_predicts(tmp_path):
    out = _run("canned_csv.py", "--model-dir", str(tmp_path / "model"), "--steps", "300").stdout
    accuracy = re.search(r"^accuracy ([\d.]+) at step 300$", out, re.M)
    assert accuracy and float(accuracy.group(1)) >= 0.85, out
    assert re.search(r"^export \S+/export/\d+$", out, re.M), out
    predicted, labels = re.search(r"^predicted ([\d ]+) labels ([\d ]+)$", out, re.M).groups()
    # The SavedModel answers for the first six rows; the toy data's classes are learnable.
    assert len(predicted.split()) == 6
    assert sum(p == l for p, l in zip(predicted.split(), labels.split())) >= 5, out


@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_a_custom_model_fn_trains_on_a_cluster_with_a_parameter_server(tmp_path):
    out = _run("custom_model_fn_cluster.py", "--model-dir", str(tmp_path / "job"),
               "--local-cluster", "--steps", "200", timeout=360).stdout
    for task in ("chief", "worker", "evaluator"):
        assert f"{task}: exit status 0" in out, out
    chief = re.search(r"^chief: accuracy ([\d.]+) at step (\d+)$", out, re.M)
    assert chief and int(chief.group(2)) >= 200 and float(chief.group(1)) >= 0.9, out
    assert re.search(r"^evaluator: accuracy [\d.]+ at step 2\d\d$", out, re.M), out
    # The chief saved the last step (its sessions need the parameter server that holds the
    # variables: without it the chief would wait for it, not end).
    assert any(re.fullmatch(r"model\.ckpt-2\d\d\.index", name)
               for name in os.listdir(tmp_path / "job"))


@needs_keras_2
@pytest.mark.timeout(300)
def test_a_keras_model_through_model_to_estimator_learns(tmp_path):
    out = _run("keras_to_estimator.py", "--model-dir", str(tmp_path / "model"),
               "--steps", "600").stdout
    accuracy = re.search(r"^accuracy ([\d.]+) at step 600$", out, re.M)
    assert accuracy and float(accuracy.group(1)) >= 0.9, out
