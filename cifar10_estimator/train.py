"""The trainer command: ``python -m cifar10_estimator`` (``cifar10-train``).

Flags (``config.flags``) -> ``TrainConfig`` -> ``training.driver.train_and_evaluate`` -> the
run summary. It does the process-level set-up a library must not do: oneDNN on and
TensorFlow's log level before TensorFlow loads (``platform.process``), a readable log
(``logs``), the CPU as oneDNN sees it, the user's cache folder for the precision probes,
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
from cifar10_estimator.config import flags
from cifar10_estimator.platform import cpu
from cifar10_estimator.platform.process import prepare_process

log = logging.getLogger("cifar10_estimator")


def run(argv: Optional[Sequence[str]] = None):
    """Parses ``argv``, sets up the process and trains; returns the ``TrainResult``.

    Raises UserError for user mistakes (``main`` prints them as one line).
    """
    config, verbose = flags.parse(argv)
    prepare_process(os.environ)  # before TensorFlow loads
    logs.setup_logging(verbose)
    from cifar10_estimator.training import driver, summary  # TF loads
    from cifar10_estimator.platform import precision_cache
    from cifar10_estimator.evaluation import report
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
