"""Synchronous training's session hooks: each worker's ``SyncReplicasOptimizer`` hook.

``sync_replicas_hook`` gives each worker its hook; the chief's is ``SyncReplicasChiefHook``, which
does what TensorFlow's does without its 120 s stall at the end of training (explained in the
class).
"""

import threading

import tensorflow as tf


class SyncReplicasChiefHook(tf.estimator.SessionRunHook):
    """The chief's ``SyncReplicasOptimizer`` hook, without the stall at the end of training.

    It runs what ``SyncReplicasOptimizer.make_session_run_hook(is_chief=True)`` runs after the
    session is created (the chief's init op and the initial tokens), then applies the
    aggregated gradients in a loop on a thread of its own.

    Why not TensorFlow's hook: ``_SyncReplicasOptimizerHook.after_create_session``
    (tensorflow/python/training/sync_replicas_optimizer.py, TF 2.15) starts the chief's
    ``QueueRunner`` with the session's Coordinator, which registers the thread. That thread
    runs ``sync_op`` forever, and ``sync_op`` first blocks in ``ConditionalAccumulator.take_grad``
    until ``replicas_to_aggregate`` gradients arrive. After the last step none arrive. At the
    end of training ``_CoordinatedSession.close`` (tensorflow/python/training/
    monitored_session.py) asks the Coordinator to stop and joins its registered threads with
    ``stop_grace_period_secs``, 120 s by default, before it closes the session; the QueueRunner's
    stop handler only closes ``sync_token_q``, which does not wake ``take_grad`` (it waits on an
    accumulator, not the queue). Estimator passes no grace period to ``MonitoredTrainingSession``
    (tensorflow_estimator/python/estimator/estimator.py), so every sync run sat out the full
    120 s, and only then did closing the session cancel the blocked op.

    Here the thread is not registered with the Coordinator, so closing begins at once, and
    closing the session cancels the pending ``take_grad`` (a session's Close cancels its
    running steps); the thread then sees the cancellation and ends. Errors while training are
    still reported to the Coordinator, as the QueueRunner did. The token queue is deliberately
    left open: it lives on the parameter server, and a closed queue there would refuse the
    tokens of a restarted chief.
    """

    def __init__(self, optimizer: tf.compat.v1.train.SyncReplicasOptimizer, num_tokens: int):
        """
        Args:
          optimizer: the SyncReplicasOptimizer, after ``apply_gradients``.
          num_tokens: tokens the chief puts in the queue at start (-1: one per replica to
            aggregate, TensorFlow's default; 0: the first step waits for every replica).
        """
        self._optimizer = optimizer
        self._num_tokens = num_tokens
        self._stopping = threading.Event()
        self._thread = None

    def begin(self):
        opt = self._optimizer
        self._ready_op = opt.ready_for_local_init_op
        self._init_op = opt.chief_init_op
        self._init_tokens_op = opt.get_init_tokens_op(self._num_tokens)
        # The queue runner's only op: take the aggregated gradients, apply them, add tokens.
        self._sync_op = opt.get_chief_queue_runner().enqueue_ops[0]

    def after_create_session(self, session, coord):
        not_ready = session.run(self._ready_op)
        if len(not_ready):
            raise RuntimeError("variables not initialised before SyncReplicasOptimizer's init: "
                               + ", ".join(v.decode() for v in not_ready))
        session.run(self._init_op)
        session.run(self._init_tokens_op)
        self._stopping.clear()
        self._thread = threading.Thread(target=self._apply_loop, args=(session, coord),
                                        name="sync_replicas_apply", daemon=True)
        self._thread.start()

    def _apply_loop(self, session, coord):
        try:
            apply = session.make_callable(self._sync_op)
            while not (self._stopping.is_set() or coord.should_stop()):
                apply()
        except tf.errors.CancelledError:
            pass  # the session was closed: end of training, or recovery from an error
        except Exception as e:  # noqa: BLE001 - reported to the training loop instead
            if not (self._stopping.is_set() or coord.should_stop()):
                coord.request_stop(e)

    def end(self, session):
        self._stopping.set()


def sync_replicas_hook(optimizer: tf.compat.v1.train.SyncReplicasOptimizer, is_chief: bool,
                       num_tokens: int = -1) -> tf.estimator.SessionRunHook:
    """The SyncReplicasOptimizer hook for one worker (every worker needs one, chief included:
    a worker's initialises its local step; the chief's also applies the gradients)."""
    if is_chief:
        return SyncReplicasChiefHook(optimizer, num_tokens)
    return optimizer.make_session_run_hook(False, num_tokens)
