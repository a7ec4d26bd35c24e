"""Clusters in the field: default cadence flags, operator-style TF_CONFIG, tasks that die.

Real processes on 127.0.0.1, each started as Kubeflow's operator starts a replica: the same
command with its own TF_CONFIG, which lists every replica type (the evaluator included) and
the ``"environment": "cloud"`` key. Tasks are killed with SIGKILL and started again with the
same command, as Kubernetes recreates a pod.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.data import schema
from cifar10_estimator.distributed import evaluator, launcher
from cifar10_estimator.data.pipeline import Cifar10DataSet
from trainer_fixtures import checkpoint_step, trainer_args

_EVAL = re.compile(r"\bevaluation at step (\d+):")
_CHECKPOINT = re.compile(r"Saving checkpoints for (\d+) ")


def operator_tf_configs(with_evaluator: bool = True) -> dict[str, str]:
    """TF_CONFIG per task as kubeflow/training-operator writes it (genTFConfigJSONStr)."""
    names = ["chief", "worker", "ps"] + (["evaluator"] if with_evaluator else [])
    ports = launcher.free_ports(len(names))
    spec = {job: [f"127.0.0.1:{port}"] for job, port in zip(names, ports)}
    return {job: json.dumps({"cluster": spec, "task": {"type": job, "index": 0},
                             "environment": "cloud"}) for job in names}


class Task:
    """One replica: a process with its own TF_CONFIG and a log file, restartable. It runs in
    the test's own folder (``log_dir``, the test's tmp_path), never in the checkout."""

    def __init__(self, name: str, tf_config: str, args: list[str], log_dir):
        self.name, self.tf_config, self.args = name, tf_config, args
        self.log = log_dir / f"{name}.log"
        self.cwd = log_dir
        self.process = None
        self.exited_at = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env.update(TF_CONFIG=self.tf_config, PYTHONUNBUFFERED="1")
        with open(self.log, "a") as log:
            log.write(f"---- start {time.monotonic():.3f}\n")
            log.flush()
            self.process = subprocess.Popen([sys.executable, "-m", "cifar10_estimator",
                                             *self.args], env=env, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.cwd)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def text(self) -> str:
        return self.log.read_text()

    def poll(self):
        code = self.process.poll()
        if code is not None and self.exited_at is None:
            self.exited_at = time.monotonic()
        return code


def _wait_all(tasks: list[Task], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(t.poll() is None for t in tasks):
        time.sleep(0.2)
    for t in tasks:
        t.poll()


def _stop_all(tasks: list[Task]) -> None:
    for t in tasks:
        if t.process and t.process.poll() is None:
            t.process.kill()
            t.process.wait()


def _wait_for(predicate, what: str, tasks: list[Task], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen:\n" +
                         "\n".join(f"== {t.name}\n{t.text()[-1500:]}" for t in tasks))


def _checkpoints_saved(task: Task) -> list[int]:
    return [int(v) for v in _CHECKPOINT.findall(task.text())]


def _exported(job_dir: str) -> list[str]:
    return os.listdir(os.path.join(job_dir, "export"))


@pytest.mark.slow
@pytest.mark.cluster
def test_operator_style_cluster_with_default_flags_ends_right_after_the_final_checkpoint(
        tiny_records, tmp_path):
    # Default cadence: checkpoints every 600 s, evaluations at most every 600 s, workers
    # staggered by Estimator's rule. Estimator's own evaluator loop slept 600 s here.
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    configs = operator_tf_configs()
    flags = trainer_args(data_dir, job_dir, "--train-steps", "60", "--export-best")
    tasks = [Task("ps", configs["ps"], [], tmp_path), Task("chief", configs["chief"], flags,
                                                            tmp_path),
             Task("worker", configs["worker"], flags, tmp_path),
             Task("evaluator", configs["evaluator"], flags, tmp_path)]
    try:
        for t in tasks:
            t.start()
        _wait_all(tasks, timeout=150)
    finally:
        _stop_all(tasks)
    for t in tasks:
        assert t.process.returncode == 0, f"{t.name}:\n{t.text()[-3000:]}"
        assert "Traceback" not in t.text(), t.text()[-3000:]
    final = checkpoint_step(tf.train.latest_checkpoint(job_dir))
    assert final >= 60
    ev = tasks[3].text()
    assert [int(v) for v in _EVAL.findall(ev)][-1] == final
    assert f"final evaluation at step {final}" in ev
    assert sorted(_exported(job_dir))[-1] == "best" and len(_exported(job_dir)) == 2
    # --export-best: the evaluator exported its best evaluation (the first one, on ties).
    accuracies = [float(a) for a in re.findall(r"\bevaluation at step \d+: accuracy = ([0-9.]+)",
                                               ev)]
    best = os.listdir(os.path.join(job_dir, "export", "best"))
    assert len(best) == 1 and accuracies, (best, ev[-3000:])
    with open(os.path.join(job_dir, "export", "best", best[0], "assets.extra",
                           "eval_metrics.json")) as f:
        # The log shows 4 significant digits.
        assert json.load(f)["accuracy"] == pytest.approx(max(accuracies), abs=5e-5)
    chief, ps, ev_task = tasks[1], tasks[0], tasks[3]
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

    from cifar10_estimator.config.settings import TrainConfig

    config = TrainConfig(data_dir=data_dir, job_dir=job_dir, num_layers=8,
                         train_batch_size=8, eval_batch_size=8)
    from cifar10_estimator.config import plan
    from cifar10_estimator.model.model_fn import ModelSettings, make_model_fn

    evaluator_role = plan.Role("evaluator", 0, {"chief": ("127.0.0.1:1",), "evaluator": ("127.0.0.1:2",)})
    settings = ModelSettings.of(plan.resolve(config, evaluator_role, dataset="cifar10",
                                             class_names=schema.CLASS_NAMES, train_records=96,
                                             precision="fp32"))

    estimator = tf.estimator.Estimator(make_model_fn(settings), model_dir=job_dir)
    metrics = evaluator.evaluate_checkpoints(estimator, input_fn, train_steps=4,
                                             throttle_secs=600)
    assert metrics["global_step"] == 4
    assert len(calls) == 2  # the deleted checkpoint was skipped, the final one evaluated


def _cluster(tmp_path, flags: list[str], with_evaluator: bool) -> list[Task]:
    configs = operator_tf_configs(with_evaluator)
    tasks = [Task("ps", configs["ps"], ["--cluster-timeout-secs", "60"], tmp_path),
             Task("chief", configs["chief"], flags, tmp_path),
             Task("worker", configs["worker"], flags, tmp_path)]
    if with_evaluator:
        tasks.append(Task("evaluator", configs["evaluator"], flags, tmp_path))
    return tasks


def _start_until_a_second_checkpoint(tasks: list[Task], chief: Task) -> None:
    """Starts every task and returns once the chief has saved two checkpoints (mid-run)."""
    for t in tasks:
        t.start()
    _wait_for(lambda: len(_checkpoints_saved(chief)) >= 2, "a second checkpoint", tasks)


@pytest.mark.slow
@pytest.mark.cluster
def test_a_parameter_server_killed_and_restarted_mid_run_the_job_still_finishes(
        tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    # 400 steps: the kill comes at the second checkpoint (step 100), and nothing trains while
    # the parameter server is away.
    flags = trainer_args(data_dir, job_dir, "--train-steps", "400", "--save-checkpoints-steps",
                         "100", "--max-worker-delay-secs", "0", "--cluster-timeout-secs", "60")
    tasks = _cluster(tmp_path, flags, with_evaluator=False)
    ps, chief, worker = tasks
    try:
        _start_until_a_second_checkpoint(tasks, chief)
        assert chief.poll() is None, "training ended before the kill"
        # The worker sits out the outage frozen, and goes on once the chief has put the
        # variables back: a worker that looks for them earlier naps 30 s (TensorFlow's
        # recovery wait) before it looks again.
        worker.process.send_signal(signal.SIGSTOP)
        try:
            ps.kill()
            time.sleep(1)
            ps.start()  # same command, same address: what Kubernetes does with the pod
            _wait_for(lambda: "Restoring parameters from" in chief.text(),
                      "the chief's recovery", tasks)
        finally:
            worker.process.send_signal(signal.SIGCONT)
        _wait_all(tasks, timeout=180)
    finally:
        _stop_all(tasks)
    for t in tasks:
        assert t.process.returncode == 0, f"{t.name}:\n{t.text()[-3000:]}"
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) >= 400
    # The chief put the latest checkpoint back into the new parameter server (its job dir
    # was empty at start, so every restore is the recovery).
    assert chief.text().count("Restoring parameters from") >= 1, chief.text()[-3000:]
    assert "parameter server 0: training finished, exiting" in ps.text()
    assert len(_exported(job_dir)) == 1


@pytest.mark.slow
@pytest.mark.cluster
def test_a_chief_and_a_worker_killed_and_restarted_resume_and_the_evaluator_sees_the_end(
        tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    steps = 400
    flags = trainer_args(data_dir, job_dir, "--train-steps", str(steps),
                         "--save-checkpoints-steps", "100", "--max-worker-delay-secs", "0",
                         "--cluster-timeout-secs", "60", "--eval-throttle-secs", "5",
                         "--progress-secs", "1")
    tasks = _cluster(tmp_path, flags, with_evaluator=True)
    ps, chief, worker, ev = tasks
    try:
        _start_until_a_second_checkpoint(tasks, chief)
        chief.kill()
        # What a rerun resumes from: the latest complete checkpoint (the "Saving checkpoints"
        # line comes before the files, so the kill may land before that one is written).
        killed_at = checkpoint_step(tf.train.latest_checkpoint(job_dir))
        chief.start()  # rerun the same command
        _wait_for(lambda: chief.text().count("Saving checkpoints for") >= 4,
                  "checkpoints of the restarted chief", tasks)
        worker.kill()
        worker.start()
        # The restarted worker must rejoin before the job ends: the chief (which would go on
        # alone) is frozen until the worker trains again (its progress line, a second after
        # its first step), then goes on. Only the worker's own steps count meanwhile.
        chief.process.send_signal(signal.SIGSTOP)
        try:
            _wait_for(lambda: re.search(rf"step \d+/{steps} \(",
                                        worker.text().split("---- start")[-1]),
                      "training by the restarted worker", tasks)
        finally:
            chief.process.send_signal(signal.SIGCONT)
        _wait_all(tasks, timeout=240)
    finally:
        _stop_all(tasks)
    for t in tasks:
        assert t.process.returncode == 0, f"{t.name}:\n{t.text()[-3000:]}"
    final = checkpoint_step(tf.train.latest_checkpoint(job_dir))
    assert final >= steps
    # The final checkpoint is named after the step it holds, though the worker's last update
    # can land while the chief recomputes the batch-norm statistics before that save.
    assert tf.train.load_variable(tf.train.latest_checkpoint(job_dir), "global_step") == final
    assert f"resuming from {job_dir}/model.ckpt-{killed_at}" in chief.text()
    # The restarted worker rejoined and trained (its second run logs its own steps).
    second_run = worker.text().split("---- start")[-1]
    ran = re.search(r"this task ran (\d+) training steps", second_run)
    assert ran and int(ran.group(1)) > 0, second_run[-3000:]
    # The evaluator's final evaluation is of the first checkpoint at or past --train-steps;
    # asynchronously the chief can still save one a step later (a worker's last update).
    evaluated = [int(v) for v in re.findall(r"final evaluation at step (\d+)", ev.text())]
    assert len(evaluated) == 1 and steps <= evaluated[0] <= final, (evaluated, final)
    assert len(_exported(job_dir)) == 1


@pytest.mark.slow
@pytest.mark.cluster
def test_a_parameter_server_that_never_comes_back_ends_every_trainer_with_one_line(
        tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    flags = trainer_args(data_dir, job_dir, "--train-steps", "100000",
                         "--save-checkpoints-steps", "50", "--max-worker-delay-secs", "0",
                         "--cluster-timeout-secs", "5")
    tasks = _cluster(tmp_path, flags, with_evaluator=False)
    ps, chief, worker = tasks
    try:
        _start_until_a_second_checkpoint(tasks, chief)
        ps.kill()
        _wait_all([chief, worker], timeout=90)
    finally:
        _stop_all(tasks)
    for t in (chief, worker):
        assert t.process.returncode == 1, f"{t.name}:\n{t.text()[-3000:]}"
        lines = [line for line in t.text().splitlines() if "lost ps:0" in line]
        assert len(lines) == 1, t.text()[-3000:]
        assert "(--cluster-timeout-secs)" in lines[0] and "start it again" in lines[0]
