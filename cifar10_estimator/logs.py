"""What the command lines print: a quiet TensorFlow import and readable training logs.

TensorFlow 2.15 with Estimator prints pages that bury the training log: C++ notices while it
loads (oneDNN, CPU features, and three harmless "Unable to register cuDNN/cuFFT/cuBLAS factory"
errors of the CPU wheel, tensorflow/tensorflow#62075), and a deprecation notice for nearly every
``tf.compat.v1`` call. Command lines call ``import_tensorflow_quietly`` before anything imports
TensorFlow and ``setup_logging`` to keep its progress lines and drop the rest. Library code
never calls these: they change process-wide state.
"""

import contextlib
import logging
import os
import re
import sys
from typing import Iterator

# TensorFlow log lines that say nothing a user can act on (shown with --verbose).
_NOISE = (
    "deprecated", "Instructions for updating",
    "Calling model_fn", "Done calling model_fn", "Create CheckpointSaverHook",
    "Graph was finalized", "Running local_init_op", "Done running local_init_op",
    "Using config:", "Not using Distribute Coordinator", "Running training and evaluation",
    "Start train and evaluate loop", "Calling checkpoint listeners", "Starting evaluation at",
    "Inference Time :", "Evaluation [", "Saving 'checkpoint_path'",
    "Using default config", "Skipping training since max_steps", "No assets to ",
    "SavedModel written to", "Assets written to", "TF_CONFIG environment variable",
    "Summary for np.ndarray is not visible",
)


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
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


def import_tensorflow_quietly(cpp_level: str = "2") -> None:
    """Imports TensorFlow without its load-time C++ noise; keeps a level the user set.

    ``TF_CPP_MIN_LOG_LEVEL`` is read once, when TensorFlow loads, so it must be set first.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", cpp_level)
    if "tensorflow" not in sys.modules:
        with _native_stderr_silenced():
            import tensorflow  # noqa: F401


# Estimator's evaluation line lists every metric; the per-class ones and the confusion matrix
# (printed as a multi-line array) go to the per-class table and eval_report.json instead.
_EVAL_LINE = "Saving dict for global step"
_SCALAR_METRIC = re.compile(r"\b(accuracy|cross_entropy|global_step|loss) = ([^,\s]+)")


class _QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(_EVAL_LINE):
            step, _, rest = message[len(_EVAL_LINE):].partition(":")
            shown = ", ".join(f"{k} = {v}" for k, v in _SCALAR_METRIC.findall(rest))
            record.msg, record.args = f"{_EVAL_LINE}{step}: {shown}", ()
            return True
        return not any(n in message for n in _NOISE)


def setup_logging(verbose: bool) -> None:
    """Timestamped lines on stderr: ours and TensorFlow's progress lines, without its noise."""
    if not verbose:
        import_tensorflow_quietly()
    import tensorflow as tf

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    if not verbose:
        handler.addFilter(_QuietFilter())
    for name in ("tensorflow", "cifar10_estimator"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
