"""The plan: every fact of a task resolved once (config/plan.py), from the role TF_CONFIG's value
gives (distributed/roles.py); the model reads it through ModelSettings.of."""

import dataclasses
import json

import pytest

from cifar10_estimator.config import overlays, plan
from cifar10_estimator.config.settings import TrainConfig
from cifar10_estimator.data import schema
from cifar10_estimator.distributed import roles
from cifar10_estimator.errors import UserError

CLUSTER = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}


def _tf_config(task_type, index=0, cluster=CLUSTER):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def _resolve(config, role=plan.Role(), records=96, precision="fp32"):
    return plan.resolve(config, role, dataset="cifar10", class_names=schema.CLASS_NAMES,
                        train_records=records, precision=precision)


def test_tf_configs_value_gives_the_role():
    assert roles.parse(None) == plan.Role() and roles.parse(None).name == "local"
    local = roles.parse(json.dumps({"task": {"type": "worker", "index": 0}}))
    assert local.local and local.is_chief and local.num_trainers == 1
    worker = roles.parse(_tf_config("worker", "1"))  # an index written as a string
    assert (worker.task_type, worker.task_id, worker.is_chief) == ("worker", 1, False)
    assert worker.trainer_index == 2 and worker.num_trainers == 3 and worker.num_ps == 1
    assert worker.ps_tasks == {"ps:0": "h:4"}
    assert set(worker.peers) == {"chief:0", "worker:0"}
    # An evaluator keeps the cluster (Estimator's RunConfig empties it): it counts the workers.
    evaluator = roles.parse(_tf_config("evaluator", 0, {**CLUSTER, "evaluator": ["h:5"]}))
    assert not evaluator.in_cluster and evaluator.num_trainers == 3
    with pytest.raises(UserError, match='TF_CONFIG: "cluster" must have exactly one "chief" '
                                        'task, or only "worker" tasks'):
        roles.parse(_tf_config("worker", 0, {"chief": ["h:1", "h:2"], "worker": ["h:3"]}))


def test_the_batch_is_resolved_once_per_worker_replica_and_global_step():
    towers = TrainConfig(train_batch_size=16, num_cpu_towers=2)
    p = _resolve(towers)
    assert (p.worker_batch, p.replica_batch, p.global_batch) == (16, 8, 16)
    assert p.devices == ("/cpu:0", "/cpu:1") and p.steps_per_epoch == 6
    chief = roles.parse(_tf_config("chief"))
    assert _resolve(TrainConfig(train_batch_size=8), chief).global_batch == 8  # asynchronous
    synced = _resolve(TrainConfig(train_batch_size=8, sync=True), chief)
    assert (synced.global_batch, synced.steps_per_epoch) == (24, 4)
    all_reduce = _resolve(TrainConfig(train_batch_size=8,
                                      distribution_strategy="multi-worker-mirrored"),
                          roles.parse(_tf_config("chief", 0, {"chief": ["h:1"],
                                                              "worker": ["h:2"]})))
    assert all_reduce.global_batch == 16 and all_reduce.all_reduce_trainer


def test_the_length_comes_from_one_setting_in_global_steps():
    assert _resolve(TrainConfig(train_steps=7)).train_steps == 7
    by_epochs = _resolve(TrainConfig(train_batch_size=8, train_epochs=1.5))
    assert (by_epochs.train_steps, by_epochs.run_epochs) == (18, 1.5)
    assert by_epochs.length_from == "--train-epochs"
    model_length = overlays.MODELS["resnet"]["train_steps"]
    assert _resolve(TrainConfig()).train_steps == model_length
    fast = overlays.build(recipe="fast", train_batch_size=8)
    own = _resolve(fast, records=50_000)
    assert own.run_epochs == overlays.recipe_epochs("fast", 50_000)
    assert own.length_from.startswith("the fast recipe's length for 50,000 records")
    # Cosine spans the run: its length is what the settings record keeps.
    assert _resolve(TrainConfig(train_steps=9, lr_schedule="cosine")).schedule_spans == 9
    assert _resolve(TrainConfig(train_steps=9)).schedule_spans is None


def test_a_plan_has_one_precision_and_cannot_change():
    p = _resolve(TrainConfig(precision="auto"), precision="bf16")
    assert (p.precision, p.compute_dtype, p.config.precision) == ("bf16", "bfloat16", "auto")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.train_steps = 1
    with pytest.raises(ValueError, match="fp32 or bf16"):
        _resolve(TrainConfig(), precision="auto")


def test_the_model_reads_the_plans_facts():
    from cifar10_estimator.model.model_fn import ModelSettings

    p = _resolve(TrainConfig(train_batch_size=8, sync=True, train_steps=30),
                 roles.parse(_tf_config("worker", 1)), precision="bf16")
    s = ModelSettings.of(p)
    assert s.params is p.config  # the settings themselves, not a copy
    assert (s.global_batch, s.num_workers, s.is_chief, s.total_steps) == (24, 3, False, 30)
    assert (s.compute_dtype, s.steps_per_epoch, s.devices) == ("bfloat16", 4, ("/cpu:0",))
    assert ModelSettings.of(p, "float32").compute_dtype == "float32"  # an fp32 export


def test_a_library_callers_settings_take_the_flags_road():
    from cifar10_estimator.config import flags

    given = {"data_dir": "d", "job_dir": "j", "num_layers": 20, "sync": True,
             "use_distortion_for_training": False, "lr_boundary_epochs": (2, 4.5),
             "lr_decay_factors": [1, 0.1, 0.01], "seed": None, "recipe": "fast",
             "verbose": True}
    config, verbose = flags.parse(flags.to_argv(given))
    assert verbose and (config.num_layers, config.sync, config.seed) == (20, True, None)
    assert not config.use_distortion_for_training
    assert config.lr_boundary_epochs == (2.0, 4.5) and config.recipe == "fast"
    assert config == flags.parse(["--data-dir", "d", "--job-dir", "j", "--num-layers", "20",
                                  "--sync", "--no-use-distortion-for-training",
                                  "--lr-boundary-epochs", "2,4.5", "--lr-decay-factors",
                                  "1,0.1,0.01", "--recipe", "fast"])[0]
    with pytest.raises(UserError, match="'num_layer' is not a setting of the trainer; did you "
                                        "mean 'num_layers'"):
        flags.to_argv({"num_layer": 20})
