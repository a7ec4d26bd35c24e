"""The plan of one task: every fact the run needs, resolved once, frozen, read everywhere after.

``resolve`` turns the sections of the settings it reads (with the model's and recipe's
defaults), this task's ``Role`` in the cluster (from the ``TF_CONFIG`` value the command read),
the training data's counts and the precision chosen for the job into a ``Plan``: the run's
length in global steps, the batch per worker, per global step and per tower or replica, the
devices (one per tower or replica), the data layout, how the gradients meet, the learning
rate's ``Schedule`` in global steps and the ``Optimizer`` that applies it, the share of the run
at small pictures (``--low-res-fraction``, or the recipe's for the data's size), the precision
as the one name it has from here on (``fp32`` or ``bf16``; ``auto`` is a request, never a
plan); and what the task's Estimator is set up with: the checkpoints' interval (global steps
or seconds), the workers' staggered start, whether precise batch norm runs, where the exports
go and whether this task exports its best evaluations. Each rule behind these facts is a
function here, and ``resolve`` is the only caller that turns them into a run's numbers. A
``Plan`` holds the role and these facts, no settings, and cannot be changed after it is
made.

No TensorFlow here: the commands resolve as much as they can before it loads.
"""

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

from cifar10_estimator.config.overlays import MODELS, recipe_epochs, recipe_low_res_fraction
from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import (ALL_REDUCE_STRATEGIES, HE_FACTORS, HE_FRACTIONS,
                                               LENGTH_SHAPED_SCHEDULES, MULTI_WORKER_MIRRORED,
                                               TOWERS, TUTORIAL_CNN, ClusterSection,
                                               DevicesSection, ModelSection, OutputSection,
                                               ScheduleSection)

# A precision's dtype: what the convolutions compute in (variables stay float32).
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def steps_together(cluster: ClusterSection) -> bool:
    """Whether a global step takes one batch from every worker (``sync``, or an all-reduce
    strategy: ``settings.STEPS_TOGETHER`` says so in the help) rather than one worker's batch
    (asynchronous parameter servers)."""
    return cluster.sync or cluster.distribution_strategy in ALL_REDUCE_STRATEGIES


def global_batch(worker_batch: int, cluster: ClusterSection, num_trainers: int) -> int:
    """Images per global step: a batch from every worker when they step together, one batch
    without."""
    return worker_batch * (num_trainers if steps_together(cluster) else 1)


def all_reduce_trainer(cluster: ClusterSection, role: Role) -> bool:
    """A training task of a multi-worker all-reduce job."""
    return cluster.distribution_strategy == MULTI_WORKER_MIRRORED and role.trains


def data_format(model: str, devices: DevicesSection) -> str:
    """The layout ``model`` computes in: ``--data-format``, else channels-first on GPUs (cuDNN's
    fast layout) and channels-last elsewhere (oneDNN's)."""
    if devices.data_format:
        return devices.data_format
    if model == TUTORIAL_CNN:
        return "channels_last"  # its local response normalisation has no other layout
    return "channels_first" if devices.num_gpus > 0 else "channels_last"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The learning rate's course over a run, in global steps (``model.schedules`` builds it):
    the defaults are a constant 0.1 (the tutorials' rate) over one step."""

    kind: str = "piecewise"  # --lr-schedule
    peak: float = 0.1  # --learning-rate, scaled to the global batch (``schedule_of``)
    warmup_steps: float = 0.0  # --warmup-epochs in global steps (one-cycle: its rise; 0: 30 %)
    total_steps: int = 1  # the run's last global step: length-shaped schedules span it
    # piecewise and he: the rate is peak x factors[i] after boundaries[i - 1] up to
    # boundaries[i] (global steps).
    boundaries: tuple[int, ...] = ()
    factors: tuple[float, ...] = (1.0,)

    @property
    def length_shaped(self) -> bool:
        return self.kind in LENGTH_SHAPED_SCHEDULES

    def with_length(self, total_steps: int) -> "Schedule":
        """This schedule over a run of ``total_steps`` global steps: ``he`` drops at its
        proportions of the new length; the others' boundaries are in epochs, which stay."""
        boundaries = he_boundaries(total_steps) if self.kind == "he" else self.boundaries
        return dataclasses.replace(self, total_steps=total_steps, boundaries=boundaries)


def he_boundaries(total_steps: int) -> tuple[int, ...]:
    """The global steps where an ``he`` schedule over ``total_steps`` drops (HE_FRACTIONS)."""
    return tuple(int(total_steps * f) for f in HE_FRACTIONS)


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """The optimizer's settings, as the model_fn applies them (``optimizer_of`` makes one from
    the settings of the same names)."""

    momentum: float
    nesterov: bool
    batch_norm_lr_multiplier: float
    lookahead_steps: int  # 0: off
    lookahead_alpha: float


def optimizer_of(schedule: ScheduleSection) -> Optimizer:
    """The optimizer of the ``schedule`` section's settings."""
    return Optimizer(**{f.name: getattr(schedule, f.name)
                        for f in dataclasses.fields(Optimizer)})


def schedule_of(params: ScheduleSection, steps_per_epoch: int, total_steps: int,
                global_batch: int) -> Schedule:
    """The schedule of ``params`` for a run of ``total_steps`` global steps of ``global_batch``
    images, ``steps_per_epoch`` of them an epoch.

    The peak is ``--learning-rate``, scaled by global batch / ``--lr-reference-batch`` when that
    is set: Goyal et al.'s linear scaling rule (2017, arXiv:1706.02677, section 2.1), which
    keeps the updates of an epoch the same size whatever the batch. ``he`` drops at He et al.'s
    proportions of the run (``config.settings``' HE_*), ``piecewise`` at epoch boundaries.
    """
    peak = params.learning_rate
    if params.lr_reference_batch:
        peak = params.learning_rate * global_batch / params.lr_reference_batch
    if params.lr_schedule == "he":
        boundaries, factors = he_boundaries(total_steps), HE_FACTORS
    else:
        boundaries = [int(steps_per_epoch * e) for e in params.lr_boundary_epochs]
        factors = params.lr_decay_factors
    return Schedule(kind=params.lr_schedule, peak=peak,
                    warmup_steps=params.warmup_epochs * steps_per_epoch,
                    total_steps=total_steps, boundaries=tuple(boundaries),
                    factors=tuple(factors))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What this task runs: its role, and every fact resolved from the settings (no settings)."""

    role: Role
    precision: str  # "fp32" or "bf16": what the job computes in
    dataset: str
    class_names: tuple[str, ...]
    train_records: int
    devices: tuple[str, ...]  # one per tower or replica of this worker
    data_format: str
    strategy: str  # --distribution-strategy: towers, or an all-reduce strategy's replicas
    variable_strategy: str  # where the variables live: "CPU" or "GPU"
    # Whether a global step takes a batch from every worker (``steps_together``), and whether
    # the towers' gradients meet in SyncReplicasOptimizer (--sync).
    steps_together: bool
    sync_replicas: bool
    all_reduce_trainer: bool  # a training task of a multi-worker all-reduce job
    worker_batch: int  # images per step of one worker, split over its towers or replicas
    replica_batch: int  # images per tower or replica
    global_batch: int  # images per global step: the schedule's and the epoch's unit
    steps_per_epoch: int  # global steps per epoch: train records // global batch
    train_steps: int  # the global step at which training ends
    run_epochs: Optional[float]  # the length in epochs, where it was given in epochs
    length_from: str  # which setting gave the length, for the log
    schedule: Schedule  # the learning rate over the run's global steps
    optimizer: Optimizer  # momentum, Nesterov, Lookahead, the batch norm's rate
    # The first low_res_fraction of the steps train at low_res_size pixels: the flag, or the
    # recipe's share for train_records (the settings record keeps this value, as it does the
    # precision); low_res_from says which, for the log.
    low_res_fraction: float
    low_res_size: int
    low_res_from: str
    # What the Estimator of this task is set up with (``checkpoint_steps``,
    # ``worker_delay_secs``, ``precise_bn_batches``, ``exports_best`` below).
    checkpoint_steps: Optional[int]  # global steps between checkpoints; None: a time
    checkpoint_secs: Optional[int]  # seconds between checkpoints; None: steps
    export_dir: str  # where the SavedModel versions go (--export-dir, else JOB/export)
    worker_delay_secs: Optional[int]  # the cap on a worker's staggered start; None: Estimator's
    precise_bn_batches: int  # batches precise batch norm averages at the end; 0: off
    exports_best: bool  # this task exports its best evaluations (--export-best)

    # Facts that follow from the ones above, computed once when the plan is made (and again
    # by ``with_length``): the classes' count, the convolutions' dtype, whether hand-built
    # towers (not a tf.distribute strategy's replicas) train, the steps a length-shaped
    # schedule spans (what the settings record keeps; None for the others), the global steps
    # at low_res_size.
    num_classes: int = dataclasses.field(init=False)
    compute_dtype: str = dataclasses.field(init=False)
    towers: bool = dataclasses.field(init=False)
    schedule_spans: Optional[int] = dataclasses.field(init=False)
    low_res_steps: int = dataclasses.field(init=False)

    def __post_init__(self):
        derived = {
            "num_classes": len(self.class_names),
            "compute_dtype": DTYPES[self.precision],
            "towers": self.strategy == TOWERS,
            "schedule_spans": (self.schedule.total_steps if self.schedule.length_shaped
                               else None),
            "low_res_steps": int(self.low_res_fraction * self.train_steps)}
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # a frozen dataclass's own set-up

    def worker_images(self, steps: int) -> int:
        """The images this worker's batches hold over ``steps`` global steps: what the run
        summary's images/s counts, as the progress lines' own figure does
        (``training.estimator.progress``)."""
        return steps * self.worker_batch

    def with_length(self, train_steps: int) -> "Plan":
        """This plan with a run of ``train_steps`` global steps (its schedule spanning them):
        what ``--change-settings`` compares a job's recorded length with."""
        return dataclasses.replace(self, train_steps=train_steps,
                                   schedule=self.schedule.with_length(train_steps))


def checkpoint_steps(output: OutputSection, steps_per_epoch: int) -> Optional[int]:
    """Global steps between checkpoints: ``--save-checkpoints-steps``, or
    ``--save-checkpoints-epochs`` in global steps (at least one); None for a time."""
    if output.save_checkpoints_epochs is not None:
        return max(1, math.ceil(output.save_checkpoints_epochs * steps_per_epoch))
    return output.save_checkpoints_steps


def worker_delay_secs(cluster: ClusterSection) -> Optional[int]:
    """``--max-worker-delay-secs``; by default 0 when the workers step together (staggering
    exists for asynchronous updates; a step together waits for every worker anyway), else
    None (Estimator's own cap)."""
    if cluster.max_worker_delay_secs is None and steps_together(cluster):
        return 0
    return cluster.max_worker_delay_secs


def precise_bn_batches(model: ModelSection) -> int:
    """Batches precise batch norm averages the statistics over at the end, 0 for none: an
    exponential moving average of the weights (--moving-average-decay) keeps its own
    statistics, so precise batch norm is off with it."""
    return 0 if model.moving_average_decay else model.precise_bn_batches


def exports_best(output: OutputSection, role: Role) -> bool:
    """Whether this task exports its best evaluations: with --export-best, the task that
    evaluates (a local run, the evaluator) or the chief (which says where the evaluator
    exports instead, when its cluster lists none)."""
    return output.export_best and (role.is_chief or role.task_type == "evaluator")


def kept_precision(role: Role, output: OutputSection, recorded: Mapping[str, Any]
                   ) -> Optional[str]:
    """The precision a job's settings record holds (``recorded``), which a rerun keeps rather
    than probing again; None where there is none, or where the chief is told to record new
    settings (--change-settings)."""
    if role.is_chief and output.change_settings:
        return None
    return recorded.get("precision")


def epoch_steps(schedule: ScheduleSection, cluster: ClusterSection, role: Role,
                train_records: int) -> int:
    """Global steps in one pass over ``train_records`` records (at least one)."""
    return max(1, train_records // global_batch(schedule.train_batch_size, cluster,
                                                role.num_trainers))


def run_length(model: ModelSection, schedule: ScheduleSection, cluster: ClusterSection,
               role: Role, train_records: int) -> tuple[int, Optional[float], str]:
    """The run's length in global steps, the epochs it was asked in (None for steps) and the
    setting it comes from (for the log): ``--train-steps``, else ``--train-epochs``, else the
    recipe's length for ``train_records`` records, else the model's. It needs neither the
    precision nor TensorFlow (``training.start.trained_to_end`` reads it before TensorFlow's
    runtime starts)."""
    if schedule.train_steps is not None:
        return schedule.train_steps, None, "--train-steps"
    steps_per_epoch = epoch_steps(schedule, cluster, role, train_records)
    if schedule.train_epochs is not None:
        return (math.ceil(schedule.train_epochs * steps_per_epoch), schedule.train_epochs,
                "--train-epochs")
    epochs = recipe_epochs(schedule.recipe, train_records)
    if epochs is None:
        return MODELS[model.model]["train_steps"], None, f"the {model.model} model's length"
    return (math.ceil(epochs * steps_per_epoch), epochs,
            f"the {schedule.recipe} recipe's length for {train_records:,} records")


def resolve(role: Role, model: ModelSection, schedule: ScheduleSection,
            devices: DevicesSection, cluster: ClusterSection, *, dataset: str,
            class_names: Sequence[str], train_records: int, precision: str,
            output: OutputSection = OutputSection()) -> Plan:
    """The plan of the task ``role`` with these sections of its settings, ``train_records``
    training records and the job's ``precision`` (fp32 or bf16: "auto" is resolved before, by
    ``platform.precision_probe.choose_training``).

    An epoch is counted in global steps: with --sync or all-reduce one global step consumes a
    batch from every worker; asynchronously every worker's own step is a global step of one
    batch.
    """
    if precision not in DTYPES:
        raise ValueError(f"a plan's precision is fp32 or bf16, not {precision!r}")
    towers = devices.tower_devices
    per_global_step = global_batch(schedule.train_batch_size, cluster, role.num_trainers)
    steps_per_epoch = epoch_steps(schedule, cluster, role, train_records)
    train_steps, epochs, length_from = run_length(model, schedule, cluster, role,
                                                  train_records)
    low_res_given = schedule.low_res_fraction is not None
    return Plan(
        role=role, precision=precision, dataset=dataset, class_names=tuple(class_names),
        train_records=train_records, devices=towers,
        data_format=data_format(model.model, devices), strategy=cluster.distribution_strategy,
        variable_strategy=devices.variable_strategy, steps_together=steps_together(cluster),
        sync_replicas=cluster.sync, all_reduce_trainer=all_reduce_trainer(cluster, role),
        worker_batch=schedule.train_batch_size,
        replica_batch=schedule.train_batch_size // len(towers), global_batch=per_global_step,
        steps_per_epoch=steps_per_epoch, train_steps=train_steps, run_epochs=epochs,
        length_from=length_from,
        schedule=schedule_of(schedule, steps_per_epoch, train_steps, per_global_step),
        optimizer=optimizer_of(schedule),
        low_res_fraction=(schedule.low_res_fraction if low_res_given
                          else recipe_low_res_fraction(schedule.recipe, train_records)),
        low_res_size=schedule.low_res_size,
        low_res_from=("--low-res-fraction" if low_res_given else
                      f"the {schedule.recipe} recipe's share for {train_records:,} records"),
        checkpoint_steps=checkpoint_steps(output, steps_per_epoch),
        checkpoint_secs=output.checkpoint_secs, export_dir=output.resolved_export_dir,
        worker_delay_secs=worker_delay_secs(cluster), precise_bn_batches=precise_bn_batches(model),
        exports_best=exports_best(output, role))
