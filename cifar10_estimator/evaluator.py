"""The evaluator task of a cluster: evaluate checkpoints as they appear, end with the final one.

``tf.estimator.train_and_evaluate`` on an evaluator task (TF 2.15,
``_TrainingExecutor._start_continuous_evaluation``) sleeps out ``throttle_secs`` after every
evaluation, even when the checkpoint that ends training is already there: with the default
600 s a job that trains for 20 s "runs" 10 more minutes, and Kubeflow's operator, which calls
the job done when the chief succeeds, may delete the evaluator before its final evaluation.
It also crashes if ``keep_checkpoint_max`` deletes a checkpoint between finding and reading it.

``evaluate_checkpoints`` replaces that loop with the same public ``Estimator.evaluate`` calls:

- It polls the job dir every ``poll_secs`` for the latest checkpoint.
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
from typing import Callable, Optional

import tensorflow as tf

log = logging.getLogger("cifar10_estimator")


def checkpoint_step(checkpoint_path: str) -> int:
    """The global step in a checkpoint path (``.../model.ckpt-1200`` -> 1200)."""
    return int(checkpoint_path.rsplit("-", 1)[1])


def checkpoint_gone(checkpoint_path: str) -> bool:
    """True once a checkpoint's files are deleted (as ``--keep-checkpoint-max`` does)."""
    return not tf.io.gfile.glob(checkpoint_path + ".index")


def evaluate_checkpoints(estimator: tf.estimator.Estimator, input_fn: Callable,
                         train_steps: int, throttle_secs: float, poll_secs: float = 1.0,
                         clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], None] = time.sleep,
                         on_evaluation: Optional[Callable[[dict, str], object]] = None) -> dict:
    """Evaluates the job's checkpoints until the final one; returns the final metrics.

    Args:
      estimator: the Estimator whose ``model_dir`` the chief writes checkpoints to.
      input_fn: the evaluation input function.
      train_steps: the global step at which training ends (``--train-steps``).
      throttle_secs: minimum seconds between the starts of two evaluations while training
        runs; the final checkpoint is evaluated at once.
      poll_secs: how often to look for a new checkpoint.
      clock, sleep: time sources (tests pass their own).
      on_evaluation: called with the metrics and the checkpoint path after each evaluation.
    """
    model_dir = estimator.model_dir
    last_path: Optional[str] = None
    last_started: Optional[float] = None
    waiting_logged = None
    while True:
        path = tf.train.latest_checkpoint(model_dir)
        if path and path != last_path:
            step = checkpoint_step(path)
            final = step >= train_steps
            due = last_started is None or clock() - last_started >= throttle_secs
            if final or due:
                started = clock()
                try:
                    metrics = estimator.evaluate(input_fn, checkpoint_path=path)
                except (tf.errors.NotFoundError, ValueError):
                    if not checkpoint_gone(path):
                        raise
                    # --keep-checkpoint-max removed it after it was listed: the next one
                    # is newer anyway.
                    log.info("checkpoint %s was deleted before it could be evaluated "
                             "(--keep-checkpoint-max); skipping it", os.path.basename(path))
                    last_path = path
                    continue
                last_path, last_started = path, started
                if on_evaluation is not None:
                    on_evaluation(metrics, path)
                if final:
                    return metrics
            elif waiting_logged != path:
                log.info("checkpoint at step %d: evaluating it (or a newer one) in %.0f s "
                         "(--eval-throttle-secs); the final checkpoint is evaluated at once",
                         step, throttle_secs - (clock() - last_started))
                waiting_logged = path
        sleep(poll_secs)
