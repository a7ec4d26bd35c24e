"""The tests' warm starts (``warm_start``): which trainers start warm, and that a warm-started one
is the process a cold ``python -m cifar10_estimator`` would be, in what the tests look at."""

import os
import re
import signal

import pytest

import warm_start

pytestmark = pytest.mark.skipif(bool(os.environ.get("CIFAR10_TESTS_COLD")),
                                reason="CIFAR10_TESTS_COLD: every process starts cold")
from cluster_fixtures import local_spec, tf_config
from trainer_fixtures import ENDLESS, TRAINING, Trainer, run_module, trainer_args, trainer_env, \
    without_cpp_log, work_dir


def _warm(argv, env_extra=None, module=warm_start.TRAINER) -> bool:
    return warm_start.can_start_warm(module, argv, trainer_env(extra=env_extra), work_dir())


def test_only_a_command_whose_tensorflow_would_load_the_same_starts_warm(tmp_path):
    args = trainer_args(tmp_path, tmp_path / "job")
    assert _warm(args)
    assert _warm(args, {"TF_CONFIG": '{"cluster": {}}'})  # read after TensorFlow loads
    assert not _warm(args + ["--verbose"])  # shows TensorFlow's load-time log
    assert not _warm(args, {"TF_ENABLE_ONEDNN_OPTS": "0"})  # read when TensorFlow loads
    assert not _warm(args, {"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert not _warm(args + ["--no-such-flag"])  # refused: the command line's own test
    assert not _warm(["--help"])
    predict = ["--saved-model", str(tmp_path), "picture.png"]
    assert _warm(predict, module="cifar10_estimator.predict")
    assert not _warm(predict, {"TF_CPP_MIN_LOG_LEVEL": "2"}, module="cifar10_estimator.predict")
    assert not _warm(["--sample"], module="cifar10_estimator.generate")  # not a warm command


def test_a_refused_run_ends_warm_as_it_ends_cold(tmp_path):
    empty = tmp_path / "no-records"
    empty.mkdir()
    args = trainer_args(empty, tmp_path / "job")
    assert _warm(args)
    warm, cold = run_module("cifar10_estimator", *args), run_module("cifar10_estimator", *args,
                                                                     cold=True)
    assert warm.returncode == cold.returncode == 2

    def untimed(text: str) -> str:
        return re.sub(r"(?m)^\d\d:\d\d:\d\d ", "", without_cpp_log(text))

    assert warm.stdout == cold.stdout and untimed(warm.stderr) == untimed(cold.stderr)
    assert "train.tfrecords not found" in warm.stderr


def test_the_commands_share_a_server_and_each_runs_as_its_own_command(tmp_path):
    # The trainer (without --verbose), predict and evaluate load TensorFlow with the same
    # settings (C++ log level 3), so one server forks all three.
    predict, evaluate = "cifar10_estimator.predict", "cifar10_estimator.evaluate"
    assert (warm_start._served_with(predict) == warm_start._served_with(evaluate)
            == warm_start._served_with(warm_start.TRAINER)
            == (warm_start.TRAINER, predict, evaluate))
    for module in (predict, evaluate):
        assert _warm(["--help"], module=module)
        warm, cold = run_module(module, "--help"), run_module(module, "--help", cold=True)
        assert warm.returncode == cold.returncode == 0
        assert warm.stdout == cold.stdout and warm.stderr == cold.stderr
        assert f"python -m {module}" in warm.stdout


@pytest.mark.slow
def test_a_warm_trainer_has_its_own_folder_environment_signals_and_streams(tiny_records,
                                                                            tmp_path):
    data_dir, _ = tiny_records
    cwd = tmp_path / "here"
    cwd.mkdir()
    # Its environment is the one given (here a role of its own; /proc/PID/environ, the
    # environment a process was exec'd with, shows the server's).
    trainer = Trainer(trainer_args(data_dir, tmp_path / "job", *ENDLESS), tmp_path / "log",
                      tf_config=tf_config(local_spec("chief"), "chief"), cwd=cwd)
    try:
        assert isinstance(trainer.process, warm_start.WarmProcess)
        trainer.wait_for(TRAINING)  # its progress lines reach the log as they are written
        assert "role: chief 0 of the cluster" in trainer.text()
        pid = trainer.process.pid
        assert os.readlink(f"/proc/{pid}/cwd") == str(cwd)
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f)
        caught = int(status["SigCgt"], 16)
        assert not caught >> (signal.SIGCHLD - 1) & 1  # the server's handler is not its own
        assert caught >> (signal.SIGTERM - 1) & 1  # the trainer's preemption handler
        assert int(status["PPid"]) != os.getpid()  # the server's child
        trainer.send(signal.SIGTERM)
        assert trainer.finish(60) == 143, trainer.text()[-3000:]
        assert "received SIGTERM at step" in trainer.text()
    finally:
        trainer.stop()
