"""Clusters in the field: default cadence flags, operator-style TF_CONFIG, tasks that die.

Real processes on 127.0.0.1, each started as Kubeflow's operator starts a replica: the same
command with its own TF_CONFIG, which lists every replica type (the evaluator included) and
the ``"environment": "cloud"`` key. Tasks are killed with SIGKILL and started again with the
same command, as Kubernetes recreates a pod.
"""

import json
import os
import re
import time

import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.data import schema
from cifar10_estimator.training.estimator import evaluate_loop
from cifar10_estimator.data.pipeline import Cifar10DataSet
from cluster_fixtures import (CLUSTER_FLAGS, EVALUATED, RAN, SAVED, exports, frozen,
                              frozen_holder, operator_tf_configs)
from trainer_fixtures import TRAINING, checkpoint_step, trainer_args


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_operator_style_cluster_with_default_flags_ends_right_after_the_final_checkpoint(
        tiny_records, tmp_path, cluster_tasks):
    # Default cadence: checkpoints every 600 s, evaluations at most every 600 s, workers
    # staggered by Estimator's rule. Estimator's own evaluator loop slept 600 s here.
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    configs = operator_tf_configs("chief", "worker", "ps", "evaluator")
    flags = trainer_args(data_dir, job_dir, "--train-steps", "60", "--export-best")
    ps = cluster_tasks.add("ps", configs["ps"], [])
    chief = cluster_tasks.add("chief", configs["chief"], flags)
    cluster_tasks.add("worker", configs["worker"], flags)
    ev_task = cluster_tasks.add("evaluator", configs["evaluator"], flags)
    cluster_tasks.start()
    # Room for a loaded machine: four TensorFlow processes on two cores, of which the evaluator
    # ends with two exports (a CI run saw one take 55 s beside the rest of the suite).
    budget = 330
    cluster_tasks.wait_all(timeout=budget)
    running = [t for t in cluster_tasks if t.process.returncode is None]
    cluster_tasks.stop()
    assert not running, f"still running after {budget} s: " + ", ".join(
        f"{t.name}:\n{t.text()[-1500:]}" for t in running)
    for t in cluster_tasks:
        assert t.process.returncode == 0, f"{t.name}:\n{t.text()[-3000:]}"
        assert "Traceback" not in t.text(), t.text()[-3000:]
    final = checkpoint_step(tf.train.latest_checkpoint(job_dir))
    assert final >= 60
    ev = ev_task.text()
    assert [int(v) for v in EVALUATED.findall(ev)][-1] == final
    assert f"final evaluation at step {final}" in ev
    assert sorted(exports(job_dir))[-1] == "best" and len(exports(job_dir)) == 2
    # --export-best: the evaluator exported its best evaluation (the first one, on ties).
    accuracies = [float(a) for a in re.findall(r"\bevaluation at step \d+: accuracy = ([0-9.]+)",
                                               ev)]
    best = os.listdir(os.path.join(job_dir, "export", "best"))
    assert len(best) == 1 and accuracies, (best, ev[-3000:])
    with open(os.path.join(job_dir, "export", "best", best[0], "assets.extra",
                           "eval_metrics.json")) as f:
        # The log shows 4 significant digits.
        assert json.load(f)["accuracy"] == pytest.approx(max(accuracies), abs=5e-5)
    # Every task exits by itself, within seconds of the chief (not a 600 s throttle later).
    assert ev_task.exited_at - chief.exited_at < 30
    assert ps.exited_at - chief.exited_at < 30
    assert "role: chief 0 of the cluster" in chief.text()


@pytest.mark.slow
def test_the_evaluator_skips_a_checkpoint_deleted_before_it_was_read(tiny_records, tmp_path):
    # As with --keep-checkpoint-max: the chief deletes an old checkpoint just after the
    # evaluator found it and before it restored it. Here the evaluation's input_fn does the
    # deleting (it runs between those two moments), then "the chief" writes the final one.
    data_dir, _ = tiny_records
    source = str(tmp_path / "source")

    train.run(trainer_args(data_dir, source, "--train-steps", "4", "--save-checkpoints-steps",
                           "2", "--eval-throttle-secs", "100000"))
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)

    def copy_checkpoint(step: int) -> None:
        for path in tf.io.gfile.glob(os.path.join(source, f"model.ckpt-{step}.*")):
            tf.io.gfile.copy(path, os.path.join(job_dir, os.path.basename(path)))
        tf.compat.v1.train.update_checkpoint_state(
            job_dir, os.path.join(job_dir, f"model.ckpt-{step}"))

    copy_checkpoint(2)
    eval_data = Cifar10DataSet(data_dir, "eval", use_distortion=False)
    calls = []

    def input_fn():
        calls.append(tf.train.latest_checkpoint(job_dir))
        if len(calls) == 1:
            for path in tf.io.gfile.glob(os.path.join(job_dir, "model.ckpt-2.*")):
                tf.io.gfile.remove(path)
            copy_checkpoint(4)
        return eval_data.make_batch(8)

    from cifar10_estimator.config.settings import Settings

    config = Settings.of(data_dir=data_dir, job_dir=job_dir, num_layers=8,
                         train_batch_size=8, eval_batch_size=8)
    from cifar10_estimator.config import plan
    from cifar10_estimator.config.role import Role
    from cifar10_estimator.training.estimator.model_fn import make_model_fn
    from cifar10_estimator.model.model_settings import ModelSettings

    evaluator_role = Role("evaluator", 0, {"chief": ("127.0.0.1:1",),
                                           "evaluator": ("127.0.0.1:2",)})
    settings = ModelSettings.of(plan.resolve(evaluator_role, config.model, config.schedule,
                                             config.devices, config.cluster, dataset="cifar10",
                                             class_names=schema.CLASS_NAMES, train_records=96,
                                             precision="fp32"),
                                config.model, config.data.data_dir)

    estimator = tf.estimator.Estimator(make_model_fn(settings), model_dir=job_dir)
    metrics = evaluate_loop.evaluate_checkpoints(estimator, input_fn, train_steps=4,
                                             throttle_secs=600)
    assert metrics["global_step"] == 4
    assert len(calls) == 2  # the deleted checkpoint was skipped, the final one evaluated


def _cluster(tasks, flags: list[str], with_evaluator: bool) -> list:
    """Adds ps, chief, worker (and an evaluator) with operator-style TF_CONFIG values to the
    ``cluster_tasks`` fixture's ``tasks``; returns them in that order."""
    configs = operator_tf_configs("chief", "worker", "ps",
                                  *(("evaluator",) if with_evaluator else ()))
    tasks.add("ps", configs["ps"], ["--cluster-timeout-secs", "60"])
    tasks.add("chief", configs["chief"], flags)
    tasks.add("worker", configs["worker"], flags)
    if with_evaluator:
        tasks.add("evaluator", configs["evaluator"], flags)
    return list(tasks)


def _start_until_a_second_checkpoint(tasks, chief) -> None:
    """Starts every task and returns once the chief has saved two checkpoints (mid-run)."""
    tasks.start()
    tasks.wait_for(lambda: len(SAVED.findall(chief.text())) >= 2, "a second checkpoint")


@pytest.mark.slow
@pytest.mark.cluster
def test_a_parameter_server_killed_and_restarted_mid_run_the_job_still_finishes(
        tiny_records, tmp_path, cluster_tasks):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    # 200 steps: the kill comes at the second checkpoint (step 50), and nothing trains while
    # the parameter server is away.
    flags = trainer_args(data_dir, job_dir, *CLUSTER_FLAGS, "--train-steps", "200",
                         "--save-checkpoints-steps", "50")
    ps, chief, worker = _cluster(cluster_tasks, flags, with_evaluator=False)
    _start_until_a_second_checkpoint(cluster_tasks, chief)
    assert chief.poll() is None, "training ended before the kill"
    # The worker sits out the outage frozen, and goes on once the chief has put the
    # variables back: a worker that looks for them earlier naps 30 s (TensorFlow's
    # recovery wait) before it looks again.
    with frozen(worker.process):
        ps.kill()
        time.sleep(1)
        ps.start()  # same command, same address: what Kubernetes does with the pod
        cluster_tasks.wait_for(lambda: "Restoring parameters from" in chief.text(),
                               "the chief's recovery")
    cluster_tasks.wait_all(timeout=180)
    cluster_tasks.stop()
    for t in cluster_tasks:
        assert t.process.returncode == 0, f"{t.name}:\n{t.text()[-3000:]}"
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) >= 200
    # The chief put the latest checkpoint back into the new parameter server (its job dir
    # was empty at start, so every restore is the recovery).
    assert chief.text().count("Restoring parameters from") >= 1, chief.text()[-3000:]
    assert "parameter server 0: training finished, exiting" in ps.text()
    assert len(exports(job_dir)) == 1


@pytest.mark.slow
@pytest.mark.cluster
def test_a_chief_and_a_worker_killed_and_restarted_resume_and_the_evaluator_sees_the_end(
        tiny_records, tmp_path, cluster_tasks):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    steps = 400
    flags = trainer_args(data_dir, job_dir, *CLUSTER_FLAGS, "--train-steps", str(steps),
                         "--save-checkpoints-steps", "100", "--eval-throttle-secs", "5",
                         "--progress-secs", "1")
    ps, chief, worker, ev = _cluster(cluster_tasks, flags, with_evaluator=True)
    _start_until_a_second_checkpoint(cluster_tasks, chief)
    chief.kill()
    # What a rerun resumes from: the latest complete checkpoint (the "Saving checkpoints"
    # line comes before the files, so the kill may land before that one is written).
    killed_at = checkpoint_step(tf.train.latest_checkpoint(job_dir))
    chief.start()  # rerun the same command
    cluster_tasks.wait_for(lambda: chief.text().count("Saving checkpoints for") >= 4,
                           "checkpoints of the restarted chief")
    worker.kill()
    worker.start()
    # The restarted worker must rejoin before the job ends: the chief (which would go on
    # alone) is frozen until the worker trains again (its progress line, a second after
    # its first step), then goes on. Only the worker's own steps count meanwhile.
    with frozen_holder(chief.process, job_dir):
        cluster_tasks.wait_for(lambda: re.search(rf"step \d+/{steps} \(", worker.last_run()),
                               "training by the restarted worker")
    cluster_tasks.wait_all(timeout=240)
    cluster_tasks.stop()
    for t in cluster_tasks:
        assert t.process.returncode == 0, f"{t.name}:\n{t.text()[-3000:]}"
    final = checkpoint_step(tf.train.latest_checkpoint(job_dir))
    assert final >= steps
    # The final checkpoint is named after the step it holds, though the worker's last update
    # can land while the chief recomputes the batch-norm statistics before that save.
    assert tf.train.load_variable(tf.train.latest_checkpoint(job_dir), "global_step") == final
    assert f"resuming from {job_dir}/model.ckpt-{killed_at}" in chief.text()
    # The restarted worker rejoined and trained (its second run logs its own steps).
    second_run = worker.last_run()
    ran = RAN.search(second_run)
    assert ran and int(ran.group(1)) > 0, second_run[-3000:]
    # The evaluator's final evaluation is of the first checkpoint at or past --train-steps;
    # asynchronously the chief can still save one a step later (a worker's last update).
    evaluated = [int(v) for v in re.findall(r"final evaluation at step (\d+)", ev.text())]
    assert len(evaluated) == 1 and steps <= evaluated[0] <= final, (evaluated, final)
    assert len(exports(job_dir)) == 1


@pytest.mark.slow
@pytest.mark.cluster
def test_a_parameter_server_that_never_comes_back_ends_every_trainer_with_one_line(
        tiny_records, tmp_path, cluster_tasks):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    flags = trainer_args(data_dir, job_dir, *CLUSTER_FLAGS, "--train-steps", "100000",
                         "--save-checkpoints-steps", "50", "--cluster-timeout-secs", "5")
    ps, chief, worker = _cluster(cluster_tasks, flags, with_evaluator=False)
    # The worker waits --cluster-timeout-secs (5 s here) for the chief's first checkpoint,
    # which a loaded machine can take longer to write: it starts once the chief has saved
    # one, and the parameter server is killed once both train.
    ps.start()
    chief.start()
    chief.wait_for(SAVED.pattern)
    worker.start()
    worker.wait_for(TRAINING)
    ps.kill()
    cluster_tasks.wait_all(timeout=90, tasks=[chief, worker])
    cluster_tasks.stop()
    for t in (chief, worker):
        assert t.process.returncode == 1, f"{t.name}:\n{t.text()[-3000:]}"
        lines = [line for line in t.text().splitlines() if "lost ps:0" in line]
        assert len(lines) == 1, t.text()[-3000:]
        assert "(--cluster-timeout-secs)" in lines[0] and "start it again" in lines[0]
