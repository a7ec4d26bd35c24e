"""Session hooks: training progress (log lines and TensorBoard throughput), and the chief's
SyncReplicasOptimizer hook.

``ProgressHook`` logs one line about every ``every_secs`` of wall time (not every N steps, so
a slow model does not go quiet and a fast one does not flood the log):
``step 1200/80000 (1.5%), loss 0.5123, lr 0.1: 650.3 images/s, ETA 2:01:33``. The ETA comes
from the recent global-step rate and counts from where this run started, so a resumed run is
right. In a cluster the line adds the cluster's rate: this worker's figure is its local batch
times its local step rate; the cluster's comes from the global step, each global step
consuming ``examples_per_global_step`` examples (one worker batch asynchronously, one batch per
replica with ``SyncReplicasOptimizer``; the original tutorial multiplied the global step rate
by one worker's batch, wrong by the number of workers in both modes). On the chief it also
writes ``images_per_sec`` and ``global_step/sec`` to TensorBoard every ``summary_steps``. At
the end each task logs how many steps it ran itself and its mean rate.

``sync_replicas_hook`` gives each worker its ``SyncReplicasOptimizer`` hook; the chief's is
``SyncReplicasChiefHook``, which does what TensorFlow's does without its 120 s stall at the end
of training (explained in the class).
"""

import logging
import threading
import time
from typing import Optional

import tensorflow as tf

log = logging.getLogger("cifar10_estimator")


def format_duration(seconds: float) -> str:
    """``1:02:03`` for 3723 s; ``0:00:07`` for 7 s; days as ``2d 1:00:00``."""
    seconds = max(0, int(round(seconds)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{days}d {text}" if days else text


def progress_line(global_step: int, total_steps: int, images_per_sec: float,
                  global_steps_per_sec: float, loss: Optional[float] = None,
                  learning_rate: Optional[float] = None,
                  cluster_images_per_sec: Optional[float] = None) -> str:
    """One progress line; the ETA is the steps left at the recent global-step rate."""
    percent = 100.0 * global_step / total_steps if total_steps else 100.0
    line = f"step {global_step}/{total_steps} ({percent:.1f}%)"
    if loss is not None:
        line += f", loss {loss:.4f}"
    if learning_rate is not None:
        line += f", lr {learning_rate:.4g}"
    line += f": {images_per_sec:.1f} images/s"
    if cluster_images_per_sec is not None:
        line += f" on this worker, cluster {cluster_images_per_sec:.1f} images/s"
    left = max(0, total_steps - global_step)
    eta = format_duration(left / global_steps_per_sec) if global_steps_per_sec > 0 else "-"
    return f"{line}, ETA {eta}"


class ProgressHook(tf.estimator.SessionRunHook):
    """Logs progress about every ``every_secs``; writes throughput summaries on the chief."""

    def __init__(self, batch_size: int, total_steps: int, loss: tf.Tensor,
                 learning_rate: tf.Tensor, examples_per_global_step: Optional[int] = None,
                 every_secs: float = 15.0, summary_dir: Optional[str] = None,
                 summary_steps: int = 100, clock=time.perf_counter):
        """
        Args:
          batch_size: examples this worker consumes per step (all its towers).
          total_steps: the global step at which training stops (``--train-steps``).
          loss, learning_rate: scalar tensors shown in the line.
          examples_per_global_step: in a cluster, examples all workers consume per global
            step (adds the cluster's rate); None for a single worker.
          every_secs: wall time between two lines (the first comes after one interval).
          summary_dir: where the chief writes ``images_per_sec`` and ``global_step/sec``;
            None on other tasks.
          summary_steps: global steps between two throughput summaries.
          clock: time source (tests pass their own).
        """
        if every_secs <= 0 or summary_steps < 1:
            raise ValueError("every_secs and summary_steps must be positive")
        self._batch = batch_size
        self._total = total_steps
        self._fetches = {"step": None, "loss": loss, "lr": learning_rate}
        self._per_global_step = examples_per_global_step
        self._every = every_secs
        self._summary_dir = summary_dir
        self._summary_steps = summary_steps
        self._clock = clock

    def begin(self):
        step = tf.compat.v1.train.get_global_step()
        if step is None:
            raise RuntimeError("ProgressHook needs a global step")
        self._fetches["step"] = step
        self._local_steps = 0
        self._first = None  # (time, local steps, global step) after the first step
        self._last_line = None
        self._last_summary = None
        self._last_global = None
        self._writer = (tf.compat.v1.summary.FileWriterCache.get(self._summary_dir)
                        if self._summary_dir else None)

    def before_run(self, run_context):
        return tf.estimator.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        now = self._clock()
        self._local_steps += 1
        values = run_values.results
        # The global step fetched before this step's update: the step just run ends at +1.
        global_step = int(values["step"]) + 1
        self._last_global = global_step
        point = (now, self._local_steps, global_step)
        if self._first is None:  # the first step pays for graph optimisation: not timed
            self._first = self._last_line = self._last_summary = point
            return
        if self._writer is not None and global_step - self._last_summary[2] >= self._summary_steps:
            self._write_summary(point)
        if now - self._last_line[0] >= self._every:
            log.info(self._line(point, self._last_line, values))
            self._last_line = point

    def _rates(self, point, since) -> tuple[float, float]:
        seconds = max(point[0] - since[0], 1e-9)
        return (self._batch * (point[1] - since[1]) / seconds,
                (point[2] - since[2]) / seconds)

    def _line(self, point, since, values) -> str:
        images, global_rate = self._rates(point, since)
        cluster = (None if self._per_global_step is None
                   else self._per_global_step * global_rate)
        return progress_line(point[2], self._total, images, global_rate,
                             float(values["loss"]), float(values["lr"]), cluster)

    def _write_summary(self, point) -> None:
        images, global_rate = self._rates(point, self._last_summary)
        if self._per_global_step is not None:
            images = self._per_global_step * global_rate  # the cluster's throughput
        summary = tf.compat.v1.Summary(value=[
            tf.compat.v1.Summary.Value(tag="images_per_sec", simple_value=images),
            tf.compat.v1.Summary.Value(tag="global_step/sec", simple_value=global_rate)])
        self._writer.add_summary(summary, point[2])
        self._last_summary = point

    def end(self, session):
        if self._first is None:
            log.info("this task ran %d training steps", self._local_steps)
            return
        point = (self._clock(), self._local_steps, self._last_global)
        images, global_rate = self._rates(point, self._first)
        text = (f"this task ran {self._local_steps} training steps of {self._batch} examples "
                f"(global step {self._last_global}): {images:.1f} images/s on average")
        if self._per_global_step is not None:
            text += (f" on this worker, cluster {self._per_global_step * global_rate:.1f} "
                     f"images/s")
        log.info(text)
        if self._writer is not None:
            self._writer.flush()


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
