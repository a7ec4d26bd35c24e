"""Precise batch norm: each checkpoint's batch-norm statistics, recomputed with its weights before
it is saved.

During training the moving statistics trail the weights: each is an exponential average of
batch statistics taken while the weights were still changing, and after a short run they still
carry their start values (Wu and Johnson 2021, "Rethinking 'Batch' in BatchNorm",
arXiv:2105.07576, section 3). Before a checkpoint is written, ``PreciseBatchNorm`` runs
the network in training mode over ``batches`` training batches, without updating the weights,
and sets each statistic to the plain mean of the batches' values: the model_fn's decay becomes
k / (k + 1) at batch k (``model.graph.PRECISE_BN_COUNT``). The evaluations, the evaluator task and
the export all read the checkpoints.

It runs in the chief's checkpoint hook, in the training session right before every save but
two: the one at the session's start (the statistics as they were restored) and a save for a
signal, which must stay quick. So every checkpoint, and every evaluation of one, has the
statistics of its own weights: the moving averages trail weights that change fast under a high
learning rate, and on Fashion-MNIST evaluations mid-run read far below the same weights with
precise statistics (docs/training.md, "Batch-norm decay"). Training itself uses
batch statistics and never reads the moving ones, so it is unchanged.

The hook (``CheckpointHook``) is also the chief's checkpoint hook of an asynchronous cluster,
with or without precise batch norm, where the other workers' updates go on landing while the
chief saves: it reads the global step again after a recompute, names the checkpoint after the
step it holds, and saves no checkpoint after the first one at or past the final step, the one
the evaluator task takes as final.
"""

import logging
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from cifar10_estimator.model.graph import PRECISE_BN_COUNT, PRECISE_BN_UPDATES

log = logging.getLogger("cifar10_estimator")
# The batch-norm statistics' variable names end so (model.resnet).
MOVING_STATISTICS = ("/moving_mean", "/moving_variance")


class PreciseBatchNorm:
    """Recomputes the batch-norm statistics over ``batches`` batches before each save."""

    def __init__(self, batches: int, final_step: int, skip: Callable[[], bool] = lambda: False):
        """
        Args:
          batches: training batches to average the statistics over.
          final_step: the run's last step (its save is logged).
          skip: says to leave a save alone (a save for a signal, which must be quick).
        """
        self.batches = batches
        self.final_step = final_step
        self.skip = skip
        self.seconds: Optional[float] = None  # how long the final save's recompute took

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        # One per replica under a tf.distribute strategy: each replica's decay must be fed.
        self._counts = graph.get_collection(PRECISE_BN_COUNT)
        self._updates = graph.get_collection(PRECISE_BN_UPDATES)
        self._first = True
        # Weights about to diverge can give infinite statistics while still finite
        # themselves: such statistics are put back as they were, not saved.
        self._moving = [v for v in tf.compat.v1.global_variables()
                        if v.op.name.endswith(MOVING_STATISTICS)]
        if self._moving:
            self._finite = tf.reduce_all(
                tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in self._moving]))
            self._kept = [tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape)
                          for v in self._moving]
            self._put_back = tf.group(*[v.assign(k) for v, k in zip(self._moving, self._kept)])

    def before_save(self, session, global_step_value: int) -> bool:
        """Recomputes the statistics unless this save should keep them; says whether it did."""
        first, self._first = self._first, False
        # The save at the session's start holds the statistics as they were restored.
        if first or not self._updates or self.skip():
            return False
        started = time.monotonic()
        before = session.run(self._moving)
        for k in range(self.batches):
            session.run(self._updates, feed_dict={count: float(k) for count in self._counts})
        if not session.run(self._finite):
            session.run(self._put_back, feed_dict=dict(zip(self._kept, before)))
            log.warning("precise batch norm: the weights of step %d give statistics that are "
                        "not finite; the checkpoint keeps the moving averages",
                        global_step_value)
            return False
        seconds = time.monotonic() - started
        if global_step_value >= self.final_step and self.seconds is None:
            self.seconds = seconds
            log.info("precise batch norm: statistics of the final weights over %d training "
                     "batches (%.1f s)", self.batches, seconds)
        return True


class CheckpointHook(tf.compat.v1.train.CheckpointSaverHook):
    """The chief's checkpoint hook, as Estimator would make it, with precise batch norm in it
    (``precise``, or None without) and one final checkpoint.

    Given among the training hooks, it takes the place of Estimator's own, and Estimator adds
    its own listeners (a local run's evaluations) to it. In an asynchronous cluster the other
    workers go on updating after the chief's save at the final step: TF 2.15's hook would save
    again at its end, under a later step, after the evaluator has taken the first save, the
    first checkpoint at or past ``final_step``, as the final one. This hook ends with that save.
    """

    def __init__(self, job_dir: str, save_secs: Optional[int], save_steps: Optional[int],
                 final_step: int, precise: Optional[PreciseBatchNorm] = None,
                 listeners: Sequence[tf.compat.v1.train.CheckpointSaverListener] = ()):
        # ``listeners``: given here as well as to Estimator, for the sessions where Estimator
        # adds none (a multi-worker strategy's); Estimator does not add one twice.
        super().__init__(job_dir, save_secs=save_secs, save_steps=save_steps,
                         save_graph_def=False, listeners=list(listeners))
        self._final_step = final_step
        self._precise = precise

    def begin(self):
        super().begin()
        if self._precise:
            self._precise.begin()

    def _save(self, session, step):
        # TF 2.15's CheckpointSaverHook reads the step before its listeners run, and a
        # recompute of seconds lets another worker's update land in between.
        if self._precise and self._precise.before_save(session, step):
            step = session.run(self._global_step_tensor)
            self._timer.update_last_triggered_step(step)  # so that end() does not save it twice
        return super()._save(session, step)

    def end(self, session):
        saved = self._timer.last_triggered_step()
        if saved is None or saved < self._final_step:
            return super().end(session)
        for listener in self._listeners:  # the final checkpoint is saved: no second one
            listener.end(session, saved)
