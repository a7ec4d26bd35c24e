"""The TF_CONFIG shapes and environment the engines write (docs/distributed.md, "Engines"), each
fed as the engine writes it; a cluster of workers only trained for real on 127.0.0.1."""

import json
import os
import shutil

import pytest
import tensorflow as tf

from cifar10_estimator.config.role import Role
from cifar10_estimator.task import tf_config
from cifar10_estimator.errors import UserError
from cifar10_estimator.model.checkpoints import checkpoint_step
from cluster_fixtures import free_ports
from trainer_fixtures import Trainer, trainer_args

# Ray Train's TensorflowTrainer (ray/train/tensorflow/config.py, _setup_tensorflow_environment)
# and SageMaker's multi-worker mirrored distribution: workers only.
RAY_TRAIN = {"cluster": {"worker": ["10.0.0.1:40001", "10.0.0.2:40002", "10.0.0.3:40003"]},
             "task": {"type": "worker", "index": 1}}
RAY_TRAIN_ONE = {"cluster": {"worker": ["10.0.0.1:40001"]}, "task": {"type": "worker", "index": 0}}
# SageMaker's parameter-server distribution: a "master", a ps on every host.
SAGEMAKER_PS = {"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"],
                            "worker": ["algo-2:2222"]},
                "environment": "cloud", "task": {"index": 0, "type": "worker"}}
# Vertex AI: chief, workers, ps and evaluator, plus keys of its own.
VERTEX = {"cluster": {"chief": ["cmle-training-workerpool0-ab-0:2222"],
                      "worker": ["cmle-training-workerpool1-ab-0:2222"]},
          "environment": "cloud", "job": {"worker_pool_specs": [{"replica_count": 1}]},
          "task": {"type": "worker", "index": 0, "trial": ""}}
# Kubeflow's TFJob operator: every replica type listed, the evaluator included.
KUBEFLOW = {"cluster": {"chief": ["job-chief-0.ns.svc:2222"], "ps": ["job-ps-0.ns.svc:2222"],
                        "evaluator": ["job-evaluator-0.ns.svc:2222"]},
            "task": {"type": "evaluator", "index": 0}}


def _both(value: dict):
    """Our role, and Estimator's RunConfig reading what the trainer sets TF_CONFIG to."""
    text = json.dumps(value)
    role = tf_config.parse(text)
    seen = tf_config.estimator_tf_config(text, role)
    before = os.environ.pop("TF_CONFIG", None)
    try:
        if seen is not None:
            os.environ["TF_CONFIG"] = seen
        rc = tf.estimator.RunConfig()
    finally:
        os.environ.pop("TF_CONFIG", None)
        if before is not None:
            os.environ["TF_CONFIG"] = before
    return role, rc, seen


def test_a_cluster_of_workers_only_has_worker_0_as_its_chief():
    role, rc, seen = _both(RAY_TRAIN)
    assert (role.task_type, role.task_id, role.is_chief) == ("worker", 0, False)
    assert role.num_trainers == 3 and role.trainer_index == 1
    assert (rc.task_type, rc.task_id, rc.is_chief, rc.num_worker_replicas) == (
        "worker", 0, False, 3)
    assert json.loads(seen)["cluster"] == {"chief": ["10.0.0.1:40001"],
                                           "worker": ["10.0.0.2:40002", "10.0.0.3:40003"]}
    chief, rc, _ = _both({**RAY_TRAIN, "task": {"type": "worker", "index": 0}})
    assert chief.is_chief and chief.evaluates_at_end and rc.is_chief
    assert chief.peers == {"worker:0": "10.0.0.2:40002", "worker:1": "10.0.0.3:40003"}


def test_one_worker_alone_is_a_local_run():
    role, rc, seen = _both(RAY_TRAIN_ONE)
    assert role == Role() and seen is None and rc.is_chief and not rc.cluster_spec


def test_sagemaker_vertex_and_kubeflow_shapes_are_taken_as_written():
    role, rc, seen = _both(SAGEMAKER_PS)
    assert (role.task_type, role.num_ps, role.num_trainers) == ("worker", 2, 2)
    assert json.loads(seen) == SAGEMAKER_PS and rc.num_ps_replicas == 2
    role, rc, seen = _both(VERTEX)
    assert (role.task_type, role.trainer_index, rc.task_type) == ("worker", 1, "worker")
    assert json.loads(seen)["job"] == VERTEX["job"]  # its own keys pass through
    role, rc, _ = _both(KUBEFLOW)
    assert role.task_type == rc.task_type == "evaluator" and role.num_trainers == 1
    assert not role.evaluates_at_end  # the evaluator task does


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_workers_only_all_reduce_trains_and_worker_0_evaluates_exports_and_reports(
        tiny_records, tmp_path):
    # TF_CONFIG as Ray Train and SageMaker write it: two workers, no chief, no evaluator.
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    flags = trainer_args(data_dir, job_dir, "--distribution-strategy", "multi-worker-mirrored",
                         "--train-steps", "6", "--save-checkpoints-steps", "3")
    tasks = [Trainer(flags, tmp_path / f"worker{i}.log", tf_config=json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}))
        for i in range(2)]
    codes = [task.finish(timeout=240) for task in tasks]
    logs = [task.text() for task in tasks]
    assert codes == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert "role: chief 0 of the cluster chief 127.0.0.1" in logs[0]
    assert "role: worker 0 of the cluster" in logs[1]
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == 6
    # Worker 0, the chief, evaluated the final checkpoint, exported it and wrote the report.
    report = json.loads((job_dir / "eval_report.json").read_text())
    assert report["global_step"] == 6
    (version,) = os.listdir(job_dir / "export")
    assert json.loads((job_dir / "export" / version / "assets.extra" / "export.json"
                       ).read_text())["global_step"] == 6
    assert "eval_report.json" not in logs[1] and "exported SavedModel" not in logs[1]
    # Worker 1 stayed until the chief's report: the chief's coordination service saw no task
    # leave early (it logs errors, " E ", when one does).
    assert not any(" E " in log or "Traceback" in log for log in logs), logs[0][-3000:]

    # A task killed after the last step and restarted (its orchestrator's restart policy)
    # finds the others gone: it joins no group (which would wait for them without end).
    # Worker 1 leaves at once; worker 0, the chief, whose export and report were lost,
    # evaluates and exports the last checkpoint again without training.
    again = Trainer(flags, tmp_path / "worker1-again.log", tf_config=tasks[1].tf_config)
    assert again.finish(timeout=120) == 0, again.text()[-3000:]
    assert (f"worker 0: the job already trained to its last step, 6, in {job_dir}: nothing "
            f"to train; this task leaves without joining the cluster") in again.text()
    shutil.rmtree(job_dir / "export")
    os.remove(job_dir / "eval_report.json")
    chief = Trainer(flags, tmp_path / "worker0-again.log", tf_config=tasks[0].tf_config)
    assert chief.finish(timeout=120) == 0, chief.text()[-3000:]
    assert json.loads((job_dir / "eval_report.json").read_text())["global_step"] == 6
    (version,) = os.listdir(job_dir / "export")
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == 6  # nothing trained


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_ps_cluster_task_restarted_after_the_last_step_waits_for_no_parameter_server(
        tiny_records, tmp_path):
    # A chaos campaign (issue 76) killed a parameter-server job's chief inside its export,
    # after the ps had served the whole run and exited: the restarted chief waited 600 s for
    # the ps and failed. Now a restarted chief concludes and a worker leaves, as in an
    # all-reduce job.
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    chief, worker, ps = (f"127.0.0.1:{port}" for port in free_ports(3))
    cluster = {"chief": [chief], "worker": [worker], "ps": [ps]}
    flags = trainer_args(data_dir, job_dir, "--train-steps", "6", "--save-checkpoints-steps",
                         "3", "--cluster-timeout-secs", "60")

    def config(task_type: str) -> str:
        return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": 0}})

    tasks = [Trainer(flags, tmp_path / f"{name}.log", tf_config=config(name))
             for name in ("ps", "chief", "worker")]
    codes = [task.finish(timeout=240) for task in tasks]
    assert codes == [0, 0, 0], "\n".join(task.text()[-3000:] for task in tasks)
    final = checkpoint_step(tf.train.latest_checkpoint(job_dir))
    shutil.rmtree(job_dir / "export")  # the export the killed chief never finished
    again = Trainer(flags, tmp_path / "worker-again.log", tf_config=config("worker"))
    assert again.finish(timeout=60) == 0, again.text()[-3000:]
    assert "this task leaves without joining the cluster" in again.text()
    chief_again = Trainer(flags, tmp_path / "chief-again.log", tf_config=config("chief"))
    assert chief_again.finish(timeout=60) == 0, chief_again.text()[-3000:]
    assert "waiting up to" not in chief_again.text()
    (version,) = os.listdir(job_dir / "export")
    assert json.loads((job_dir / "export" / version / "assets.extra" / "export.json"
                       ).read_text())["global_step"] == final
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == final  # nothing trained


def test_the_engines_folders_are_defaults_under_the_flags_given():
    from cifar10_estimator import engines
    from cifar10_estimator.config import flags

    environ = {"SM_MODEL_DIR": "/opt/ml/model", "SM_CHANNEL_TRAINING": "/opt/ml/input/data/t",
               "AIP_MODEL_DIR": "gs://b/model", "AIP_CHECKPOINT_DIR": "gs://b/checkpoints"}
    found = engines.settings(environ)
    assert found == {"export_dir": ("/opt/ml/model", "SM_MODEL_DIR"),
                     "data_dir": ("/opt/ml/input/data/t", "SM_CHANNEL_TRAINING"),
                     "job_dir": ("gs://b/checkpoints", "AIP_CHECKPOINT_DIR")}
    under = {name: value for name, (value, _) in found.items()}
    config, _ = flags.parse(["--model_dir", "s3://b/job", "--data-dir", "d"], under)
    assert tuple(config.value(name) for name in ("job_dir", "data_dir", "export_dir")) == (
        "s3://b/job", "d", "/opt/ml/model")  # the flags given win
    assert engines.settings({"AIP_MODEL_DIR": ""}) == {}


def test_sagemakers_arguments_and_environment_train_and_export_where_it_looks(
        tiny_records, tmp_path):
    # SageMaker's script mode: hyperparameters as flags, --model_dir, the data channel and the
    # model folder in the environment.
    from trainer_fixtures import TINY_FLAGS, run_module

    data_dir, _ = tiny_records
    model = tmp_path / "opt-ml-model"
    proc = run_module("cifar10_estimator", "--model_dir", str(tmp_path / "job"), *TINY_FLAGS,
                      "--train-steps", "2", "--precise-bn-batches", "0",
                      env_extra={"SM_MODEL_DIR": str(model), "SM_CHANNEL_TRAINING": data_dir})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"--export-dir {model}: from SM_MODEL_DIR" in proc.stderr
    assert f"--data-dir {data_dir}: from SM_CHANNEL_TRAINING" in proc.stderr
    (version,) = os.listdir(model)
    assert (model / version / "saved_model.pb").exists()
    assert checkpoint_step(tf.train.latest_checkpoint(tmp_path / "job")) == 2


def test_rays_gpus_per_task_become_the_trainers_gpus():
    from cifar10_estimator.launch import ray_actors

    assert ray_actors.with_gpus(["--job-dir", "j"], 2, 0) == ["--job-dir", "j", "--num-gpus",
                                                                "2"]
    assert ray_actors.with_gpus(["--num-gpus", "1"], 1, 1) == ["--num-gpus", "1"]
    assert ray_actors.with_gpus(["--job-dir", "j"], 0, 0) == ["--job-dir", "j"]
    with pytest.raises(UserError, match="--num-gpus 2 differs from --gpus-per-task 1"):
        ray_actors.with_gpus([], 1, 2)
    with pytest.raises(UserError, match="whole number"):
        ray_actors.with_gpus([], 0.5, 0)


def test_a_lost_node_after_the_restarts_are_spent_ends_the_job_in_one_line():
    # The launcher's rule, without a cluster: a task whose actor Ray declared dead, and
    # --max-failures 0 (the real loss and placement again: tests/test_ray.py).
    import io

    pytest.importorskip("ray")
    from cifar10_estimator.launch import layout, loop, ray_actors

    tasks = layout.tasks_of(layout.cluster_of(2, 0, ["10.0.0.1:1", "10.0.0.2:2"]), False)
    placed = {t.name: ray_actors.Placed(None, f"10.0.0.{i + 1}:{i + 1}", f"node{i}" * 4)
              for i, t in enumerate(tasks)}
    for task in tasks:
        task.process = ray_actors.RayProcess(None, 1)
    tasks[1].process.lost_because = "The actor died because its node has died."
    out = io.StringIO()
    placement = ray_actors.RayActors(placed, place_again=lambda: pytest.fail("placed again"))
    cluster = loop.LaunchLoop(tasks, placement, [], {}, out, max_failures=0)
    assert not cluster._place_again([tasks[1]])
    assert out.getvalue() == (
        "[cluster] worker0's node 10.0.0.2 (node node1nod) was lost (The actor died because "
        "its node has died.); no restarts left (--max-failures 0)\n")
    assert not cluster._place_again([tasks[0]])  # a task that failed on its own: not a loss
