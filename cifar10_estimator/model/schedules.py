"""Values that change with the global step: the learning rate and the batch-norm decay.

Learning-rate schedules, all counted in global steps and epochs of the training file:

- ``piecewise``: the paper's; the peak rate times one factor per phase, changing at epoch
  boundaries (He et al. 2015, section 4.2, by way of tensorpack's cifar10-resnet).
- ``he``: the paper's proportions of any run: the peak, a tenth of it from half the run's
  steps and a hundredth from three quarters (He et al. 2015, section 4.2: 32k and 48k of 64k
  iterations; ``config.settings``' HE_*).
- ``cosine``: half a cosine from the peak down to 0 at the run's last step (Loshchilov and
  Hutter 2017, "SGDR", arXiv:1608.03983, without restarts).
- ``triangular``: linear up from a fifth of the peak to the peak over a fifth of the run, then
  linear down to 0 at its last step (airbench's, Jordan 2024; ``config.settings``'
  TRIANGULAR_*).
- ``one-cycle``: linear up from a fraction of the peak to the peak, then half a cosine down to
  a far smaller fraction at the last step (Smith and Topin 2017, "Super-Convergence",
  arXiv:1708.07120; the fractions and the rising share are ``config.settings``' ONE_CYCLE_*,
  PyTorch's ``OneCycleLR`` defaults).

The schedule's numbers (its peak, scaled to the global batch; its drops in global steps; the
warm-up's steps; the run's length) are the plan's (``config.plan.Schedule``): this module turns
them into tensors.

A warm-up (``warmup_epochs``; Goyal et al. 2017, "Accurate, Large Minibatch SGD",
arXiv:1706.02677) scales the rate linearly from 0 to full over its epochs: for ``piecewise``
and ``he`` it ramps the first phase, whose boundaries stay where they are; ``cosine`` starts
its decay after it; for ``one-cycle`` and ``triangular`` it sets the length of the rise.
"""

import math

import tensorflow as tf

from cifar10_estimator.config.plan import Schedule
from cifar10_estimator.config.settings import (ONE_CYCLE_END_DIVISOR, ONE_CYCLE_RISE,
                                               ONE_CYCLE_START_DIVISOR, TRIANGULAR_RISE,
                                               TRIANGULAR_START)


def learning_rate(global_step: tf.Tensor, schedule: Schedule) -> tf.Tensor:
    """The learning rate of ``schedule`` at ``global_step``."""
    step = tf.cast(global_step, tf.float32)
    peak, warmup, total = schedule.peak, schedule.warmup_steps, schedule.total_steps
    if schedule.kind == "one-cycle":
        return _one_cycle(step, peak, warmup or ONE_CYCLE_RISE * total, total)
    if schedule.kind == "triangular":
        rise = warmup or TRIANGULAR_RISE * total
        up = peak * (TRIANGULAR_START + (1.0 - TRIANGULAR_START)
                     * tf.minimum(step / max(rise, 1.0), 1.0))
        down = peak * tf.clip_by_value((total - step) / max(total - rise, 1.0), 0.0, 1.0)
        return tf.where(step < rise, up, down)
    if schedule.kind == "cosine":
        progress = tf.clip_by_value((step - warmup) / max(total - warmup, 1.0), 0.0, 1.0)
        rate = peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
    elif not schedule.boundaries:  # piecewise_constant needs one boundary at least
        rate = tf.constant(peak * schedule.factors[0], tf.float32)
    else:
        values = [peak * f for f in schedule.factors]
        rate = tf.cast(tf.compat.v1.train.piecewise_constant(
            global_step, list(schedule.boundaries), values), tf.float32)
    if warmup > 0:
        # Step 0 already trains: (step + 1) / warmup reaches the peak at the warm-up's end.
        rate *= tf.minimum(1.0, (step + 1.0) / warmup)
    return rate


def _one_cycle(step: tf.Tensor, peak: float, rise: float, total: int) -> tf.Tensor:
    start, end = peak / ONE_CYCLE_START_DIVISOR, peak / ONE_CYCLE_END_DIVISOR
    up = start + (peak - start) * tf.minimum(step / max(rise, 1.0), 1.0)
    progress = tf.clip_by_value((step - rise) / max(total - rise, 1.0), 0.0, 1.0)
    down = end + (peak - end) * 0.5 * (1.0 + tf.cos(math.pi * progress))
    return tf.where(step < rise, up, down)


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
