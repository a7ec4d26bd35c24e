"""The driver: one ``TrainConfig`` in, ``tf.estimator.train_and_evaluate`` run, SavedModel out.

This is the only module that builds the Estimator's ``RunConfig``, and through it the only
consumer of ``TF_CONFIG`` (the cluster and this task's role). Locally it trains, evaluates each
new checkpoint (at most every ``--eval-throttle-secs``) and once at the end, then exports.
Rerunning with the same job dir resumes from the latest checkpoint there.
"""

import dataclasses
import logging
from typing import Optional

import tensorflow as tf

from cifar10_estimator import export, towers
from cifar10_estimator.config import TrainConfig
from cifar10_estimator.dataset import Cifar10DataSet
from cifar10_estimator.model_fn import ModelSettings, make_model_fn

log = logging.getLogger("cifar10_estimator")


@dataclasses.dataclass
class TrainResult:
    """What a task produced: final eval metrics (if it evaluated) and the export (if chief)."""

    eval_metrics: Optional[dict]
    export_path: Optional[str]


def session_config(config: TrainConfig) -> tf.compat.v1.ConfigProto:
    """Threading, placement and logical CPU devices for every session of the job."""
    proto = tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        log_device_placement=config.log_device_placement,
        intra_op_parallelism_threads=config.num_intra_threads,
        inter_op_parallelism_threads=config.num_inter_threads,
        # Pinned host memory makes host-to-GPU copies of input batches faster.
        gpu_options=tf.compat.v1.GPUOptions(force_gpu_compatible=True))
    if config.num_gpus == 0 and config.num_cpu_towers > 1:
        proto.device_count["CPU"] = config.num_cpu_towers
    return proto


def run_config(config: TrainConfig) -> tf.estimator.RunConfig:
    """The Estimator RunConfig; reads TF_CONFIG for the cluster and this task's role."""
    return tf.estimator.RunConfig(
        model_dir=config.job_dir,
        tf_random_seed=config.seed,
        session_config=session_config(config),
        save_checkpoints_steps=config.save_checkpoints_steps,
        save_checkpoints_secs=config.checkpoint_secs,
        keep_checkpoint_max=config.keep_checkpoint_max,
        save_summary_steps=100,
        # The model_fn's own hooks log step, loss, learning rate and examples/sec; the
        # Estimator's step counter would log a second, less informative line.
        log_step_count_steps=None)


def model_settings(config: TrainConfig, num_workers: int, is_chief: bool,
                   train_records: int) -> ModelSettings:
    """Resolves the model_fn's settings from the config and the cluster."""
    steps_per_epoch = max(1, train_records // (config.train_batch_size * num_workers))
    return ModelSettings(
        num_layers=config.num_layers,
        resnet_version=config.resnet_version,
        data_format=config.resolved_data_format(),
        batch_norm_decay=config.batch_norm_decay,
        batch_norm_epsilon=config.batch_norm_epsilon,
        weight_decay=config.weight_decay,
        momentum=config.momentum,
        learning_rate=config.learning_rate,
        lr_boundary_epochs=tuple(config.lr_boundary_epochs),
        lr_decay_factors=tuple(config.lr_decay_factors),
        steps_per_epoch=steps_per_epoch,
        train_batch_size=config.train_batch_size,
        devices=tuple(towers.tower_devices(config.num_gpus, config.num_cpu_towers)),
        variable_strategy=config.variable_strategy,
        num_workers=num_workers,
        sync=config.sync,
        is_chief=is_chief)


def train_and_evaluate(config: TrainConfig) -> TrainResult:
    """Trains, evaluates and (on the chief) exports, as this task's role in TF_CONFIG says."""
    rc = run_config(config)
    if rc.task_type == "ps":
        log.info("parameter server %d of cluster %s", rc.task_id, rc.cluster_spec.as_dict())
        tf.estimator.train_and_evaluate(
            tf.estimator.Estimator(lambda features, labels, mode: None, config=rc),
            tf.estimator.TrainSpec(lambda: None), tf.estimator.EvalSpec(lambda: None))
        return TrainResult(None, None)

    num_workers = rc.num_worker_replicas or 1
    train_data = Cifar10DataSet(config.data_dir, "train", config.use_distortion_for_training)
    eval_data = Cifar10DataSet(config.data_dir, "eval", use_distortion=False)
    train_records = train_data.num_examples()
    settings = model_settings(config, num_workers, rc.is_chief, train_records)
    log.info("ResNet-%d v%d, %s, towers on %s, %d worker(s), %d train records, %d steps per "
             "epoch", config.num_layers, config.resnet_version, settings.data_format,
             ", ".join(settings.devices), num_workers, train_records, settings.steps_per_epoch)

    latest = tf.train.latest_checkpoint(config.job_dir)
    if latest:
        log.info("resuming from %s", latest)
    estimator = tf.estimator.Estimator(make_model_fn(settings), config=rc)
    train_spec = tf.estimator.TrainSpec(
        lambda: train_data.make_batch(config.train_batch_size, seed=config.seed),
        max_steps=config.train_steps)
    eval_spec = tf.estimator.EvalSpec(
        lambda: eval_data.make_batch(config.eval_batch_size),
        steps=None, name=None, start_delay_secs=0, throttle_secs=config.eval_throttle_secs)
    result = tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    metrics = result[0] if result else None

    export_path = None
    if rc.is_chief:
        checkpoint = tf.train.latest_checkpoint(config.job_dir)
        export_path = export.export_saved_model(settings, checkpoint,
                                                config.resolved_export_dir)
        log.info("exported SavedModel to %s", export_path)
    return TrainResult(metrics, export_path)
