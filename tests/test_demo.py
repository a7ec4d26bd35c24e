"""The demo, the README's main job: a run from nothing, then a rerun that skips what is done."""

import importlib.util
import os
import re

import pytest

from trainer_fixtures import run_module

pytestmark = pytest.mark.slow


def test_the_demo_runs_and_its_rerun_skips_the_finished_work(tmp_path):
    work = str(tmp_path / "demo")
    flags = ("--work-dir", work, "--train-steps", "2", "--sample-size", "10")
    first = run_module("cifar10_estimator.demo", *flags)
    assert first.returncode == 0, first.stderr[-3000:]
    accuracy = re.search(r"eval accuracy of ResNet-20 after 2 steps: ([0-9.]+%)", first.stdout)
    assert accuracy, first.stdout[-2000:]
    exports = os.listdir(os.path.join(work, "job", "export"))
    # Where LiteRT is installed (the test extra installs it), the export also becomes an int8
    # file, gated by its accuracy: kept, and used on the same pictures, or refused by name.
    litert = importlib.util.find_spec("ai_edge_litert") is not None
    converted = re.search(r"eval accuracy of the LiteRT int8 file: ([0-9.]+%)", first.stdout)
    assert litert == bool(converted or "LiteRT int8: not kept" in first.stdout), first.stdout

    again = run_module("cifar10_estimator.demo", *flags)
    assert again.returncode == 0, again.stderr[-3000:]
    out = again.stdout
    assert "records already in" in out and "already trained to step 2" in again.stderr
    assert "Saving checkpoints" not in again.stderr  # nothing trained
    # The finished run's result, not "nan%", and no second export.
    assert f"eval accuracy of ResNet-20 after 2 steps: {accuracy.group(1)}" in out
    assert os.listdir(os.path.join(work, "job", "export")) == exports
    assert len(re.findall(r"eval\d\d_\w+\.png: ", out)) == 5 * (2 if converted else 1)
    if converted:  # classified again by the file, which is not converted again
        assert "already converted" in out and converted.group(0) in out
