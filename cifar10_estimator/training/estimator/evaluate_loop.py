"""The evaluator task of a cluster: evaluate checkpoints as they appear, end with the final one.

``tf.estimator.train_and_evaluate`` on an evaluator task (TF 2.15,
``_TrainingExecutor._start_continuous_evaluation``) sleeps out ``throttle_secs`` after every
evaluation, even when the checkpoint that ends training is already there: with the default
600 s a job that trains for 20 s "runs" 10 more minutes, and Kubeflow's operator, which calls
the job done when the chief succeeds, may delete the evaluator before its final evaluation.
It also crashes if ``keep_checkpoint_max`` deletes a checkpoint between finding and reading it.

``evaluate_checkpoints`` replaces that loop with the same public ``Estimator.evaluate`` calls:

- It waits for the job dir's newest checkpoint with TensorFlow's own poll
  (``tf.train.checkpoints_iterator``).
- While training runs, it evaluates a new checkpoint at most every ``throttle_secs``.
- It evaluates the final checkpoint (global step >= ``train_steps``) as soon as it exists,
  whatever the throttle, and returns its metrics.
- A checkpoint deleted before it could be read is skipped with one log line.
- ``on_evaluation(metrics, checkpoint_path)``, if given, runs after every evaluation (the
  best-export of ``--export-best``).

The results go to ``JOB/eval`` for TensorBoard, as Estimator's own loop writes them.
"""

import logging
import os
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from cifar10_estimator.model.checkpoints import checkpoint_gone, checkpoint_step

log = logging.getLogger("cifar10_estimator")

# How long one wait of TensorFlow's checkpoint poll lasts before it hands control back (to see
# whether a checkpoint held back by the throttle is due): it looks every second, so at least
# two, or it returns without sleeping and the loop spins.
_WAIT_SECS = 2


def evaluate_checkpoints(estimator: tf.estimator.Estimator, input_fn: Callable,
                         train_steps: int, throttle_secs: float,
                         on_evaluation: Optional[Callable[[dict, str], object]] = None,
                         hooks: Sequence[tf.estimator.SessionRunHook] = ()) -> dict:
    """Evaluates the job's checkpoints until the final one; returns the final metrics.

    Args:
      estimator: the Estimator whose ``model_dir`` the chief writes checkpoints to.
      input_fn: the evaluation input function.
      train_steps: the global step at which training ends (``--train-steps``).
      throttle_secs: minimum seconds between the starts of two evaluations while training
        runs; the final checkpoint is evaluated at once.
      on_evaluation: called with the metrics and the checkpoint path after each evaluation.
      hooks: session hooks of every evaluation.
    """
    evaluated: Optional[str] = None  # the last checkpoint evaluated (or skipped as deleted)
    waiting: Optional[str] = None  # a newer one that waits for the throttle
    last_started: Optional[float] = None

    def due() -> bool:
        return last_started is None or time.monotonic() - last_started >= throttle_secs

    def waited_enough() -> bool:  # ends the iterator's wait once a waiting checkpoint is due
        return waiting is not None and due()

    while True:
        path = None
        for found in tf.train.checkpoints_iterator(estimator.model_dir, timeout=_WAIT_SECS,
                                                   timeout_fn=waited_enough):
            if found == evaluated:
                continue
            if checkpoint_step(found) >= train_steps or due():
                path = found
                break
            if found != waiting:
                waiting = found
                log.info("checkpoint at step %d: evaluating it (or a newer one) in %.0f s "
                         "(--eval-throttle-secs); the final checkpoint is evaluated at once",
                         checkpoint_step(found), throttle_secs - (time.monotonic() - last_started))
        path = path or tf.train.latest_checkpoint(estimator.model_dir)  # the newest, now due
        waiting = None
        started = time.monotonic()
        try:
            metrics = estimator.evaluate(input_fn, checkpoint_path=path, hooks=hooks)
        except (tf.errors.NotFoundError, ValueError):
            if not checkpoint_gone(path):
                raise
            # --keep-checkpoint-max removed it after it was listed: the next one is newer.
            log.info("checkpoint %s was deleted before it could be evaluated "
                     "(--keep-checkpoint-max); skipping it", os.path.basename(path))
            evaluated = path
            continue
        evaluated, last_started = path, started
        if on_evaluation is not None:
            on_evaluation(metrics, path)
        if checkpoint_step(path) >= train_steps:
            return metrics
