"""The driver: a task's plan in, ``tf.estimator.train_and_evaluate`` run, SavedModel out.

The command has parsed the settings and this task's role (``task.tf_config``, from the
``TF_CONFIG`` value it read) and checked both. Each task then starts (``training.start``:
the data checked, the plan resolved, the waits for the rest of the cluster, the chief's lock
and the settings record). Locally it then trains, evaluates each new checkpoint (at most every
``--eval-throttle-secs``) and once at the end, then exports. Rerunning with the same job dir
resumes from the latest checkpoint there; rerunning a finished job reports its result and
trains and exports nothing (``training.end``).

In a cluster the role decides: a ``ps`` serves variables until the training tasks are done;
``chief`` and ``worker`` train against the parameter servers, asynchronously or with
``--sync``, or all-reduce (a training task started after the job's last step, as an
orchestrator restarts one killed then, joins no group and waits for no parameter server:
``training.start.trained_to_end``); an ``evaluator`` evaluates new checkpoints in the shared
job dir and exits right after the one at the last step (``training.estimator.evaluate_loop``;
Estimator's own evaluator loop would sleep out ``--eval-throttle-secs`` first). The evaluator may be listed in
the cluster, as Kubeflow's operator lists it, or left out: Estimator ignores it there. Only the
chief saves checkpoints and exports; with ``--export-best`` the task that evaluates (locally,
the only one; in a cluster, the evaluator) also exports each evaluation that beats the best so
far.

The chief (or a local run) holds the job dir's lock (``jobdir.lock``) from its start to its
end. Once it has lost the lock it stops with ``LockLost`` (one line, exit status 2) and saves
nothing more: its sessions check before every step and re-read the lock before every
checkpoint (``training.estimator.fence``), and no evaluation, report or export follows.
"""

import contextlib
import functools
import logging
import signal
import time
from typing import Callable, Optional

import tensorflow as tf

from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import (DataSection, OutputSection, ProblemSettings,
                                               RuntimeSettings, TrainerSettings)
from cifar10_estimator.task import allreduce, peers
from cifar10_estimator.errors import Stopped, UserError
from cifar10_estimator.jobdir import guards
from cifar10_estimator.training import end, start
from cifar10_estimator.training.estimator import evaluate_loop, fence, specs
from cifar10_estimator.training.end import TrainResult
from cifar10_estimator.training.preemption import Preemption, stopped_line

log = logging.getLogger("cifar10_estimator")

# How long a finished trainer tries to tell a parameter server so (a live one answers in ms).
_REPORT_TIMEOUT_SECS = 30
# How long a chief stopped by a signal tries to tell a parameter server it saved: inside the
# parameter server's wait for it (task.peers.STOP_SAVE_SECS) and a grace period's 30 s.
_SAVED_REPORT_SECS = 5


def train_and_evaluate(role: Role, machine: start.Machine,
                       preemption: Optional[Preemption] = None, *, problem: ProblemSettings,
                       trainer: TrainerSettings, runtime: RuntimeSettings,
                       on_evaluation: Optional[Callable[[dict, str, float, float], None]] = None
                       ) -> TrainResult:
    """Trains, evaluates and (on the chief) exports, as ``role`` (``task.tf_config.parse`` of
    TF_CONFIG's value) says, with the settings in their three groups (the command checked them
    against the machine). ``machine`` is the CPU as oneDNN sees it, oneDNN's state and the
    precision probes' cache; ``preemption``, if installed, turns SIGTERM and SIGINT into a save
    and ``errors.Stopped``; ``on_evaluation`` is handed each evaluation's metrics, its
    checkpoint, its epoch and this task's training images per second, as the evaluation ends
    (a tuning service's intermediate reports). The root of a task's run: it hands each part
    the sections that part reads."""
    data, model = problem.data, problem.model
    output = trainer.output
    devices, cluster = runtime.devices, runtime.cluster
    preemption = preemption or Preemption()
    preemption.before_exit(lambda stop: log.info(
        stopped_line(stop, role, output.job_dir, preemption.last_step)))
    try:
        # A task of a cluster starts a server of its own; a local run, none.
        with (contextlib.nullcontext() if role.local else
              peers.own_server(role.cluster_spec, role.task_type, role.task_id)):
            if role.task_type == "ps":
                preemption.serving = True  # a signal: serve on for the chief's save
                start.serve_variables(cluster, role, lambda: preemption.signum is not None)
                preemption.check()
                return TrainResult(None, None, role="ps")
            # A training task restarted after the job's last step joins no group and waits for
            # no parameter server: a worker is done at once, the chief concludes (evaluation,
            # export, report) without training.
            ended = start.trained_to_end(role, data, model, trainer.schedule, cluster, output)
            if ended is not None:
                log.info("%s: the job already trained to its last step, %d, in %s: nothing to "
                         "train; this task %s without joining the cluster", role.name, ended,
                         output.job_dir, "concludes it" if role.is_chief else "leaves")
                if not role.is_chief:
                    return TrainResult(None, None, role=role.kind)
            strategy = (None if ended is not None  # made before TensorFlow's runtime starts
                        else start.make_strategy(devices, cluster, role))
            with contextlib.ExitStack() as stack:  # the chief's lock of the job dir, to the end
                task = start.start(role, machine, stack, preemption.before_exit, strategy,
                                   problem=problem, trainer=trainer, runtime=runtime,
                                   trained=ended is not None)
                # What exports compute with, decided (and probed) once, by a task that exports.
                serving = functools.cache(lambda: end.serving_settings(
                    task.model, devices.serving_precision, task.plan.precision, machine))
                try:
                    return _run(task, serving, preemption, on_evaluation, data=data,
                                trainer=trainer, runtime=runtime)
                except Exception as e:
                    lost = fence.lock_loss(e)
                    if lost is None or lost is e:
                        raise
                    raise lost from None
    except Stopped as stop:
        log.info(stopped_line(stop, role, output.job_dir, preemption.last_step))
        raise


def _check_lock(task: start.StartedTask) -> None:
    """LockLost if the task that held the job dir's lock has lost it (re-reads it)."""
    if task.lock is not None:
        task.lock.check()


def _after_evaluation(task: start.StartedTask, best, on_evaluation) -> Callable[[dict, str], object]:
    """What follows each evaluation: ``--export-best``'s exporter considers it, and
    ``on_evaluation`` gets it with its epoch and this task's images/s since it started."""
    started, plan = time.monotonic(), task.plan

    def after(metrics: dict, path: str):
        exported = best.consider(metrics, path) if best else None
        if on_evaluation:
            step = int(metrics.get("global_step", 0))
            secs = time.monotonic() - started
            on_evaluation(metrics, path, step / plan.steps_per_epoch,
                          plan.worker_images(step - task.start_step) / secs if secs else 0.0)
        return exported

    return after


def _run(task: start.StartedTask, serving: Callable, preemption: Preemption, on_evaluation, *,
         data: DataSection, trainer: TrainerSettings, runtime: RuntimeSettings) -> TrainResult:
    output, cluster = trainer.output, runtime.cluster
    plan = task.plan
    role = plan.role
    if role.is_chief:
        finished = end.finished(plan, output, serving)
        if finished:
            return finished
    if role.is_chief or plan.exports_best:
        serving()
    estimator = specs.estimator(task.model, specs.run_config(task, data.seed, runtime, trainer))
    best = end.best_export(plan, serving()) if plan.exports_best else None
    after = _after_evaluation(task, best, on_evaluation)
    train_spec, eval_spec = specs.specs(
        task, preemption, after, data=data, cluster=cluster, trainer=trainer)
    guard = functools.partial(guards.training_errors, data.data_dir, output.job_dir,
                              role.is_chief)
    if role.task_type == "evaluator":
        return _evaluate_only(task, estimator, eval_spec, after, guard, output)
    # The chief of a cluster's job that had trained to its last step made no strategy and
    # waited for no parameter server (``start.trained_to_end``): it only concludes.
    joined = not (role.in_cluster and task.start_step >= plan.train_steps)
    metrics = _train(task, preemption, estimator, train_spec, eval_spec, guard,
                     cluster.cluster_timeout_secs, output.job_dir) if joined else None
    _check_lock(task)  # nothing after training either: no evaluation, report or export
    if not role.is_chief:
        # Training ended at --train-steps (the input repeats), or at once at a later step it
        # found. The job dir may not show that step yet: the chief writes the last checkpoint
        # after the all-reduce of the last step, which this worker has already left (a worker
        # that took the step before for the end waited for an export never made).
        step = max(plan.train_steps, specs.latest_step(output.job_dir))
        if plan.all_reduce_trainer:
            # The chief leads the job's coordination service and exports now (and, where it
            # evaluates at the end, reports): a worker that left first would be logged as
            # failed by that service once its heartbeats stop.
            end.wait_for_end(plan, output, step, cluster.cluster_timeout_secs)
        steps = step - task.start_step
        return TrainResult(metrics, None, role=role.kind, steps_trained=steps,
                           images_trained=plan.worker_images(steps))

    def evaluate() -> dict:
        with guard():
            return estimator.evaluate(eval_spec.input_fn, hooks=eval_spec.hooks)

    metrics, export, report, step = end.conclude(plan, output, metrics, serving, evaluate,
                                                   lambda: _check_lock(task))
    steps = step - task.start_step
    result = TrainResult(metrics, export, report, steps, role.kind, plan.worker_images(steps))
    if plan.all_reduce_trainer and joined:
        # The chief leads the job's coordination service: leaving before the workers have
        # ended their sessions makes them log errors about it. The workers leave once this
        # export exists (end.wait_for_end).
        peers.wait_until_gone(role.peers, _REPORT_TIMEOUT_SECS)
    return result


def _evaluate_only(task: start.StartedTask, estimator, eval_spec, after, guard,
                   output: OutputSection) -> TrainResult:
    """The evaluator task: every new checkpoint until the final one."""
    plan = task.plan

    def logged(metrics, path):
        log.info(end.evaluation_line(metrics))
        after(metrics, path)

    with guard():
        metrics = evaluate_loop.evaluate_checkpoints(
            estimator, eval_spec.input_fn, plan.train_steps,
            output.eval_throttle_secs, on_evaluation=logged, hooks=eval_spec.hooks)
    return TrainResult(metrics, None, end.write_report(plan, output.job_dir, metrics),
                       role="evaluator")


def _train(task: start.StartedTask, preemption: Preemption, estimator, train_spec, eval_spec, guard,
           timeout_secs: int, job_dir: str) -> Optional[dict]:
    """Trains (and, locally, evaluates); returns the final evaluation's metrics, if any."""
    plan = task.plan
    role = plan.role
    try:
        with guard():
            metrics = specs.train_and_evaluate(estimator, train_spec, eval_spec)
    except tf.errors.OpError as e:
        if plan.all_reduce_trainer and allreduce.is_lost_peer(e):
            allreduce.exit_for_restart(f"{role.task_type} {role.task_id}",
                                       f"training failed ({e.message.splitlines()[0]})",
                                       job_dir)
        if not isinstance(e, tf.errors.DeadlineExceededError) or role.is_chief:
            raise
        raise UserError(f"the chief did not make the model ready within "
                        f"{timeout_secs} s (--cluster-timeout-secs): "
                        f"{e.message.splitlines()[0]}") from None
    if preemption.signum is not None and role.in_cluster and role.num_ps and role.is_chief:
        # The parameter servers, if a signal stops them too, serve on until this save.
        peers.report(role.cluster_spec, f"{role.task_type}:{role.task_id}", peers.SAVED,
                     _SAVED_REPORT_SECS)
    preemption.check()  # a session that stopped for a signal: no report, no export
    if plan.all_reduce_trainer and task.agreed_stop.stopped:
        raise Stopped(signal.SIGTERM, why="stopped with the job (another task received a signal)")
    if role.in_cluster and role.num_ps:
        # Lets the parameter servers exit; the export below does not need them.
        peers.report(role.cluster_spec, f"{role.task_type}:{role.task_id}", peers.FINISHED,
                     _REPORT_TIMEOUT_SECS)
    return metrics
