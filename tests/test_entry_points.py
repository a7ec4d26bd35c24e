"""Every command answers where users call it: ``python -m`` modules, the generator script and
the console scripts pyproject.toml installs (real processes, ``--help``)."""

import os
import subprocess
import sys

import pytest

from cifar10_estimator import __version__
from trainer_fixtures import REPO, work_dir

BIN = os.path.dirname(sys.executable)
COMMANDS = {
    "trainer": ([sys.executable, "-m", "cifar10_estimator"], "cifar10-train"),
    "generator": ([sys.executable, os.path.join(REPO, "tools", "generate_tfrecords.py")],
                  "cifar10-generate-tfrecords"),
    "predict": ([sys.executable, "-m", "cifar10_estimator.predict"], "cifar10-predict"),
    "evaluate": ([sys.executable, "-m", "cifar10_estimator.evaluate"], "cifar10-evaluate"),
    "demo": ([sys.executable, "-m", "cifar10_estimator.demo"], "cifar10-demo"),
    "cluster": ([sys.executable, "-m", "cifar10_estimator.cluster"], "cifar10-cluster"),
    "sweep": ([sys.executable, "-m", "cifar10_estimator.sweep"], "cifar10-sweep"),
}


def _help(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120,
                          cwd=work_dir())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_module_and_the_console_script_both_answer(name):
    module, script = COMMANDS[name]
    by_module = _help(module)
    assert by_module.returncode == 0 and by_module.stdout.startswith("usage:"), by_module.stderr
    by_script = _help([os.path.join(BIN, script)])
    assert by_script.returncode == 0, by_script.stderr
    # The same command either way: the same flags, each help naming itself as it was run.
    as_module = f"python -m {module[2]}" if module[1] == "-m" else os.path.basename(module[-1])
    # (After the usage lines, which wrap by the name's length.)
    assert (by_script.stdout.split("\n\n", 1)[1].replace(script, "PROG") ==
            by_module.stdout.split("\n\n", 1)[1].replace(as_module, "PROG"))


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=work_dir())


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_version_and_one_line_errors_named_as_it_was_run(name):
    module, script = COMMANDS[name]
    version = _run([*module, "--version"])
    assert version.returncode == 0 and version.stdout.strip() == f"cifar10_estimator {__version__}"
    expected = {"trainer": "cifar10_estimator", "generator": "generate_tfrecords.py"}.get(
        name, module[-1])  # python -m X: X
    for argv, prefix in ((module, expected), ([os.path.join(BIN, script)], script)):
        proc = _run([*argv, "--bogus-flag", "1"])
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert lines[0] == (f"{prefix}: error: unrecognized arguments: --bogus-flag; "
                            f"see --help")


def test_a_mistyped_flag_is_named_with_the_closest_one_and_prefixes_are_not_flags():
    trainer = COMMANDS["trainer"][0]
    for typed, meant in (("--num-l", "--num-layers"), ("--lerning-rate", "--learning-rate")):
        proc = _run([*trainer, typed, "20"])
        assert proc.returncode == 2
        assert proc.stderr.strip() == (f"cifar10_estimator: error: unrecognized arguments: "
                                       f"{typed} (did you mean {meant}?); see --help")
    predict = _run([os.path.join(BIN, "cifar10-predict"), "--saved-modle", "x", "y.png"])
    assert "(did you mean --saved-model?)" in predict.stderr


def test_help_shows_defaults_groups_and_examples():
    text = _help(COMMANDS["trainer"][0]).stdout
    for group in ("data:", "model:", "schedule:", "devices:", "cluster:", "output:", "logging:"):
        assert f"\n{group}\n" in text
    flat = " ".join(text.split())
    assert "ResNet depth, 6n+2 (20, 32, 44, 56, 110, ...) (default: 44)" in flat
    assert "(default: 82,123,300)" in flat and "(default: true)" in flat
    assert "\nexamples:\n  python -m cifar10_estimator --data-dir" in text
    assert "(default: 3)" in " ".join(_help(COMMANDS["predict"][0]).stdout.split())


@pytest.mark.slow
def test_flag_files_hold_flags_with_comments_and_later_flags_win(tmp_path):
    from cifar10_estimator.config import flags

    path = tmp_path / "job.flags"
    path.write_text("# the job\n--data-dir 'my data'   # quoted, as in a shell\n"
                    "--num-layers 20\n\n--recipe fast --train-epochs 30\n")
    config, _ = flags.parse([f"@{path}", "--train-epochs", "40"])
    assert (config.data.data_dir, config.model.num_layers, config.schedule.train_epochs) == (
        "my data", 20, 40.0)
    assert config.schedule.lr_schedule == "one-cycle"  # the recipe, from the file
    # In a real process, the generator's own flags from a file (the sample data, small).
    gen = tmp_path / "gen.flags"
    gen.write_text(f"--data-dir {tmp_path / 'data'}\n--sample --sample-size 10  # tiny\n")
    proc = _run([*COMMANDS["generator"][0], f"@{gen}"])
    assert proc.returncode == 0, proc.stderr
    assert os.path.isfile(tmp_path / "data" / "train.tfrecords")
    missing = _run([*COMMANDS["generator"][0], f"@{tmp_path / 'nothing.flags'}"])
    assert missing.returncode == 2 and "nothing.flags" in missing.stderr.strip().splitlines()[0]


def test_a_command_ends_its_process_without_the_interpreters_teardown(tmp_path):
    """The commands end with ``os._exit`` once their output is out (TensorFlow's teardown took
    about a second after every run); a command that may start Ray keeps the teardown, whose
    exit handler stops what Ray started."""
    hooks, marker = tmp_path / "hooks", tmp_path / "torn-down"
    hooks.mkdir()
    # An exit handler in every process: it runs only if the interpreter tears down.
    (hooks / "sitecustomize.py").write_text(
        f"import atexit\natexit.register(lambda: open({str(marker)!r}, 'w').close())\n")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))}

    def run(argv):
        marker.unlink(missing_ok=True)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                              cwd=work_dir())
        return proc, marker.exists()

    data = tmp_path / "data"
    made, torn_down = run([os.path.join(BIN, "cifar10-generate-tfrecords"), "--data-dir",
                           str(data), "--sample", "--sample-size", "10"])
    assert made.returncode == 0 and not torn_down, made.stderr
    assert os.path.getsize(data / "eval.tfrecords") > 0  # the output was all written
    # The trainer's one-line error for a folder with no records, from the command's end.
    refused, torn_down = run([*COMMANDS["trainer"][0], "--data-dir", str(tmp_path / "none"),
                              "--job-dir", str(tmp_path / "job")])
    assert refused.returncode == 2 and not torn_down
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith("cifar10_estimator: error: ") and "none" in error
    kept, torn_down = run([os.path.join(BIN, "cifar10-cluster"), "--bogus-flag", "1"])
    assert kept.returncode == 2 and torn_down
