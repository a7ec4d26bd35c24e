"""Collective all-reduce through Estimator (--distribution-strategy mirrored and
multi-worker-mirrored): the same training as towers, a real multi-process cluster on 127.0.0.1
that survives a kill -9 and stops together for a signal, and one line for every combination
that cannot work. The cluster that trains, evaluates, exports and ends on its own runs with its
job dir in a bucket (tests/test_object_storage.py), as a cluster's job dir usually is."""

import json
import os
import re
import shutil
import signal

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.config import checks, flags
from cifar10_estimator.data.pipeline import Cifar10DataSet
from cifar10_estimator.errors import UserError
from cluster_fixtures import local_spec, tf_config
from trainer_fixtures import checkpoint_step, run_module, trainer_args

ALL_REDUCE = ["--distribution-strategy", "multi-worker-mirrored"]


def _weights(checkpoint: str) -> dict:
    reader = tf.train.load_checkpoint(checkpoint)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith("resnet/") and "moving_" not in name
            and not name.endswith("/Momentum")}


@pytest.mark.slow
def test_mirrored_on_two_cpu_devices_trains_what_two_towers_train(tiny_records, tmp_path):
    # From one checkpoint, on the same batches (no augmentation, one seed): the replicas'
    # all-reduced gradients are the towers' averaged ones, so the weights agree.
    data_dir, _ = tiny_records
    common = ["--num-cpu-towers", "2", "--seed", "3", "--use-distortion-for-training", "false",
              "--eval-throttle-secs", "100000", "--precise-bn-batches", "0"]
    start = tmp_path / "start"
    assert train.main(trainer_args(data_dir, start, *common, "--train-steps", "1")) == 0
    for name in ("towers", "mirrored"):
        shutil.copytree(start, tmp_path / name)
        assert train.main(trainer_args(data_dir, tmp_path / name, *common, "--train-steps", "4",
                                       "--distribution-strategy", name)) == 0
    towers = _weights(tf.train.latest_checkpoint(tmp_path / "towers"))
    mirrored = _weights(tf.train.latest_checkpoint(tmp_path / "mirrored"))
    assert towers.keys() == mirrored.keys() and len(towers) > 10
    moved = max(float(np.max(np.abs(towers[n] - _weights(
        tf.train.latest_checkpoint(start))[n]))) for n in towers)
    differ = max(float(np.max(np.abs(towers[n] - mirrored[n]))) for n in towers)
    assert moved > 1e-3 and differ < 1e-4 * max(1.0, moved), (moved, differ)


def test_training_records_are_sharded_so_workers_read_disjoint_records(tiny_records):
    data_dir, rows = tiny_records
    data = Cifar10DataSet(data_dir, "train", use_distortion=False)
    seen = []
    for index in range(3):
        batch = next(iter(data.make_batch(32, seed=1, shard=(3, index))))
        # The pixels of each record are distinct: a record is its bytes.
        seen.append({bytes(img.astype(np.uint8).tobytes()) for img in batch[0]["image"].numpy()})
    assert all(len(s) == 32 for s in seen)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])


@pytest.mark.parametrize("extra,message", [
    (["--distribution-strategy", "mirrored", "--sync"],
     "--sync: --distribution-strategy mirrored is synchronous already"),
    ([*ALL_REDUCE, "--variable-strategy", "GPU"],
     "--variable-strategy GPU: with --distribution-strategy multi-worker-mirrored every replica"),
    ([*ALL_REDUCE, "--num-cpu-towers", "2"],
     "--num-cpu-towers: --distribution-strategy multi-worker-mirrored runs one replica per GPU"),
    ([*ALL_REDUCE, "--precise-bn-batches", "10"],
     "--precise-bn-batches: not available with --distribution-strategy multi-worker-mirrored"),
])
def test_what_a_strategy_cannot_do_is_refused_with_one_line(extra, message):
    config, _ = flags.parse(["--data-dir", "d", "--job-dir", "j", *extra])
    with pytest.raises(UserError, match="^" + re.escape(message)):
        checks.validate(config)


def test_a_multi_worker_job_leaves_precise_batch_norm_off_by_default():
    config, _ = flags.parse(["--data-dir", "d", "--job-dir", "j", *ALL_REDUCE])
    checks.validate(config)
    assert config.model.precise_bn_batches == 0
    assert flags.parse(["--distribution-strategy", "mirrored"])[0].model.precise_bn_batches == 50


@pytest.mark.slow
@pytest.mark.parametrize("cluster,strategy,message", [
    (local_spec("chief", "worker", "ps", ports=[1, 2, 3]), "multi-worker-mirrored",
     "TF_CONFIG: --distribution-strategy multi-worker-mirrored all-reduces among the chief and "
     "workers, and TF_CONFIG lists 1 'ps' task(s)"),
    (local_spec("chief", "worker", ports=[1, 2]), "mirrored",
     "TF_CONFIG: --distribution-strategy mirrored runs on one machine"),
    (local_spec("chief", "worker", ports=[1, 2]), "towers",
     "TF_CONFIG: the cluster has 2 training tasks but no 'ps' job"),
])
def test_a_cluster_that_does_not_fit_the_strategy_is_one_line(tiny_records, tmp_path, cluster,
                                                               strategy, message):
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    proc = run_module("cifar10_estimator", *trainer_args(
        data_dir, job_dir, "--distribution-strategy", strategy),
        env_extra={"TF_CONFIG": tf_config(cluster, "chief")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "cifar10_estimator: error: " + message)
    assert not job_dir.exists()


def test_the_launcher_refuses_parameter_servers_for_an_all_reduce_cluster(tmp_path):
    proc = run_module("cifar10_estimator.cluster", "--num-ps", "1", "--",
                      *trainer_args(tmp_path, tmp_path / "job", *ALL_REDUCE))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "cifar10_estimator.cluster: error: --num-ps 1: a multi-worker-mirrored cluster "
        "all-reduces among the chief and workers, without parameter servers")


def _worker_pid(log_text: str, after: int = 0) -> int:
    pids = [int(p) for p in re.findall(r"\[cluster\] started worker0 \(pid (\d+)\)", log_text)]
    return pids[-1] if len(pids) > after else 0


@pytest.mark.cluster
@pytest.mark.timeout(400)
def test_an_all_reduce_job_survives_a_kill_9_and_stops_together_for_a_sigterm(
        tiny_records, tmp_path, launch):
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    # The job restarts twice: after the kill at step 100 or later, and after the signal a
    # moment past the restart (a second of the worker's training, some 30 steps); 200 more
    # steps (about 5 s alone on 2 cores of an AMD Zen 4) leave the signal time to land before
    # the end.
    steps = 300
    cluster = launch(
        ["--num-workers", "2", "--",
         *trainer_args(data_dir, job_dir, *ALL_REDUCE, "--train-steps", str(steps),
                       "--save-checkpoints-steps", "100", "--eval-throttle-secs", "100000",
                       "--progress-secs", "1")], tmp_path / "cluster.log")
    # kill -9 of the worker after a checkpoint (the first one past the start's): the job
    # restarts from it.
    seen = cluster.wait_for(r"\[chief\] .*Saving checkpoints for 100 ")
    os.kill(_worker_pid(cluster.text()), signal.SIGKILL)
    seen = cluster.wait_for(r"\[chief\] .*exits with status 143 for a restart of the job, "
                            r"which resumes from \S+model\.ckpt-(\d+)", since=seen)
    resumed = int(re.findall(r"resumes from \S+model\.ckpt-(\d+)", cluster.text())[-1])
    assert resumed >= 100
    seen = cluster.wait_for(rf"\[chief\] .*Restoring parameters from \S+model\.ckpt-{resumed}",
                            since=seen)
    # SIGTERM to the worker: every task stops at one agreed step, the chief saves it.
    sent = cluster.wait_for(rf"\[worker0\] .*step \d+/{steps}", since=seen)
    os.kill(_worker_pid(cluster.text(), after=1), signal.SIGTERM)
    cluster.wait_for(r"\[chief\] .*stopped with the job \(another task received a signal\) "
                     r"at step (\d+): saved", since=sent)
    agreed = int(re.findall(r"stopped with the job \(another task received a signal\) at "
                            r"step (\d+)", cluster.text())[-1])
    # The worker's own line comes a moment before or after the chief's: search from the
    # signal on (wait_for fails the test if it never comes).
    cluster.wait_for(rf"\[worker0\] .*received SIGTERM at step {agreed}:", since=sent)
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == agreed
    assert cluster.wait(timeout=300) == 0, cluster.text()[-4000:]
    text = cluster.text()
    assert checkpoint_step(tf.train.latest_checkpoint(job_dir)) == steps
    assert "[cluster] training finished" in text and "Traceback" not in text
    assert re.search(rf"\[chief\] .*Restoring parameters from \S+model\.ckpt-{agreed}", text)


ALL_REDUCE_MANIFEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                   "k8s", "tfjob-allreduce.yaml")
OPERATOR_CRD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "shared", "k8s", "kubeflow.org_tfjobs.yaml")


def test_the_all_reduce_manifest_is_a_tfjob_of_chief_workers_and_evaluator_only():
    import jsonschema
    import yaml

    with open(ALL_REDUCE_MANIFEST) as f:
        (job,) = [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "TFJob"]
    schema_path = os.path.join(os.path.dirname(ALL_REDUCE_MANIFEST), "tfjob.schema.json")
    with open(schema_path) as f:
        jsonschema.Draft202012Validator(json.load(f)).validate(job)
    if os.path.isfile(OPERATOR_CRD):  # the operator's own CRD, where it is provided
        with open(OPERATOR_CRD) as f:
            crd = yaml.safe_load(f)
        version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
        jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"]).validate(job)
    specs = job["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "Worker", "Evaluator"}  # no PS
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    parser = flags.build_parser()
    for name, spec in specs.items():
        assert spec["restartPolicy"] == "ExitCode"  # 143: the job restarts whole
        (container,) = spec["template"]["spec"]["containers"]
        args = parser.parse_args(container["args"])
        assert args.distribution_strategy == "multi-worker-mirrored"
        config, _ = flags.parse(container["args"])
        checks.validate(config)
