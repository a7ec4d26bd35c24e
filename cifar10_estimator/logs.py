"""What the command lines print: a quiet TensorFlow import and readable training logs.

TensorFlow with Estimator prints pages that bury the training log: C++ notices while it
loads (oneDNN, CPU features, and three harmless "Unable to register cuDNN/cuFFT/cuBLAS factory"
errors of the CPU wheel, tensorflow/tensorflow#62075; from 2.16 on, the CUDA wheel's "failed
call to cuInit" on a machine without a GPU driver, when it first lists devices), a deprecation
notice for nearly every ``tf.compat.v1`` call, and dozens of INFO lines about graphs, hooks and
sessions. Command lines call ``import_tensorflow_quietly`` before anything imports TensorFlow,
and ``setup_logging``:

- the package's own lines (progress, evaluations, reports) are all shown;
- of TensorFlow's, warnings and errors are shown, except deprecation notices, recognised by
  the module that emits them, not by their wording;
- of TensorFlow's INFO lines, only those whose message template is in ``TF_INFO_SHOWN`` (a
  checkpoint saved, a checkpoint restored, training's last step). The tests check that each
  one still appears, so a reworded template fails the suite instead of vanishing;
- a failure TensorFlow reports twice is shown once, where it is raised: its event-file
  writer thread logs its error and dies with a traceback (a full disk, a store gone), then
  the same error is raised in the training loop, which the command turns into its one line.

``--verbose`` shows everything. Library code never calls these: they change process-wide state.
``setup_logging`` returns what undoes its changes, for ``train.run`` called from another
program.
"""

import contextlib
import logging
import os
import sys
import threading
import warnings
from typing import Callable, Iterator


CPP_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"  # read by TensorFlow's C++ once, when it loads


@contextlib.contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Points file descriptor 2 at /dev/null for the block (C++ writes bypass sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow without its load-time C++ noise on stderr. The level of its C++ log
    (``CPP_LOG_LEVEL_ENV``) is read once, when it loads: the command sets it first
    (``platform.process.prepare_process``).

    The devices are listed inside the same silence: TensorFlow's wheel from 2.16 on carries
    CUDA and, on a machine without a GPU driver, logs ``failed call to cuInit`` as an error
    the first time it looks for devices (once a process). The run's own lines say which
    devices it uses."""
    if "tensorflow" not in sys.modules:
        with native_stderr_silenced():
            import tensorflow

            tensorflow.config.list_physical_devices()


# TensorFlow's INFO messages worth a line, by template (``LogRecord.msg``): from
# basic_session_run_hooks.CheckpointSaverHook, saver.Saver.restore and Estimator.train.
TF_INFO_SHOWN = frozenset({
    "Saving checkpoints for %d into %s.",
    "Restoring parameters from %s",
    "Loss for final step: %s.",
})
# tensorflow/python/util/deprecation.py emits every deprecation notice.
_DEPRECATION_MODULE = "deprecation"


class _QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("tensorflow"):
            return True  # the package's own
        if record.module == _DEPRECATION_MODULE or record.msg == _EVENT_WRITER_ERROR:
            return False
        return record.levelno >= logging.WARNING or record.msg in TF_INFO_SHOWN


# tensorflow/python/summary/writer/event_file_writer.py: the writer thread's own report of the
# error that ends it (and that the next write or flush raises in the training loop).
_EVENT_WRITER_ERROR = "EventFileWriter writer thread error: %s"
_EVENT_WRITER_THREAD = "EventLoggerThread"  # the same file's thread name


def _quiet_event_writer_thread(previous: Callable) -> Callable:
    """A ``threading.excepthook`` that drops the traceback TensorFlow's event-file writer
    thread dies with (the error is raised again where the events are written) and passes
    every other thread's exception to ``previous``."""
    def hook(args) -> None:
        if args.thread is not None and args.thread.name == _EVENT_WRITER_THREAD:
            return
        previous(args)
    return hook


# A Python warning tf.distribute's input pipeline gives every run of a strategy in graph mode
# (tensorflow/python/data/ops/dataset_ops.py, Dataset.options): nothing a user can act on.
_DATASET_OPTIONS_WARNING = "To make it possible to preserve tf.data options"


def setup_logging(verbose: bool) -> Callable[[], None]:
    """Timestamped lines on stderr: ours and TensorFlow's progress lines, without its noise.

    Returns a function that puts the two loggers (handlers, level, propagation), and the
    warning filter it added, back as they were."""
    if not verbose:
        import_tensorflow_quietly()
    import tensorflow as tf

    # TensorFlow sets its logger up once, on first use (a handler of its own when the root
    # logger has none): that is part of loading TensorFlow, so it comes before the snapshot.
    tf.get_logger()
    loggers = [logging.getLogger(name) for name in ("tensorflow", "cifar10_estimator")]
    saved = [(logger, logger.handlers[:], logger.level, logger.propagate) for logger in loggers]
    filters_before = list(warnings.filters)
    if not verbose:
        warnings.filterwarnings("ignore", message=_DATASET_OPTIONS_WARNING,
                                category=UserWarning)
    added = [f for f in warnings.filters if f not in filters_before]

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    excepthook = threading.excepthook
    if not verbose:
        handler.addFilter(_QuietFilter())
        threading.excepthook = _quiet_event_writer_thread(excepthook)
    for logger in loggers:
        logger.handlers[:] = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)  # the tensorflow logger's

    def restore() -> None:
        threading.excepthook = excepthook
        for logger, handlers, level, propagate in saved:
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate
        handler.flush()
        handler.close()
        for item in added:
            if item in warnings.filters:
                warnings.filters.remove(item)
        # What filterwarnings itself calls after a change: the cached decisions are stale.
        getattr(warnings, "_filters_mutated", lambda: None)()
    return restore
