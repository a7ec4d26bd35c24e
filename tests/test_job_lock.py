"""One job dir, one trainer, fenced: a holder that loses the lock stops without saving, a lease
survives slow writes, and a living holder is never taken over, PID namespaces included.

Real processes and real files throughout: a trainer whose lock another holder takes, small
Python processes holding a ``JobLock`` through the library (frozen with SIGSTOP, their writes
refused by a file-size limit, in another PID namespace), racers for a lease on moto's S3 server
behind a relay that slows every PUT down, and a real TensorFlow session with the lock's hook
and listener.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

from cifar10_estimator.jobdir import lock as job_lock
from cifar10_estimator.jobdir.lock import JobLock, LockLost
from cifar10_estimator.training.estimator import fence
from cluster_fixtures import frozen, wait_stopped
from trainer_fixtures import (NEEDS_S3, NO_BEAT, NO_EVAL, checkpoint_step, trainer_env,
                              wait_until, work_dir, write_lock_file)
# moto's S3 server, one for this module (the fixtures of test_object_storage, imported).
from test_object_storage import _Relay, _s3_env, bucket, s3_server  # noqa: F401


# --- losing the lock, in this process -------------------------------------------------------------

def test_a_holder_finds_its_lock_taken_or_deleted_at_its_next_check_or_heartbeat(tmp_path):
    path = tmp_path / job_lock.LOCK_FILE
    lock = JobLock(str(tmp_path), heartbeat_secs=NO_BEAT)
    lock.acquire()
    try:
        lock.check()
        write_lock_file(path, host="thief", boot_id="x", pid=4242)
        lock.check(read=False)  # no heartbeat has seen it yet: a step goes on
        with pytest.raises(LockLost) as lost:
            lock.check()  # re-read, as before a save
        assert str(lost.value) == (
            f"lost the lock of --job-dir {tmp_path} to pid 4242 on thief (since "
            f"2026-01-01T00:00:00); stopped without saving: the checkpoints saved before are "
            f"kept; rerun the same command to resume once no other trainer uses --job-dir, or "
            f"use another --job-dir")
        with pytest.raises(LockLost):
            lock.check(read=False)  # for good
    finally:
        lock.release()
    assert json.loads(path.read_text())["host"] == "thief"  # not ours to delete

    # The heartbeat notices by itself, within a beat, and the verdict needs no read.
    path.unlink()
    lock = JobLock(str(tmp_path), heartbeat_secs=0.05)
    lock.acquire()
    try:
        path.unlink()
        wait_until(lambda: lock.lost_error() is not None, "the heartbeat's verdict", 5)
        assert str(lock.lost_error()).startswith(
            f"lost the lock of --job-dir {tmp_path}: {path} was deleted; stopped without saving")
    finally:
        lock.release()


def test_a_lease_not_renewed_in_time_is_lost_for_good(tmp_path):
    now = [0.0]
    lock = JobLock(str(tmp_path), clock=lambda: now[0])  # the defaults: 10 s beats, 60 s stale
    assert lock.renew_within == job_lock.STALE_SECS - 2 * job_lock.HEARTBEAT_SECS == 40
    lock.acquire()
    try:
        now[0] = 39.0
        assert lock._beat_once()  # renews: the lease now runs from 39 s
        now[0] = 78.0
        lock.check()
        now[0] = 78.9
        lock.check(read=False)
        now[0] = 79.5  # a beat that lands 40.5 s after the last renewal began: too late
        assert lock._beat_once() is False  # renews nothing
        with pytest.raises(LockLost, match=r": its heartbeat was not renewed for over 40 s \("
                                           r"a heartbeat took 0.0 s\), and another trainer may "
                                           r"take a lock over after 60 s without one; stopped "
                                           r"without saving"):
            lock.check(read=False)
        assert lock._beat_once() is False
        with pytest.raises(LockLost):
            lock.check()
    finally:
        lock.release()
    assert not (tmp_path / job_lock.LOCK_FILE).exists()  # it still named us: deleted


def _tiny_session(job_dir, lock: JobLock, save_steps: int):
    """A real TensorFlow training session as Estimator's chief runs one: the checkpoint hook
    (with the driver's listener) first, then the driver's lock hook."""
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.assign_add(step, 1)
    saver = tf.compat.v1.train.CheckpointSaverHook(str(job_dir), save_steps=save_steps,
                                                   listeners=[fence.LockListener(lock)])
    session = tf.compat.v1.train.MonitoredSession(
        tf.compat.v1.train.ChiefSessionCreator(checkpoint_dir=str(job_dir)),
        hooks=[saver, fence.LockHook(lock)])
    return session, train_op


def _saved_steps(job_dir) -> list[int]:
    state = tf.train.get_checkpoint_state(str(job_dir))
    return sorted(checkpoint_step(p) for p in state.all_model_checkpoint_paths) if state else []


@pytest.mark.parametrize("how", ["at the next save", "at the next heartbeat"])
def test_a_session_that_loses_the_lock_stops_without_another_checkpoint(how, tmp_path):
    # By the listener: no heartbeat ever comes, the save 2 steps after the takeover re-reads
    # the lock. By the hook: saves every 1000 steps, the heartbeat's verdict stops the next
    # step. Either way no checkpoint after step 0 (the session's first), and none at the end
    # (the checkpoint hook's end() would save the last step).
    path = tmp_path / job_lock.LOCK_FILE
    by_listener = how == "at the next save"
    lock = JobLock(str(tmp_path), heartbeat_secs=NO_BEAT if by_listener else 0.05)
    lock.acquire()
    steps = 0
    try:
        with tf.Graph().as_default():
            session, train_op = _tiny_session(tmp_path, lock, 4 if by_listener else 1000)
            with pytest.raises(LockLost, match=r"to pid 4242 on thief"):
                with session:
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        session.run(train_op)
                        steps += 1
                        # A heartbeat that read the lock just before the takeover rewrites
                        # it (the documented window of a read, then a write): the thief
                        # writes again until it is seen.
                        if steps >= 2 and json.loads(path.read_text())["host"] != "thief":
                            write_lock_file(path, host="thief", boot_id="x", pid=4242)
                        time.sleep(0.01)
    finally:
        lock.release()
    assert _saved_steps(tmp_path) == [0]
    assert steps == 3 if by_listener else steps >= 2  # the listener: at once, before step 4's


# --- real processes holding a JobLock -------------------------------------------------------------

# A process that holds (or tries to take) a job dir's lock through the library: argv is the job
# dir, the heartbeat, the stale time and what to do. "hold": hold it, checking before every
# "step" (20 ms) as the training hook does, until lost; "try": take it and let go. SIGUSR1 caps
# its file size at 0 (RLIMIT_FSIZE), so every write of the heartbeat fails (EFBIG).
HOLDER = r"""
import logging, resource, signal, sys, time
from cifar10_estimator.errors import UserError
from cifar10_estimator.jobdir.lock import JobLock, LockLost

logging.basicConfig(level=logging.INFO, format="%(message)s")
job_dir, heartbeat, stale, mode = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]

def no_room(*_):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

signal.signal(signal.SIGUSR1, no_room)
lock = JobLock(job_dir, heartbeat_secs=heartbeat, stale_secs=stale)
try:
    lock.acquire()
except UserError as e:
    print(f"refused: {e}", flush=True)
    sys.exit(2)
print("held", flush=True)
if mode == "try":
    lock.release()
    sys.exit(0)
try:
    while True:
        lock.check(read=False)
        time.sleep(0.02)
except LockLost as e:
    print(f"lost: {e}", flush=True)
    sys.exit(3)
"""


class _Holder:
    """``HOLDER`` in the background (``prefix``: a command to run it under); ``kill`` ends its
    process group (unshare and the process in it, too). Its output comes through a pipe, which
    a file-size limit does not touch."""

    def __init__(self, job_dir, heartbeat: float = job_lock.HEARTBEAT_SECS,
                 stale: float = job_lock.STALE_SECS, prefix: tuple = ()):
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-c", HOLDER, str(job_dir), str(heartbeat), str(stale),
             "hold"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            cwd=work_dir(), env=trainer_env(), start_new_session=True)
        self._lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._lines.append(line)

    def text(self) -> str:
        return "".join(self._lines)

    def wait_for(self, word: str, timeout: float = 60) -> None:
        wait_until(lambda: word in self.text() or self.process.poll() is not None,
                   f"{word!r} from the holder", timeout)
        assert word in self.text(), self.text()

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)


def _try(job_dir, prefix: tuple = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-c", HOLDER, str(job_dir), "10", "60",
                           "try"], capture_output=True, text=True, timeout=120, cwd=work_dir(),
                          env=trainer_env())


def test_a_frozen_holder_and_one_whose_heartbeats_fail_lose_the_lock_in_time(tmp_path):
    # Test-sized leases: 0.25 s beats, 3 s stale, so a lease runs out 2.5 s after its last
    # renewal began.
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    frozen = _Holder(tmp_path / "a", heartbeat=0.25, stale=3.0)
    failing = _Holder(tmp_path / "b", heartbeat=0.25, stale=3.0)
    try:
        frozen.wait_for("held")
        failing.wait_for("held")
        # A machine frozen (a VM paused, SIGSTOP) past its lease: on waking it stops at its
        # next check, before anything else, though no one took the lock over meanwhile.
        frozen.process.send_signal(signal.SIGSTOP)
        wait_stopped(frozen.process.pid)
        time.sleep(3.0)
        frozen.process.send_signal(signal.SIGCONT)
        # Heartbeats that fail (every write refused) for as long: the same.
        failing.process.send_signal(signal.SIGUSR1)
        refused_at = time.monotonic()
        assert frozen.process.wait(30) == 3, frozen.text()
        assert failing.process.wait(30) == 3, failing.text()
        failed_for = time.monotonic() - refused_at
    finally:
        frozen.kill()
        failing.kill()
    # (A heartbeat frozen between its read and its write lands after the thaw: it says so.)
    assert re.fullmatch(
        rf"held\nlost: lost the lock of --job-dir {re.escape(str(tmp_path / 'a'))}: its heartbeat "
        rf"was not renewed for over 2.5 s( \(a heartbeat took [\d.]+ s\))?, and another trainer "
        rf"may take a lock over after 3 s without one; stopped without saving: .*\n",
        frozen.text()), frozen.text()
    assert re.search(r"lost: lost the lock of --job-dir \S+: its heartbeat was not renewed for "
                     r"over 2.5 s \(the last write failed: File too large\)", failing.text()), \
        failing.text()
    assert failed_for < 10, failed_for  # 2.5 s after its last renewal, and a check


def _unshare_pid() -> tuple:
    """The command prefix that runs a program in a new PID namespace with a /proc of its own
    (the same host name, file systems and kernel); skips the test where that is not allowed."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare command (util-linux) to make a PID namespace")
    prefix = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"unshare --pid is not permitted here (it needs root, or user namespaces): "
                    f"{probe.stderr.strip()}")
    return prefix


@pytest.mark.parametrize("holder_in, taker_in", [("this", "another"), ("another", "this")])
def test_a_holder_in_another_pid_namespace_is_never_taken_over_while_it_lives(
        holder_in, taker_in, tmp_path):
    # The same host name and boot id on both sides, pids of different namespaces: the holder's
    # pid means nothing to the taker (absent from its /proc, or another process's), and only
    # the kernel lock on the job dir says whether the holder lives.
    namespace = _unshare_pid()
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    holder = _Holder(job_dir, prefix=namespace if holder_in == "another" else ())
    taker_prefix = namespace if taker_in == "another" else ()
    try:
        holder.wait_for("held")
        recorded = json.loads((job_dir / job_lock.LOCK_FILE).read_text())
        assert recorded["host"] == socket.gethostname()
        assert (recorded["pid_ns"] == os.readlink("/proc/self/ns/pid")) == (holder_in == "this")
        started = time.monotonic()
        refused = _try(job_dir, taker_prefix)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stdout.startswith(
            f"refused: --job-dir {job_dir} is in use by another trainer (pid {recorded['pid']} "
            f"on {socket.gethostname()}, since "), refused.stdout
        assert time.monotonic() - started < 30  # at once: no heartbeat watch
        assert json.loads((job_dir / job_lock.LOCK_FILE).read_text())["pid"] == recorded["pid"]
    finally:
        holder.kill()  # SIGKILL: its lock file stays
    taken = _try(job_dir, taker_prefix)
    assert taken.returncode == 0, taken.stdout + taken.stderr
    assert taken.stdout == "held\n"
    assert f"took over {job_dir / job_lock.LOCK_FILE}: its holder (pid {recorded['pid']} " \
           in taken.stdout + taken.stderr
    assert not (job_dir / job_lock.LOCK_FILE).exists()


# --- a trainer that loses its lock --------------------------------------------------------------

_SAVED = re.compile(r"Saving checkpoints for (\d+) into")


@pytest.mark.slow
def test_a_trainer_whose_lock_is_taken_over_stops_before_its_next_save_and_saves_nothing_more(
        tiny_records, tmp_path, endless_trainer):
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    trainer = endless_trainer(data_dir, job_dir, "--save-checkpoints-steps", "3",
                              "--precise-bn-batches", "2", *NO_EVAL,
                              until=r"Saving checkpoints for [1-9]\d* into", timeout=180)
    # Frozen for a moment, so that "before" and "after" the takeover are exact: another
    # trainer takes the lock over as a taker does (a whole file by a rename).
    with frozen(trainer.process):
        wait_stopped(trainer.process.pid)
        saved_before = _SAVED.findall(trainer.text())
        write_lock_file(job_dir / job_lock.LOCK_FILE, host="thief", boot_id="x", pid=4242)
    taken_at = time.monotonic()
    code = trainer.finish(120)
    stopped_after = time.monotonic() - taken_at
    text = trainer.text()
    assert code == 2, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert re.fullmatch(
        rf"cifar10_estimator: error: lost the lock of --job-dir {re.escape(str(job_dir))} to pid "
        rf"4242 on thief \(since 2026-01-01T00:00:00\); stopped without saving: the checkpoints "
        rf"saved before are kept; rerun the same command to resume once no other trainer uses "
        rf"--job-dir, or use another --job-dir", text.strip().splitlines()[-1]), text[-2000:]
    # No save began after the takeover (the one in flight, if any, had begun before), none at
    # the end, and nothing after training.
    assert _SAVED.findall(text) == saved_before, text[-3000:]
    assert checkpoint_step(tf.train.latest_checkpoint(str(job_dir))) <= int(saved_before[-1])
    assert not (job_dir / "export").exists()
    assert not (job_dir / "eval_report.json").exists()
    assert json.loads((job_dir / job_lock.LOCK_FILE).read_text())["host"] == "thief"
    # Well within one heartbeat: the next save, 3 steps on, re-read the lock (the process's
    # end included).
    assert stopped_after < job_lock.HEARTBEAT_SECS + 20, stopped_after
    print(f"the trainer ended {stopped_after:.1f} s after the takeover")


# --- a lease whose writes are slow ----------------------------------------------------------------

# A trainer's start of the lock, on s3:// through tensorflow-io, raced: it sets up the S3 client
# (a first request) and says "ready", takes the lock once told to (a line on stdin), then holds
# it for argv[3] seconds, re-reading it every 0.2 s as before a checkpoint save. It ends with
# os._exit: tensorflow-io's client aborts the interpreter's teardown (tensorflow/io issue 1912).
RACER = r"""
import os, sys, time
from cifar10_estimator import storage
from cifar10_estimator.errors import UserError
from cifar10_estimator.jobdir.lock import JobLock

def end(line, code):
    print(line, flush=True)
    os._exit(code)

job_dir, settle, hold = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
storage.exists(job_dir)
print("ready", flush=True)
sys.stdin.readline()
lock = JobLock(job_dir, heartbeat_secs=0.5, settle_secs=settle)
try:
    lock.acquire()
except UserError as e:
    end(f"refused: {e}", 2)
print("held", flush=True)
until = time.monotonic() + hold
try:
    while time.monotonic() < until:
        lock.check()
        time.sleep(0.2)
except UserError as e:
    end(f"lost: {e}", 3)
lock.release()
end("released", 0)
"""


@NEEDS_S3
@pytest.mark.slow
def test_two_trainers_racing_for_a_lease_whose_writes_are_slow_never_both_hold_it(
        s3_server, bucket, tmp_path):
    # Every lease write takes about 1.2 s (two PUTs held 0.6 s each), over the least wait of
    # 0.5 s these racers are given: with a fixed wait, the second racer, which starts 0.9 s
    # after the first and so still finds no lease, lands its lease after the first has read its
    # own back, and both would hold the lock. A wait measured against the writes (4 x 1.2 s)
    # sees the second lease land: the first reads it back and is refused.
    relay = _Relay(int(s3_server.rsplit(":", 1)[1]), put_delay=0.6)
    relay.start()
    job_dir = f"s3://{bucket}/job"
    env = trainer_env(extra=_s3_env(f"http://127.0.0.1:{relay.port}"))
    racers = [subprocess.Popen([sys.executable, "-c", RACER, job_dir, "0.5", "3"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=work_dir(), env=env)
              for _ in range(2)]
    try:
        for racer in racers:
            assert racer.stdout.readline() == "ready\n", racer.communicate(timeout=60)
        for racer, delay in zip(racers, (0.0, 0.9)):
            time.sleep(delay)
            racer.stdin.write("go\n")
            racer.stdin.flush()
        outputs = [racer.communicate(timeout=120) for racer in racers]
    finally:
        for racer in racers:
            if racer.poll() is None:
                racer.kill()
        relay.stop()
    codes = [racer.returncode for racer in racers]
    assert sorted(codes) == [0, 2], outputs
    holder = racers[codes.index(0)]
    held, refused = outputs[codes.index(0)][0], outputs[codes.index(2)][0]
    assert held == "held\nreleased\n", outputs  # it never found another lease on its own
    assert refused.startswith(
        f"refused: --job-dir {job_dir} is in use by another trainer (pid {holder.pid} "
        f"on "), outputs
