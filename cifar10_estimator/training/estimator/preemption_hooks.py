"""The session hooks of a preemption (``training.preemption.Preemption``): they tell the task's
signal state whether a training session or an evaluation runs, and stop a training session
after the step in flight once SIGTERM or SIGINT came (the checkpoint hook then saves that step
on the way out)."""

import tensorflow as tf


class TrainingHook(tf.estimator.SessionRunHook):
    """Marks a training session for ``preemption``; with ``stop``, asks the session to stop
    after the step in flight once a signal came (an all-reduce job stops at a step its tasks
    agree on instead: ``cluster_hooks.AgreedStopHook``)."""

    def __init__(self, preemption, stop: bool = True):
        self._p = preemption
        self._stop = stop

    def begin(self):
        self._step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self._p.training = True
        self._p.check()  # a signal during start-up

    def before_run(self, run_context):
        return tf.estimator.SessionRunArgs(self._step)

    def after_run(self, run_context, run_values):
        # The step read before the update: the step just run ends one later.
        self._p.last_step = int(run_values.results) + 1
        if self._p.signum is not None and self._stop:
            run_context.request_stop()

    def end(self, session):
        self._p.training = False


class EvaluationHook(tf.estimator.SessionRunHook):
    """Marks an evaluation, which a signal ends at once (and which does not start after one:
    a local run's final evaluation is skipped)."""

    def __init__(self, preemption):
        self._p = preemption

    def begin(self):
        self._p.check()
        self._p.evaluating = True

    def end(self, session):
        self._p.evaluating = False
