"""The trainer's command line: flag parsing and every validation error."""

import os

import pytest

from cifar10_estimator import train
from cifar10_estimator.config import flags
from trainer_fixtures import run_module, trainer_args


@pytest.mark.parametrize("flags,message", [
    (["--num-layers", "21"], "--num-layers must be 6n+2"),
    (["--train-batch-size", "9", "--num-cpu-towers", "2"], "--train-batch-size 9 is not divisible"),
    (["--eval-batch-size", "7", "--num-cpu-towers", "2"], "--eval-batch-size 7 is not divisible"),
    (["--num-gpus", "-1"], "--num-gpus must be 0 or more"),
    (["--train-steps", "-5"], "--train-steps must be 0 or more"),
    (["--num-gpus", "2"], "--num-gpus 2 requested but TensorFlow sees 0 GPU(s)"),
    (["--variable-strategy", "GPU"], "--variable-strategy GPU needs GPUs"),
    (["--num-cpu-towers", "0"], "--num-cpu-towers must be 1 or more"),
    (["--save-checkpoints-steps", "5", "--save-checkpoints-secs", "5"], "exclude each other"),
    (["--lr-boundary-epochs", "5,3,7"], "--lr-boundary-epochs must be positive and strictly"),
    (["--lr-decay-factors", "1,0.1"], "--lr-decay-factors needs exactly one more value"),
    (["--momentum", "1.5"], "--momentum must be in [0, 1)"),
    (["--train-steps", "5", "--train-epochs", "2"], "--train-steps and --train-epochs exclude"),
    (["--train-epochs", "0"], "--train-epochs must be positive"),
    (["--label-smoothing", "1"], "--label-smoothing must be in [0, 1)"),
    (["--lr-schedule", "cosine", "--train-epochs", "2", "--warmup-epochs", "2"],
     "--warmup-epochs 2 leaves nothing of the 2 --train-epochs"),
])
def test_invalid_flags_give_one_line_naming_the_flag_and_write_nothing(
        flags, message, tiny_records, tmp_path, capsys):
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    status = train.main(trainer_args(data_dir, job_dir, *flags))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert message in err[-1] and err[-1].startswith("cifar10_estimator: error:")
    assert not job_dir.exists()


def test_missing_records_name_the_generator_command(tmp_path, capsys):
    status = train.main(trainer_args(tmp_path, tmp_path / "job"))
    err = capsys.readouterr().err
    assert status == 2 and "train.tfrecords not found" in err and "generate_tfrecords" in err
    assert not (tmp_path / "job").exists()


def test_booleans_are_real_booleans():
    parse = flags.build_parser().parse_args
    assert parse([]).use_distortion_for_training is True
    for text, value in [("false", False), ("False", False), ("0", False), ("no", False),
                        ("true", True), ("1", True)]:
        assert parse([f"--use-distortion-for-training={text}"]).use_distortion_for_training is value
    assert parse(["--no-use-distortion-for-training"]).use_distortion_for_training is False
    assert parse(["--sync"]).sync is True and parse([]).sync is False
    with pytest.raises(SystemExit):
        parse(["--use-distortion-for-training=maybe"])


@pytest.mark.slow
def test_a_user_mistake_in_a_real_process_prints_no_traceback(tmp_path):
    proc = run_module("cifar10_estimator", *trainer_args(tmp_path, tmp_path / "job",
                                                          "--num-layers", "10"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "cifar10_estimator: error: --num-layers must be 6n+2 with n >= 1 "
        "(8, 14, 20, 32, 44, 56, 110, ...), got 10")
    assert not os.path.exists(tmp_path / "job")
