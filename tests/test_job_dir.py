"""One job dir, one trainer, one set of settings: real processes on a real job dir."""

import json
import os
import re
import signal
import socket
import time

import pytest
import tensorflow as tf

from cifar10_estimator.errors import UserError
from cifar10_estimator.jobdir import lock as job_lock, settings_record
from trainer_fixtures import TINY_FLAGS, Trainer, checkpoint_step, run_module


def _flags(data_dir, job_dir, *extra):
    return ["--data-dir", data_dir, "--job-dir", str(job_dir), *TINY_FLAGS, "--progress-secs",
            "1", *extra]


def _last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


# --- one trainer per job dir --------------------------------------------------------------------

def test_a_second_trainer_on_a_running_job_dir_is_refused_at_once_and_writes_nothing(
        tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    trainer = Trainer(_flags(data_dir, job_dir, "--train-steps", "100000"), tmp_path / "log")
    first = trainer.process
    try:
        trainer.wait_for(r"step \d+/100000")
        before = sorted(os.listdir(job_dir))
        started = time.monotonic()
        second = run_module("cifar10_estimator", *_flags(data_dir, job_dir, "--train-steps", "5"))
        assert second.returncode == 2
        line = _last_line(second)
        assert re.fullmatch(
            rf"cifar10_estimator: error: --job-dir {re.escape(str(job_dir))} is in use by another "
            rf"trainer \(pid {first.pid} on {re.escape(socket.gethostname())}, since "
            rf"\d{{4}}-\d\d-\d\dT\S+\); wait for it to end, stop it, or use another --job-dir",
            line), line
        assert "resuming from" not in second.stderr and "Saving checkpoints" not in second.stderr
        # Nothing written: the first trainer's own files, at most its newer checkpoints.
        after = set(os.listdir(job_dir))
        assert not {n for n in after - set(before) if not n.startswith("model.ckpt")}
        assert time.monotonic() - started < 60  # at once: no wait for a living holder here
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 143
    assert not (job_dir / job_lock.LOCK_FILE).exists()  # released on the way out


def test_a_lock_left_by_a_killed_trainer_never_blocks_the_rerun(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    trainer = Trainer(_flags(data_dir, job_dir, "--train-steps", "100000"), tmp_path / "log")
    first = trainer.process
    trainer.wait_for(r"step \d+/100000")
    first.kill()  # SIGKILL: no chance to release the lock
    first.wait()
    assert (job_dir / job_lock.LOCK_FILE).exists()
    rerun = run_module("cifar10_estimator", *_flags(data_dir, job_dir, "--train-steps", "3"))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"took over {job_dir / job_lock.LOCK_FILE}: its holder (pid {first.pid}" in rerun.stderr


def _lock_file(path, **holder) -> None:
    body = {"host": socket.gethostname(), "boot_id": job_lock._boot_id(), "pid": os.getpid(),
            "start_ticks": job_lock._start_ticks(os.getpid()), "since": "2026-01-01T00:00:00",
            "beat": 0}
    body.update(holder)
    path.write_text(json.dumps(body))


def test_a_living_holder_on_this_machine_is_recognised_and_a_reused_pid_is_not(tmp_path):
    path = tmp_path / job_lock.LOCK_FILE
    _lock_file(path)  # this very process: alive
    with pytest.raises(UserError, match=rf"in use by another trainer \(pid {os.getpid()} on "):
        job_lock.JobLock(str(tmp_path)).acquire()
    # The same pid with another start time is another process (a restarted container).
    _lock_file(path, start_ticks=job_lock._start_ticks(os.getpid()) - 1)
    with job_lock.JobLock(str(tmp_path)):
        assert json.loads(path.read_text())["pid"] == os.getpid()
        assert json.loads(path.read_text())["start_ticks"] == job_lock._start_ticks(os.getpid())
    assert not path.exists()


def test_a_holder_on_another_machine_is_alive_while_its_heartbeat_moves(tmp_path):
    path = tmp_path / job_lock.LOCK_FILE
    _lock_file(path, host="other-host", boot_id="other-boot")
    sleeps = []

    def beating(seconds):  # the other machine's trainer writes a heartbeat meanwhile
        sleeps.append(seconds)
        _lock_file(path, host="other-host", boot_id="other-boot", beat=len(sleeps))

    with pytest.raises(UserError, match=r"in use by another trainer \(pid \d+ on other-host"):
        job_lock.JobLock(str(tmp_path), sleep=beating).acquire()
    assert len(sleeps) == 1  # refused at the first heartbeat seen
    # Silent for stale_secs: a lost node; the lock is taken over.
    waited = []
    lock = job_lock.JobLock(str(tmp_path), stale_secs=5, sleep=waited.append)
    lock.acquire()
    assert sum(waited) == 5 and json.loads(path.read_text())["host"] == socket.gethostname()
    lock.release()


def test_the_holder_beats_and_stops_beating_once_taken_over(tmp_path):
    lock = job_lock.JobLock(str(tmp_path), heartbeat_secs=0.05)
    lock.acquire()
    path = tmp_path / job_lock.LOCK_FILE
    deadline = time.monotonic() + 10
    while json.loads(path.read_text())["beat"] < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    _lock_file(path, host="thief", boot_id="x", pid=1)
    time.sleep(0.3)
    assert json.loads(path.read_text())["host"] == "thief"  # not overwritten
    lock.release()
    assert path.exists()  # not ours to delete


# --- the job dir remembers its settings -----------------------------------------------------------

def test_a_rerun_with_other_settings_is_refused_naming_each_flag(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    first = run_module("cifar10_estimator", *_flags(data_dir, job_dir, "--train-steps", "2"))
    assert first.returncode == 0, first.stderr[-3000:]
    record = json.loads((job_dir / settings_record.RECORD_FILE).read_text())["settings"]
    assert record["train_batch_size"] == 8 and record["learning_rate"] == 0.1
    assert record["dataset"] == "cifar10" and "train_steps" not in record
    before = sorted(os.listdir(job_dir))
    changed = run_module("cifar10_estimator", *_flags(
        data_dir, job_dir, "--train-steps", "4", "--learning-rate", "0.05",
        "--lr-boundary-epochs", "10,20,30", "--momentum", "0.8"))
    assert changed.returncode == 2
    assert _last_line(changed) == (
        f"cifar10_estimator: error: --job-dir {job_dir} was trained with other settings "
        f"(settings.json): --learning-rate 0.1 (now 0.05); --lr-boundary-epochs 82,123,300 "
        f"(now 10,20,30); --momentum 0.9 (now 0.8); rerun with the recorded values, use a new "
        f"--job-dir, or add --change-settings to change them on purpose")
    assert sorted(os.listdir(job_dir)) == before  # nothing written
    # Training longer just works; a deliberate change is recorded.
    longer = run_module("cifar10_estimator", *_flags(data_dir, job_dir, "--train-steps", "4"))
    assert longer.returncode == 0, longer.stderr[-3000:]
    deliberate = run_module("cifar10_estimator", *_flags(
        data_dir, job_dir, "--train-steps", "6", "--learning-rate", "0.05", "--change-settings"))
    assert deliberate.returncode == 0, deliberate.stderr[-3000:]
    assert "--change-settings: recorded the new settings" in deliberate.stderr
    assert "--learning-rate 0.1 (now 0.05)" in deliberate.stderr
    record = json.loads((job_dir / settings_record.RECORD_FILE).read_text())["settings"]
    assert record["learning_rate"] == 0.05
    assert checkpoint_step(tf.train.latest_checkpoint(str(job_dir))) == 6


def test_an_evaluator_with_other_settings_is_refused(tiny_records, tmp_path):
    # The evaluator reads the chief's record: it would evaluate another model.
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    assert run_module("cifar10_estimator",
                      *_flags(data_dir, job_dir, "--train-steps", "2")).returncode == 0
    tf_config = json.dumps({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                            "task": {"type": "evaluator", "index": 0}})
    evaluator = run_module("cifar10_estimator", *_flags(
        data_dir, job_dir, "--train-steps", "2", "--weight-decay", "0.001"),
        env_extra={"TF_CONFIG": tf_config})
    assert evaluator.returncode == 2
    assert _last_line(evaluator).endswith(
        "(settings.json): --weight-decay 0.0002 (now 0.001); start this task with the same flags "
        "as the chief")
