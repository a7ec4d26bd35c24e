"""The input_fns Estimator calls: a worker's shard of the training records, or under a
tf.distribute strategy one pipeline per worker of one replica's batches; the evaluation's
batches in file order."""

from typing import Callable, Optional

import tensorflow as tf

from cifar10_estimator.config.plan import Plan
from cifar10_estimator.data.pipeline import Cifar10DataSet


def train_input_fn(data: Cifar10DataSet, plan: Plan, seed: Optional[int]) -> Callable:
    """The training input_fn of ``plan``'s task over ``data``: this worker's shard of the
    records, shuffled and augmented from ``seed``; under a tf.distribute strategy, Estimator
    calls it per input pipeline for batches of one replica's share."""
    if plan.towers:
        shard = ((plan.role.num_trainers, plan.role.trainer_index) if plan.role.in_cluster
                 else (1, 0))
        return lambda: data.make_batch(plan.worker_batch, seed=seed, shard=shard)

    def input_fn(input_context: tf.distribute.InputContext):
        # One pipeline per worker, each batch one replica's share.
        return data.make_batch(
            plan.replica_batch, seed=seed,
            shard=(input_context.num_input_pipelines, input_context.input_pipeline_id))
    return input_fn


def eval_input_fn(data: Cifar10DataSet, batch_size: int) -> Callable:
    """The evaluation input_fn: every record of ``data`` once, in batches of ``batch_size``."""
    return lambda: data.make_batch(batch_size)
