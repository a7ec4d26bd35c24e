"""Fencing the job dir's lock holder: a chief (or local run) that has lost ``JOB/trainer.lock``
(``jobdir.lock``) ends its session with ``LockLost`` before its next step or checkpoint, and
saves nothing more.
"""

from typing import Optional

import tensorflow as tf

from cifar10_estimator.jobdir.lock import JobLock, LockLost

# The checkpoint cadence of a collective all-reduce task given --save-checkpoints-secs: TF 2.15's
# MonitoredTrainingSession saves every 1000 steps instead (monitored_session.py,
# _create_monitored_session_with_worker_context: "Collective ops may deadlock with
# save_checkpoints_secs").
ALL_REDUCE_SAVE_STEPS = 1000


class LockHook(tf.compat.v1.train.SessionRunHook):
    """Ends a session of the lock's holder once the lock is lost, with ``LockLost``: before
    and after each step on the heartbeat's verdict (no I/O), and re-reading the lock file when
    the session starts and ends.

    An exception from a hook ends a MonitoredSession without its hooks' ``end()`` (TF 2.15's
    ``_MonitoredSession._close_internal`` calls them only when the session closes without
    one), so the checkpoint hook does not save on the way out either.

    An all-reduce task's session gives the checkpoint hook no listener, but runs the given
    hooks before it: with ``save_steps``, this hook keeps the checkpoint hook's step timer and
    re-reads the lock file after each step the checkpoint hook will save, before it does; and
    its ``end()`` comes before the checkpoint hook's final save."""

    def __init__(self, lock: JobLock, save_steps: Optional[int] = None):
        self._lock = lock
        self._timer = (tf.compat.v1.train.SecondOrStepTimer(every_steps=save_steps)
                       if save_steps else None)

    def begin(self):
        self._step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session, coord):
        self._lock.check()
        if self._timer:
            self._timer.update_last_triggered_step(session.run(self._step))

    def before_run(self, run_context):
        self._lock.check(read=False)
        return tf.estimator.SessionRunArgs(self._step) if self._timer else None

    def after_run(self, run_context, run_values):
        # The step read before the update: the step just run ends one later.
        step = int(run_values.results) + 1 if self._timer else None
        if step is not None and self._timer.should_trigger_for_step(step):
            self._timer.update_last_triggered_step(step)
            self._lock.check()  # the checkpoint hook saves this step next
        else:
            self._lock.check(read=False)

    def end(self, session):
        self._lock.check()


class LockListener(tf.compat.v1.train.CheckpointSaverListener):
    """Re-reads the lock file right before each checkpoint is saved (the checkpoint hook calls
    its listeners' ``before_save`` first, then saves): a holder that lost the lock saves nothing
    more, whenever its heartbeat would have noticed. Also before the final evaluation, which a
    local run's evaluation listener runs in ``end``, after this one."""

    def __init__(self, lock: JobLock):
        self._lock = lock

    def before_save(self, session, global_step_value):
        self._lock.check()

    def end(self, session, global_step_value):
        self._lock.check()


def lock_loss(error: Optional[BaseException]) -> Optional[LockLost]:
    """The ``LockLost`` behind ``error``: a hook's, which the conversion of training errors to
    one line on their way out (``guards.training_errors``) may have replaced."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, LockLost):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
