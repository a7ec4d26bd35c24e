"""A task's start, up to the moment it can build its Estimator: the data checked, the plan
resolved, the waits for the rest of the cluster, the chief's check and lock of the job dir,
the precision the job computes in and the settings record checked.

In order (``start``):

1. The data: the record files checked against their metadata (a file cut short can read as a
   shorter valid one), the data set's classes and the training records counted; the role
   logged.
2. Waits, bounded by ``--cluster-timeout-secs``: a cluster's trainer for the parameter
   servers; a worker or evaluator for the chief's first checkpoint (proof that the job dir is
   shared, and a worker arriving before the chief has initialised the variables would sleep
   30 s between checks, SessionManager's ``recovery_wait_secs``), or, in an all-reduce job,
   only for the chief's settings record (the chief cannot save before the first step, which
   the workers join).
3. The chief (or a local run): the job dir checked and locked (``jobdir.lock``: it holds the
   lock to its end); then every task: the precision (``--precision auto`` follows the job's
   record, else measures), then the plan (``config.plan.resolve``), made once and logged; the
   settings checked against the record (the chief writes it).

Also here: the strategy object of ``--distribution-strategy`` (made before TensorFlow's runtime
starts), and before it whether a training task of a cluster comes after the job's last step
(``trained_to_end``: then it joins no group and waits for no other task); and the parameter
server's whole run.
"""

import contextlib
import dataclasses
import logging
import os
from typing import Callable, Optional

import tensorflow as tf

from cifar10_estimator.config import plan as plans
from cifar10_estimator.config.plan import Plan, Schedule
from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import (TOWERS, ClusterSection, DataSection,
                                               DevicesSection, ModelSection, OutputSection,
                                               ProblemSettings, RuntimeSettings, ScheduleSection,
                                               Settings, TrainerSettings)
from cifar10_estimator.data import metadata
from cifar10_estimator.data.pipeline import Cifar10DataSet
from cifar10_estimator.task import allreduce, peers, tf_config
from cifar10_estimator.errors import UserError
from cifar10_estimator.jobdir import guards, settings_record
from cifar10_estimator.jobdir.lock import JobLock
from cifar10_estimator.model import checkpoints, networks, schedules, towers
from cifar10_estimator.training.estimator.model_fn import make_train_step
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.platform import precision_probe
from cifar10_estimator.platform.precision_probe import Machine
from cifar10_estimator.platform.session import session_config

log = logging.getLogger("cifar10_estimator")


@dataclasses.dataclass(frozen=True)
class StartedTask:
    """A started task: its plan, and what it runs with."""

    plan: Plan
    model: ModelSettings  # what its model_fn reads: the model section and the plan's facts
    train_data: Cifar10DataSet
    eval_data: Cifar10DataSet
    # The global step the job had reached when this task started.
    start_step: int
    # A multi-worker all-reduce job's stop at one step for a signal to any task.
    agreed_stop: allreduce.AgreedStop
    # The tf.distribute strategy a training task runs through Estimator (None: towers).
    strategy: Optional[tf.distribute.Strategy] = None
    # The job dir's lock, on the task that holds it (a local run or the chief).
    lock: Optional[JobLock] = None


def make_strategy(devices: DevicesSection, cluster: ClusterSection, role: Role
                  ) -> Optional[tf.distribute.Strategy]:
    """The tf.distribute strategy of ``--distribution-strategy`` for a training task (None for
    towers, and for tasks that do not train). Made first, before anything starts TensorFlow's
    runtime: a strategy's devices and collective operations can be set up only then."""
    if not role.trains:
        return None
    strategy = cluster.distribution_strategy
    if strategy == TOWERS:
        return None
    if devices.logical_cpus and not towers.ensure_logical_cpus(devices.logical_cpus):
        raise UserError(f"--num-cpu-towers {devices.logical_cpus}: TensorFlow started in this "
                        f"process with fewer CPU devices; run the trainer in a process of its "
                        f"own (python -m cifar10_estimator)")
    try:
        return allreduce.make_strategy(strategy, devices.tower_devices)
    except RuntimeError as e:  # collective operations after TensorFlow's runtime started
        raise UserError(f"--distribution-strategy {strategy}: {e}; run the trainer in a process "
                        f"of its own (python -m cifar10_estimator)") from None


def trained_to_end(role: Role, data: DataSection, model: ModelSection,
                   schedule: ScheduleSection, cluster: ClusterSection, output: OutputSection
                   ) -> Optional[int]:
    """For a training task of a cluster: the step of the job's latest checkpoint when it has
    reached this run's last step, else None.

    Such a task must not join the cluster: the others trained the last step with an earlier
    process of this task (one killed or preempted after that step, which its orchestrator
    restarted) and are ending or gone. An all-reduce strategy would wait, without end, for a
    group that is gone; a parameter server that served the whole run has exited, and waiting
    for it would fail after --cluster-timeout-secs (a chaos campaign found a ps chief killed
    inside its export waiting so, issue 76). So it is asked before the strategy is made, from
    the flags and the training records' count alone, before TensorFlow's runtime starts."""
    if not (role.in_cluster and role.trains):
        return None
    step = checkpoints.latest_step(output.job_dir)
    if not step:
        return None
    train_steps, _, _ = plans.run_length(model, schedule, cluster, role,
                                         metadata.split_size(data.data_dir, "train"))
    return step if step >= train_steps else None


def serve_variables(cluster: ClusterSection, role: Role,
                    stop_requested: Callable[[], bool]) -> None:
    """A parameter server's run: serves variables until every training task reported done, or
    after ``stop_requested()`` until the chief has saved (``task.peers``)."""
    log.info("role: ps %d of the cluster %s", role.task_id, tf_config.describe(role.cluster_spec))
    peers.run_parameter_server(role.cluster_spec, role.task_id, cluster.cluster_timeout_secs,
                               stop_requested)


def start(role: Role, machine: Machine, stack: contextlib.ExitStack,
          before_exit: Callable[[Callable], None], strategy: Optional[tf.distribute.Strategy],
          *, problem: ProblemSettings, trainer: TrainerSettings, runtime: RuntimeSettings,
          trained: bool = False) -> StartedTask:
    """Starts this task (see the module's docstring) with its settings in their three groups
    and returns it; ``trained``: the job already trained to its last step
    (``trained_to_end``), so the task waits for no other. The chief's lock is released when
    ``stack`` closes, or by ``before_exit`` (a preemption's exit)."""
    data, model = problem.data, problem.model
    schedule, output = trainer.schedule, trainer.output
    devices, cluster = runtime.devices, runtime.cluster
    train_data = Cifar10DataSet(data.data_dir, "train", data.use_distortion_for_training,
                                networks.AUGMENTATIONS[model.model], data.alternating_flips)
    eval_data = Cifar10DataSet(data.data_dir, "eval", use_distortion=False)
    for split in ("eval",) if role.task_type == "evaluator" else ("train", "eval"):
        metadata.verify_split(data.data_dir, split)
    info = metadata.dataset_info(data.data_dir)
    log.info(tf_config.role_line(role, cluster, output))
    if not (trained or role.local):  # a local run waits for nobody
        _wait_for_peers(cluster, output.job_dir, role)
    lock = None
    if role.is_chief:
        guards.check_job_dir(output.job_dir, model, info.num_classes)
        lock = stack.enter_context(JobLock(output.job_dir))
        before_exit(lambda _: lock.release())
        guards.remove_unfinished_saves(output.job_dir)  # a killed save's, now nobody saves
    recorded = settings_record.read(output.job_dir) or {}
    precision = precision_probe.choose_training(
        model, schedule, devices, session_config(devices, trainer.logging.log_device_placement),
        data.data_dir, info.class_names, machine,
        plans.kept_precision(role, output, recorded), make_train_step)
    plan = plans.resolve(role, model, schedule, devices, cluster, dataset=info.dataset,
                         class_names=info.class_names, train_records=train_data.num_examples(),
                         precision=precision, output=output)
    log.info(_plan_line(plan, model, schedule.recipe))
    current = settings_record.of_plan(plan, Settings.of_groups(problem, trainer, runtime).flat())
    if not role.is_chief:
        settings_record.check(output.job_dir, current, is_chief=False)
    else:
        lock.check()  # the settings record is written only by the lock's holder
        spans = recorded.get(settings_record.SCHEDULE_STEPS)
        settings_record.check(output.job_dir, current, is_chief=True,
                              change=output.change_settings)
        if spans and current.get(settings_record.SCHEDULE_STEPS, spans) != spans:
            log.info("--change-settings: %s", schedule_change(
                plan, spans, checkpoints.latest_step(output.job_dir)))
    agreed_stop = allreduce.AgreedStop(output.job_dir)
    if role.is_chief:
        if plan.all_reduce_trainer:
            agreed_stop.clear()  # an earlier run's
        latest = tf.train.latest_checkpoint(output.job_dir)
        if latest:  # only the chief restores; others use the ps, get the chief's values
            log.info("resuming from %s", latest)
    return StartedTask(plan, ModelSettings.of(plan, model, data.data_dir), train_data, eval_data,
                checkpoints.latest_step(output.job_dir), agreed_stop, strategy, lock)


def _wait_for_peers(cluster: ClusterSection, job_dir: str, role: Role) -> None:
    timeout = cluster.cluster_timeout_secs
    if role.in_cluster:
        # Fail within --cluster-timeout-secs, with the task named, rather than let gRPC retry.
        # A trainer's sessions use only the parameter servers (and itself); a worker learns
        # that the chief is up from its checkpoint, below.
        peers.wait_for_tasks(role.ps_tasks, timeout)
    if role.is_chief:
        return
    if plans.all_reduce_trainer(cluster, role):
        allreduce.wait_for_file(os.path.join(job_dir, settings_record.RECORD_FILE), timeout,
                                "the chief's settings record")
    else:
        peers.wait_for_checkpoint(job_dir, timeout)


def _plan_line(plan: Plan, model: ModelSection, recipe: str) -> str:
    schedule = plan.schedule
    how = "towers" if plan.towers else f"{plan.strategy} replicas"
    own = (f", {plan.length_from}" if plan.length_from.startswith(f"the {recipe} recipe")
           else "")
    return (f"{networks.describe(model)}, {plan.data_format}, {how} on "
            f"{', '.join(plan.devices)}, {plan.role.num_trainers} worker(s); {plan.dataset}, "
            f"{plan.num_classes} classes, {plan.train_records} train records, "
            f"{plan.steps_per_epoch} steps per epoch, {plan.train_steps} steps in all "
            f"({plan.train_steps / plan.steps_per_epoch:.4g} epochs{own}), "
            f"{schedule.kind} learning rate peaking at {schedule.peak:.4g}{_drops(schedule)}"
            f"{_small_pictures(plan)}")


def _small_pictures(plan: Plan) -> str:
    """``; the first 1873 steps (0.545 of the run, the fast recipe's share for 40,000
    records) at 24 pixels`` where progressive resizing is on; nothing where it is off."""
    if not plan.low_res_steps:
        return ""
    return (f"; the first {plan.low_res_steps} steps ({plan.low_res_fraction:g} of the run, "
            f"{plan.low_res_from}) at {plan.low_res_size} pixels")


def _drops(schedule: Schedule) -> str:
    """``, x0.1 after step 50 and x0.01 after step 75 (He et al.'s proportions of the run)``
    for an ``he`` schedule, whose steps follow the length; nothing for the others."""
    if schedule.kind != "he":
        return ""
    return (", " + " and ".join(f"x{f:g} after step {b}" for b, f in zip(schedule.boundaries,
                                                                          schedule.factors[1:]))
            + " (He et al.'s proportions of the run)")


def schedule_change(plan: Plan, recorded_steps: int, at_step: int) -> str:
    """What the learning rate does when ``--change-settings`` gives a length-shaped schedule a
    new length: its value at ``at_step`` before and after, and where it now ends."""
    def rate(schedule: Schedule) -> float:
        return float(schedules.learning_rate(tf.constant(at_step, tf.int64), schedule))

    before = plan.with_length(recorded_steps).schedule
    return (f"the {plan.schedule.kind} schedule now spans {plan.train_steps} steps "
            f"instead of {recorded_steps}: at step {at_step} the learning rate goes from "
            f"{rate(before):.4g} to {rate(plan.schedule):.4g}, and it reaches its "
            f"end at step {plan.train_steps}")
