"""tensorflow/estimator 2.15.0's own tests on this TensorFlow with the layer: the slice that CI
runs, the files through which the estimator reaches what the layer supplies (RunConfig from
TF_CONFIG with a strategy, train_and_evaluate's multi-worker road, the estimator's export
names) and the general-purpose ones beside them (model_fn, exporters, early stopping, Keras),
each file's counts equal to TensorFlow 2.15's as shipped (the record in docs/records, made by
tools/run_suite.py). The whole suite, per release: docs/suite.md."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

DISTRIBUTION = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join(DISTRIBUTION, "tools", "run_suite.py")
REFERENCE = os.path.join(DISTRIBUTION, "docs", "records", "tf2.15.1-py3.11.json")
# The reference copy of the 68 files beside this repository's checkout (its README says
# where they come from).
TESTS = os.path.join(os.path.dirname(DISTRIBUTION), "..", "shared", "estimator-tests")
SLICE = ("run_config_test.py", "training_test.py", "estimator_export_test.py",
         "model_fn_test.py", "exporter_test.py", "early_stopping_test.py", "keras_test.py")
COUNTS = ("passed", "failed", "errors", "skipped")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(tuple(int(p) for p in tf.__version__.split(".")[:2]) < (2, 16),
                    reason="TensorFlow 2.15 is the reference: the layer supplies nothing there")
@pytest.mark.skipif(not os.path.isdir(TESTS), reason=f"no estimator tests in {TESTS}")
def test_the_estimators_own_tests_count_as_on_tensorflow_2_15(tmp_path):
    record = tmp_path / "record.json"
    done = subprocess.run([sys.executable, RUNNER, "run", "--tests", TESTS, "--files", *SLICE,
                           "--out", str(record), "--timeout", "600"],
                          capture_output=True, text=True, timeout=850)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(record) as f:
        measured = json.load(f)["files"]
    with open(REFERENCE) as f:
        reference = json.load(f)["files"]
    assert sorted(measured) == sorted(SLICE)
    differing = {name: ({c: measured[name][c] for c in COUNTS}, measured[name]["failures"])
                 for name in SLICE
                 if any(measured[name][c] != reference[name][c] for c in COUNTS)}
    assert differing == {}, done.stdout
    assert sum(measured[name]["passed"] for name in SLICE) > 300  # not an empty run
