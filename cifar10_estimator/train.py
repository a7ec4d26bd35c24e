"""The trainer command: ``python -m cifar10_estimator`` (``cifar10-train``).

Flags (``training.flags``) -> ``TrainConfig`` -> ``training.driver.train_and_evaluate`` -> the
run summary. It does the process-level set-up a library must not do: oneDNN on before
TensorFlow loads (``training.cpu``), a readable log (``logs``), the CPU as oneDNN sees it,
SIGTERM and SIGINT handled as a preemption (``training.preemption``: save, exit 143 or 130),
and one-line errors with exit status 2 for user mistakes (``errors.run_cli``).
"""

import logging
import os
import sys
import time
from typing import Optional, Sequence

from cifar10_estimator import logs
from cifar10_estimator.errors import run_cli
from cifar10_estimator.training import cpu, flags

log = logging.getLogger("cifar10_estimator")


def run(argv: Optional[Sequence[str]] = None):
    """Parses ``argv``, sets up the process and trains; returns the ``TrainResult``.

    Raises UserError for user mistakes (``main`` prints them as one line).
    """
    config, verbose = flags.parse(argv)
    # Before TensorFlow loads: oneDNN roughly doubles CPU training speed where TF leaves it
    # off (AVX2-only CPUs) and is what runs channels_first on a CPU (see training/cpu.py).
    cpu.prefer_onednn(os.environ)
    logs.setup_logging(verbose)
    from cifar10_estimator.training import driver, precision_cache, report, summary  # TF loads
    from cifar10_estimator.training.preemption import Preemption

    started = time.monotonic()
    preemption = Preemption().install()  # SIGTERM/SIGINT: save, say so, exit 128 + signal
    cpu_info = cpu.read_cpu_info().as_seen_by_onednn(os.environ.get(cpu.ONEDNN_CAP_ENV))
    try:
        result = driver.train_and_evaluate(
            config, cpu_info, preemption,
            precision_cache.cache_folder(os.environ, os.path.expanduser("~")))
    finally:
        preemption.restore()  # for callers that go on (the demo, the tests)
    if result.eval_metrics:
        log.info("final %s", report.evaluation_line(result.eval_metrics))
    if result.role != "ps":
        for line in summary.run_summary(config, result, time.monotonic() - started):
            log.info(line)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    def train_only() -> int:
        run(argv)
        return 0
    return run_cli(train_only, flags.MODULE)


if __name__ == "__main__":
    sys.exit(main())
