"""Values that change with the global step: the learning rate and the batch-norm decay."""

from typing import Sequence

import tensorflow as tf


def learning_rate_schedule(global_step: tf.Tensor, learning_rate: float,
                           boundary_epochs: Sequence[float], decay_factors: Sequence[float],
                           steps_per_epoch: int) -> tf.Tensor:
    """Piecewise-constant learning rate: base x factor[i] from epoch boundary[i-1] on.

    The tutorial took tensorpack's cifar10-resnet schedule: x1, 0.1, 0.01, 0.002 at epochs 82,
    123 and 300 (82 and 123 epochs are the paper's 32k and 48k iterations at batch 128 on 45k
    images, He et al. 2015, section 4.2).
    """
    boundaries = [int(steps_per_epoch * e) for e in boundary_epochs]
    values = [learning_rate * f for f in decay_factors]
    return tf.compat.v1.train.piecewise_constant(global_step, boundaries, values)


def batch_norm_decay_schedule(global_step: tf.Tensor, decay: float) -> tf.Tensor:
    """The batch-norm moving-average decay at this step: min(decay, (1 + t) / (10 + t)).

    The moving statistics start at mean 0 and variance 1. With a fixed decay of 0.997 they
    still hold 0.997^t of those start values after t steps (15 % after 624 steps), which
    ruins evaluation after short runs on images whose activations are far from that start
    (e.g. mostly black pictures); CIFAR's zero-centred inputs hide it. A decay that grows with
    the step, as ``tf.compat.v1.train.ExponentialMovingAverage`` does with ``num_updates``,
    forgets the start values within a few steps and equals ``decay`` from t = (10 decay - 1)
    / (1 - decay) on (2,990 steps for 0.997), so long runs are unchanged.
    """
    t = tf.cast(global_step, tf.float32)
    return tf.minimum(tf.constant(decay, tf.float32), (1.0 + t) / (10.0 + t),
                      name="batch_norm_decay")
