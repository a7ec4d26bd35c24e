"""The plan: every fact of a task resolved once (config/plan.py), from the role (config/role.py)
TF_CONFIG's value gives (task/tf_config.py); the model reads it through
ModelSettings.of."""

import dataclasses
import json

import pytest

from cifar10_estimator.config import overlays, plan
from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import TrainConfig
from cifar10_estimator.data import schema
from cifar10_estimator.task import tf_config
from cifar10_estimator.errors import UserError

CLUSTER = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}


def _tf_config(task_type, index=0, cluster=CLUSTER):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def _resolve(config, role=Role(), records=96, precision="fp32"):
    return plan.resolve(config, role, dataset="cifar10", class_names=schema.CLASS_NAMES,
                        train_records=records, precision=precision)


def test_tf_configs_value_gives_the_role():
    assert tf_config.parse(None) == Role() and tf_config.parse(None).name == "local"
    local = tf_config.parse(json.dumps({"task": {"type": "worker", "index": 0}}))
    assert local.local and local.is_chief and local.num_trainers == 1
    worker = tf_config.parse(_tf_config("worker", "1"))  # an index written as a string
    assert (worker.task_type, worker.task_id, worker.is_chief) == ("worker", 1, False)
    assert worker.trainer_index == 2 and worker.num_trainers == 3 and worker.num_ps == 1
    assert worker.ps_tasks == {"ps:0": "h:4"}
    assert set(worker.peers) == {"chief:0", "worker:0"}
    # An evaluator keeps the cluster (Estimator's RunConfig empties it): it counts the workers.
    evaluator = tf_config.parse(_tf_config("evaluator", 0, {**CLUSTER, "evaluator": ["h:5"]}))
    assert not evaluator.in_cluster and evaluator.num_trainers == 3
    with pytest.raises(UserError, match='TF_CONFIG: "cluster" must have exactly one "chief" '
                                        'task, or only "worker" tasks'):
        tf_config.parse(_tf_config("worker", 0, {"chief": ["h:1", "h:2"], "worker": ["h:3"]}))


def test_the_batch_is_resolved_once_per_worker_replica_and_global_step():
    towers = TrainConfig(train_batch_size=16, num_cpu_towers=2)
    p = _resolve(towers)
    assert (p.worker_batch, p.replica_batch, p.global_batch) == (16, 8, 16)
    assert p.devices == ("/cpu:0", "/cpu:1") and p.steps_per_epoch == 6
    chief = tf_config.parse(_tf_config("chief"))
    assert _resolve(TrainConfig(train_batch_size=8), chief).global_batch == 8  # asynchronous
    synced = _resolve(TrainConfig(train_batch_size=8, sync=True), chief)
    assert (synced.global_batch, synced.steps_per_epoch) == (24, 4)
    all_reduce = _resolve(TrainConfig(train_batch_size=8,
                                      distribution_strategy="multi-worker-mirrored"),
                          tf_config.parse(_tf_config("chief", 0, {"chief": ["h:1"],
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
                 tf_config.parse(_tf_config("worker", 1)), precision="bf16")
    s = ModelSettings.of(p)
    assert s.params == p.config.model_params() and not hasattr(s.params, "job_dir")
    assert s.schedule is p.schedule and s.schedule.total_steps == 30
    assert (s.num_workers, s.is_chief, s.compute_dtype, s.devices) == (
        3, False, "bfloat16", ("/cpu:0",))
    assert ModelSettings.of(p, "float32").compute_dtype == "float32"  # an fp32 export


def test_the_schedules_numbers_are_the_plans():
    chief = tf_config.parse(_tf_config("chief"))
    scaled = _resolve(TrainConfig(train_batch_size=8, sync=True, lr_reference_batch=8,
                                  learning_rate=0.1, train_steps=40), chief)
    # Three workers stepping together: a global batch of 24, the peak scaled by 24 / 8.
    assert scaled.schedule.peak == pytest.approx(0.3) and scaled.schedule.kind == "piecewise"
    assert scaled.schedule.boundaries == tuple(int(4 * e) for e in (82, 123, 300))
    he = _resolve(TrainConfig(lr_schedule="he", train_steps=200, warmup_epochs=0.5,
                              train_batch_size=8))
    assert (he.schedule.boundaries, he.schedule.factors) == ((100, 150), (1.0, 0.1, 0.01))
    assert he.schedule.warmup_steps == 6 and he.schedule_spans == 200
    longer = he.with_length(400)
    assert longer.train_steps == 400 and longer.schedule.boundaries == (200, 300)
    # The run summary's images: this worker's batches.
    assert scaled.worker_images(10) == 80


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


def test_the_rules_the_help_states_are_the_ones_the_plan_applies():
    from cifar10_estimator.config import settings

    # What scales with the workers: the strategies the help names, or --sync.
    named = set(settings.STEPS_TOGETHER.split("--distribution-strategy ")[1].split(" or "))
    for strategy in settings.STRATEGIES:
        for sync in (False, True):
            config = TrainConfig(train_batch_size=8, distribution_strategy=strategy, sync=sync)
            assert (plan.global_batch(config, 3) == 24) == (sync or strategy in named)
    assert settings.STEPS_TOGETHER in dataclasses.fields(TrainConfig)[
        [f.name for f in dataclasses.fields(TrainConfig)].index("train_batch_size")
    ].metadata["help"]


def test_the_schedules_the_help_calls_length_shaped_are_the_ones_that_follow_the_length():
    import re

    import tensorflow as tf

    from cifar10_estimator.config import settings
    from cifar10_estimator.model import schedules

    help_text = next(f.metadata["help"] for f in dataclasses.fields(TrainConfig)
                     if f.name == "lr_schedule")
    said = re.search(r"([a-z, -]+) follow the run's length", help_text).group(1)
    assert said.strip().split(", ") == list(settings.LENGTH_SHAPED_SCHEDULES)
    for kind in settings.LR_SCHEDULES:
        config = TrainConfig(lr_schedule=kind, lr_boundary_epochs=(5, 8),
                             lr_decay_factors=(1.0, 0.1, 0.01), train_batch_size=8)
        rates = []
        for length in (100, 300):
            schedule = _resolve(dataclasses.replace(config, train_steps=length)).schedule
            with tf.Graph().as_default():
                step = tf.compat.v1.placeholder(tf.int64, [])
                rate = schedules.learning_rate(step, schedule)
                with tf.compat.v1.Session() as session:
                    rates.append([float(session.run(rate, {step: s})) for s in range(0, 100, 7)])
        assert (rates[0] != rates[1]) == (kind in settings.LENGTH_SHAPED_SCHEDULES), kind
        assert _resolve(dataclasses.replace(config, train_steps=100)).schedule_spans == (
            100 if kind in settings.LENGTH_SHAPED_SCHEDULES else None)


def test_a_paper_run_given_in_epochs_takes_he_unless_a_schedule_flag_is_given():
    from cifar10_estimator.config import settings

    assert overlays.build(recipe="paper", train_epochs=15).lr_schedule == "he"
    assert overlays.build(recipe="paper", train_steps=15).lr_schedule == "piecewise"
    line = overlays.describe(overlays.build(recipe="paper", train_epochs=15))
    assert "--lr-schedule he (--train-epochs: the paper's proportions of the run)" in line
    given = {"lr_schedule": "piecewise", "lr_boundary_epochs": (5.0,),
             "lr_decay_factors": (1.0, 0.1)}
    help_text = next(f.metadata["help"] for f in dataclasses.fields(TrainConfig)
                     if f.name == "train_epochs")
    for name in settings.SCHEDULE_FIELDS:
        assert f"--{name.replace('_', '-')}" in help_text
        extra = {name: given[name]} if name != "lr_decay_factors" else {
            "lr_boundary_epochs": (82.0, 123.0, 300.0), name: (1.0, 0.1, 0.01, 0.001)}
        assert overlays.build(recipe="paper", train_epochs=15, **extra).lr_schedule != "he"
