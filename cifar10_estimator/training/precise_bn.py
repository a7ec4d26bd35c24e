"""Precise batch norm: the final checkpoint's batch-norm statistics, recomputed with the final
weights before it is saved.

During training the moving statistics trail the weights: each is an exponential average of
batch statistics taken while the weights were still changing, and after a short run they still
carry their start values (Wu and Johnson 2021, "Rethinking 'Batch' in BatchNorm",
arXiv:2105.07576, section 3). Before the final checkpoint is written, ``PreciseBatchNorm`` runs
the network in training mode over ``batches`` training batches, without updating the weights,
and sets each statistic to the plain mean of the batches' values: the model_fn's decay becomes
k / (k + 1) at batch k (``model_fn.PRECISE_BN_COUNT``). The final evaluation, the evaluator
task and the export all read that checkpoint.

It runs in the chief's checkpoint hook, in the training session right before a save: on the save
at or past the last step only (a save for a signal, earlier, stays quick). In an asynchronous
cluster the other workers' last updates can land while the statistics are recomputed, so the hook
reads the global step again afterwards and names the checkpoint after the step it holds.
"""

import logging
import time
from typing import Optional

import tensorflow as tf

from cifar10_estimator.model.model_fn import PRECISE_BN_COUNT, PRECISE_BN_UPDATES

log = logging.getLogger("cifar10_estimator")


class PreciseBatchNorm:
    """Recomputes the batch-norm statistics over ``batches`` batches at the final save."""

    def __init__(self, batches: int, final_step: int):
        self.batches = batches
        self.final_step = final_step
        self.seconds: Optional[float] = None  # how long it took, once done

    def begin(self):
        graph = tf.compat.v1.get_default_graph()
        self._count = graph.get_collection(PRECISE_BN_COUNT)[0]
        self._updates = graph.get_collection(PRECISE_BN_UPDATES)

    def before_save(self, session, global_step_value: int) -> bool:
        """Recomputes the statistics if this is the final save; says whether it did."""
        if self.seconds is not None or global_step_value < self.final_step:
            return False
        started = time.monotonic()
        for k in range(self.batches):
            session.run(self._updates, feed_dict={self._count: float(k)})
        self.seconds = time.monotonic() - started
        log.info("precise batch norm: statistics of the final weights over %d training batches "
                 "(%.1f s)", self.batches, self.seconds)
        return True


class CheckpointHook(tf.compat.v1.train.CheckpointSaverHook):
    """The chief's checkpoint hook, as Estimator would make it, with precise batch norm in it.

    Given among the training hooks, it takes the place of Estimator's own, and Estimator adds
    its own listeners (a local run's evaluations) to it.
    """

    def __init__(self, job_dir: str, save_secs: Optional[int], save_steps: Optional[int],
                 precise: PreciseBatchNorm):
        super().__init__(job_dir, save_secs=save_secs, save_steps=save_steps,
                         save_graph_def=False)
        self._precise = precise

    def begin(self):
        super().begin()
        self._precise.begin()

    def _save(self, session, step):
        # The one override: TF 2.15's CheckpointSaverHook reads the step before its listeners
        # run, and a recompute of seconds lets another worker's update land in between.
        if self._precise.before_save(session, step):
            step = session.run(self._global_step_tensor)
            self._timer.update_last_triggered_step(step)  # so that end() does not save it twice
        return super()._save(session, step)
