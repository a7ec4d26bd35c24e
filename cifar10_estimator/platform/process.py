"""What every command does to its process before TensorFlow loads: ``prepare_process``.

TensorFlow reads its settings from the environment once, when it loads, so a command sets them
first, and only where the user has not (their value wins):

- ``TF_ENABLE_ONEDNN_OPTS=1``: oneDNN's kernels, which TF 2.15 leaves off on CPUs without
  AVX512_VNNI, AVX512_BF16 or AMX, train about twice as fast there and are what runs
  ``channels_first`` on a CPU (``cpu.prefer_onednn``, docs/cpus.md);
- ``TF_CPP_MIN_LOG_LEVEL``: how much of TensorFlow's C++ log a command shows (``logs``).

Library code never calls this: it changes process-wide state. ``train.run``, the trainer's
entry point for other programs too, puts the variables back as it found them when it returns
(``restore_process``): what TensorFlow read of them when it loaded stays, for the life of the
process (oneDNN on or off; see docs/training.md, "From Python").
"""

from typing import Mapping, MutableMapping

from cifar10_estimator.logs import CPP_LOG_LEVEL_ENV
from cifar10_estimator.platform import cpu


def prepare_process(environ: MutableMapping[str, str],
                    cpp_log_level: str = "2") -> dict[str, str]:
    """Sets, where the user has not, oneDNN on and TensorFlow's C++ log level (2: errors
    only; 3: none), before TensorFlow loads; returns the variables it set, with their values."""
    before = {name: environ.get(name) for name in (cpu.ONEDNN_ENV, CPP_LOG_LEVEL_ENV)}
    cpu.prefer_onednn(environ)
    environ.setdefault(CPP_LOG_LEVEL_ENV, cpp_log_level)
    return {name: environ[name] for name, value in before.items()
            if value is None and name in environ}


def restore_process(environ: MutableMapping[str, str], set_by_prepare: Mapping[str, str]) -> None:
    """Removes the variables ``prepare_process`` set, unless something has changed them since
    (then they are someone else's now)."""
    for name, value in set_by_prepare.items():
        if environ.get(name) == value:
            del environ[name]
