"""Distributed training for real: clusters of processes on 127.0.0.1 driven by TF_CONFIG.

Every cluster is 1 ps + chief + 1 worker training a ResNet-8 on batches of 8 for a few dozen
steps, through the launcher (``python -m cifar10_estimator.cluster``) or with hand-made
TF_CONFIG values. The tasks' logs are the evidence: each trainer logs how many steps it ran
itself, the parameter server logs which trainers reported, the evaluator logs each evaluation.
"""

import os
import re
import socket
import time

import pytest
import tensorflow as tf

from cifar10_estimator.data import schema
from cifar10_estimator.config import plan
from cifar10_estimator.config.role import Role
from cifar10_estimator.launch import layout
from cifar10_estimator.config.settings import Settings
from cluster_fixtures import (CLUSTER_FLAGS, EVALUATED, RAN, RATE, exports, free_ports,
                              frozen_holder, local_spec, one, run_cluster, task_lines, tf_config)
from trainer_fixtures import checkpoint_step, run_trainer, trainer_args
import test_cluster_network as network

STEPS = 40

# The clusters' run: STEPS steps, a checkpoint every 10, evaluations as often as they come.
CLUSTER_RUN = ["--train-steps", str(STEPS), "--save-checkpoints-steps", "10",
               "--eval-throttle-secs", "1", *CLUSTER_FLAGS, "--seed", "1"]


def _seconds(line: str) -> int:
    h, m, s = map(int, line[:8].split(":"))
    return 3600 * h + 60 * m + s


def _assert_clean_end(code: int, output: str, tasks: list[str], job_dir: str) -> None:
    assert code == 0, output[-4000:]
    for task in tasks:
        assert f"[cluster] {task}: exit status 0" in output, output[-4000:]
    exported = exports(job_dir)
    assert len(exported) == 1, exported  # exported once, by the chief only
    assert os.path.isfile(os.path.join(job_dir, "export", exported[0], "saved_model.pb"))
    assert "Traceback" not in output, output[-4000:]


def _assert_evaluated_final(output: str, final_step: int) -> None:
    lines = task_lines(output, "evaluator")
    evaluated = [int(m.group(1)) for m in map(EVALUATED.search, lines) if m]
    assert evaluated and evaluated[-1] == final_step, evaluated
    assert evaluated == sorted(evaluated)  # checkpoints in the order they appeared
    assert any(f"final evaluation at step {final_step}" in line for line in lines)


@pytest.mark.slow
@pytest.mark.cluster
def test_async_cluster_with_evaluator_trains_to_the_target_and_exits_cleanly(
        tiny_records, tmp_path, launch):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    # A progress line 0.2 s after a task's first step: the chief trains (for the checks of its
    # network below, tests/test_cluster_network.py's).
    cluster = launch(["--num-workers", "2", "--num-ps", "1", "--evaluator", "--",
                      *trainer_args(data_dir, job_dir, *CLUSTER_RUN, "--precision", "auto",
                                    "--progress-secs", "0.2")], tmp_path / "cluster.log")
    cluster.wait_for(r"^\[ps0\] .*parameter server 0 serving", rf"^\[chief\] .*step \d+/{STEPS}")
    no_namespace = network.check_private_network(cluster, ["ps0", "chief", "worker0"])
    code = cluster.wait(240)
    output = cluster.text()
    _assert_clean_end(code, output, ["ps0", "chief", "worker0", "evaluator"], job_dir)
    assert "[cluster] training finished" in output
    # One precision for the whole job: the chief's choice, recorded; the others follow it.
    chosen = [found.groups() for task in ("chief", "worker0", "evaluator")
              for found in (re.match(r"[\d:]+ precision auto: (fp32|bf16)\b(.*)", line)
                            for line in task_lines(output, task)) if found]
    assert len(chosen) == 3 and len({precision for precision, _ in chosen}) == 1, chosen
    assert "recorded" not in chosen[0][1]
    assert all(why == ", the job's recorded precision" for _, why in chosen[1:]), chosen

    final = checkpoint_step(tf.train.latest_checkpoint(job_dir))
    # Async training can end a few steps past the target: each worker finishes the step it is
    # in, and Estimator's StopAtStepHook estimates the global step from a value read during
    # the step (before the other worker's concurrent update). Two workers: at most 3 extra.
    assert STEPS <= final <= STEPS + 3
    chief, worker = task_lines(output, "chief"), task_lines(output, "worker0")
    assert any("role: chief 0 of the cluster" in l and "asynchronous" in l for l in chief)
    # Asynchronous: every local step is one global step, whoever ran it. (A worker that
    # starts after the chief's last checkpoint skips training and logs no count: 0 steps.)
    worker_steps = one(RAN, worker) if any(RAN.search(l) for l in worker) else 0
    assert final <= one(RAN, chief) + worker_steps <= STEPS + 3
    assert any("chief:0 finished" in l for l in task_lines(output, "ps0"))
    assert any("(2 of 2 training tasks)" in l for l in task_lines(output, "ps0"))
    _assert_evaluated_final(output, final)
    if no_namespace:
        pytest.skip(f"the network checks: {no_namespace}")


def test_the_chiefs_save_at_the_final_step_stays_the_final_checkpoint(tmp_path):
    # In an asynchronous cluster another worker's update lands after the chief's save at the
    # final step (here: a hook before the chief's bumps the global step at the session's end).
    # The evaluator took that save as final, so the chief must not save again under step 41.
    from cifar10_estimator.training.estimator.precise_bn import CheckpointHook

    class OtherWorker(tf.estimator.SessionRunHook):
        def begin(self):
            self._bump = tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)

        def end(self, session):
            session.run(self._bump)

    ends = []

    class Listener(tf.compat.v1.train.CheckpointSaverListener):
        def end(self, session, global_step_value):
            ends.append(global_step_value)

    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.get_variable("w", [1])
        train_op = tf.compat.v1.assign_add(step, 1)
        hook = CheckpointHook(str(tmp_path), None, 10, final_step=STEPS)
        hook._listeners.append(Listener())
        with tf.compat.v1.train.MonitoredSession(hooks=[
                OtherWorker(), tf.compat.v1.train.StopAtStepHook(last_step=STEPS), hook]) as s:
            while not s.should_stop():
                s.run(train_op)
    saved = tf.train.get_checkpoint_state(str(tmp_path)).all_model_checkpoint_paths
    assert [checkpoint_step(p) for p in saved][-2:] == [30, STEPS]
    assert ends == [STEPS]


@pytest.mark.slow
@pytest.mark.cluster
def test_sync_cluster_aggregates_one_gradient_per_worker_per_step_without_a_stall(
        tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    # On this host's network (tests/test_cluster_network.py's check of its first line).
    code, output = run_cluster(["--num-workers", "2", "--num-ps", "1", "--evaluator",
                                "--network", "host", "--",
                                *trainer_args(data_dir, job_dir, *CLUSTER_RUN, "--sync")],
                               tmp_path / "cluster.log")
    _assert_clean_end(code, output, ["ps0", "chief", "worker0", "evaluator"], job_dir)
    network.check_host_network_first_line(output)

    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == STEPS  # no overshoot in sync
    chief, worker = task_lines(output, "chief"), task_lines(output, "worker0")
    assert any("replicas_to_aggregate=2" in line for line in chief)
    # STEPS global steps from 2 x STEPS local steps, one per worker per step: both
    # contributed to every update.
    assert (one(RAN, chief), one(RAN, worker)) == (STEPS, STEPS)
    # The cluster rate counts both workers' batches: twice this worker's own rate.
    for lines in (chief, worker):
        own, total = map(float, [m for m in map(RATE.search, lines) if m][-1].groups())
        assert total == pytest.approx(2 * own, rel=0.05)
    # TensorFlow's own chief hook stalls 120 s between the last step and the session's end.
    last_step = next(l for l in chief if RAN.search(l))
    closed = next(l for l in chief if "Loss for final step" in l)
    assert _seconds(closed) - _seconds(last_step) < 20
    _assert_evaluated_final(output, STEPS)


@pytest.mark.slow
def test_sync_on_one_machine_ends_without_the_shutdown_stall(tiny_records, tmp_path):
    # Upstream §8.8: a local --sync run sat out 120 s after its last step on TF 2.15.
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    started = time.monotonic()
    proc = run_trainer(*trainer_args(data_dir, job_dir, "--train-steps", "12",
                                     "--save-checkpoints-steps", "6", "--sync"),
                       timeout=150, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == 12
    assert "Traceback" not in proc.stderr and "threads still running" not in proc.stderr
    assert time.monotonic() - started < 90


@pytest.mark.slow
@pytest.mark.cluster
def test_killing_the_worker_in_async_mode_lets_the_chief_finish(tiny_records, tmp_path,
                                                               cluster_tasks):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    steps = 150
    spec = local_spec("chief", "worker", "ps")
    flags = trainer_args(data_dir, job_dir, *CLUSTER_RUN, "--cluster-timeout-secs", "10",
                         "--save-checkpoints-steps", "50", "--progress-secs", "0.5",
                         "--train-steps", str(steps))
    # A parameter server needs no flags at all; it waits this long for a dead worker's report.
    ps = cluster_tasks.add("ps", tf_config(spec, "ps"), ["--cluster-timeout-secs", "5"])
    chief = cluster_tasks.add("chief", tf_config(spec, "chief"), flags)
    worker = cluster_tasks.add("worker", tf_config(spec, "worker"), flags)
    cluster_tasks.start()
    # A progress line: the task is training (its end-of-run line also says images/s).
    # The chief is frozen once it trains, until the worker trains too: the run cannot end
    # before the kill, however late the worker starts.
    training = re.escape("images/s, ETA")
    chief.wait_for(training, timeout=120)
    with frozen_holder(chief.process, job_dir):
        worker.wait_for(training, timeout=120)
    assert chief.poll() is None, "the chief finished before the kill"
    worker.kill()
    assert chief.finish(120) == 0, chief.text()[-3000:]
    # The ps waits --cluster-timeout-secs for the dead worker's report, then exits.
    assert ps.finish(60) == 0, ps.text()[-3000:]
    assert steps <= checkpoint_step(tf.train.latest_checkpoint(job_dir)) <= steps + 3
    assert len(exports(job_dir)) == 1
    ps_log = ps.text()
    assert "chief:0 finished" in ps_log and "worker:0 never reported" in ps_log
    chief_steps = one(RAN, chief.text().splitlines())
    assert 0 < chief_steps < steps  # the worker did part of the work before it died


@pytest.mark.slow
def test_a_worker_that_cannot_reach_the_cluster_fails_within_the_timeout(
        tiny_records, tmp_path):
    data_dir, _ = tiny_records
    # The ps address accepts TCP connections but is no TensorFlow server (TensorFlow's own
    # session creation would wait for it forever); the chief's address is closed.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    ps_port = listener.getsockname()[1]
    # The chief's and the worker's ports: free a moment ago, and nobody listens.
    spec = local_spec("chief", "worker", "ps", ports=[*free_ports(2), ps_port])
    started = time.monotonic()
    try:
        proc = run_trainer(*trainer_args(data_dir, tmp_path / "job", "--cluster-timeout-secs", "2"),
                           env_extra={"TF_CONFIG": tf_config(spec, "worker")}, timeout=120,
                           cwd=tmp_path)
    finally:
        listener.close()
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("cifar10_estimator: error: cannot reach ")
    assert f"ps:0 at 127.0.0.1:{ps_port}" in error
    assert "within 2 s (--cluster-timeout-secs)" in error
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - started < 60


@pytest.mark.slow
@pytest.mark.parametrize("task, strategy", [("ps", "towers"),
                                            ("chief", "multi-worker-mirrored")])
def test_a_task_whose_port_another_program_holds_fails_in_one_line(
        tiny_records, tmp_path, task, strategy):
    # Another program listens on the task's own port (TensorFlow binds 0.0.0.0:PORT): the
    # parameter server's server, or the collective operations an all-reduce strategy sets up
    # at its start, cannot start there.
    data_dir, _ = tiny_records
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    port = holder.getsockname()[1]
    jobs = ("chief", "ps") if task == "ps" else ("chief", "worker")
    spec = local_spec(*jobs, ports=[port if job == task else free_ports(1)[0] for job in jobs])
    try:
        proc = run_trainer(*trainer_args(data_dir, tmp_path / "job", "--distribution-strategy",
                                         strategy, "--cluster-timeout-secs", "5"),
                           env_extra={"TF_CONFIG": tf_config(spec, task)}, timeout=120,
                           cwd=tmp_path)
    finally:
        holder.close()
    assert proc.returncode == 2, proc.stderr[-3000:]
    error = proc.stderr.strip().splitlines()[-1]
    assert error == (
        f"cifar10_estimator: error: TF_CONFIG: {task} 0 at 127.0.0.1:{port}: TensorFlow could "
        f"not start this task's server on port {port} (it binds every interface: another "
        f"program holds that port, or an earlier run of this task still does); end that "
        f"program, or give this task a free port in TF_CONFIG"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(tmp_path / "job" / "settings.json")  # nothing started


@pytest.mark.slow
@pytest.mark.cluster
def test_a_worker_that_does_not_see_the_chiefs_job_dir_fails_clearly(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    # A real parameter server (in this process) answers; the chief writes elsewhere.
    spec = local_spec("chief", "worker", "ps")
    tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="ps", task_index=0, start=True)
    job_dir = str(tmp_path / "not-shared")
    proc = run_trainer(*trainer_args(data_dir, job_dir, "--cluster-timeout-secs", "2"),
                       env_extra={"TF_CONFIG": tf_config(spec, "worker")}, timeout=120,
                       cwd=tmp_path)
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    assert f"no checkpoint from the chief appeared in --job-dir {job_dir}" in error
    assert "same --job-dir" in error and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.cluster
def test_the_launcher_stops_every_task_and_fails_when_one_task_fails(tmp_path):
    empty = tmp_path / "no-records"
    empty.mkdir()
    code, output = run_cluster(["--num-workers", "2", "--num-ps", "1", "--",
                                *trainer_args(empty, tmp_path / "job")],
                               tmp_path / "cluster.log", timeout=120)
    assert code == 1
    assert re.search(r"\[cluster\] (chief|worker0) failed with exit status 2", output), output
    assert "[cluster] ps0: stopped" in output  # the ps was serving; the launcher ended it
    assert "train.tfrecords not found" in output


def test_cluster_layout_counts_the_chief_among_the_workers():
    tasks = layout.lay_out(num_workers=3, num_ps=2, evaluator=True)
    assert [t.name for t in tasks] == ["ps0", "ps1", "chief", "worker0", "worker1", "evaluator"]
    import json
    spec = json.loads(tasks[0].tf_config)["cluster"]
    assert (len(spec["chief"]), len(spec["worker"]), len(spec["ps"])) == (1, 2, 2)
    # The launcher leaves the evaluator out of the spec (it serves nothing); Estimator accepts
    # it either way (tests/test_cluster_lifecycle.py lists it, as Kubeflow's operator does).
    assert "evaluator" not in spec
    addresses = spec["chief"] + spec["worker"] + spec["ps"]
    assert len(set(addresses)) == 5 and all(a.startswith("127.0.0.1:") for a in addresses)


def test_an_epoch_counts_every_workers_batch_in_sync_mode_only():
    async_config = Settings.of(data_dir="d", job_dir="j", train_batch_size=8)
    sync_config = Settings.of(data_dir="d", job_dir="j", train_batch_size=8, sync=True)
    # 96 records: 12 batches of 8. Async: one batch per global step, whatever the workers.
    two = {"chief": ("h:1",), "worker": ("h:2",), "ps": ("h:3",)}

    def resolve(config, role):
        return plan.resolve(role, config.model, config.schedule, config.devices, config.cluster,
                            dataset="cifar10", class_names=schema.CLASS_NAMES,
                            train_records=96, precision="fp32")

    chief, evaluator = Role("chief", 0, two), Role("evaluator", 0, two)
    assert resolve(async_config, chief).steps_per_epoch == 12
    assert resolve(async_config, chief).global_batch == 8
    # Sync with 2 workers: each global step consumes 2 batches.
    assert resolve(sync_config, chief).steps_per_epoch == 6
    assert resolve(sync_config, chief).global_batch == 16
    assert resolve(sync_config, Role()).steps_per_epoch == 12
    # The evaluator counts the cluster's workers too: it waits for the chief's last step.
    epochs = sync_config.replace(train_epochs=2.0)
    assert resolve(epochs, evaluator).train_steps == resolve(epochs, chief).train_steps == 12
