"""A task of the job, resolved before anything trains: its ``RunConfig`` (the one reader of
``TF_CONFIG``, through Estimator) and session settings, the data (checked against its
metadata), the model's settings (epochs counted in global steps) and the precision it
computes in.
"""

import dataclasses
import logging
import math
import os
from typing import Optional, Sequence

import tensorflow as tf

from cifar10_estimator.config import overlays
from cifar10_estimator.config.settings import (MIRRORED, MULTI_WORKER_MIRRORED, TOWERS,
                                               ModelParams, TrainConfig, global_batch,
                                               steps_together)
from cifar10_estimator.data import metadata
from cifar10_estimator.data.pipeline import Cifar10DataSet
from cifar10_estimator.distributed import allreduce
from cifar10_estimator.distributed import cluster as distributed
from cifar10_estimator.errors import UserError
from cifar10_estimator.jobdir import settings_record
from cifar10_estimator.jobdir.lock import JobLock
from cifar10_estimator.model import networks, schedules, towers
from cifar10_estimator.model.model_fn import ModelSettings
from cifar10_estimator.platform import cpu, precision, precision_cache, precision_probe
from cifar10_estimator.training.preemption import Preemption

log = logging.getLogger("cifar10_estimator")

CLUSTER_HELP = "see docs/distributed.md"


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the precision choice measures on: the CPU as oneDNN sees it, oneDNN's state and
    the probes' cache."""

    cpu: cpu.CpuInfo
    onednn: bool
    cache: precision_cache.PrecisionCache


@dataclasses.dataclass
class Job:
    """What this task resolved before it builds the Estimator."""

    config: TrainConfig
    rc: tf.estimator.RunConfig
    cluster: dict
    in_cluster: bool
    info: metadata.DatasetInfo
    settings: ModelSettings
    train_data: Cifar10DataSet
    eval_data: Cifar10DataSet
    preemption: Preemption
    machine: Machine
    # What an export computes with (the serving precision), on the tasks that export.
    serving_settings: Optional[ModelSettings] = None
    # A multi-worker all-reduce job's stop at one step for a signal to any task.
    agreed_stop: Optional[allreduce.AgreedStop] = None
    # The tf.distribute strategy a training task runs through Estimator (None: towers).
    strategy: Optional[tf.distribute.Strategy] = None
    # The job dir's lock, on the task that holds it (a local run or the chief: driver._start).
    lock: Optional[JobLock] = None


def session_config(config: TrainConfig, device_filters: Sequence[str] = ()
                   ) -> tf.compat.v1.ConfigProto:
    """Threading, placement and logical CPU devices for every session of the job.

    ``device_filters`` limits a cluster task's sessions to the tasks it needs
    (``distributed.device_filters``).
    """
    proto = tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        log_device_placement=config.log_device_placement,
        intra_op_parallelism_threads=config.num_intra_threads,
        inter_op_parallelism_threads=config.num_inter_threads,
        # Pinned host memory makes host-to-GPU copies of input batches faster.
        gpu_options=tf.compat.v1.GPUOptions(force_gpu_compatible=True))
    if config.num_gpus == 0 and config.num_cpu_towers > 1:
        proto.device_count["CPU"] = config.num_cpu_towers
    if config.xla:
        proto.graph_options.optimizer_options.global_jit_level = (
            tf.compat.v1.OptimizerOptions.ON_1)
    proto.device_filters.extend(device_filters)
    return proto


def run_config(config: TrainConfig, train_distribute: Optional[tf.distribute.Strategy] = None
               ) -> tf.estimator.RunConfig:
    """The Estimator RunConfig; reads TF_CONFIG for the cluster and this task's role.

    With ``train_distribute`` Estimator runs a multi-worker strategy's tasks as its
    distribute coordinator's independent workers (which start their own servers): that
    RunConfig is only for the Estimator, and its ``task_type`` and ``is_chief`` are not this
    task's role (every task reads as a chief 'worker'); the role comes from one without.
    """
    worker_delay = config.max_worker_delay_secs
    if worker_delay is None and steps_together(config):
        # Staggering exists for async updates; a sync step waits for every worker anyway.
        worker_delay = 0
    distributed.check_tf_config(os.environ.get("TF_CONFIG"))
    try:
        rc = tf.estimator.RunConfig(
            model_dir=config.job_dir,
            tf_random_seed=config.seed,
            session_config=session_config(config),
            save_checkpoints_steps=config.save_checkpoints_steps,
            save_checkpoints_secs=config.checkpoint_secs,
            keep_checkpoint_max=config.keep_checkpoint_max,
            save_summary_steps=config.save_summary_steps,
            # The checkpoint hook would otherwise serialise the whole training graph twice
            # more at start-up (graph.pbtxt and a .meta file with every checkpoint), about a
            # second for ResNet-44; TensorBoard still gets the graph from the event file, and
            # resuming rebuilds the graph from code.
            checkpoint_save_graph_def=False,
            # The progress hook logs step/total, loss, learning rate, images/s and ETA, and
            # writes images/s and global_step/sec summaries; the Estimator's step counter
            # would log a second, less informative line.
            log_step_count_steps=None,
            # A worker waits this long for the chief to initialise or restore the model
            # (SessionManager.wait_for_session); Estimator's default is 7200 s.
            session_creation_timeout_secs=config.cluster_timeout_secs,
            experimental_max_worker_delay_secs=worker_delay,
            train_distribute=train_distribute)
    except ValueError as e:  # TF_CONFIG that Estimator refuses (its words span lines)
        raise UserError(f"TF_CONFIG: {' '.join(str(e).split())}; {CLUSTER_HELP}") from None
    if (rc.cluster_spec and rc.task_type in distributed.TRAINER_JOBS
            and config.distribution_strategy == TOWERS):
        # (An all-reduce step talks to every worker: no filters there.)
        rc = rc.replace(session_config=session_config(
            config, distributed.device_filters(rc.task_type, rc.task_id)))
    return rc


def worker_index(rc: tf.estimator.RunConfig) -> int:
    """This training task's place among the cluster's training tasks: the chief 0, worker i
    i + 1 (its shard of the training records)."""
    return 0 if rc.task_type in ("chief", "master") else rc.task_id + 1


def check_cluster(config: TrainConfig, rc: tf.estimator.RunConfig) -> None:
    """The cluster of TF_CONFIG (``rc``'s) against --distribution-strategy, in one line."""
    strategy = config.distribution_strategy
    in_cluster = rc.task_type in distributed.TRAINER_JOBS and bool(rc.cluster_spec)
    if strategy == TOWERS and in_cluster and rc.num_worker_replicas > 1 and not rc.num_ps_replicas:
        raise UserError(f"TF_CONFIG: the cluster has {rc.num_worker_replicas} training tasks "
                        f"but no 'ps' job; with --distribution-strategy towers workers share "
                        f"variables through parameter servers (or use --distribution-strategy "
                        f"multi-worker-mirrored); {CLUSTER_HELP}")
    if strategy == MIRRORED and in_cluster and rc.num_worker_replicas > 1:
        raise UserError(f"TF_CONFIG: --distribution-strategy mirrored runs on one machine, and "
                        f"TF_CONFIG lists {rc.num_worker_replicas} training tasks; use "
                        f"--distribution-strategy multi-worker-mirrored for a cluster")
    if strategy == MULTI_WORKER_MIRRORED and rc.num_ps_replicas:
        raise UserError(f"TF_CONFIG: --distribution-strategy multi-worker-mirrored all-reduces "
                        f"among the chief and workers, and TF_CONFIG lists "
                        f"{rc.num_ps_replicas} 'ps' task(s); leave them out, or use "
                        f"--distribution-strategy towers for parameter servers")


def run_epochs(config: TrainConfig, train_records: int) -> Optional[float]:
    """The run's length in epochs where it is given in epochs: --train-epochs, else the
    recipe's own length for this many records; None where the length is in steps."""
    if config.train_steps is not None:
        return None
    if config.train_epochs is not None:
        return config.train_epochs
    return overlays.recipe_epochs(config.recipe, train_records)


def model_settings(config: TrainConfig, num_workers: int, is_chief: bool,
                   train_records: int, class_names: Sequence[str]) -> ModelSettings:
    """Resolves the model_fn's settings from the config and the cluster.

    An epoch is counted in global steps: with --sync one global step consumes a batch from
    every worker; asynchronously every worker's own step is a global step of one batch.
    """
    per_global_step = global_batch(config, num_workers)
    steps_per_epoch = max(1, train_records // per_global_step)
    total_steps = config.train_steps
    if total_steps is None:
        epochs = run_epochs(config, train_records)
        total_steps = (math.ceil(epochs * steps_per_epoch) if epochs is not None
                       else overlays.MODELS[config.model]["train_steps"])
    return ModelSettings(
        params=ModelParams(**{f.name: getattr(config, f.name)
                              for f in dataclasses.fields(ModelParams)}),
        data_format=config.resolved_data_format(),
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        devices=tuple(towers.tower_devices(config.num_gpus, config.num_cpu_towers)),
        num_workers=num_workers,
        is_chief=is_chief,
        # None until --precision auto is resolved (_resolve_precision), before any graph.
        compute_dtype=precision.DTYPES.get(config.precision),
        class_names=tuple(class_names))


def gpu_capabilities(config: TrainConfig) -> list[tuple[int, int]]:
    return precision.gpu_capabilities(config.num_gpus) if config.num_gpus else []


def resolve_precision(job: Job, recorded: Optional[str]) -> None:
    """Replaces ``--precision auto`` by what fits this machine (measured where it has native
    bf16), or by the job's ``recorded`` choice; logs the CPU and the choice with its reason."""
    config, machine = job.config, job.machine
    describe_cpu = machine.cpu.describe()
    work = (f"training {networks.describe(config)}, batch {config.train_batch_size} on "
            f"{', '.join(job.settings.devices)}, {job.settings.data_format}, threads "
            f"{config.num_intra_threads}/{config.num_inter_threads}{', XLA' if config.xla else ''}")
    choice = precision.resolve_precision(
        config.precision, machine.cpu, onednn=machine.onednn, gpu_capabilities=gpu_capabilities(config),
        measure=lambda: precision_cache.measured(
            machine.cache, describe_cpu, work, lambda: precision_probe.measure_training(
                job.settings, config.train_batch_size, session_config(config))),
        cached=precision_cache.cached(machine.cache, describe_cpu, work),
        recorded=recorded if config.precision == "auto" else None)
    log.info("CPU: %s; oneDNN %s", describe_cpu, "on" if machine.onednn else "off")
    log.info("precision %s: %s", config.precision, choice.reason)
    if choice.warning:
        log.warning("warning: %s", choice.warning)
    job.config = dataclasses.replace(config, precision=choice.precision)
    job.settings = dataclasses.replace(job.settings,
                                       compute_dtype=precision.DTYPES[choice.precision])


def resolve_serving_precision(job: Job) -> None:
    """The precision this task's exports compute in (``--serving-precision``)."""
    config, machine = job.config, job.machine
    choice = precision_probe.serving_choice(config.serving_precision, config.precision,
                                            job.settings, machine.cpu, machine.onednn,
                                            machine.cache)
    log.info("serving precision %s: %s", config.serving_precision, choice.reason)
    if choice.warning:
        log.warning("warning: %s", choice.warning)
    job.serving_settings = dataclasses.replace(
        job.settings, compute_dtype=precision.DTYPES[choice.precision])


def _log_role(job: Job) -> None:
    rc, config = job.rc, job.config
    if rc.task_type == "evaluator":
        log.info("role: evaluator: evaluates new checkpoints in %s (at most every %d s while "
                 "training runs) and the final one, at global step %d, at once",
                 config.job_dir, config.eval_throttle_secs, config.train_steps)
    elif job.cluster:
        updates = ("collective all-reduce" if config.distribution_strategy != TOWERS else
                   "synchronous" if config.sync else "asynchronous")
        log.info("role: %s %d of the cluster %s; %d training task(s), %d ps, %s updates",
                 rc.task_type, rc.task_id, distributed.describe(job.cluster),
                 rc.num_worker_replicas, rc.num_ps_replicas, updates)
    else:
        log.info("role: local (no cluster in TF_CONFIG)")


def prepare(config: TrainConfig, preemption: Preemption, machine: Machine,
            strategy: Optional[tf.distribute.Strategy] = None) -> Job:
    """The RunConfig, the data (checked before anything trains) and the model's settings."""
    rc = run_config(config)
    cluster = rc.cluster_spec.as_dict() if rc.cluster_spec else {}
    in_cluster = rc.task_type in distributed.TRAINER_JOBS and bool(cluster)
    train_data = Cifar10DataSet(config.data_dir, "train", config.use_distortion_for_training,
                                networks.AUGMENTATIONS[config.model])
    eval_data = Cifar10DataSet(config.data_dir, "eval", use_distortion=False)
    # Before anything trains: a record file cut short can read as a shorter valid one.
    for split in ("eval",) if rc.task_type == "evaluator" else ("train", "eval"):
        metadata.verify_split(config.data_dir, split)
    info = metadata.dataset_info(config.data_dir)
    train_records = train_data.num_examples()
    num_workers = rc.num_worker_replicas or 1
    settings = model_settings(config, num_workers, rc.is_chief, train_records, info.class_names)
    own_length = (f", the {config.recipe} recipe's length for {train_records:,} records"
                  if config.train_steps is None and config.train_epochs is None
                  and overlays.recipe_epochs(config.recipe, train_records) is not None else "")
    # From here on the run's length is in global steps, whichever flag gave it.
    config = dataclasses.replace(config, train_steps=settings.total_steps)
    job = Job(config, rc, cluster, in_cluster, info, settings, train_data, eval_data,
              preemption, machine, agreed_stop=allreduce.AgreedStop(config.job_dir),
              strategy=strategy)
    _log_role(job)
    log.info("%s, %s, %s on %s, %d worker(s); %s, %d classes, %d train records, "
             "%d steps per epoch, %d steps in all (%.4g epochs%s), %s learning rate peaking at "
             "%.4g", networks.describe(config), settings.data_format,
             "towers" if config.distribution_strategy == TOWERS else
             f"{config.distribution_strategy} replicas", ", ".join(settings.devices), num_workers, info.dataset, info.num_classes,
             train_records, settings.steps_per_epoch, settings.total_steps,
             settings.total_steps / settings.steps_per_epoch, own_length, config.lr_schedule,
             schedules.peak_learning_rate(settings.params, global_batch(config, num_workers)))
    return job


def ps_tasks(cluster: dict) -> dict:
    return {f"ps:{i}": address for i, address in enumerate(cluster.get("ps", ()))}


# Schedules whose shape depends on the run's length (model/schedules.py).
LENGTH_SHAPED_SCHEDULES = ("cosine", "one-cycle")


def run_settings(job: Job) -> dict:
    spans = (job.settings.total_steps if job.config.lr_schedule in LENGTH_SHAPED_SCHEDULES
             else None)
    return settings_record.run_settings(job.config, job.info.dataset, job.info.num_classes,
                                        spans)


def schedule_change(job: Job, recorded_steps: int, at_step: int) -> str:
    """What the learning rate does when ``--change-settings`` gives a length-shaped schedule a
    new length: its value at ``at_step`` before and after, and where it now ends."""
    s = job.settings

    def rate(total: int) -> float:
        return float(schedules.learning_rate(
            tf.constant(at_step, tf.int64), s.params, s.steps_per_epoch, total,
            global_batch(s.params, s.num_workers)))

    return (f"the {job.config.lr_schedule} schedule now spans {s.total_steps} steps instead of "
            f"{recorded_steps}: at step {at_step} the learning rate goes from "
            f"{rate(recorded_steps):.4g} to {rate(s.total_steps):.4g}, and it reaches its end "
            f"at step {s.total_steps}")
