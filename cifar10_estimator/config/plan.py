"""The plan of one task: every fact the run needs, resolved once, frozen, read everywhere after.

``resolve`` turns the settings (``TrainConfig``, with the model's and recipe's defaults), this
task's ``Role`` in the cluster (from the ``TF_CONFIG`` value the command read), the training
data's counts and the precision chosen for the job into a ``Plan``: the run's length in global
steps, the batch per worker, per global step and per tower or replica, the devices and tower
count, the data layout, the precision as the one name it has from here on (``fp32`` or
``bf16``; ``auto`` is a request, never a plan). Later modules read the plan and compute none of
these again; a ``Plan`` cannot be changed after it is made.

No TensorFlow here: the commands resolve as much as they can before it loads.
"""

import dataclasses
import math
from typing import Mapping, Optional, Sequence

from cifar10_estimator.config.overlays import MODELS, recipe_epochs
from cifar10_estimator.config.settings import TOWERS, TrainConfig

# Jobs whose tasks run training steps ("master" is the pre-"chief" name Estimator still accepts).
TRAINER_JOBS = ("chief", "master", "worker")
# A precision's dtype: what the convolutions compute in (variables stay float32).
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
# Schedules whose shape depends on the run's length (model/schedules.py).
LENGTH_SHAPED_SCHEDULES = ("he", "cosine", "one-cycle")


@dataclasses.dataclass(frozen=True)
class Role:
    """This task's place in the job, as ``TF_CONFIG`` gives it (``distributed.roles.parse``).

    A run without a cluster is Estimator's local task, ``worker`` 0 with no cluster. The
    cluster stays as listed for every task, an evaluator's included (Estimator's ``RunConfig``
    gives an evaluator an empty one, so it cannot count the workers whose global step it
    follows).
    """

    task_type: str = "worker"
    task_id: int = 0
    cluster: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    # TF_CONFIG listed workers only (Ray Train, SageMaker): worker 0 became the chief.
    workers_only: bool = False

    @property
    def local(self) -> bool:
        return not self.cluster

    @property
    def name(self) -> str:
        """``local``, or the task as TF_CONFIG names it (``worker 1``)."""
        return "local" if self.local else f"{self.task_type} {self.task_id}"

    @property
    def kind(self) -> str:
        """``local`` or the task's type: what a result reports."""
        return "local" if self.local else self.task_type

    @property
    def trains(self) -> bool:
        return self.task_type in TRAINER_JOBS

    @property
    def in_cluster(self) -> bool:
        """A training task of a cluster."""
        return self.trains and not self.local

    @property
    def is_chief(self) -> bool:
        """The task that saves checkpoints and exports: the chief, or a local run."""
        return self.local or self.task_type in ("chief", "master")

    @property
    def evaluates_at_end(self) -> bool:
        """The task that evaluates the final checkpoint after training: a local run, or the
        chief of a cluster of workers only that lists no evaluator (the engines that write
        that shape run no evaluator task; elsewhere an evaluator task evaluates, listed in the
        cluster or not)."""
        return self.local or (self.chief_evaluates and self.task_type == "chief")

    @property
    def chief_evaluates(self) -> bool:
        """Whether the chief of this task's cluster evaluates at the end (above)."""
        return self.workers_only and "evaluator" not in self.cluster

    @property
    def num_trainers(self) -> int:
        """Training tasks of the job (chief and workers); 1 for a local run."""
        return max(1, sum(len(self.cluster.get(job, ())) for job in TRAINER_JOBS))

    @property
    def num_ps(self) -> int:
        return len(self.cluster.get("ps", ()))

    @property
    def trainer_index(self) -> int:
        """This training task's place among the trainers (its shard of the training records):
        the chief 0, worker i i + 1; 0 for a local run."""
        if self.local or self.task_type in ("chief", "master"):
            return 0
        return self.task_id + (1 if any(j in self.cluster for j in ("chief", "master")) else 0)

    @property
    def ps_tasks(self) -> dict[str, str]:
        """``ps:i`` -> address."""
        return {f"ps:{i}": address for i, address in enumerate(self.cluster.get("ps", ()))}

    @property
    def peers(self) -> dict[str, str]:
        """The other training tasks: ``job:index`` -> address."""
        return {f"{job}:{i}": address for job in TRAINER_JOBS
                for i, address in enumerate(self.cluster.get(job, ()))
                if (job, i) != (self.task_type, self.task_id)}


def steps_together(config: TrainConfig) -> bool:
    """Whether a global step takes one batch from every worker (``sync``, or an all-reduce
    strategy) rather than one worker's batch (asynchronous parameter servers)."""
    return config.sync or config.distribution_strategy != TOWERS


def global_batch(config: TrainConfig, num_trainers: int) -> int:
    """Images per global step: a batch from every worker when they step together, one batch
    without."""
    return config.train_batch_size * (num_trainers if steps_together(config) else 1)


def tower_devices(num_gpus: int, num_cpu_towers: int = 1) -> tuple[str, ...]:
    """The compute device of each tower or replica: N GPUs, else ``num_cpu_towers`` logical
    CPUs (``model.towers`` places ops on them)."""
    if num_gpus > 0:
        return tuple(f"/gpu:{i}" for i in range(num_gpus))
    return tuple(f"/cpu:{i}" for i in range(max(1, num_cpu_towers)))


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
        """A training task of a multi-worker all-reduce job."""
        return (self.config.distribution_strategy == "multi-worker-mirrored"
                and self.role.trains)

    @property
    def schedule_spans(self) -> Optional[int]:
        """The steps a length-shaped schedule spans (what the settings record keeps), else
        None."""
        return (self.train_steps if self.config.lr_schedule in LENGTH_SHAPED_SCHEDULES
                else None)


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
    devices = tower_devices(config.num_gpus, config.num_cpu_towers)
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
        data_format=config.resolved_data_format(), worker_batch=config.train_batch_size,
        replica_batch=config.train_batch_size // len(devices), global_batch=per_global_step,
        steps_per_epoch=steps_per_epoch, train_steps=train_steps, run_epochs=epochs,
        length_from=length_from)
