"""Every command answers where users call it: ``python -m`` modules, the generator script and
the console scripts pyproject.toml installs (real processes, ``--help``)."""

import os
import subprocess
import sys

import pytest

from trainer_fixtures import REPO

BIN = os.path.dirname(sys.executable)
COMMANDS = {
    "trainer": ([sys.executable, "-m", "cifar10_estimator"], "cifar10-train"),
    "generator": ([sys.executable, os.path.join(REPO, "tools", "generate_tfrecords.py")],
                  "cifar10-generate-tfrecords"),
    "predict": ([sys.executable, "-m", "cifar10_estimator.predict"], "cifar10-predict"),
    "evaluate": ([sys.executable, "-m", "cifar10_estimator.evaluate"], "cifar10-evaluate"),
    "demo": ([sys.executable, "-m", "cifar10_estimator.demo"], "cifar10-demo"),
    "cluster": ([sys.executable, "-m", "cifar10_estimator.cluster"], "cifar10-cluster"),
}


def _help(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_module_and_the_console_script_both_answer(name):
    module, script = COMMANDS[name]
    by_module = _help(module)
    assert by_module.returncode == 0 and by_module.stdout.startswith("usage:"), by_module.stderr
    by_script = _help([os.path.join(BIN, script)])
    assert by_script.returncode == 0, by_script.stderr
    # The same command either way: the same flags.
    assert by_script.stdout.split("\n", 1)[1] == by_module.stdout.split("\n", 1)[1]
