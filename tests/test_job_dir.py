"""One job dir, one trainer, one set of settings: real processes on a real job dir."""

import json
import os
import re
import socket
import threading
import time

import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.errors import UserError
from cifar10_estimator.jobdir import lock as job_lock, settings_record
from cifar10_estimator.platform import cpu
from cluster_fixtures import local_spec, tf_config
from trainer_fixtures import (NO_BEAT, checkpoint_step, last_line, run_trainer, trainer_args,
                              wait_until, write_lock_file)


# --- one trainer per job dir --------------------------------------------------------------------

# A trainer on a running job dir, and a trainer's lock left by a kill -9: the trainers these
# checks need run in tests/test_preemption.py (the SIGTERM run: ``check_a_second_trainer``) and
# tests/test_faults.py (the kills and their rerun), which start them anyway.

def check_a_second_trainer(data_dir, job_dir, first) -> None:
    """A second trainer on the job dir of a running one (``first``, a
    ``trainer_fixtures.Trainer``) is refused at once and writes nothing."""
    before = sorted(os.listdir(job_dir))
    started = time.monotonic()
    second = run_trainer(*trainer_args(data_dir, job_dir, "--progress-secs", "1",
                                       "--train-steps", "5"))
    assert second.returncode == 2
    line = last_line(second.stderr)
    assert re.fullmatch(
        rf"cifar10_estimator: error: --job-dir {re.escape(str(job_dir))} is in use by another "
        rf"trainer \(pid {first.process.pid} on {re.escape(socket.gethostname())}, since "
        rf"\d{{4}}-\d\d-\d\dT\S+\); wait for it to end, stop it, or use another --job-dir",
        line), line
    assert "resuming from" not in second.stderr and "Saving checkpoints" not in second.stderr
    # Nothing written: the first trainer's own files, at most its newer checkpoints and, for a
    # moment, a temporary file of its own (its lease's heartbeat writes one, then renames it).
    def new_files() -> set:
        return {n for n in set(os.listdir(job_dir)) - set(before)
                if not n.startswith("model.ckpt")}

    assert time.monotonic() - started < 60  # at once: no wait for a living holder here
    wait_until(lambda: not new_files(), f"the new files {sorted(new_files())} to go",
               timeout=10)


def check_the_lock_left_by_a_kill(job_dir, killed_pid: int, rerun_stderr: str) -> None:
    """A lock left by a trainer killed with SIGKILL (pid ``killed_pid``: no chance to release
    it) never blocks the rerun, which took it over (its stderr ``rerun_stderr``)."""
    lock = os.path.join(str(job_dir), job_lock.LOCK_FILE)
    assert f"took over {lock}: its holder (pid {killed_pid}" in rerun_stderr


# The lock's own tests run JobLock in this process. Its heartbeat thread rewrites the lock file
# every ``heartbeat_secs``; where a test reads or replaces the file while holding the lock, the
# heartbeat is either out of the way (``NO_BEAT``, an hour: it never beats during the test) or
# waited on through what it does (the file's counter, the thread's end), never through fixed
# sleeps. ``write_lock_file`` writes a holder's lock file as a trainer does.


def _holder(path) -> dict:
    return json.loads(path.read_text())


def _heartbeat_thread_of(acquire) -> threading.Thread:
    """Calls ``acquire()``; returns the heartbeat thread it started."""
    before = set(threading.enumerate())
    acquire()
    (thread,) = [t for t in threading.enumerate()
                 if t not in before and t.name == "job_lock_heartbeat"]
    return thread


def test_a_living_holder_on_this_machine_is_recognised_and_a_reused_pid_is_not(tmp_path):
    path = tmp_path / job_lock.LOCK_FILE
    write_lock_file(path)  # this very process: alive
    with pytest.raises(UserError, match=rf"in use by another trainer \(pid {os.getpid()} on "):
        job_lock.JobLock(str(tmp_path), heartbeat_secs=NO_BEAT).acquire()
    # The same pid with another start time is another process (a restarted container).
    write_lock_file(path, start_ticks=job_lock._start_ticks(os.getpid()) - 1)
    with job_lock.JobLock(str(tmp_path), heartbeat_secs=NO_BEAT):
        assert json.loads(path.read_text())["pid"] == os.getpid()
        assert json.loads(path.read_text())["start_ticks"] == job_lock._start_ticks(os.getpid())
    assert not path.exists()


def test_a_holder_on_another_machine_is_alive_while_its_heartbeat_moves(tmp_path):
    path = tmp_path / job_lock.LOCK_FILE
    write_lock_file(path, host="other-host", boot_id="other-boot")
    sleeps = []

    def beating(seconds):  # the other machine's trainer writes a heartbeat meanwhile
        sleeps.append(seconds)
        write_lock_file(path, host="other-host", boot_id="other-boot", beat=len(sleeps))

    with pytest.raises(UserError, match=r"in use by another trainer \(pid \d+ on other-host"):
        job_lock.JobLock(str(tmp_path), sleep=beating).acquire()
    assert len(sleeps) == 1  # refused at the first heartbeat seen
    # Silent for stale_secs: a lost node; the lock is taken over.
    waited = []
    with job_lock.JobLock(str(tmp_path), heartbeat_secs=NO_BEAT, stale_secs=5,
                          sleep=waited.append):
        assert sum(waited) == 5 and _holder(path)["host"] == socket.gethostname()


def test_the_holder_beats_and_stops_beating_once_taken_over(tmp_path):
    path = tmp_path / job_lock.LOCK_FILE
    lock = job_lock.JobLock(str(tmp_path), heartbeat_secs=0.05)
    heartbeat = _heartbeat_thread_of(lock.acquire)
    try:
        wait_until(lambda: _holder(path)["beat"] >= 2, "two heartbeats")
        # Another trainer takes the lock over. Each beat reads the file, then rewrites it: a
        # takeover that lands between the two is overwritten by that beat (the lock's
        # documented window), so the thief writes again until the heartbeat has seen it. What
        # counts: once it has seen the thief, the heartbeat ends by itself.
        deadline = time.monotonic() + 30
        while heartbeat.is_alive():
            if _holder(path)["host"] != "thief":
                write_lock_file(path, host="thief", boot_id="x", pid=1)
            assert time.monotonic() < deadline, "the heartbeat went on beating after a takeover"
            time.sleep(0.01)
        assert _holder(path)["host"] == "thief"  # not overwritten, and no beat comes any more
    finally:
        lock.release()
    assert path.exists() and _holder(path)["host"] == "thief"  # not ours to delete


# --- the job dir remembers its settings -----------------------------------------------------------

@pytest.mark.slow
def test_a_rerun_or_an_evaluator_with_other_settings_is_refused_naming_each_flag(
        tiny_records, tmp_path, capsys, monkeypatch):
    # In this process, as the command line runs it (train.main: its exit status, its one line).
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"

    def run(*flags: str) -> tuple[int, str]:
        capsys.readouterr()
        code = train.main(trainer_args(data_dir, job_dir, "--progress-secs", "1", *flags))
        return code, capsys.readouterr().err

    code, err = run("--train-steps", "2")
    assert code == 0, err[-3000:]
    record = json.loads((job_dir / settings_record.RECORD_FILE).read_text())["settings"]
    assert record["train_batch_size"] == 8 and record["learning_rate"] == 0.1
    assert record["dataset"] == "cifar10" and "train_steps" not in record
    check_another_model_is_refused(data_dir, job_dir, capsys)
    before = sorted(os.listdir(job_dir))
    code, err = run("--train-steps", "4", "--learning-rate", "0.05", "--lr-boundary-epochs",
                    "10,20,30", "--momentum", "0.8")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"cifar10_estimator: error: --job-dir {job_dir} was trained with other settings "
        f"(settings.json): --learning-rate 0.1 (now 0.05); --lr-boundary-epochs 82,123,300 "
        f"(now 10,20,30); --momentum 0.9 (now 0.8); rerun with the recorded values, use a new "
        f"--job-dir, or add --change-settings to change them on purpose")
    assert sorted(os.listdir(job_dir)) == before  # nothing written
    # The evaluator reads the chief's record: it would evaluate another model.
    with monkeypatch.context() as env:
        env.setenv("TF_CONFIG", tf_config(local_spec("chief", "ps", ports=[1, 2]), "evaluator"))
        code, err = run("--train-steps", "2", "--weight-decay", "0.001")
    assert code == 2
    assert err.strip().splitlines()[-1].endswith(
        "(settings.json): --weight-decay 0.0002 (now 0.001); start this task with the same flags "
        "as the chief")
    # A record written before a setting existed (tests/test_settings_record.py): the setting
    # is read as its default, which a rerun may not change, and may keep (it is then recorded).
    path = job_dir / settings_record.RECORD_FILE
    body = json.loads(path.read_text())
    del body["settings"]["test_time_mirror"]
    path.write_text(json.dumps(body, indent=2))
    code, err = run("--train-steps", "4", "--test-time-mirror")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"cifar10_estimator: error: --job-dir {job_dir} was trained with other settings "
        f"(settings.json): --test-time-mirror false (now true); rerun with the recorded "
        f"values, use a new --job-dir, or add --change-settings to change them on purpose")
    assert "test_time_mirror" not in json.loads(path.read_text())["settings"]
    # Training longer just works, in another layout too (it does not change what is computed:
    # channels_first on a CPU where oneDNN is on; tests/test_faults.py); a deliberate change is
    # recorded.
    layout = "channels_first" if cpu.onednn_enabled() else "channels_last"
    code, err = run("--train-steps", "4", "--data-format", layout)
    assert code == 0, err[-3000:]
    assert ("settings.json was written before --test-time-mirror existed: taking its default, "
            "false") in err
    assert json.loads(path.read_text())["settings"]["test_time_mirror"] is False
    code, err = run("--train-steps", "6", "--learning-rate", "0.05", "--change-settings")
    assert code == 0, err[-3000:]
    assert "--change-settings: recorded the new settings" in err
    assert "--learning-rate 0.1 (now 0.05)" in err
    record = json.loads((job_dir / settings_record.RECORD_FILE).read_text())["settings"]
    assert record["learning_rate"] == 0.05
    assert checkpoint_step(tf.train.latest_checkpoint(str(job_dir))) == 6


def check_another_model_is_refused(data_dir, job_dir, capsys) -> None:
    """A job dir of a ResNet-8 v1 (trained with ``trainer_fixtures.TINY_FLAGS``) is refused
    by name for another network, and nothing is written (tests/test_faults.py's)."""
    base = trainer_args(data_dir, job_dir, "--eval-throttle-secs", "100000")
    before = sorted(os.listdir(job_dir))
    capsys.readouterr()
    for flags, found in ([["--num-layers", "14"], "ResNet-8 v1, but the flags ask for ResNet-14 v1"],
                         [["--resnet-version", "2"], "ResNet-8 v1, but the flags ask for ResNet-8 v2"],
                         [["--model", "tutorial-cnn"],
                          "ResNet-8 v1, but the flags ask for the tutorial CNN"]):
        args = [*base, "--train-steps", "4", *flags]
        if "tutorial-cnn" in flags:  # --num-layers applies to the ResNet only
            del args[args.index("--num-layers"):args.index("--num-layers") + 2]
        assert train.main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert found in err and "--num-layers 8 --resnet-version 1" in err
    assert sorted(os.listdir(job_dir)) == before


@pytest.mark.parametrize("holds_job_dir", [True, False])
def test_a_save_without_room_is_cleaned_up_only_by_the_job_dirs_holder(tmp_path, holds_job_dir):
    # A chaos campaign (issue 76) filled an all-reduce job's disk: the worker's save failed,
    # and its one-line error's clean-up removed the chief's save in progress from the job
    # dir, which then failed with a traceback. Only the lock's holder cleans the job dir.
    from cifar10_estimator.jobdir import guards

    partial = tmp_path / "model.ckpt-5_temp"
    partial.mkdir()
    (partial / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 64)
    with pytest.raises(UserError, match=r"cannot write a checkpoint in --job-dir .* \(No space "
                                        r"left on device\)"):
        with guards.training_errors(str(tmp_path), str(tmp_path), holds_job_dir):
            raise tf.errors.ResourceExhaustedError(
                None, None, "model.ckpt-5_temp/part-00000; No space left on device")
    assert partial.exists() is not holds_job_dir
