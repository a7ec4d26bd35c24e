"""What every command does to its process before TensorFlow loads: ``prepare_process``.

TensorFlow reads its settings from the environment once, when it loads, so a command sets them
first, and only where the user has not (their value wins):

- ``TF_ENABLE_ONEDNN_OPTS=1``: oneDNN's kernels, which TF 2.15 leaves off on CPUs without
  AVX512_VNNI, AVX512_BF16 or AMX, train about twice as fast there and are what runs
  ``channels_first`` on a CPU (``cpu.prefer_onednn``, docs/cpus.md);
- ``TF_CPP_MIN_LOG_LEVEL``: how much of TensorFlow's C++ log a command shows (``logs``);
- ``TF_USE_LEGACY_KERAS=0`` where it is on and the separate ``tf_keras`` package is missing:
  ``tf.estimator`` imports Keras, and TF 2.15 then looks for ``tf_keras`` instead of the Keras
  it bundles and fails ("Keras cannot be imported"). Ray sets the variable in every worker
  (docs/distributed.md, "Engines"); the package itself uses no Keras.

Then it installs the estimator layer (``tf_estimator_compat``, a distribution of this
repository's own: ``tf.estimator`` on TensorFlow 2.16 and newer, behind its version gate), for
the process's life: the estimator modules loaded through it keep needing it.
Importing the package changes no import machinery; this set-up is where a process opts in.

Library code never calls this: it changes process-wide state. ``train.run``, the trainer's
entry point for other programs too, puts the variables back as it found them when it returns
(``restore_process``): what TensorFlow read of them when it loaded stays, for the life of the
process (oneDNN on or off; see docs/training.md, "From Python").
"""

import importlib.util
from typing import Mapping, MutableMapping, Optional

import tf_estimator_compat

from cifar10_estimator.logs import CPP_LOG_LEVEL_ENV
from cifar10_estimator.platform import cpu

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
# What TensorFlow 2.15 counts as on (tensorflow/python/util/lazy_loader.py).
_ON = ("true", "1")


def prepare_process(environ: MutableMapping[str, str], cpp_log_level: str = "2"
                    ) -> dict[str, tuple[str, Optional[str]]]:
    """Sets, where the user has not, oneDNN on and TensorFlow's C++ log level (2: errors
    only; 3: none), and legacy Keras off where it cannot load, before TensorFlow loads, and
    installs ``tf_estimator_compat``; returns the variables it set: name -> (the value set, the
    value before or None)."""
    before = {name: environ.get(name) for name in (cpu.ONEDNN_ENV, CPP_LOG_LEVEL_ENV,
                                                   LEGACY_KERAS_ENV)}
    cpu.prefer_onednn(environ)
    environ.setdefault(CPP_LOG_LEVEL_ENV, cpp_log_level)
    if (environ.get(LEGACY_KERAS_ENV, "").lower() in _ON
            and importlib.util.find_spec("tf_keras") is None):
        environ[LEGACY_KERAS_ENV] = "0"
    tf_estimator_compat.install()
    return {name: (environ[name], value) for name, value in before.items()
            if name in environ and environ[name] != value}


def restore_process(environ: MutableMapping[str, str],
                    set_by_prepare: Mapping[str, tuple[str, Optional[str]]]) -> None:
    """Puts back the variables ``prepare_process`` set, unless something has changed them since
    (then they are someone else's now)."""
    for name, (value, before) in set_by_prepare.items():
        if environ.get(name) == value:
            if before is None:
                del environ[name]
            else:
                environ[name] = before
