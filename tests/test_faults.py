"""Faults and bad input, with real processes and signals: nothing lost, nothing executed,
every error one clear line."""

import json
import os
import random
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.data import metadata, schema, sources, writer
from cifar10_estimator.jobdir import lock as job_lock
from conftest import md5, run_generator_cli
from trainer_fixtures import (Trainer, bomb_png, checkpoint_step, one_line_error,
                              run_concurrently, run_module, trainer_args)
import test_job_dir

STEP = re.compile(r"step (\d+)/\d+ \(")  # a progress line


def _copy_records(tiny_records, tmp_path) -> str:
    data_dir = str(tmp_path / "data")
    shutil.copytree(tiny_records[0], data_dir)
    return data_dir


@pytest.mark.slow
def test_kill_9_at_random_moments_then_rerun_resumes_and_finishes(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    interval = 2
    flags = trainer_args(data_dir, job_dir, "--save-checkpoints-steps", str(interval),
                         "--eval-throttle-secs", "100000", "--train-steps", "100000",
                         "--progress-secs", "0.2")
    rng = random.Random(7)  # repeatable kill times; with a checkpoint every 2 steps, several
    # of them land while a checkpoint is being written
    resumed = []
    for _ in range(3):
        log_path = tmp_path / "run.log"
        trainer = Trainer(flags, log_path, cwd=tmp_path)
        try:
            deadline = time.time() + 120
            # Training is under way, past the next checkpoint after the one it resumed from
            # (so each kill can lose progress; on a loaded machine the first progress line
            # can come before any checkpoint but step 0).
            floor = (resumed[-1] if resumed else 0) + interval
            while time.time() < deadline and max(
                    map(int, STEP.findall(log_path.read_text())), default=-1) <= floor:
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 1.5))
        finally:
            trainer.kill()
            killed = trainer.process.pid
        logged = [int(s) for s in STEP.findall(log_path.read_text())]
        latest = tf.train.latest_checkpoint(job_dir)
        assert latest, "a killed run left no usable checkpoint"
        tf.train.list_variables(latest)  # the latest checkpoint reads completely
        # At most one checkpoint interval of logged progress is lost.
        assert checkpoint_step(latest) >= max(logged) - interval
        resumed.append(checkpoint_step(latest))
    assert resumed == sorted(resumed) and resumed[-1] > resumed[0]
    # SIGKILL gave the trainer no chance to release the job dir's lock.
    assert os.path.exists(os.path.join(job_dir, job_lock.LOCK_FILE))

    final = resumed[-1] + 3
    flags[flags.index("--train-steps") + 1] = str(final)
    proc = run_module("cifar10_estimator", *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The lock the kill left never blocks the rerun (tests/test_job_dir.py).
    test_job_dir.check_the_lock_left_by_a_kill(job_dir, killed, proc.stderr)
    # (This run is also what tests/test_train.py once checked after a kill at a checkpoint:
    # it resumes from the latest one, trains to the new end and evaluates there.)
    assert f"resuming from {job_dir}/model.ckpt-{resumed[-1]}" in proc.stderr
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == final
    assert f"final evaluation at step {final}" in proc.stderr
    export_dir = os.path.join(job_dir, "export")
    assert all(name.isdigit() for name in os.listdir(export_dir))  # no half-written export


@pytest.mark.slow
def test_corrupt_training_records_name_the_file(tiny_records, tmp_path):
    data_dir = _copy_records(tiny_records, tmp_path)
    path = schema.record_path(data_dir, "train")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: a CRC mismatch mid-file
    open(path, "wb").write(bytes(data))
    # Metadata of format 1 (an older generator: counts, no sizes or checksums): nothing to
    # check before training, so the damage is met inside training.
    with open(os.path.join(data_dir, metadata.METADATA_FILENAME), "w") as f:
        json.dump({"format": 1, "counts": {"train": 96, "validation": 16, "eval": 37},
                   "source": "test", "label_names": list(schema.CLASS_NAMES)}, f)
    proc = run_module("cifar10_estimator",
                      *trainer_args(data_dir, tmp_path / "job", "--train-steps", "5"))
    one_line_error(proc, f"{path} is truncated or corrupt", "generate_tfrecords.py")


@pytest.mark.slow
def test_truncated_eval_records_name_the_file(tiny_records, tmp_path):
    data_dir = _copy_records(tiny_records, tmp_path)
    path = schema.record_path(data_dir, "eval")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    proc = run_module("cifar10_estimator",
                      *trainer_args(data_dir, tmp_path / "job", "--train-steps", "3"))
    one_line_error(proc, f"{path} is truncated or corrupt")


@pytest.mark.slow
def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    proc = run_module("cifar10_estimator", *trainer_args(
        data_dir, job_dir, "--learning-rate", "1e30", "--train-steps", "200",
        "--save-checkpoints-steps", "1"))
    one_line_error(proc, "the loss became NaN or infinite", "--learning-rate")
    latest = tf.train.latest_checkpoint(job_dir)
    assert latest and latest in proc.stderr.strip().splitlines()[-1]
    reader = tf.train.load_checkpoint(latest)
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if np.issubdtype(np.asarray(value).dtype, np.floating):
            assert np.isfinite(value).all(), name
    assert not os.path.exists(os.path.join(job_dir, "export"))


# A job dir of another model is refused by name, and resuming with another layout is
# allowed: tests/test_job_dir.py (``check_another_model_is_refused``), on the job dir its
# settings test trains anyway.


@pytest.mark.slow
def test_unusable_job_dir_is_a_clear_error(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run_module("cifar10_estimator",
                      *trainer_args(data_dir, blocker / "job", "--train-steps", "2"))
    one_line_error(proc, f"--job-dir {blocker / 'job'} is not a writable folder")


def _limit_file_size():
    # "Disk full" for this process only: writes past 200 kB fail with EFBIG instead of
    # killing the process with SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


@pytest.mark.slow
def test_disk_full_during_export_leaves_no_export_that_looks_complete(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    flags = trainer_args(data_dir, job_dir, "--train-steps", "2",
                         "--export-dir", str(tmp_path / "export"))
    assert train.main(flags) == 0
    shutil.rmtree(tmp_path / "export")
    proc = subprocess.run([sys.executable, "-m", "cifar10_estimator", *flags], cwd=tmp_path,
                          capture_output=True, text=True, preexec_fn=_limit_file_size)
    one_line_error(proc, f"cannot write the SavedModel under {tmp_path / 'export'}")
    assert os.listdir(tmp_path / "export") == []


@pytest.mark.slow
def test_predict_handles_odd_images_and_refuses_bad_input(tiny_export, tmp_path):
    export = tiny_export  # a trained model's export, only read here
    job_dir = os.path.dirname(os.path.dirname(export))
    gray = tmp_path / "gray.png"
    gray.write_bytes(tf.io.encode_png(np.full((9, 40, 1), 200, np.uint8)).numpy())
    rgba = tmp_path / "rgba.png"
    rgba.write_bytes(tf.io.encode_png(np.full((300, 17, 4), 90, np.uint8)).numpy())
    text = tmp_path / "notes.png"
    text.write_text("this is not an image")
    huge = tmp_path / "huge.png"
    huge.write_bytes(bomb_png(60_000, 60_000))

    def predict(saved_model, *pictures):
        return lambda: run_module("cifar10_estimator.predict", "--saved-model", saved_model,
                                  *map(str, pictures))

    # Each command in a process of its own, all at once.
    ok, not_an_image, bomb, no_saved_model, missing = run_concurrently(
        predict(export, gray, rgba), predict(export, text), predict(export, huge),
        predict(job_dir, gray), predict(export, tmp_path / "missing.png"))
    assert ok.returncode == 0, ok.stderr
    assert [line.split(":")[0] for line in ok.stdout.splitlines()] == [str(gray), str(rgba)]
    one_line_error(not_an_image, f"{text} is not a readable PNG, JPEG, GIF or BMP image")
    one_line_error(bomb, f"{huge} is too large to decode safely (Image size (3600000000 pixels)")
    one_line_error(no_saved_model, f"{job_dir} is not a SavedModel folder")
    one_line_error(missing, "cannot read image")


def test_generator_refuses_a_tarball_missing_a_batch(tmp_path, make_cifar_tarball):
    archive, _ = make_cifar_tarball(skip=("data_batch_3",))
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(archive)
    proc = run_generator_cli("--data-dir", str(tmp_path), "--source-md5", md5(archive))
    one_line_error(proc, "data_batch_3")
    assert not list(tmp_path.glob("*.tfrecords"))


def _generate_records(data_dir: str) -> None:
    """The records of CIFAR-10's batches in ``data_dir``, written beside them, quietly."""
    def quiet(_):
        pass

    writer.write_tfrecords(sources.load_source(data_dir, log=quiet), data_dir, log=quiet)


def _record_starts(path: str) -> list[int]:
    """Byte offsets where the records of a TFRecord file start (length, CRC, data, CRC)."""
    starts, offset, data = [], 0, open(path, "rb").read()
    while offset < len(data):
        starts.append(offset)
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        offset += 8 + 4 + length + 4
    return starts


@pytest.mark.parametrize("cut", ["7 bytes into a record header", "inside a record",
                                 "exactly between records"])
def test_a_record_file_cut_short_is_refused_before_training(cut, tmp_path, capsys):
    # TensorFlow's reader takes a partial header at the end for the end of the file, and a
    # cut between records leaves a valid shorter file: both would train without a word.
    from conftest import write_cifar_dir

    data_dir = str(tmp_path / "data")
    write_cifar_dir(data_dir, images_per_batch=12)
    _generate_records(data_dir)
    path = schema.record_path(data_dir, "train")
    starts = _record_starts(path)
    half = starts[len(starts) // 2]  # half the file gone
    offset = {"7 bytes into a record header": half + 7, "inside a record": half + 12 + 100,
              "exactly between records": half}[cut]
    with open(path, "r+b") as f:
        f.truncate(offset)
    job_dir = tmp_path / "job"
    status = train.main(trainer_args(data_dir, job_dir, "--train-steps", "2"))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1] == (
        f"cifar10_estimator: error: {path} is {offset:,} bytes but the generator wrote "
        f"{_written_size(data_dir):,} "
        f"({metadata.METADATA_FILENAME}): it is truncated or was replaced; regenerate it with "
        f"{schema.GENERATOR_COMMAND}")
    assert not job_dir.exists()


def _written_size(data_dir: str) -> int:
    return metadata.dataset_info(data_dir).splits["train"].size


def test_changed_bytes_of_the_same_size_are_refused_before_training(tmp_path, capsys):
    from conftest import write_cifar_dir

    data_dir = str(tmp_path / "data")
    write_cifar_dir(data_dir, images_per_batch=12)
    _generate_records(data_dir)
    path = schema.record_path(data_dir, "eval")
    data = bytearray(open(path, "rb").read())
    data[-40] ^= 0x01  # one pixel of the last image
    open(path, "wb").write(bytes(data))
    status = train.main(trainer_args(data_dir, tmp_path / "job", "--train-steps", "2"))
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2 and f"{path} has the size the generator wrote but other bytes" in err
    assert "regenerate it with" in err
