"""What every command does to its process before TensorFlow loads: ``prepare_process``.

TensorFlow reads its settings from the environment once, when it loads, so a command sets them
first, and only where the user has not (their value wins):

- ``TF_ENABLE_ONEDNN_OPTS=1``: oneDNN's kernels, which TF 2.15 leaves off on CPUs without
  AVX512_VNNI, AVX512_BF16 or AMX, train about twice as fast there and are what runs
  ``channels_first`` on a CPU (``cpu.prefer_onednn``, docs/cpus.md);
- ``TF_CPP_MIN_LOG_LEVEL``: how much of TensorFlow's C++ log a command shows (``logs``).

Library code never calls this: it changes process-wide state.
"""

from typing import MutableMapping

from cifar10_estimator.logs import CPP_LOG_LEVEL_ENV
from cifar10_estimator.platform import cpu


def prepare_process(environ: MutableMapping[str, str], cpp_log_level: str = "2") -> None:
    """Sets, where the user has not, oneDNN on and TensorFlow's C++ log level (2: errors
    only; 3: none), before TensorFlow loads."""
    cpu.prefer_onednn(environ)
    environ.setdefault(CPP_LOG_LEVEL_ENV, cpp_log_level)
