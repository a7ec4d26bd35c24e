"""What the model is built from: ``ModelSettings``, the network's section and the task's plan's
facts that the model_fn (``training.estimator.model_fn``), the export's graphs (``serving``) and the
evaluations read, and the message of the training graph's NaN check, which the job dir's
guards recognise (``jobdir.guards``). Below the Estimator-facing room, so that the rooms
under it read the model's settings without reaching into the model_fn."""

import dataclasses
from typing import Optional, Sequence

from cifar10_estimator.config.plan import Optimizer, Plan, Schedule, optimizer_of
from cifar10_estimator.config.settings import ModelSection, ScheduleSection
from cifar10_estimator.data import schema

# Marks the check_numerics failure of a NaN or infinite loss (see jobdir.guards).
NAN_LOSS_MESSAGE = "training loss is NaN or infinite"


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """What the model_fn reads: the network's settings (``ModelSection``) and the facts of the
    task's plan (``ModelSettings.of``). The defaults are one worker's tower on ``/cpu:0`` in
    float32."""

    model: ModelSection = ModelSection()
    # Momentum, Nesterov, Lookahead, the batch norm's rate: the settings' defaults.
    optimizer: Optimizer = optimizer_of(ScheduleSection())
    data_format: str = "channels_last"
    schedule: Schedule = Schedule()  # the learning rate over the run's global steps
    devices: Sequence[str] = ("/cpu:0",)  # one compute device per tower
    variable_strategy: str = "CPU"  # where the variables live (``towers``)
    sync_replicas: bool = False  # the towers' gradients meet in SyncReplicasOptimizer
    num_workers: int = 1  # training tasks: SyncReplicasOptimizer aggregates one per worker
    is_chief: bool = True
    compute_dtype: str = "float32"
    # Names of the classes in label order; their count is the width of the logits.
    class_names: Sequence[str] = schema.CLASS_NAMES
    # The records folder whose training pictures give the whitening filters (training only).
    data_dir: Optional[str] = None
    # Global steps that train on pictures scaled down to low_res_size pixels
    # (--low-res-fraction of the run's, or the recipe's share: Plan.low_res_steps).
    low_res_steps: int = 0
    low_res_size: int = 32

    @classmethod
    def of(cls, plan: Plan, model: ModelSection, data_dir: Optional[str],
           compute_dtype: Optional[str] = None) -> "ModelSettings":
        """The plan's view for the model_fn, with the network's settings and the records
        folder; ``compute_dtype`` for an export that computes in another precision than the
        job trains in (``--serving-precision``)."""
        return cls(model=model, optimizer=plan.optimizer, data_format=plan.data_format,
                   schedule=plan.schedule, devices=plan.devices,
                   variable_strategy=plan.variable_strategy, sync_replicas=plan.sync_replicas,
                   num_workers=plan.role.num_trainers, is_chief=plan.role.is_chief,
                   compute_dtype=compute_dtype or plan.compute_dtype,
                   class_names=plan.class_names, data_dir=data_dir,
                   low_res_steps=plan.low_res_steps, low_res_size=plan.low_res_size)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)
