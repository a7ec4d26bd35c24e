"""The exporter Estimator calls after each local evaluation (``EvalSpec.exporters``): the one
callback ``train_and_evaluate`` offers with an evaluation's figures and its checkpoint, which
the trainer uses to log the evaluation and to consider the checkpoint for ``--export-best``."""

from typing import Callable, Optional

import tensorflow as tf

from cifar10_estimator.jobdir.lock import JobLock


class AfterEvaluation(tf.estimator.Exporter):
    """Hands each evaluation's figures and checkpoint path to ``see``, once the job dir's
    ``lock`` (if any) is still held: nothing is exported once the lock is lost. ``name`` is
    the folder Estimator would give an export (``export/<name>``)."""

    def __init__(self, name: str, see: Callable[[dict, str], object],
                 lock: Optional[JobLock] = None):
        self._name, self._see, self._lock = name, see, lock

    @property
    def name(self) -> str:
        return self._name

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        if self._lock is not None:
            self._lock.check()
        return self._see(eval_result, checkpoint_path)
