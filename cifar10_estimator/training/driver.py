"""The driver: one ``TrainConfig`` in, ``tf.estimator.train_and_evaluate`` run, SavedModel out.

This is the only module that builds the Estimator's ``RunConfig``, and through it the only
consumer of ``TF_CONFIG`` (the cluster and this task's role). Locally it trains, evaluates each
new checkpoint (at most every ``--eval-throttle-secs``) and once at the end, then exports.
Rerunning with the same job dir resumes from the latest checkpoint there.

In a cluster (``TF_CONFIG`` with a ``cluster``) the role decides: a ``ps`` serves variables
until the training tasks are done (``distributed.run_parameter_server``); ``chief`` and
``worker`` train against the parameter servers, asynchronously or with ``--sync``; an
``evaluator`` evaluates new checkpoints in the shared job dir and exits right after the one at
``--train-steps`` (``evaluator.evaluate_checkpoints``; Estimator's own evaluator loop would
sleep out ``--eval-throttle-secs`` first). The evaluator may be listed in the cluster, as
Kubeflow's operator lists it, or left out: Estimator ignores it there. Only the chief saves
checkpoints and exports; with ``--export-best`` the task that evaluates (locally, the only one;
in a cluster, the evaluator) also exports each evaluation that beats the best so far.
"""

import contextlib
import dataclasses
import logging
import math
from typing import Callable, Optional, Sequence

import tensorflow as tf

from cifar10_estimator.data import metadata
from cifar10_estimator.data.pipeline import Cifar10DataSet
from cifar10_estimator.errors import Stopped, UserError
from cifar10_estimator.model import checkpoints, towers
from cifar10_estimator.model.model_fn import ModelSettings, make_model_fn
from cifar10_estimator.model import networks, schedules
from cifar10_estimator.model.params import ModelParams, global_batch
from cifar10_estimator.serving.best_export import BEST_SUBDIR, BestExport
from cifar10_estimator.serving.export import export_saved_model
from cifar10_estimator.training import (cpu, distributed, evaluator, guards, precise_bn,
                                        precision, precision_cache, precision_probe, progress,
                                        recipes, report, settings_record)
from cifar10_estimator.training.job_lock import JobLock
from cifar10_estimator.training.preemption import Preemption
from cifar10_estimator.training.config import MODEL_TRAIN_STEPS, TrainConfig, validate

log = logging.getLogger("cifar10_estimator")

# How long a finished trainer tries to tell a parameter server so (a live one answers in ms).
_REPORT_TIMEOUT_SECS = 30
_CLUSTER_HELP = "see docs/distributed.md"


@dataclasses.dataclass
class TrainResult:
    """What a task produced: final eval metrics (if it evaluated) and the export (if chief)."""

    eval_metrics: Optional[dict]
    export_path: Optional[str]
    report_path: Optional[str] = None  # JOB/eval_report.json, by the task that evaluated
    steps_trained: int = 0  # global steps this run added (0 for an evaluator)
    role: str = "local"  # the task's type in TF_CONFIG's cluster, or "local"


@dataclasses.dataclass
class _Job:
    """What the driver resolved for this task before it builds the Estimator."""

    config: TrainConfig
    rc: tf.estimator.RunConfig
    cluster: dict
    in_cluster: bool
    info: metadata.DatasetInfo
    settings: ModelSettings
    train_data: Cifar10DataSet
    eval_data: Cifar10DataSet
    preemption: Preemption
    machine: "_Machine"
    # What an export computes with (the serving precision), on the tasks that export.
    serving_settings: Optional[ModelSettings] = None


@dataclasses.dataclass(frozen=True)
class _Machine:
    """What the precision choice measures on: the CPU as oneDNN sees it, oneDNN's state and
    the probes' cache."""

    cpu: cpu.CpuInfo
    onednn: bool
    cache: precision_cache.PrecisionCache


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


def run_config(config: TrainConfig) -> tf.estimator.RunConfig:
    """The Estimator RunConfig; reads TF_CONFIG for the cluster and this task's role."""
    worker_delay = config.max_worker_delay_secs
    if worker_delay is None and config.sync:
        # Staggering exists for async updates; a sync step waits for every worker anyway.
        worker_delay = 0
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
            experimental_max_worker_delay_secs=worker_delay)
    except ValueError as e:  # TF_CONFIG that Estimator refuses
        raise UserError(f"TF_CONFIG: {e}; {_CLUSTER_HELP}") from None
    if rc.cluster_spec and rc.task_type in distributed.TRAINER_JOBS:
        rc = rc.replace(session_config=session_config(
            config, distributed.device_filters(rc.task_type, rc.task_id)))
    return rc


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
        total_steps = (math.ceil(config.train_epochs * steps_per_epoch)
                       if config.train_epochs is not None else MODEL_TRAIN_STEPS[config.model])
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


def _gpu_capabilities(config: TrainConfig) -> list[tuple[int, int]]:
    return precision.gpu_capabilities(config.num_gpus) if config.num_gpus else []


def _resolve_precision(job: _Job, recorded: Optional[str]) -> None:
    """Replaces ``--precision auto`` by what fits this machine (measured where it has native
    bf16), or by the job's ``recorded`` choice; logs the CPU and the choice with its reason."""
    config, machine = job.config, job.machine
    describe_cpu = machine.cpu.describe()
    work = (f"training {networks.describe(config)}, batch {config.train_batch_size} on "
            f"{', '.join(job.settings.devices)}, {job.settings.data_format}, threads "
            f"{config.num_intra_threads}/{config.num_inter_threads}{', XLA' if config.xla else ''}")
    choice = precision.resolve_precision(
        config.precision, machine.cpu, onednn=machine.onednn, gpu_capabilities=_gpu_capabilities(config),
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


def _resolve_serving_precision(job: _Job) -> None:
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


def _log_role(job: _Job) -> None:
    rc, config = job.rc, job.config
    if rc.task_type == "evaluator":
        log.info("role: evaluator: evaluates new checkpoints in %s (at most every %d s while "
                 "training runs) and the final one, at global step %d, at once",
                 config.job_dir, config.eval_throttle_secs, config.train_steps)
    elif job.cluster:
        log.info("role: %s %d of the cluster %s; %d training task(s), %d ps, %s updates",
                 rc.task_type, rc.task_id, distributed.describe(job.cluster),
                 rc.num_worker_replicas, rc.num_ps_replicas,
                 "synchronous" if config.sync else "asynchronous")
    else:
        log.info("role: local (no cluster in TF_CONFIG)")


def _prepare(config: TrainConfig, preemption: Preemption, machine: _Machine) -> _Job:
    """The RunConfig, the data (checked before anything trains) and the model's settings."""
    rc = run_config(config)
    cluster = rc.cluster_spec.as_dict() if rc.cluster_spec else {}
    in_cluster = rc.task_type in distributed.TRAINER_JOBS and bool(cluster)
    if in_cluster and rc.num_worker_replicas > 1 and not rc.num_ps_replicas:
        raise UserError(f"TF_CONFIG: the cluster has {rc.num_worker_replicas} training tasks "
                        f"but no 'ps' job; workers share variables through parameter servers")
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
    # From here on the run's length is in global steps, whichever flag gave it.
    config = dataclasses.replace(config, train_steps=settings.total_steps)
    job = _Job(config, rc, cluster, in_cluster, info, settings, train_data, eval_data,
               preemption, machine)
    _log_role(job)
    log.info("%s, %s, towers on %s, %d worker(s); %s, %d classes, %d train records, "
             "%d steps per epoch, %d steps in all (%.4g epochs), %s learning rate peaking at "
             "%.4g", networks.describe(config), settings.data_format,
             ", ".join(settings.devices), num_workers, info.dataset, info.num_classes,
             train_records, settings.steps_per_epoch, settings.total_steps,
             settings.total_steps / settings.steps_per_epoch, config.lr_schedule,
             schedules.peak_learning_rate(settings.params, global_batch(config, num_workers)))
    return job


def _ps_tasks(cluster: dict) -> dict:
    return {f"ps:{i}": address for i, address in enumerate(cluster.get("ps", ()))}


def _start(job: _Job, stack: contextlib.ExitStack) -> None:
    """Bounded waits for the rest of the cluster; the chief's checks and lock of the job dir;
    the precision (every task of a job computes in the one the job recorded); every task's
    check of the job dir's settings record."""
    config = job.config
    if job.in_cluster:
        # Fail within --cluster-timeout-secs, with the task named, rather than let gRPC retry.
        # A trainer's sessions use only the parameter servers (and itself); a worker learns
        # that the chief is up from its checkpoint, below.
        distributed.wait_for_tasks(_ps_tasks(job.cluster), config.cluster_timeout_secs)
    if not job.rc.is_chief:
        # A worker or evaluator starts once the chief's first checkpoint exists: this proves
        # the job dir is shared, and a worker arriving before the chief has initialised the
        # variables would sleep 30 s between checks (SessionManager's recovery_wait_secs).
        distributed.wait_for_checkpoint(config.job_dir, config.cluster_timeout_secs)
        _resolve_precision(job, _recorded_precision(config.job_dir))
        if job.rc.task_type == "evaluator" and config.export_best:
            _resolve_serving_precision(job)
        settings_record.check(config.job_dir, _run_settings(job), is_chief=False)
        return
    guards.check_job_dir(config.job_dir, config, job.info.num_classes)
    if "://" in config.job_dir:
        log.info("--job-dir %s is not a local path, which this package cannot lock: make sure "
                 "only one trainer uses it", config.job_dir)
    else:
        lock = stack.enter_context(JobLock(config.job_dir))
        job.preemption.before_exit(lambda _: lock.release())
    _resolve_precision(job, None if config.change_settings else
                       _recorded_precision(config.job_dir))
    _resolve_serving_precision(job)
    settings_record.check(config.job_dir, _run_settings(job), is_chief=True,
                          change=config.change_settings)
    latest = tf.train.latest_checkpoint(config.job_dir)
    if latest:  # only the chief restores; others use the ps or evaluate
        log.info("resuming from %s", latest)


def _recorded_precision(job_dir: str) -> Optional[str]:
    return (settings_record.read(job_dir) or {}).get("precision")


def _run_settings(job: _Job) -> dict:
    return settings_record.run_settings(job.config, job.info.dataset, job.info.num_classes)


class _AfterEvaluation(tf.estimator.Exporter):
    """Estimator's hook after each local evaluation: logs it and hands it on."""

    def __init__(self, consider: Optional[Callable[[dict, str], object]]):
        self._consider = consider

    @property
    def name(self) -> str:
        return BEST_SUBDIR

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        log.info(report.evaluation_line(eval_result))
        return self._consider(eval_result, checkpoint_path) if self._consider else None


def _progress_hook(job: _Job) -> progress.ProgressHook:
    config, s = job.config, job.settings
    per_global_step = None
    if s.num_workers > 1:
        per_global_step = config.train_batch_size * (s.num_workers if config.sync else 1)
    return progress.ProgressHook(
        config.train_batch_size, config.train_steps, per_global_step,
        every_secs=config.progress_secs, summary_dir=config.job_dir if s.is_chief else None,
        summary_steps=config.save_summary_steps)


def _specs(job: _Job, best: Optional[BestExport]):
    """The TrainSpec and EvalSpec of ``tf.estimator.train_and_evaluate``."""
    config = job.config
    train_hooks = [_progress_hook(job), job.preemption.training_hook()]
    if job.rc.is_chief and config.precise_bn_batches and not config.moving_average_decay:
        train_hooks.append(precise_bn.CheckpointHook(
            config.job_dir, config.checkpoint_secs, config.save_checkpoints_steps,
            precise_bn.PreciseBatchNorm(config.precise_bn_batches, config.train_steps,
                                        skip=lambda: job.preemption.signum is not None)))
    if job.in_cluster:
        train_hooks.append(distributed.ParameterServerWatchdog(
            _ps_tasks(job.cluster), config.cluster_timeout_secs,
            "start it again on the same address and rerun the tasks that stopped with the "
            "same flags: the chief resumes from the latest checkpoint in --job-dir"))
    train_spec = tf.estimator.TrainSpec(
        lambda: job.train_data.make_batch(config.train_batch_size, seed=config.seed),
        max_steps=config.train_steps, hooks=train_hooks)
    eval_spec = tf.estimator.EvalSpec(
        lambda: job.eval_data.make_batch(config.eval_batch_size),
        steps=None, name=None, start_delay_secs=0, throttle_secs=config.eval_throttle_secs,
        exporters=[_AfterEvaluation(best.consider if best else None)],
        hooks=[job.preemption.evaluation_hook()])
    return train_spec, eval_spec


def _evaluate_only(job: _Job, estimator, eval_spec, best: Optional[BestExport]) -> TrainResult:
    """The evaluator task: every new checkpoint until the final one."""
    def after(metrics, path):
        log.info(report.evaluation_line(metrics))
        if best:
            best.consider(metrics, path)

    with guards.training_errors(job.config.data_dir, job.config.job_dir):
        metrics = evaluator.evaluate_checkpoints(
            estimator, eval_spec.input_fn, job.config.train_steps,
            job.config.eval_throttle_secs, on_evaluation=after, hooks=eval_spec.hooks)
    return TrainResult(metrics, None, _report(job, metrics), role="evaluator")


def _train(job: _Job, estimator, train_spec, eval_spec) -> Optional[dict]:
    """Trains (and, locally, evaluates); returns the final evaluation's metrics, if any."""
    try:
        with guards.training_errors(job.config.data_dir, job.config.job_dir):
            result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    except tf.errors.DeadlineExceededError as e:
        if job.rc.is_chief:
            raise
        raise UserError(f"the chief did not make the model ready within "
                        f"{job.config.cluster_timeout_secs} s (--cluster-timeout-secs): "
                        f"{e.message.splitlines()[0]}") from None
    job.preemption.check()  # a session that stopped for a signal: no report, no export
    if job.in_cluster:
        # Lets the parameter servers exit; the export below does not need them.
        distributed.report_done(job.cluster, f"{job.rc.task_type}:{job.rc.task_id}",
                                _REPORT_TIMEOUT_SECS)
    return result[0] if result else None


def _export_final(job: _Job, metrics: Optional[dict]) -> str:
    checkpoint = tf.train.latest_checkpoint(job.config.job_dir)
    # The final evaluation is of the final checkpoint when it ran here (locally).
    evaluated = metrics if metrics and metrics.get("global_step") == (
        checkpoints.checkpoint_step(checkpoint)) else None
    path = export_saved_model(job.serving_settings, checkpoint, job.config.resolved_export_dir,
                              evaluated)
    log.info("exported SavedModel to %s", path)
    return path


def train_and_evaluate(config: TrainConfig, cpu_info: cpu.CpuInfo,
                       preemption: Optional[Preemption] = None,
                       cache_dir: Optional[str] = None) -> TrainResult:
    """Validates, then trains, evaluates and (on the chief) exports, as this task's role in
    TF_CONFIG says. ``cpu_info`` is the CPU as oneDNN sees it (for ``--precision``);
    ``preemption``, if installed, turns SIGTERM and SIGINT into a save and ``errors.Stopped``;
    ``cache_dir`` keeps the precision probes' results (None: no cache)."""
    preemption = preemption or Preemption()
    try:
        role = tf.estimator.RunConfig()  # only the role: a ps needs none of the settings
    except ValueError as e:
        raise UserError(f"TF_CONFIG: {e}; {_CLUSTER_HELP}") from None
    preemption.before_exit(lambda stop: log.info(
        _stopped_line(stop, role, config.job_dir, preemption.last_step)))
    onednn = cpu.onednn_enabled()
    validate(config, num_visible_gpus=len(tf.config.list_physical_devices("GPU")),
             needs_data=role.task_type != "ps", onednn_enabled=onednn)
    try:
        if role.task_type == "ps":
            cluster = role.cluster_spec.as_dict()
            log.info("role: ps %d of the cluster %s", role.task_id, distributed.describe(cluster))
            distributed.run_parameter_server(cluster, role.task_id, config.cluster_timeout_secs)
            return TrainResult(None, None, role="ps")
        log.info(recipes.describe(config))
        precision.check_requested(config.precision, cpu_info, onednn=onednn,
                                  gpu_capabilities=_gpu_capabilities(config))
        machine = _Machine(cpu_info, onednn,
                           precision_cache.PrecisionCache(cache_dir, tf.__version__))
        return _run(_prepare(config, preemption, machine))
    except Stopped as stop:
        log.info(_stopped_line(stop, role, config.job_dir, preemption.last_step))
        raise


def _run(job: _Job) -> TrainResult:
    with contextlib.ExitStack() as stack:  # the chief's lock of the job dir, to the very end
        _start(job, stack)
        return _train_evaluate_export(job)


def _train_evaluate_export(job: _Job) -> TrainResult:
    config = job.config
    start_step = checkpoints.latest_step(config.job_dir)
    estimator = tf.estimator.Estimator(make_model_fn(job.settings), config=job.rc)
    best = (BestExport(job.serving_settings, config.resolved_export_dir) if config.export_best
            else None)
    if best and job.in_cluster and "evaluator" not in job.cluster and job.rc.is_chief:
        log.info("--export-best: the best export is made by the evaluator task, and this "
                 "cluster lists none (start one with the same flags and "
                 "TF_CONFIG task type 'evaluator')")
    train_spec, eval_spec = _specs(job, best)
    if job.rc.task_type == "evaluator":
        return _evaluate_only(job, estimator, eval_spec, best)
    metrics = _train(job, estimator, train_spec, eval_spec)
    trained = checkpoints.latest_step(config.job_dir) - start_step
    role = job.rc.task_type if job.cluster else "local"
    if not job.rc.is_chief:
        return TrainResult(metrics, None, steps_trained=trained, role=role)
    return TrainResult(metrics, _export_final(job, metrics), _report(job, metrics), trained, role)


def _stopped_line(stop: Stopped, role: tf.estimator.RunConfig, job_dir: Optional[str],
                  last_step: Optional[int]) -> str:
    """What a task that received a signal says before it exits."""
    head = f"received {stop.name}"
    if role.task_type == "ps":
        return (f"{head}: parameter server stopped (the chief's checkpoints hold the "
                f"variables); start it again with the same command")
    if role.task_type == "evaluator":
        return f"{head}: evaluator stopped; rerun the same command to evaluate on"
    at = f" at step {last_step}" if last_step is not None else " before training started"
    if not role.is_chief:
        return (f"{head}{at}: worker stopped (the chief saves the checkpoints); rerun the same "
                f"command to rejoin")
    latest = tf.train.latest_checkpoint(job_dir) if job_dir else None
    if latest and last_step is not None and checkpoints.checkpoint_step(latest) >= last_step:
        kept = f"saved {latest}"
    else:
        kept = f"the latest checkpoint is {latest}" if latest else "no checkpoint yet"
    return f"{head}{at}: {kept}; rerun the same command to resume"


def _report(job: _Job, metrics: Optional[dict]) -> Optional[str]:
    """Logs the final evaluation's per-class results and writes JOB/eval_report.json."""
    if not metrics or "confusion_matrix" not in metrics:
        return None
    content = report.build(metrics, job.info.class_names, job.info.dataset)
    for line in report.log_lines(content):
        log.info(line)
    return report.write(job.config.job_dir, content)
