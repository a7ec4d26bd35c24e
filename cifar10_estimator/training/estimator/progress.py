"""Training progress a person can watch: log lines with step/total, images/s and ETA, and
TensorBoard's throughput scalars.

``ProgressHook`` logs its first line about 5 s after the first step, then one about every
``every_secs`` of wall time (not every N steps, so a slow model does not go quiet and a fast one
does not flood the log):
``step 1200/80000 (1.5%), loss 0.5123, lr 0.1: 650.3 images/s, ETA 2:01:33``. The ETA comes
from the recent global-step rate and counts from where this run started, so a resumed run is
right. In a cluster the line adds the cluster's rate: this worker's figure is its local batch
times its local step rate; the cluster's comes from the global step, each global step
consuming ``examples_per_global_step`` examples (one worker batch asynchronously, one batch per
replica with ``SyncReplicasOptimizer``; the original tutorial multiplied the global step rate
by one worker's batch, wrong by the number of workers in both modes). On the chief it also
writes ``images_per_sec`` and ``global_step/sec`` to TensorBoard every ``summary_steps``. At
the end each task logs how many steps it ran itself and its mean rate.

The hook finds the loss and the learning rate by the names ``model.graph`` gives them, so the
model needs to know nothing of progress reporting.
"""

import datetime
import logging
import time
from typing import Optional

import tensorflow as tf

from cifar10_estimator.model import graph as model_graph

log = logging.getLogger("cifar10_estimator")
# Seconds from the first (timed) step to the first line.
FIRST_LINE_SECS = 5.0


def format_duration(seconds: float) -> str:
    """Whole seconds as ``datetime.timedelta`` prints them: ``2:01:33``, ``1 day, 2:00:00``."""
    return str(datetime.timedelta(seconds=max(0, round(seconds))))


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

    def __init__(self, batch_size: int, total_steps: int,
                 examples_per_global_step: Optional[int] = None,
                 every_secs: float = 15.0, summary_dir: Optional[str] = None,
                 summary_steps: int = 100, clock=time.perf_counter):
        """
        Args:
          batch_size: examples this worker consumes per step (all its towers).
          total_steps: the global step at which training stops (``--train-steps``).
          examples_per_global_step: in a cluster, examples all workers consume per global
            step (adds the cluster's rate); None for a single worker.
          every_secs: wall time between two lines (the first comes after
            ``FIRST_LINE_SECS``, or one interval if that is shorter).
          summary_dir: where the chief writes ``images_per_sec`` and ``global_step/sec``;
            None on other tasks.
          summary_steps: global steps between two throughput summaries.
          clock: time source (tests pass their own).
        """
        if every_secs <= 0 or summary_steps < 1:
            raise ValueError("every_secs and summary_steps must be positive")
        self._batch = batch_size
        self._total = total_steps
        self._per_global_step = examples_per_global_step
        self._every = every_secs
        self._summary_dir = summary_dir
        self._summary_steps = summary_steps
        self._clock = clock

    def begin(self):
        step = tf.compat.v1.train.get_global_step()
        if step is None:
            raise RuntimeError("ProgressHook needs a global step")
        graph = tf.compat.v1.get_default_graph()
        self._fetches = {"step": step,
                         "loss": graph.get_tensor_by_name(model_graph.LOSS_TENSOR),
                         "lr": graph.get_tensor_by_name(model_graph.LEARNING_RATE_TENSOR)}
        self._local_steps = 0
        self._lines = 0
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
        # The first line comes soon (the first ETA is the one a user waits for), then one
        # every interval.
        due = self._every if self._lines else min(FIRST_LINE_SECS, self._every)
        if now - self._last_line[0] >= due:
            log.info(self._line(point, self._last_line, values))
            self._last_line = point
            self._lines += 1

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
