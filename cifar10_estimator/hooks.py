"""Session hooks that report training progress: examples per second.

Throughput is counted from this worker's own steps, so it is right in every topology: one
worker's figure is its local batch times its local step rate. The cluster-wide figure comes
from the global step: each global step consumes ``examples_per_global_step`` examples, which
is one worker batch when workers update asynchronously, and one batch per replica when
``SyncReplicasOptimizer`` aggregates them. (The original tutorial multiplied the global step
rate by one worker's batch, wrong by the number of workers in both modes.)
"""

import logging
import time

import tensorflow as tf

log = logging.getLogger("cifar10_estimator")


class ExamplesPerSecondHook(tf.estimator.SessionRunHook):
    """Logs average and current examples/sec every ``every_n_steps`` local steps."""

    def __init__(self, batch_size: int, examples_per_global_step: int | None = None,
                 every_n_steps: int = 10, warm_up_steps: int = 1):
        """
        Args:
          batch_size: examples this worker consumes per step (all its towers).
          examples_per_global_step: in a cluster, examples all workers consume per global
            step (adds a cluster-wide figure); None for a single worker.
          every_n_steps: logging period in local steps.
          warm_up_steps: local steps excluded from the average (graph optimisation and the
            first input batches make them slow).
        """
        if every_n_steps < 1:
            raise ValueError("every_n_steps must be positive")
        self._batch_size = batch_size
        self._per_global_step = examples_per_global_step
        self._every = every_n_steps
        self._warm_up = warm_up_steps

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        if self._global_step is None:
            raise RuntimeError("ExamplesPerSecondHook needs a global step")
        self._local_steps = 0
        self._start = None  # (time, local step, global step) after warm-up
        self._last = None

    def before_run(self, run_context):
        return tf.estimator.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        self._local_steps += 1
        now, global_step = time.perf_counter(), int(run_values.results)
        if self._local_steps == self._warm_up:
            self._start = self._last = (now, self._local_steps, global_step)
            return
        if self._start is None or (self._local_steps - self._warm_up) % self._every:
            return
        t0, s0, g0 = self._start
        t1, s1, g1 = self._last
        self._last = (now, self._local_steps, global_step)
        average = self._batch_size * (self._local_steps - s0) / (now - t0)
        current = self._batch_size * (self._local_steps - s1) / (now - t1)
        if self._per_global_step is None:
            log.info("examples/sec: %.1f average, %.1f current (step %d)",
                     average, current, global_step)
        else:
            cluster = self._per_global_step * (global_step - g0) / (now - t0)
            log.info("examples/sec: %.1f average, %.1f current on this worker; cluster "
                     "%.1f (step %d)", average, current, cluster, global_step)
