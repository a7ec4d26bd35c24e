"""What ``tf.estimator.train_and_evaluate`` is given for a started task, and the call: the
``RunConfig``, the Estimator, the ``TrainSpec`` and ``EvalSpec``, assembled from this room's
parts (the model_fn, the input functions, the hooks of progress, preemption, the job dir's
lock, precise batch norm and a cluster's watchdogs, the exporter after each evaluation), read
from the task's plan and the sections of the settings each of them needs."""

import functools
import logging
from typing import Callable, Optional

import tensorflow as tf

from cifar10_estimator.config.plan import Plan
from cifar10_estimator.config.settings import (ClusterSection, DataSection, LoggingSection,
                                               RuntimeSettings, TrainerSettings)
from cifar10_estimator.errors import UserError
from cifar10_estimator.training.estimator import (cluster_hooks, fence, input_fn,
                                                  precise_bn, preemption_hooks, progress)
from cifar10_estimator.training.estimator.exporter import AfterEvaluation
from cifar10_estimator.training.estimator.model_fn import make_model_fn
from cifar10_estimator.model import checkpoints
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.platform.session import session_config
from cifar10_estimator.serving.best_export import BEST_SUBDIR
from cifar10_estimator.task import peers
from cifar10_estimator.task.allreduce import JoinWithin
from cifar10_estimator.training.end import evaluation_line
from cifar10_estimator.training.start import StartedTask

log = logging.getLogger("cifar10_estimator")


def run_config(task: StartedTask, seed: Optional[int], runtime: RuntimeSettings,
               trainer: TrainerSettings) -> tf.estimator.RunConfig:
    """The Estimator's RunConfig for ``task``, with ``seed`` (``--seed``), where it runs
    (``runtime``) and what the trainer settings say of checkpoints, summaries and logs.

    Estimator reads TF_CONFIG itself for the cluster and the role (the command passes the
    value ``tf_config.parse`` read). With a tf.distribute strategy Estimator runs a multi-worker
    strategy's tasks as its distribute coordinator's independent workers (which start their
    own servers): that RunConfig's ``task_type`` and ``is_chief`` are not this task's role
    (every task reads as a chief 'worker'); the role is the plan's.
    """
    plan = task.plan
    role = plan.role
    devices, cluster = runtime.devices, runtime.cluster
    output, logs = trainer.output, trainer.logging
    filters = (peers.device_filters(role.task_type, role.task_id)
               # (An all-reduce step talks to every worker: no filters there.)
               if role.in_cluster and plan.towers else ())
    try:
        return tf.estimator.RunConfig(
            model_dir=output.job_dir,
            tf_random_seed=seed,
            session_config=session_config(devices, logs.log_device_placement, filters),
            save_checkpoints_steps=plan.checkpoint_steps,
            save_checkpoints_secs=plan.checkpoint_secs,
            keep_checkpoint_max=output.keep_checkpoint_max,
            save_summary_steps=logs.save_summary_steps,
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
            session_creation_timeout_secs=cluster.cluster_timeout_secs,
            experimental_max_worker_delay_secs=plan.worker_delay_secs,
            train_distribute=task.strategy)
    except ValueError as e:  # TF_CONFIG that Estimator refuses (its words span lines)
        raise UserError(f"TF_CONFIG: {' '.join(str(e).split())}; see docs/distributed.md"
                        ) from None


def _progress_hook(plan: Plan, logs: LoggingSection, job_dir: str) -> progress.ProgressHook:
    return progress.ProgressHook(
        plan.worker_batch, plan.train_steps,
        plan.global_batch if plan.role.num_trainers > 1 else None,
        every_secs=logs.progress_secs,
        summary_dir=job_dir if plan.role.is_chief else None,
        summary_steps=logs.save_summary_steps)


def _evaluated(consider: Optional[Callable[[dict, str], object]], eval_result: dict,
               checkpoint_path: str):
    """After each local evaluation: its line, then ``consider`` (``--export-best``)."""
    log.info(evaluation_line(eval_result))
    return consider(eval_result, checkpoint_path) if consider else None


def specs(task: StartedTask, preemption, consider: Optional[Callable[[dict, str], object]], *,
          data: DataSection, cluster: ClusterSection, trainer: TrainerSettings):
    """The TrainSpec and EvalSpec of ``tf.estimator.train_and_evaluate``; ``preemption`` (a
    ``training.preemption.Preemption``) gives its hooks, ``consider`` sees each evaluation
    (``--export-best``)."""
    plan, lock, output = task.plan, task.lock, trainer.output
    role, job_dir, timeout = plan.role, output.job_dir, cluster.cluster_timeout_secs
    all_reduce = plan.all_reduce_trainer
    # The lock's hook first: in an all-reduce task's session it then runs before the checkpoint
    # hooks, which Estimator gives no listener there.
    lock_hooks = ([fence.LockHook(lock, (plan.checkpoint_steps or fence.ALL_REDUCE_SAVE_STEPS)
                                  if all_reduce else None)] if lock is not None else [])
    listeners = [fence.LockListener(lock)] if lock is not None else []
    train_hooks = [*lock_hooks, _progress_hook(plan, trainer.logging, job_dir),
                   preemption_hooks.TrainingHook(preemption, stop=not all_reduce)]
    if all_reduce:
        name = f"{role.task_type} {role.task_id}"
        train_hooks += [
            cluster_hooks.AgreedStopHook(task.agreed_stop, lambda: preemption.signum is not None,
                                         on_session=preemption.reinstall),
            cluster_hooks.RestartOnLostPeer(name, job_dir),
            cluster_hooks.FirstStepHook(JoinWithin(timeout, (
                f"every task of TF_CONFIG's chief and workers must run; {name} is waiting for "
                f"the others")).start())]
    asynchronous = role.in_cluster and role.num_ps and not plan.sync_replicas
    if role.is_chief and (plan.precise_bn_batches or asynchronous):
        train_hooks.append(precise_bn.CheckpointHook(
            job_dir, plan.checkpoint_secs, plan.checkpoint_steps,
            plan.train_steps, precise_bn.PreciseBatchNorm(
                plan.precise_bn_batches, plan.train_steps,
                skip=lambda: preemption.signum is not None) if plan.precise_bn_batches else None,
            listeners))
    if role.in_cluster and role.num_ps:
        train_hooks.append(cluster_hooks.ParameterServerWatchdog(
            role.ps_tasks, timeout,
            "start it again on the same address and rerun the tasks that stopped with the "
            "same flags: the chief resumes from the latest checkpoint in --job-dir"))
    # Estimator adds a chief's saving listeners to its first checkpoint hook (the one above, or
    # its own), except under a multi-worker strategy, which takes none.
    train_spec = tf.estimator.TrainSpec(input_fn.train_input_fn(task.train_data, plan, data.seed),
                                        max_steps=plan.train_steps,
                                        hooks=train_hooks,
                                        saving_listeners=[] if all_reduce else listeners)
    eval_spec = tf.estimator.EvalSpec(
        input_fn.eval_input_fn(task.eval_data, data.eval_batch_size),
        steps=None, name=None, start_delay_secs=0, throttle_secs=output.eval_throttle_secs,
        exporters=[AfterEvaluation(BEST_SUBDIR, functools.partial(_evaluated, consider), lock)],
        # A local run's evaluations end too once the lock is lost.
        hooks=[preemption_hooks.EvaluationHook(preemption),
               *([fence.LockHook(lock)] if lock is not None else [])])
    return train_spec, eval_spec


def latest_step(job_dir: str) -> int:
    """The global step of the latest checkpoint in ``job_dir`` (0 without one)."""
    return checkpoints.latest_step(job_dir)


def estimator(settings: ModelSettings, config: tf.estimator.RunConfig
              ) -> tf.estimator.Estimator:
    """The task's Estimator: the model_fn of ``settings`` (its plan's), with its RunConfig."""
    return tf.estimator.Estimator(make_model_fn(settings), config=config)


def train_and_evaluate(estimator: tf.estimator.Estimator, train_spec: tf.estimator.TrainSpec,
                       eval_spec: tf.estimator.EvalSpec) -> Optional[dict]:
    """Estimator's ``train_and_evaluate``: the metrics of a local run's final evaluation (the
    first of its result), None on a cluster's tasks."""
    result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    return result[0] if result else None
