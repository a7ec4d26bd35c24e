"""A preempted run loses nothing: real processes, real signals, default checkpoint cadence.

With the default ``--save-checkpoints-secs 600`` none of these runs would write a checkpoint
after step 0 by itself: every checkpoint past 0 below is the one the signal made.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from cifar10_estimator.jobdir import lock as job_lock
from cifar10_estimator.launch import host_processes as local_launch
from cluster_fixtures import (frozen, frozen_holder, local_spec, operator_tf_configs,
                              tf_config)
from trainer_fixtures import (Trainer, checkpoint_step, run_trainer, trainer_args,
                              trainer_env)
import test_job_dir

# Every test here starts TensorFlow processes. Only the size of each run and the progress
# cadence differ from the trainer's defaults; the checkpoint and evaluation cadences are the
# defaults (600 s).
pytestmark = pytest.mark.slow

_STOPPED = re.compile(r"received (SIGTERM|SIGINT) at step (\d+): saved (\S+); rerun the same "
                      r"command to resume")
_PROGRESS = re.compile(r"step (\d+)/")


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_run_saves_the_current_step_and_exits_for_a_restart(
        signum, status, tiny_records, tmp_path, endless_trainer):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    trainer = endless_trainer(data_dir, job_dir)
    if signum == signal.SIGTERM:
        # Meanwhile a second trainer on this job dir is refused (tests/test_job_dir.py).
        test_job_dir.check_a_second_trainer(data_dir, job_dir, trainer)
    trainer.send(signum)
    assert trainer.finish() == status, trainer.text()[-3000:]
    text = trainer.text()
    stopped = _STOPPED.search(text)
    assert stopped and stopped.group(1) == signal.Signals(signum).name, text[-3000:]
    step = int(stopped.group(2))
    latest = tf.train.latest_checkpoint(job_dir)
    assert stopped.group(3) == latest and checkpoint_step(latest) == step > 0
    assert step >= max(int(s) for s in _PROGRESS.findall(text))  # the step in flight is in it
    tf.train.load_checkpoint(latest).get_tensor("resnet/dense/kernel")  # whole and readable
    assert "evaluation at step" not in text  # no evaluation on the way out
    assert "Traceback" not in text
    if signum == signal.SIGTERM:
        assert not os.path.exists(os.path.join(job_dir, job_lock.LOCK_FILE))  # released
        # The same command, training longer, resumes from the step the signal saved.
        rerun = Trainer(trainer_args(data_dir, job_dir, "--progress-secs", "1",
                                     "--train-steps", str(step + 3)), tmp_path / "rerun.log")
        assert rerun.finish(120) == 0, rerun.text()[-3000:]
        assert f"resuming from {latest}" in rerun.text()
        assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == step + 3


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for the signal (``SigCgt`` of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) >> (signum - 1) & 1)


def test_a_second_signal_ends_the_process_at_once(tiny_records, tmp_path, endless_trainer):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    trainer = endless_trainer(data_dir, job_dir)
    pid = trainer.process.pid
    assert _catches(pid, signal.SIGTERM)
    trainer.send(signal.SIGTERM)
    while _catches(pid, signal.SIGTERM):  # until the first one is handled: save under way
        time.sleep(0.001)
    # Frozen wherever it is (the step, the save or the session's end), then the second signal.
    with frozen(trainer.process):
        trainer.send(signal.SIGTERM)
    # The second signal's default action: killed by it, whatever the first one had begun.
    assert trainer.finish() == -signal.SIGTERM, trainer.text()[-3000:]
    latest = tf.train.latest_checkpoint(job_dir)
    tf.train.load_checkpoint(latest).get_tensor("resnet/dense/kernel")  # still whole


def test_a_signal_that_ends_the_process_at_once_closes_its_event_files_first(tmp_path,
                                                                              monkeypatch):
    # A signal outside a training step (an evaluation: Estimator evaluates at the first
    # checkpoint after the start, whatever the throttle) ends the process from the handler
    # with os._exit. The event files Estimator keeps open are closed first: on s3:// each
    # open one has a local copy in /tmp that only its close removes (tensorflow-io).
    from cifar10_estimator.errors import Stopped
    from cifar10_estimator.training import preemption

    class Exited(BaseException):
        pass

    codes = []

    def exit_now(code):
        codes.append(code)
        raise Exited

    cache = tf.compat.v1.summary.FileWriterCache
    with tf.Graph().as_default():  # as Estimator's sessions use it
        writer = cache.get(str(tmp_path))
    said = []
    task = preemption.Preemption()
    task.before_exit(said.append)
    monkeypatch.setattr(preemption.os, "_exit", exit_now)
    with pytest.raises(Exited):
        task._exit_now(Stopped(signal.SIGTERM))
    monkeypatch.undo()
    assert codes == [143] and [s.name for s in said] == ["SIGTERM"]
    assert writer.event_writer._closed  # closed, and gone from the cache
    with tf.Graph().as_default():
        again = cache.get(str(tmp_path))
    assert again is not writer
    again.close()


@pytest.mark.parametrize("parent_death", [signal.SIGHUP, signal.SIGKILL, signal.SIGTERM, 0])
def test_a_preemption_takes_any_parent_death_signal_its_launcher_set(parent_death):
    # The local launcher sets SIGHUP, a Ray node's runner SIGKILL (which no handler can take:
    # installing one failed every trainer of the Ray engine at its start).
    from cifar10_estimator.training.preemption import SIGNALS, Preemption

    before = {s: signal.getsignal(s) for s in (*SIGNALS, signal.SIGHUP)}
    preemption = Preemption().install(parent_death)
    try:
        handled = signal.getsignal(signal.SIGHUP) == preemption._on_signal
        assert handled == (parent_death == signal.SIGHUP)
        assert all(signal.getsignal(s) == preemption._on_signal for s in SIGNALS)
    finally:
        preemption.restore()
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_parameter_server_stops_at_once_with_status_143(tmp_path):
    ps = Trainer([], tmp_path / "ps.log", tf_config(local_spec("chief", "ps"), "ps"))
    try:
        ps.wait_for("parameter server 0 serving")
    finally:
        ps.send(signal.SIGTERM)
    assert ps.finish(30) == 143, ps.text()[-3000:]
    assert "received SIGTERM: parameter server stopped" in ps.text()


@pytest.mark.cluster
def test_the_launcher_restarts_tasks_a_signal_stopped_and_the_job_still_finishes(
        tiny_records, tmp_path, launch):
    # What Kubernetes does with restartPolicy ExitCode: a task that exits with 143 is started
    # again and carries on from the chief's checkpoints.
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    cluster = launch(["--num-workers", "2", "--evaluator", "--", *trainer_args(
        data_dir, job_dir, "--progress-secs", "0.2", "--train-steps", "150",
        "--max-worker-delay-secs", "0")], tmp_path / "cluster.log")
    # Each signal must reach its task while the task is under way: the chief and the
    # worker training (a progress line comes 0.2 s after a task's first step), the
    # evaluator running (its role line comes after its handlers are in place). The chief
    # alone can do all the steps before a slow worker starts (300 steps once did), so it is
    # frozen once it trains: until the signals, only the worker's steps count (a fraction
    # of a second of them), and the job cannot end.
    cluster.wait_for(r"\[cluster\] started evaluator \(pid \d+\)", r"\[chief\] .*step \d+/150",
                     timeout=180)
    pids = cluster.pids()
    with frozen_holder(pids["chief"], job_dir):
        cluster.wait_for(r"\[worker0\] .*step \d+/150", r"\[evaluator\] .*role: evaluator",
                         timeout=180)
        for name in ("chief", "worker0", "evaluator"):
            os.kill(pids[name], signal.SIGTERM)  # the frozen chief's waits for SIGCONT
    assert cluster.wait(240) == 0, cluster.text()[-4000:]
    text = cluster.text()
    for name in ("chief", "worker0", "evaluator"):
        assert f"[cluster] {name} stopped by a signal (exit status 143): starting it again" in text
    assert re.search(r"\[chief\] .*received SIGTERM at step \d+: saved ", text)
    assert re.search(r"\[worker0\] .*received SIGTERM at step \d+: worker stopped", text)
    assert "[evaluator] " in text and "received SIGTERM: evaluator stopped" in text
    assert re.search(r"\[chief\] .*resuming from ", text)
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) >= 150


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_a_killed_launcher_stops_its_tasks_and_the_same_command_resumes(
        tiny_records, tmp_path, launch):
    # kill -9 of the launcher (a lost terminal, the out-of-memory killer): its tasks, each in a
    # session of its own, trained on, held the job dir's lock and refused the rerun. Now the
    # kernel sends each one SIGTERM: they save and stop, and the same command resumes.
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    # Training without end, and no checkpoint but the first: only a save on SIGTERM leaves
    # another one. (Before, the tasks trained on, their output to the dead launcher's pipe
    # lost.)
    def command(steps: int) -> list[str]:
        return ["--evaluator", "--", *trainer_args(data_dir, job_dir, "--progress-secs", "0.2",
                                                   "--train-steps", str(steps),
                                                   "--save-checkpoints-steps", "100000")]

    cluster = launch(command(100000), tmp_path / "cluster.log")
    cluster.wait_for(r"\[cluster\] started evaluator \(pid \d+\)", r"\[chief\] .*step \d+/",
                     timeout=180)
    assert sorted(cluster.running()) == ["chief", "evaluator", "ps0", "worker0"]
    cluster.process.kill()
    cluster.process.wait()
    deadline = time.monotonic() + 60
    while cluster.running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not cluster.running(), cluster.text()[-3000:]
    saved = checkpoint_step(tf.train.latest_checkpoint(job_dir))
    assert saved > 0, cluster.text()[-3000:]  # the chief's save on SIGTERM
    # The same command (to an end, here) resumes from it.
    rerun = launch(command(saved + 20), tmp_path / "rerun.log")
    assert rerun.wait(300) == 0, rerun.text()[-4000:]
    assert re.search(rf"\[chief\] .*resuming from \S+model\.ckpt-{saved}\b", rerun.text())
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) >= saved + 20


# A parent of a task of the local launcher, with the launcher's placement: argv: the task's
# log, then its flags. It prints the task's pid.
_LAUNCHER_PARENT = """
import os, sys
from cifar10_estimator.launch.layout import LaunchedTask
from cifar10_estimator.launch.host_processes import HostProcesses
child = HostProcesses().spawn(LaunchedTask("chief", 0, ""), sys.argv[2:], dict(os.environ))
print(child.pid, flush=True)
with open(sys.argv[1], "w") as log:
    for line in child.stdout:
        log.write(line)
        log.flush()
"""


@pytest.mark.timeout(300)
def test_a_launched_trainer_takes_its_parents_death_signal_once_however_often_it_comes(
        tiny_records, tmp_path):
    # The kernel signals a child once per thread of its dying parent that it passes through
    # (platform.parent_death): a task of a killed launcher got its parent-death SIGTERM more
    # than once, and the second one ended it in the middle of its save (a CI run kept step 0).
    # Here the repeats come on cue, from the test.
    data_dir, _ = tiny_records
    job_dir, log = tmp_path / "job", tmp_path / "trainer.log"
    parent = subprocess.Popen(
        [sys.executable, "-c", _LAUNCHER_PARENT, str(log),
         *trainer_args(data_dir, job_dir, "--progress-secs", "0.2", "--train-steps", "100000")],
        stdout=subprocess.PIPE, text=True, env=trainer_env(), cwd=tmp_path)
    try:
        pid = int(parent.stdout.readline())
        deadline = time.monotonic() + 180
        while not re.search(r"step [1-9]\d*/100000", log.read_text() if log.exists() else ""):
            assert parent.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        deadline = time.monotonic() + 60
        while parent.poll() is None and time.monotonic() < deadline:  # until its output ends
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, local_launch.PARENT_DEATH_SIGNAL)
            time.sleep(0.02)  # the repeats throughout the step in flight and the save
        assert parent.poll() == 0
    finally:
        parent.kill()
        parent.wait()
    name = signal.Signals(local_launch.PARENT_DEATH_SIGNAL).name
    stopped = re.search(rf"received {name} at step (\d+): saved (\S+); rerun the same command "
                        rf"to resume", log.read_text())
    assert stopped, log.read_text()[-3000:]
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == int(stopped.group(1)) > 0
    assert not os.path.exists(os.path.join(job_dir, job_lock.LOCK_FILE))  # released
    assert "Traceback" not in log.read_text()


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_parameter_server_signalled_with_its_chief_serves_until_the_chief_has_saved(
        tiny_records, tmp_path, cluster_tasks):
    # A whole job stopped at once (its launcher killed, a Kubernetes job deleted): every task
    # gets SIGTERM. The chief's save on SIGTERM reads the variables from the parameter
    # server, which exited at once: the chief then waited for it, still running 60 s after
    # its signal. Here the parameter server gets its signal first, the worst order.
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    configs = operator_tf_configs("chief", "ps")
    ps = cluster_tasks.add("ps", configs["ps"], [])
    chief = cluster_tasks.add("chief", configs["chief"], trainer_args(
        data_dir, job_dir, "--progress-secs", "0.2", "--train-steps", "100000"))
    cluster_tasks.start()
    chief.wait_for(r"step [1-9]\d*/100000", timeout=180)
    ps.send(signal.SIGTERM)
    ps.wait_for("asked to stop; serving until chief:0 has saved", timeout=30)
    chief.send(signal.SIGTERM)
    assert chief.finish(60) == 143, chief.text()[-3000:]
    assert ps.finish(30) == 143, ps.text()[-3000:]
    stopped = _STOPPED.search(chief.text())
    assert stopped, chief.text()[-3000:]
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == int(stopped.group(2)) > 0
    assert "chief:0 saved" in ps.text() and "parameter server stopped" in ps.text()
    assert "Traceback" not in chief.text() + ps.text()


def _small_file_system_available(cwd) -> str:
    """'' if this machine lets an unprivileged process mount its own tmpfs, else why not."""
    if not shutil.which("unshare"):
        return "no unshare command"
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True,
                           text=True, cwd=cwd, timeout=60)
    return "" if probe.returncode == 0 else f"cannot mount a tmpfs here: {probe.stderr.strip()}"


# The one line a trainer ends with when its job dir has no room (group 1: what it could not
# write; group 2: the checkpoint it keeps).
_NO_ROOM_LINE = re.compile(
    r"cifar10_estimator: error: cannot write (a checkpoint|TensorBoard events) in --job-dir "
    r"\S+ \(No space left on device\); the latest checkpoint, (\S+), is kept\. Free space "
    r"\(or raise the quota\) and rerun the same command to resume")


def _train_in_small_file_system(tiny_records, tmp_path, size: str, meanwhile: str = "",
                                before: str = ""):
    """Trains ResNet-8 for up to 400 steps, a checkpoint every 20, in a job dir on a tmpfs of
    ``size`` of its own, after the shell command ``before`` and with ``meanwhile`` in the
    background (each may name the job dir as JOB; a file it leaves in the job dir called filler is removed after); the
    job dir is then copied out. Returns the run and the copy's path."""
    unavailable = _small_file_system_available(tmp_path)
    if unavailable:
        pytest.skip(unavailable)
    data_dir, _ = tiny_records
    job_dir, kept = tmp_path / "job", tmp_path / "kept"
    job_dir.mkdir()
    flags = trainer_args(data_dir, job_dir, "--progress-secs", "1", "--train-steps", "400",
                         "--save-checkpoints-steps", "20")
    command = " ".join([sys.executable, "-m", "cifar10_estimator", *flags])
    background = f"({meanwhile}) &" if meanwhile else ""
    first = f"{before};" if before else ""
    proc = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
         f"mount -t tmpfs -o size={size} tmpfs {job_dir} && "
         f"{(first + background).replace('JOB', str(job_dir))} {command}; "
         f"status=$?; wait; rm -f {job_dir}/filler; cp -a {job_dir}/. {kept}/; exit $status"],
        capture_output=True, text=True, cwd=tmp_path, env=trainer_env(), timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    return proc, kept


def _resumes(tiny_records, tmp_path, kept, latest) -> None:
    """The same command, with room, resumes from ``latest``: it loads."""
    data_dir, _ = tiny_records
    rerun = run_trainer(*trainer_args(data_dir, kept, "--progress-secs", "1",
                                      "--train-steps", str(checkpoint_step(latest) + 2)),
                        cwd=tmp_path, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {latest}" in rerun.stderr


def test_a_checkpoint_that_does_not_fit_stops_training_and_keeps_the_last_one(
        tiny_records, tmp_path):
    # A 3 MB file system of the job's own: the step-0 checkpoint and the graph fit, and a few
    # checkpoints of ResNet-8 (about 0.6 MB each) fill it.
    proc, kept = _train_in_small_file_system(tiny_records, tmp_path, "3m")
    line = proc.stderr.strip().splitlines()[-1]
    match = _NO_ROOM_LINE.fullmatch(line)
    assert match and match.group(1) == "a checkpoint", line
    latest = tf.train.latest_checkpoint(str(kept))
    assert os.path.basename(latest) == os.path.basename(match.group(2))
    assert checkpoint_step(latest) > 0
    assert not [p for p in os.listdir(kept) if p.endswith("_temp")]  # partial shards removed
    _resumes(tiny_records, tmp_path, kept, latest)


def test_a_job_dir_that_fills_after_a_checkpoint_ends_in_one_line_and_resumes(
        tiny_records, tmp_path):
    # Room for the checkpoints, then none: a file fills the job's own 20 MB file system as soon
    # as the step-20 checkpoint is written, so the next write that needs room (the evaluation's
    # event file, TensorBoard's events or the next checkpoint) finds none. TensorFlow's event
    # writer thread died with a traceback, its own error line and a C++ error line before the
    # one-line error (issue 76).
    proc, kept = _train_in_small_file_system(
        tiny_records, tmp_path, "20m", "while [ ! -e JOB/model.ckpt-20.index ]; do sleep 0.1; "
        "done; dd if=/dev/zero of=JOB/filler bs=64k 2>/dev/null")
    lines = proc.stderr.strip().splitlines()
    assert _NO_ROOM_LINE.fullmatch(lines[-1]), lines[-1]
    # Every line before it is one of the run's own timestamped lines, none of them an error.
    stray = [line for line in lines[:-1]
             if not re.match(r"\d\d:\d\d:\d\d ", line) or "error" in line.lower()]
    assert not stray, stray
    latest = tf.train.latest_checkpoint(str(kept))
    assert checkpoint_step(latest) >= 20
    _resumes(tiny_records, tmp_path, kept, latest)


def test_a_full_job_dir_at_the_start_asks_for_room_not_another_folder(tiny_records, tmp_path):
    # A job dir already full when the trainer (re)starts: the one-line error said "choose
    # another --job-dir", which would leave the job's checkpoints behind (issue 76).
    proc, _ = _train_in_small_file_system(
        tiny_records, tmp_path, "1m", before="dd if=/dev/zero of=JOB/filler bs=64k 2>/dev/null")
    job_dir = tmp_path / "job"
    assert proc.stderr.strip().splitlines()[-1] == (
        f"cifar10_estimator: error: --job-dir {job_dir} is not a writable folder (No space left "
        f"on device); free space (or raise the quota) and rerun the same command")

