"""The plan of one task: every fact the run needs, resolved once, frozen, read everywhere after.

``resolve`` turns the settings (``TrainConfig``, with the model's and recipe's defaults), this
task's ``Role`` in the cluster (from the ``TF_CONFIG`` value the command read), the training
data's counts and the precision chosen for the job into a ``Plan``: the run's length in global
steps, the batch per worker, per global step and per tower or replica, the devices (one per
tower or replica), the data layout, the learning rate's ``Schedule`` in global steps, the
share of the run at small pictures (``--low-res-fraction``, or the recipe's for the data's
size), the precision as the one name it has from here on (``fp32`` or ``bf16``; ``auto`` is a
request, never a plan). Each rule behind these facts is a function here, and ``resolve`` is the only
caller that turns them into a run's numbers; a ``Plan`` cannot be changed after it is made.

No TensorFlow here: the commands resolve as much as they can before it loads.
"""

import dataclasses
import math
from typing import Optional, Sequence

from cifar10_estimator.config.overlays import MODELS, recipe_epochs, recipe_low_res_fraction
from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import (ALL_REDUCE_STRATEGIES, HE_FACTORS, HE_FRACTIONS,
                                               LENGTH_SHAPED_SCHEDULES, MULTI_WORKER_MIRRORED,
                                               TUTORIAL_CNN, ModelParams, TrainConfig)

# A precision's dtype: what the convolutions compute in (variables stay float32).
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def steps_together(config: TrainConfig) -> bool:
    """Whether a global step takes one batch from every worker (``sync``, or an all-reduce
    strategy: ``settings.STEPS_TOGETHER`` says so in the help) rather than one worker's batch
    (asynchronous parameter servers)."""
    return config.sync or config.distribution_strategy in ALL_REDUCE_STRATEGIES


def global_batch(config: TrainConfig, num_trainers: int) -> int:
    """Images per global step: a batch from every worker when they step together, one batch
    without."""
    return config.train_batch_size * (num_trainers if steps_together(config) else 1)


def all_reduce_trainer(config: TrainConfig, role: Role) -> bool:
    """A training task of a multi-worker all-reduce job."""
    return config.distribution_strategy == MULTI_WORKER_MIRRORED and role.trains


def tower_devices(config: TrainConfig) -> tuple[str, ...]:
    """The compute device of each tower or replica of one worker: ``--num-gpus`` GPUs, else
    ``--num-cpu-towers`` logical CPUs (``model.towers`` places ops on them)."""
    if config.num_gpus > 0:
        return tuple(f"/gpu:{i}" for i in range(config.num_gpus))
    return tuple(f"/cpu:{i}" for i in range(max(1, config.num_cpu_towers)))


def data_format(config: TrainConfig) -> str:
    """The layout the model computes in: ``--data-format``, else channels-first on GPUs (cuDNN's
    fast layout) and channels-last elsewhere (oneDNN's)."""
    if config.data_format:
        return config.data_format
    if config.model == TUTORIAL_CNN:
        return "channels_last"  # its local response normalisation has no other layout
    return "channels_first" if config.num_gpus > 0 else "channels_last"


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


def schedule_of(params: ModelParams, steps_per_epoch: int, total_steps: int,
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
        boundaries, factors = [int(total_steps * f) for f in HE_FRACTIONS], HE_FACTORS
    else:
        boundaries = [int(steps_per_epoch * e) for e in params.lr_boundary_epochs]
        factors = params.lr_decay_factors
    return Schedule(kind=params.lr_schedule, peak=peak,
                    warmup_steps=params.warmup_epochs * steps_per_epoch,
                    total_steps=total_steps, boundaries=tuple(boundaries),
                    factors=tuple(factors))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What this task runs: the settings as asked, and every fact resolved from them."""

    config: TrainConfig  # the settings as asked: ``config.precision`` may be the request "auto"
    role: Role
    precision: str  # "fp32" or "bf16": what the job computes in
    dataset: str
    class_names: tuple[str, ...]
    train_records: int
    devices: tuple[str, ...]  # one per tower or replica of this worker
    data_format: str
    worker_batch: int  # images per step of one worker, split over its towers or replicas
    replica_batch: int  # images per tower or replica
    global_batch: int  # images per global step: the schedule's and the epoch's unit
    steps_per_epoch: int  # global steps per epoch: train records // global batch
    train_steps: int  # the global step at which training ends
    run_epochs: Optional[float]  # the length in epochs, where it was given in epochs
    length_from: str  # which setting gave the length, for the log
    schedule: Schedule  # the learning rate over the run's global steps
    # The first low_res_fraction of the steps train at --low-res-size: the flag, or the recipe's
    # share for train_records (the settings record keeps this value, as it does the precision).
    low_res_fraction: float

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def compute_dtype(self) -> str:
        return DTYPES[self.precision]

    @property
    def steps_together(self) -> bool:
        return steps_together(self.config)

    @property
    def all_reduce_trainer(self) -> bool:
        return all_reduce_trainer(self.config, self.role)

    @property
    def schedule_spans(self) -> Optional[int]:
        """The steps a length-shaped schedule spans (what the settings record keeps), else
        None."""
        return self.schedule.total_steps if self.schedule.length_shaped else None

    @property
    def low_res_steps(self) -> int:
        """The global steps that train on pictures scaled down to --low-res-size."""
        return int(self.low_res_fraction * self.train_steps)

    def worker_images(self, steps: int) -> int:
        """The images this worker's batches hold over ``steps`` global steps: what the run
        summary's images/s counts, as the progress lines' own figure does
        (``training.progress``)."""
        return steps * self.worker_batch

    def with_length(self, train_steps: int) -> "Plan":
        """This plan with a run of ``train_steps`` global steps (its schedule spanning them):
        what ``--change-settings`` compares a job's recorded length with."""
        return dataclasses.replace(self, train_steps=train_steps, schedule=schedule_of(
            self.config, self.steps_per_epoch, train_steps, self.global_batch))


def resolve(config: TrainConfig, role: Role, *, dataset: str, class_names: Sequence[str],
            train_records: int, precision: str) -> Plan:
    """The plan of ``config`` for the task ``role``, with ``train_records`` training records
    and the job's ``precision`` (fp32 or bf16: "auto" is resolved before, by
    ``platform.precision_probe.choose_training``).

    An epoch is counted in global steps: with --sync or all-reduce one global step consumes a
    batch from every worker; asynchronously every worker's own step is a global step of one
    batch.
    """
    if precision not in DTYPES:
        raise ValueError(f"a plan's precision is fp32 or bf16, not {precision!r}")
    devices = tower_devices(config)
    per_global_step = global_batch(config, role.num_trainers)
    steps_per_epoch = max(1, train_records // per_global_step)
    epochs, length_from = None, "--train-steps"
    if config.train_steps is not None:
        train_steps = config.train_steps
    elif config.train_epochs is not None:
        epochs, length_from = config.train_epochs, "--train-epochs"
    else:
        epochs = recipe_epochs(config.recipe, train_records)
        length_from = (f"the {config.recipe} recipe's length for {train_records:,} records"
                       if epochs is not None else f"the {config.model} model's length")
    if config.train_steps is None:
        train_steps = (math.ceil(epochs * steps_per_epoch) if epochs is not None
                       else MODELS[config.model]["train_steps"])
    return Plan(
        config=config, role=role, precision=precision, dataset=dataset,
        class_names=tuple(class_names), train_records=train_records, devices=devices,
        data_format=data_format(config), worker_batch=config.train_batch_size,
        replica_batch=config.train_batch_size // len(devices), global_batch=per_global_step,
        steps_per_epoch=steps_per_epoch, train_steps=train_steps, run_epochs=epochs,
        length_from=length_from,
        schedule=schedule_of(config, steps_per_epoch, train_steps, per_global_step),
        low_res_fraction=(config.low_res_fraction if config.low_res_fraction is not None
                          else recipe_low_res_fraction(config.recipe, train_records)))
