"""The driver: one ``TrainConfig`` in, ``tf.estimator.train_and_evaluate`` run, SavedModel out.

Each task first resolves itself (``task``: its role from ``TF_CONFIG``, the data, the model's
settings, the precision). Locally it then trains, evaluates each new checkpoint (at most every
``--eval-throttle-secs``) and once at the end, then exports. Rerunning with the same job dir
resumes from the latest checkpoint there; rerunning a finished job reports its result and
trains and exports nothing.

In a cluster (``TF_CONFIG`` with a ``cluster``) the role decides: a ``ps`` serves variables
until the training tasks are done (``distributed.run_parameter_server``); ``chief`` and
``worker`` train against the parameter servers, asynchronously or with ``--sync``; an
``evaluator`` evaluates new checkpoints in the shared job dir and exits right after the one at
``--train-steps`` (``evaluator.evaluate_checkpoints``; Estimator's own evaluator loop would
sleep out ``--eval-throttle-secs`` first). The evaluator may be listed in the cluster, as
Kubeflow's operator lists it, or left out: Estimator ignores it there. Only the chief saves
checkpoints and exports; with ``--export-best`` the task that evaluates (locally, the only one;
in a cluster, the evaluator) also exports each evaluation that beats the best so far.

The chief (or a local run) holds the job dir's lock (``jobdir.lock``) from its start to its
end. Once it has lost the lock it stops with ``LockLost`` (one line, exit status 2) and saves
nothing more: its sessions check before every step and re-read the lock before every
checkpoint (``training.fence``), and no evaluation, report or export follows.
"""

import contextlib
import dataclasses
import json
import logging
import os
import signal
from typing import Callable, Optional

import tensorflow as tf

from cifar10_estimator import storage
from cifar10_estimator.config import overlays
from cifar10_estimator.config.checks import validate
from cifar10_estimator.config.settings import (MULTI_WORKER_MIRRORED, TOWERS, TrainConfig,
                                               steps_together)
from cifar10_estimator.distributed import allreduce, evaluator
from cifar10_estimator.distributed import cluster as distributed
from cifar10_estimator.errors import Stopped, UserError
from cifar10_estimator.evaluation import offline, report
from cifar10_estimator.jobdir import guards, settings_record
from cifar10_estimator.jobdir.lock import JobLock
from cifar10_estimator.model import checkpoints, towers
from cifar10_estimator.model.model_fn import make_model_fn
from cifar10_estimator.platform import cpu, precision, precision_cache
from cifar10_estimator.serving.best_export import BEST_SUBDIR, BestExport
from cifar10_estimator.serving import client
from cifar10_estimator.serving.export import export_saved_model
from cifar10_estimator.training import fence, precise_bn, progress, task
from cifar10_estimator.training.preemption import Preemption, stopped_line
from cifar10_estimator.training.task import Job

log = logging.getLogger("cifar10_estimator")

# How long a finished trainer tries to tell a parameter server so (a live one answers in ms).
_REPORT_TIMEOUT_SECS = 30


@dataclasses.dataclass
class TrainResult:
    """What a task produced: final eval metrics (if it evaluated) and the export (if chief)."""

    eval_metrics: Optional[dict]
    export_path: Optional[str]
    report_path: Optional[str] = None  # JOB/eval_report.json, by the task that evaluated
    steps_trained: int = 0  # global steps this run added (0 for an evaluator)
    role: str = "local"  # the task's type in TF_CONFIG's cluster, or "local"


def _start(job: Job, stack: contextlib.ExitStack) -> None:
    """Bounded waits for the rest of the cluster; the chief's checks and lock of the job dir;
    the precision (every task of a job computes in the one the job recorded); every task's
    check of the job dir's settings record."""
    config = job.config
    if job.in_cluster:
        # Fail within --cluster-timeout-secs, with the task named, rather than let gRPC retry.
        # A trainer's sessions use only the parameter servers (and itself); a worker learns
        # that the chief is up from its checkpoint, below.
        distributed.wait_for_tasks(task.ps_tasks(job.cluster), config.cluster_timeout_secs)
    if not job.rc.is_chief:
        if _all_reduce_cluster(job):
            # An all-reduce worker joins the chief's first step (the chief cannot save a
            # checkpoint before that step): it waits only for the chief's settings record.
            allreduce.wait_for_file(os.path.join(config.job_dir, settings_record.RECORD_FILE),
                                    config.cluster_timeout_secs, "the chief's settings record")
        else:
            # A worker or evaluator starts once the chief's first checkpoint exists: this
            # proves the job dir is shared, and a worker arriving before the chief has
            # initialised the variables would sleep 30 s between checks (SessionManager's
            # recovery_wait_secs).
            distributed.wait_for_checkpoint(config.job_dir, config.cluster_timeout_secs)
        task.resolve_precision(job, (settings_record.read(config.job_dir) or {}).get(
            "precision"))
        settings_record.check(config.job_dir, task.run_settings(job), is_chief=False)
        return
    guards.check_job_dir(config.job_dir, config, job.info.num_classes)
    lock = job.lock = stack.enter_context(JobLock(config.job_dir))
    job.preemption.before_exit(lambda _: lock.release())
    recorded = settings_record.read(config.job_dir) or {}
    task.resolve_precision(job, None if config.change_settings else recorded.get("precision"))
    current = task.run_settings(job)
    lock.check()  # the settings record is written only by the lock's holder
    settings_record.check(config.job_dir, current, is_chief=True, change=config.change_settings)
    spans = recorded.get(settings_record.SCHEDULE_STEPS)
    if spans and current.get(settings_record.SCHEDULE_STEPS, spans) != spans:
        log.info("--change-settings: %s", task.schedule_change(
            job, spans, checkpoints.latest_step(config.job_dir)))
    if _all_reduce_cluster(job):
        job.agreed_stop.clear()  # an earlier run's
    latest = tf.train.latest_checkpoint(config.job_dir)
    if latest:  # only the chief restores; others use the ps, get the chief's values or evaluate
        log.info("resuming from %s", latest)


def _all_reduce_cluster(job: Job) -> bool:
    """A training task of a multi-worker all-reduce job."""
    return (job.config.distribution_strategy == MULTI_WORKER_MIRRORED
            and job.rc.task_type in distributed.TRAINER_JOBS)


def _check_lock(job: Job) -> None:
    """LockLost if the task that held the job dir's lock has lost it (re-reads it)."""
    if job.lock is not None:
        job.lock.check()


class _AfterEvaluation(tf.estimator.Exporter):
    """Estimator's hook after each local evaluation: logs it and hands it on."""

    def __init__(self, consider: Optional[Callable[[dict, str], object]],
                 lock: Optional[JobLock] = None):
        self._consider = consider
        self._lock = lock

    @property
    def name(self) -> str:
        return BEST_SUBDIR

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        if self._lock is not None:
            self._lock.check()  # no best export once the lock is lost
        log.info(report.evaluation_line(eval_result))
        return self._consider(eval_result, checkpoint_path) if self._consider else None


def _progress_hook(job: Job) -> progress.ProgressHook:
    config, s = job.config, job.settings
    per_global_step = None
    if s.num_workers > 1:
        per_global_step = config.train_batch_size * (s.num_workers if steps_together(config)
                                                     else 1)
    return progress.ProgressHook(
        config.train_batch_size, config.train_steps, per_global_step,
        every_secs=config.progress_secs, summary_dir=config.job_dir if s.is_chief else None,
        summary_steps=config.save_summary_steps)


def _specs(job: Job, best: Optional[BestExport]):
    """The TrainSpec and EvalSpec of ``tf.estimator.train_and_evaluate``."""
    config = job.config
    all_reduce = _all_reduce_cluster(job)
    # The lock's hook first: in an all-reduce task's session it then runs before the checkpoint
    # hooks, which Estimator gives no listener there.
    lock_hooks = ([fence.LockHook(job.lock, (config.save_checkpoints_steps
                                             or fence.ALL_REDUCE_SAVE_STEPS)
                                  if all_reduce else None)] if job.lock is not None else [])
    listeners = [fence.LockListener(job.lock)] if job.lock is not None else []
    train_hooks = [*lock_hooks, _progress_hook(job),
                   job.preemption.training_hook(stop=not all_reduce)]
    if all_reduce:
        name = f"{job.rc.task_type} {job.rc.task_id}"
        train_hooks += [
            job.agreed_stop.hook(lambda: job.preemption.signum is not None,
                                 on_session=job.preemption.reinstall),
            allreduce.RestartOnLostPeer(name, config.job_dir),
            allreduce.JoinWithin(config.cluster_timeout_secs, (
                f"every task of TF_CONFIG's chief and workers must run; {name} is waiting for "
                f"the others")).start().hook()]
    precise = config.precise_bn_batches and not config.moving_average_decay
    asynchronous = job.in_cluster and job.rc.num_ps_replicas and not config.sync
    if job.rc.is_chief and (precise or asynchronous):
        train_hooks.append(precise_bn.CheckpointHook(
            config.job_dir, config.checkpoint_secs, config.save_checkpoints_steps,
            config.train_steps, precise_bn.PreciseBatchNorm(
                config.precise_bn_batches, config.train_steps,
                skip=lambda: job.preemption.signum is not None) if precise else None,
            listeners))
    if job.in_cluster and job.rc.num_ps_replicas:
        train_hooks.append(distributed.ParameterServerWatchdog(
            task.ps_tasks(job.cluster), config.cluster_timeout_secs,
            "start it again on the same address and rerun the tasks that stopped with the "
            "same flags: the chief resumes from the latest checkpoint in --job-dir"))
    # Estimator adds a chief's saving listeners to its first checkpoint hook (the one above, or
    # its own), except under a multi-worker strategy, which takes none.
    train_spec = tf.estimator.TrainSpec(_train_input(job), max_steps=config.train_steps,
                                        hooks=train_hooks,
                                        saving_listeners=[] if all_reduce else listeners)
    eval_spec = tf.estimator.EvalSpec(
        lambda: job.eval_data.make_batch(config.eval_batch_size),
        steps=None, name=None, start_delay_secs=0, throttle_secs=config.eval_throttle_secs,
        exporters=[_AfterEvaluation(best.consider if best else None, job.lock)],
        # A local run's evaluations end too once the lock is lost.
        hooks=[job.preemption.evaluation_hook(),
               *([fence.LockHook(job.lock)] if job.lock is not None else [])])
    return train_spec, eval_spec


def _train_input(job: Job) -> Callable:
    """The training input_fn: this worker's shard of the records; under a tf.distribute
    strategy, Estimator calls it per input pipeline for batches of one replica's share."""
    config = job.config
    if config.distribution_strategy == TOWERS:
        shard = ((job.settings.num_workers, task.worker_index(job.rc)) if job.in_cluster
                 else (1, 0))
        return lambda: job.train_data.make_batch(config.train_batch_size, seed=config.seed,
                                                 shard=shard)

    def input_fn(input_context: tf.distribute.InputContext):
        pipelines = input_context.num_input_pipelines  # one per worker
        replicas_here = input_context.num_replicas_in_sync // pipelines
        return job.train_data.make_batch(
            config.train_batch_size // replicas_here, seed=config.seed,
            shard=(pipelines, input_context.input_pipeline_id))
    return input_fn


def _evaluate_only(job: Job, estimator, eval_spec, best: Optional[BestExport]) -> TrainResult:
    """The evaluator task: every new checkpoint until the final one."""
    def after(metrics, path):
        log.info(report.evaluation_line(metrics))
        if best:
            best.consider(metrics, path)

    with guards.training_errors(job.config.data_dir, job.config.job_dir):
        metrics = evaluator.evaluate_checkpoints(
            estimator, eval_spec.input_fn, job.config.train_steps,
            job.config.eval_throttle_secs, on_evaluation=after, hooks=eval_spec.hooks)
    return TrainResult(metrics, None, _final_report(job, metrics), role="evaluator")


def _train(job: Job, estimator, train_spec, eval_spec) -> Optional[dict]:
    """Trains (and, locally, evaluates); returns the final evaluation's metrics, if any."""
    try:
        with guards.training_errors(job.config.data_dir, job.config.job_dir):
            result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    except tf.errors.OpError as e:
        if _all_reduce_cluster(job) and allreduce.is_lost_peer(e):
            allreduce.exit_for_restart(f"{job.rc.task_type} {job.rc.task_id}",
                                       f"training failed ({e.message.splitlines()[0]})",
                                       job.config.job_dir)
        if not isinstance(e, tf.errors.DeadlineExceededError) or job.rc.is_chief:
            raise
        raise UserError(f"the chief did not make the model ready within "
                        f"{job.config.cluster_timeout_secs} s (--cluster-timeout-secs): "
                        f"{e.message.splitlines()[0]}") from None
    job.preemption.check()  # a session that stopped for a signal: no report, no export
    if _all_reduce_cluster(job) and job.agreed_stop.stopped:
        raise Stopped(signal.SIGTERM, why="stopped with the job (another task received a signal)")
    if job.in_cluster and job.rc.num_ps_replicas:
        # Lets the parameter servers exit; the export below does not need them.
        distributed.report_done(job.cluster, f"{job.rc.task_type}:{job.rc.task_id}",
                                _REPORT_TIMEOUT_SECS)
    return result[0] if result else None


def _export_final(job: Job, metrics: Optional[dict]) -> str:
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
    distributed.check_tf_config(os.environ.get("TF_CONFIG"))
    try:
        role = tf.estimator.RunConfig()  # only the role: a ps needs none of the settings
    except ValueError as e:
        raise UserError(f"TF_CONFIG: {' '.join(str(e).split())}; {task.CLUSTER_HELP}") from None
    preemption.before_exit(lambda stop: log.info(
        stopped_line(stop, role, config.job_dir, preemption.last_step)))
    onednn = cpu.onednn_enabled()
    validate(config, num_visible_gpus=len(tf.config.list_physical_devices("GPU")),
             needs_data=role.task_type != "ps", onednn_enabled=onednn)
    try:
        if role.task_type == "ps":
            cluster = role.cluster_spec.as_dict()
            log.info("role: ps %d of the cluster %s", role.task_id, distributed.describe(cluster))
            distributed.run_parameter_server(cluster, role.task_id, config.cluster_timeout_secs)
            return TrainResult(None, None, role="ps")
        log.info(overlays.describe(config))
        precision.check_requested(config.precision, cpu_info, onednn=onednn,
                                  gpu_capabilities=task.gpu_capabilities(config))
        task.check_cluster(config, role)
        # First, before anything starts TensorFlow's runtime: a strategy's devices and
        # collective operations can be set up only then.
        strategy = (_strategy(config) if config.distribution_strategy != TOWERS
                    and role.task_type in distributed.TRAINER_JOBS else None)
        machine = task.Machine(cpu_info, onednn,
                               precision_cache.PrecisionCache(cache_dir, tf.__version__))
        return _run(task.prepare(config, preemption, machine, strategy))
    except Stopped as stop:
        log.info(stopped_line(stop, role, config.job_dir, preemption.last_step))
        raise


def _strategy(config: TrainConfig) -> tf.distribute.Strategy:
    """The tf.distribute strategy of ``--distribution-strategy`` for this task."""
    if (config.num_gpus == 0 and config.num_cpu_towers > 1
            and not towers.ensure_logical_cpus(config.num_cpu_towers)):
        raise UserError(f"--num-cpu-towers {config.num_cpu_towers}: TensorFlow started in this "
                        f"process with fewer CPU devices; run the trainer in a process of its "
                        f"own (python -m cifar10_estimator)")
    try:
        return allreduce.make_strategy(config.distribution_strategy, towers.tower_devices(
            config.num_gpus, config.num_cpu_towers))
    except RuntimeError as e:  # collective operations after TensorFlow's runtime started
        raise UserError(f"--distribution-strategy {config.distribution_strategy}: {e}; run the "
                        f"trainer in a process of its own (python -m cifar10_estimator)") from None


def _run(job: Job) -> TrainResult:
    with contextlib.ExitStack() as stack:  # the chief's lock of the job dir, to the very end
        _start(job, stack)
        try:
            return _train_evaluate_export(job)
        except Exception as e:
            lost = fence.lock_loss(e)
            if lost is None or lost is e:
                raise
            raise lost from None


def _final_export(job: Job, step: int) -> Optional[str]:
    """The newest export, if it was made of the checkpoint of ``step``."""
    try:
        export = client.newest_export(job.config.resolved_export_dir)
    except UserError:
        return None
    return export if offline.export_info(export).get("global_step") == step else None


def _final_report_of(job: Job, step: int) -> Optional[dict]:
    """JOB/eval_report.json, if it reports the evaluation of ``step``."""
    try:
        final = json.loads(storage.read_bytes(
            storage.join(job.config.job_dir, report.REPORT_FILE)))
        return final if final["global_step"] == step else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _finished(job: Job) -> Optional[TrainResult]:
    """The result of a job that already trained to its last step and exported it (and, run
    locally, reported its final evaluation), else None. A job that trained to its end and
    reported that step's evaluation but lost or never finished its export (a full disk) is
    exported here, once, with the report's figures: nothing is trained or evaluated again."""
    config = job.config
    step = checkpoints.latest_step(config.job_dir)
    if step < config.train_steps:
        return None
    export = _final_export(job, step)
    final = _final_report_of(job, step)
    if final is None and not (export and job.cluster):
        return None  # a local run evaluates and reports below; the export is not made twice
    metrics = {"accuracy": float(final["accuracy"]), "global_step": step} if final else None
    path = os.path.join(config.job_dir, report.REPORT_FILE) if final else None
    shown = f", final accuracy {100 * metrics['accuracy']:.2f}%" if metrics else ""
    if export is None:
        task.resolve_serving_precision(job)
        export = _export_final(job, metrics)
        log.info("already trained to step %d in %s%s: nothing to train; exported its final "
                 "checkpoint, which had no export, to %s", step, config.job_dir, shown, export)
        return TrainResult(metrics, export, path, 0, "local" if not job.cluster else "chief")
    log.info("already trained to step %d in %s%s: nothing to train or export (raise "
             "--train-steps to train longer); its export is %s%s", step, config.job_dir, shown,
             export, f" and its report {path}" if path else "")
    return TrainResult(metrics, export, path, 0, "local" if not job.cluster else "chief")


def _train_evaluate_export(job: Job) -> TrainResult:
    config = job.config
    if job.rc.is_chief:
        finished = _finished(job)
        if finished:
            return finished
    if job.rc.is_chief or (job.rc.task_type == "evaluator" and config.export_best):
        task.resolve_serving_precision(job)
    start_step = checkpoints.latest_step(config.job_dir)
    rc = job.rc
    if job.strategy is not None:
        rc = task.run_config(config, job.strategy)
    estimator = tf.estimator.Estimator(make_model_fn(job.settings), config=rc)
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
    _check_lock(job)  # nothing after training either: no evaluation, report or export
    step = checkpoints.latest_step(config.job_dir)
    trained = step - start_step
    role = job.rc.task_type if job.cluster else "local"
    if not job.rc.is_chief:
        return TrainResult(metrics, None, steps_trained=trained, role=role)
    if not job.cluster and (not metrics or metrics.get("global_step") != step):
        # Estimator evaluates only a checkpoint it saved in this run: the last one of a run
        # that stopped between its final save and its report is evaluated here, once.
        with guards.training_errors(config.data_dir, config.job_dir):
            metrics = estimator.evaluate(eval_spec.input_fn, hooks=eval_spec.hooks)
        log.info(report.evaluation_line(metrics))
        _check_lock(job)
    export = _final_export(job, step) or _export_final(job, metrics)
    _check_lock(job)  # before the report
    result = TrainResult(metrics, export, _final_report(job, metrics), trained, role)
    if _all_reduce_cluster(job):
        # The chief leads the job's coordination service: leaving before the workers have
        # ended their sessions makes them log errors about it. A worker ends seconds after.
        distributed.wait_until_gone(
            {name: address for name, address in _peers(job).items()}, _REPORT_TIMEOUT_SECS)
    return result


def _peers(job: Job) -> dict[str, str]:
    """The other training tasks of the cluster: ``job:index`` -> address."""
    return {f"{kind}:{i}": address for kind in distributed.TRAINER_JOBS
            for i, address in enumerate(job.cluster.get(kind, ()))
            if (kind, i) != (job.rc.task_type, job.rc.task_id)}


def _final_report(job: Job, metrics: Optional[dict]) -> Optional[str]:
    """Logs the final evaluation's per-class results and writes JOB/eval_report.json."""
    if not metrics or "confusion_matrix" not in metrics:
        return None
    content = report.build(metrics, job.info.class_names, job.info.dataset)
    for line in report.log_lines(content):
        log.info(line)
    return report.write(job.config.job_dir, content)
