"""Lookahead (Zhang, Lucas, Hinton and Ba 2019, "Lookahead Optimizer: k steps forward, 1 step
back", arXiv:1907.08610, Algorithm 1) around the momentum update, in graph mode.

The optimizer's weights are the fast ones. Every ``k`` global steps the slow weights (one
non-trainable copy per trainable variable, ``<variable>/lookahead_slow``, kept in the
checkpoints so that a resumed run goes on where it stopped) move ``alpha`` of the way towards
them, and the fast weights restart from the slow ones. The momentum buffers are kept, as the
paper's experiments do by default.
"""

from typing import Sequence

import tensorflow as tf

SLOW_SUFFIX = "lookahead_slow"


def step(apply_op: tf.Operation, weights: Sequence[tf.Variable], global_step: tf.Variable,
         k: int, alpha: float) -> tf.Operation:
    """An op that runs ``apply_op`` (which advances ``global_step``) and then, when the new
    step is a multiple of ``k``, the slow weights' update and the fast weights' reset."""
    slow = []
    for weight in weights:
        # Placed with its weight; starts at the weight's own initial value: the same tensor,
        # which the one run of the variables' initialiser computes once for both.
        with tf.compat.v1.colocate_with(weight):
            slow.append(tf.compat.v1.get_variable(
                f"{weight.op.name}/{SLOW_SUFFIX}", initializer=weight.initial_value,
                trainable=False))

    def synchronise():
        updates = []
        for fast, copy in zip(weights, slow):
            moved = copy + alpha * (fast - copy)
            updates.append(tf.group(copy.assign(moved), fast.assign(moved)))
        return tf.group(*updates)

    with tf.control_dependencies([apply_op]):
        return tf.cond(tf.equal(global_step.read_value() % k, 0), synchronise, tf.no_op,
                       name="lookahead")
