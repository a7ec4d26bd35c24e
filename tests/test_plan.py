"""The plan: every fact of a task resolved once (config/plan.py), from the role (config/role.py)
TF_CONFIG's value gives (task/tf_config.py); the model reads it through
ModelSettings.of."""

import dataclasses
import json

import pytest

from cifar10_estimator.config import overlays, plan
from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import FIELDS, SECTIONS, ClusterSection, Settings
from cifar10_estimator.data import schema
from cifar10_estimator.task import tf_config
from cifar10_estimator.errors import UserError

CLUSTER = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}


def _tf_config(task_type, index=0, cluster=CLUSTER):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def _resolve(config, role=Role(), records=96, precision="fp32"):
    return plan.resolve(role, config.model, config.schedule, config.devices, config.cluster,
                        dataset="cifar10", class_names=schema.CLASS_NAMES,
                        train_records=records, precision=precision, output=config.output)


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
    towers = Settings.of(train_batch_size=16, num_cpu_towers=2)
    p = _resolve(towers)
    assert (p.worker_batch, p.replica_batch, p.global_batch) == (16, 8, 16)
    assert p.devices == ("/cpu:0", "/cpu:1") and p.steps_per_epoch == 6
    chief = tf_config.parse(_tf_config("chief"))
    assert _resolve(Settings.of(train_batch_size=8), chief).global_batch == 8  # asynchronous
    synced = _resolve(Settings.of(train_batch_size=8, sync=True), chief)
    assert (synced.global_batch, synced.steps_per_epoch) == (24, 4)
    all_reduce = _resolve(Settings.of(train_batch_size=8,
                                      distribution_strategy="multi-worker-mirrored"),
                          tf_config.parse(_tf_config("chief", 0, {"chief": ["h:1"],
                                                              "worker": ["h:2"]})))
    assert all_reduce.global_batch == 16 and all_reduce.all_reduce_trainer


def test_what_the_estimator_is_set_up_with_is_resolved_once_in_the_plan():
    # 96 records, batch 8: 12 global steps an epoch.
    assert _resolve(Settings.of(train_batch_size=8)).checkpoint_steps is None  # a time
    assert _resolve(Settings.of(train_batch_size=8,
                                save_checkpoints_steps=5)).checkpoint_steps == 5
    assert _resolve(Settings.of(train_batch_size=8,
                                save_checkpoints_epochs=0.5)).checkpoint_steps == 6
    assert _resolve(Settings.of(train_batch_size=8,
                                save_checkpoints_epochs=0.01)).checkpoint_steps == 1
    chief = tf_config.parse(_tf_config("chief"))
    assert _resolve(Settings.of(), chief).worker_delay_secs is None  # Estimator's, async
    assert _resolve(Settings.of(sync=True), chief).worker_delay_secs == 0
    assert _resolve(Settings.of(sync=True, max_worker_delay_secs=7),
                    chief).worker_delay_secs == 7
    assert _resolve(Settings.of()).precise_bn_batches == 50
    assert _resolve(Settings.of(moving_average_decay=0.99)).precise_bn_batches == 0
    best = Settings.of(export_best=True)
    assert _resolve(best).exports_best and not _resolve(Settings.of()).exports_best
    assert _resolve(best, chief).exports_best  # it says where the evaluator exports instead
    assert not _resolve(best, tf_config.parse(_tf_config("worker"))).exports_best
    evaluator = tf_config.parse(_tf_config("evaluator", 0, {**CLUSTER, "evaluator": ["h:5"]}))
    assert _resolve(best, evaluator).exports_best


def test_the_length_comes_from_one_setting_in_global_steps():
    assert _resolve(Settings.of(train_steps=7)).train_steps == 7
    by_epochs = _resolve(Settings.of(train_batch_size=8, train_epochs=1.5))
    assert (by_epochs.train_steps, by_epochs.run_epochs) == (18, 1.5)
    assert by_epochs.length_from == "--train-epochs"
    model_length = overlays.MODELS["resnet"]["train_steps"]
    assert _resolve(Settings.of()).train_steps == model_length
    fast = overlays.build(recipe="fast", train_batch_size=8)
    own = _resolve(fast, records=50_000)
    assert own.run_epochs == overlays.recipe_epochs("fast", 50_000)
    assert own.length_from.startswith("the fast recipe's length for 50,000 records")
    # Cosine spans the run: its length is what the settings record keeps.
    assert _resolve(Settings.of(train_steps=9, lr_schedule="cosine")).schedule_spans == 9
    assert _resolve(Settings.of(train_steps=9)).schedule_spans is None


def test_a_plan_has_one_precision_and_cannot_change():
    p = _resolve(Settings.of(precision="auto"), precision="bf16")
    assert (p.precision, p.compute_dtype) == ("bf16", "bfloat16")
    # The request ("auto") stays in the settings: the plan holds the one precision resolved.
    assert [f.name for f in dataclasses.fields(p) if "precision" in f.name] == ["precision"]
    assert not hasattr(p, "config")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.train_steps = 1
    with pytest.raises(ValueError, match="fp32 or bf16"):
        _resolve(Settings.of(), precision="auto")


def test_the_model_reads_the_plans_facts():
    from cifar10_estimator.model.model_settings import ModelSettings

    settings = Settings.of(train_batch_size=8, sync=True, train_steps=30, data_dir="d",
                           job_dir="j", num_layers=8)
    p = _resolve(settings, tf_config.parse(_tf_config("worker", 1)), precision="bf16")
    s = ModelSettings.of(p, settings.model, settings.data.data_dir)
    # The model_fn's view holds the network's section and the plan's optimizer, no job
    # settings.
    assert s.model is settings.model and s.model.num_layers == 8
    assert not hasattr(s.model, "job_dir") and not hasattr(s.optimizer, "job_dir")
    assert s.optimizer is p.optimizer == plan.optimizer_of(settings.schedule)
    assert not any(isinstance(getattr(s, f.name), Settings) for f in dataclasses.fields(s))
    # The plan holds no settings at all: only the role and the facts resolved from them.
    assert not any(isinstance(getattr(p, f.name), (Settings, *dict(SECTIONS).values()))
                   for f in dataclasses.fields(plan.Plan))
    assert s.schedule is p.schedule and s.schedule.total_steps == 30
    assert (s.num_workers, s.is_chief, s.compute_dtype, s.devices) == (
        3, False, "bfloat16", ("/cpu:0",))
    assert (s.sync_replicas, s.variable_strategy, s.data_dir) == (True, "CPU", "d")
    assert (s.low_res_steps, s.low_res_size) == (p.low_res_steps, p.low_res_size)
    assert ModelSettings.of(p, settings.model, None,
                            "float32").compute_dtype == "float32"  # an fp32 export


def test_the_schedules_numbers_are_the_plans():
    chief = tf_config.parse(_tf_config("chief"))
    scaled = _resolve(Settings.of(train_batch_size=8, sync=True, lr_reference_batch=8,
                                  learning_rate=0.1, train_steps=40), chief)
    # Three workers stepping together: a global batch of 24, the peak scaled by 24 / 8.
    assert scaled.schedule.peak == pytest.approx(0.3) and scaled.schedule.kind == "piecewise"
    assert scaled.schedule.boundaries == tuple(int(4 * e) for e in (82, 123, 300))
    he = _resolve(Settings.of(lr_schedule="he", train_steps=200, warmup_epochs=0.5,
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
    assert verbose and (config.model.num_layers, config.cluster.sync, config.data.seed) == (
        20, True, None)
    assert not config.data.use_distortion_for_training
    assert config.schedule.lr_boundary_epochs == (2.0, 4.5) and config.schedule.recipe == "fast"
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
            cluster = ClusterSection(distribution_strategy=strategy, sync=sync)
            assert (plan.global_batch(8, cluster, 3) == 24) == (sync or strategy in named)
            assert plan.steps_together(cluster) == (sync or strategy in named)
    assert settings.STEPS_TOGETHER in next(
        f for f in FIELDS if f.name == "train_batch_size").metadata["help"]


def test_the_schedules_the_help_calls_length_shaped_are_the_ones_that_follow_the_length():
    import re

    import tensorflow as tf

    from cifar10_estimator.config import settings
    from cifar10_estimator.model import schedules

    help_text = next(f.metadata["help"] for f in FIELDS if f.name == "lr_schedule")
    said = re.search(r"([a-z, -]+) follow the run's length", help_text).group(1)
    assert said.strip().split(", ") == list(settings.LENGTH_SHAPED_SCHEDULES)
    for kind in settings.LR_SCHEDULES:
        config = Settings.of(lr_schedule=kind, lr_boundary_epochs=(5, 8),
                             lr_decay_factors=(1.0, 0.1, 0.01), train_batch_size=8)
        rates = []
        for length in (100, 300):
            schedule = _resolve(config.replace(train_steps=length)).schedule
            with tf.Graph().as_default():
                step = tf.compat.v1.placeholder(tf.int64, [])
                rate = schedules.learning_rate(step, schedule)
                with tf.compat.v1.Session() as session:
                    rates.append([float(session.run(rate, {step: s})) for s in range(0, 100, 7)])
        assert (rates[0] != rates[1]) == (kind in settings.LENGTH_SHAPED_SCHEDULES), kind
        assert _resolve(config.replace(train_steps=100)).schedule_spans == (
            100 if kind in settings.LENGTH_SHAPED_SCHEDULES else None)


def test_a_paper_run_given_in_epochs_takes_he_unless_a_schedule_flag_is_given():
    from cifar10_estimator.config import settings

    assert overlays.build(recipe="paper", train_epochs=15).schedule.lr_schedule == "he"
    assert overlays.build(recipe="paper", train_steps=15).schedule.lr_schedule == "piecewise"
    line = overlays.describe(overlays.build(recipe="paper", train_epochs=15))
    assert "--lr-schedule he (--train-epochs: the paper's proportions of the run)" in line
    given = {"lr_schedule": "piecewise", "lr_boundary_epochs": (5.0,),
             "lr_decay_factors": (1.0, 0.1)}
    help_text = next(f.metadata["help"] for f in FIELDS if f.name == "train_epochs")
    for name in settings.SCHEDULE_FIELDS:
        assert f"--{name.replace('_', '-')}" in help_text
        extra = {name: given[name]} if name != "lr_decay_factors" else {
            "lr_boundary_epochs": (82.0, 123.0, 300.0), name: (1.0, 0.1, 0.01, 0.001)}
        assert overlays.build(recipe="paper", train_epochs=15,
                              **extra).schedule.lr_schedule != "he"


def _package_modules():
    """(path relative to the package, its syntax tree) of every module of the package."""
    import ast
    import pathlib

    import cifar10_estimator

    root = pathlib.Path(cifar10_estimator.__file__).parent
    for path in sorted(root.rglob("*.py")):
        yield path.relative_to(root).as_posix(), ast.parse(path.read_text(), str(path))


def _chain(node) -> list[str]:
    """The names of an attribute chain, outermost last: ``task.plan.config`` ->
    [task, plan, config]."""
    import ast

    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
    return names[::-1]


def test_the_plan_holds_facts_only_and_the_devices_are_worked_out_once():
    # Issue 67's done-criteria: no settings object in the plan, nothing outside config/ reading
    # a setting through it, no function past config/ and the commands given the whole settings,
    # the tower devices and the CPU-towers condition in one place.
    import ast
    import typing

    from cifar10_estimator.config import settings

    held = {Settings, *dict(SECTIONS).values()}
    for name, hint in typing.get_type_hints(plan.Plan).items():
        assert hint not in held and not held & set(typing.get_args(hint)), name
    through_plan, whole_settings = [], []
    logical_cpus, tower_names, reads_towers = set(), set(), set()
    for module, tree in _package_modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and "/" in module and not module.startswith("config/"):
                # Past config/ and the commands, a function takes the sections it reads.
                if node.annotation is not None and "Settings" in {
                        getattr(n, "id", getattr(n, "value", None))
                        for n in ast.walk(node.annotation)}:
                    whole_settings.append(f"{module}: {node.arg}")
            if isinstance(node, ast.Attribute):
                chain = _chain(node)
                if len(chain) >= 2 and chain[-1] == "config" and chain[-2] in ("plan", "p"):
                    through_plan.append(f"{module}: {'.'.join(chain)}")
                if (len(chain) >= 2 and chain[-2] == "config"
                        and chain[-1] in settings.SECTION_OF):
                    through_plan.append(f"{module}: {'.'.join(chain)}")
                if node.attr == "num_cpu_towers":
                    reads_towers.add(module)
            elif isinstance(node, ast.Compare) and any(
                    isinstance(side, ast.Attribute) and side.attr == "num_cpu_towers"
                    for side in (node.left, *node.comparators)) and any(
                    isinstance(op, (ast.Gt, ast.GtE)) for op in node.ops):
                logical_cpus.add(module)
            elif isinstance(node, ast.JoinedStr) and node.values and isinstance(
                    node.values[0], ast.Constant) and str(node.values[0].value).startswith(
                    ("/cpu:", "/gpu:")):
                tower_names.add(module)
    assert not [line for line in through_plan if not line.startswith("config/")], through_plan
    assert not whole_settings, whole_settings
    assert logical_cpus == {"config/settings.py"}  # DevicesSection.logical_cpus
    assert tower_names == {"config/settings.py"}  # DevicesSection.tower_devices
    # Past config/, a task reads the devices' facts, never the flag they follow from.
    assert all(module.startswith("config/") for module in reads_towers), reads_towers
