"""The trainer command: ``python -m cifar10_estimator`` (``cifar10-train``), and ``run``, its
entry point for other programs.

Flags (``config.flags``) -> ``Settings`` -> ``training.driver.train_and_evaluate`` -> the
run summary. It does the process-level set-up a library must not do: oneDNN on and
TensorFlow's log level before TensorFlow loads (``platform.process``), a readable log
(``logs``), the CPU as oneDNN sees it, the user's cache folder for the precision probes,
SIGTERM and SIGINT handled as a preemption (``training.preemption``: save, exit 143 or 130),
one-line errors with exit status 2 for user mistakes (``errors.run_cli``, in ``main``), and
the environment read once: ``TF_CONFIG``, the engines' folders, and Vertex AI's
hyperparameter-tuning variables, whose metric file gets each evaluation and the final one
(``engines``).

``run`` is what ``main`` runs and what another program calls (from any thread: Ray Train calls
from a worker thread). It returns the result or raises, and undoes its set-up when it returns:
the environment variables, the log's handlers and levels, the warning filter and the signal
handlers are as it found them. It installs signal handlers only on the main thread. What stays
is what cannot be undone in a process: TensorFlow loaded with the settings it read then (oneDNN
on), TensorFlow's runtime configured once (``--num-cpu-towers`` devices), and, with a
multi-worker strategy, TensorFlow's own SIGTERM handler (docs/training.md, "From Python").
"""

import contextlib
import logging
import os
import time
from typing import Any, Mapping, Optional, Sequence, Union

from cifar10_estimator import engines, logs
from cifar10_estimator.errors import entry_point, run_cli
from cifar10_estimator.config import checks, flags, overlays
from cifar10_estimator.config.fields import flag
from cifar10_estimator.task import tf_config
from cifar10_estimator.platform import cpu
from cifar10_estimator.platform.parent_death import parent_death_signal
from cifar10_estimator.platform.process import prepare_process, restore_process

log = logging.getLogger("cifar10_estimator")

TF_CONFIG_ENV = "TF_CONFIG"
# TensorFlow's C++ log while training: fatal lines only, errors too with --verbose. Its error
# lines come beside an error raised in Python (which the command prints as its one line, or
# as a traceback) or from a fault the run outlives: a full job dir printed "events_writer.cc:
# Write failed because file could not be opened" above the one-line error (issue 76).
CPP_LOG_LEVEL = "3"
CPP_LOG_LEVEL_VERBOSE = "2"


def run(argv: Union[Sequence[str], Mapping[str, Any], None] = None, *,
        handle_signals: bool = True):
    """Trains as ``python -m cifar10_estimator argv`` does; returns the ``TrainResult``
    (``eval_metrics``, ``export_path``, ``report_path``, ``steps_trained``, ``role``).

    ``argv`` is the command line's arguments, or the settings as a mapping of field names to
    values (``{"data_dir": "data", "job_dir": "job", "num_layers": 20}``), which take the
    same road as the flags (``flags.to_argv``).

    ``handle_signals``: on the main thread, SIGTERM and SIGINT save the current step and stop
    the run (``errors.Stopped``, or the process ends with 128 + the signal outside a training
    session); off the main thread, or with False, no handler is installed and the caller's
    stay in charge.

    Raises:
      UserError: a user's mistake (``main`` prints it as one line, exit status 2).
      errors.Stopped: a signal stopped the run after saving (handlers installed only).
      SystemExit: from argparse, for a flag it refuses (status 2, its line printed) and for
        --help and --version (status 0).
    """
    if isinstance(argv, Mapping):
        argv = flags.to_argv(argv)
    # The one read of TF_CONFIG: the role is checked, with the settings, before TensorFlow
    # loads. Estimator and TensorFlow's strategies read the variable themselves: they are given
    # the role as parsed (a cluster of workers only, mapped to a chief and workers).
    tf_config_value = os.environ.get(TF_CONFIG_ENV)
    role = tf_config.parse(tf_config_value)
    from_engine = engines.settings(os.environ)
    # Vertex AI's hyperparameter tuning (and a sweep's trial): where each evaluation and the
    # final figures go (the metric file).
    tuning = (os.environ.get(engines.TRIAL_ID_ENV), os.environ.get(engines.METRIC_FILE_ENV))
    on_evaluation = engines.evaluation_reporter(*tuning)
    settings, verbose = flags.parse(argv, {name: value for name, (value, _) in
                                           from_engine.items()})
    checks.validate(settings, needs_data=role.task_type != "ps")
    checks.check_cluster(settings.cluster.distribution_strategy, role)
    groups = (settings.problem, settings.trainer, settings.runtime)  # what the driver takes
    with contextlib.ExitStack() as undo:
        _set_for_this_run(TF_CONFIG_ENV, tf_config.estimator_tf_config(tf_config_value, role),
                          undo)
        set_env = prepare_process(  # before TensorFlow loads
            os.environ, cpp_log_level=CPP_LOG_LEVEL_VERBOSE if verbose else CPP_LOG_LEVEL)
        undo.callback(restore_process, os.environ, set_env)
        undo.callback(logs.setup_logging(verbose))
        for name, (value, variable) in from_engine.items():
            if settings.value(name) == value:
                log.info("%s %s: from %s (the engine's; a flag given wins)",
                         flag(name), value, variable)
        return _train(settings, groups, role, handle_signals, undo, tuning, on_evaluation)


def _set_for_this_run(name: str, value: Optional[str], undo: contextlib.ExitStack) -> None:
    """Sets (or, for None, unsets) the environment variable ``name`` until ``undo`` closes."""
    before = os.environ.get(name)
    if value == before:
        return
    if value is None:
        del os.environ[name]
    else:
        os.environ[name] = value
    undo.callback(lambda: os.environ.__setitem__(name, before) if before is not None
                  else os.environ.pop(name, None))


def _train(settings, groups, role, handle_signals: bool, undo: contextlib.ExitStack,
           tuning: tuple[Optional[str], Optional[str]] = (None, None), on_evaluation=None):
    from cifar10_estimator.training import driver, summary  # TF loads
    from cifar10_estimator.platform import precision_cache
    from cifar10_estimator.platform import precision_probe
    from cifar10_estimator.platform.precision_probe import Machine
    from cifar10_estimator.evaluation import report
    from cifar10_estimator.training.preemption import Preemption, on_main_thread

    started = time.monotonic()
    cpu_info = cpu.read_cpu_info().as_seen_by_onednn(os.environ.get(cpu.ONEDNN_CAP_ENV))
    parent_death = parent_death_signal()  # a launcher's task: the signal its death sends
    import tensorflow as tf

    machine = Machine(cpu_info, cpu.onednn_enabled(), precision_cache.PrecisionCache(
        precision_cache.cache_folder(os.environ, os.path.expanduser("~")), tf.__version__))
    if role.task_type != "ps":
        # The settings against this machine, in one line: a precision it can compute in, GPUs,
        # oneDNN, reachable paths.
        precision_probe.check_requested(settings.devices.precision, settings.devices.num_gpus,
                                        machine)
        log.info(overlays.describe(settings))
        checks.validate_machine(settings, len(tf.config.list_physical_devices("GPU")),
                                machine.onednn)
    preemption = Preemption()
    if handle_signals and on_main_thread():
        # SIGTERM/SIGINT (and a launcher's death): save, say so, exit 128 + signal
        preemption.install(parent_death)
        undo.callback(preemption.restore)  # for callers that go on (the demo, the tests)
    else:
        log.info("SIGTERM and SIGINT are the caller's to handle: this run installs no signal "
                 "handlers (%s)", "not on the main thread" if handle_signals
                 else "handle_signals=False")
    problem, trainer, runtime = groups
    result = driver.train_and_evaluate(role, machine, preemption, problem=problem,
                                       trainer=trainer, runtime=runtime,
                                       on_evaluation=on_evaluation)
    if result.eval_metrics:
        log.info("final %s", report.evaluation_line(result.eval_metrics))
    if result.role != "ps":
        for line in summary.run_summary(settings.data.data_dir, settings.output.job_dir, result,
                                        time.monotonic() - started):
            log.info(line)
    engines.report_to_ray_train(result)
    engines.report_to_tuning(settings.output.job_dir, result, *tuning)
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    def train_only() -> int:
        run(argv)
        return 0
    return run_cli(train_only, flags.MODULE)


command = entry_point(main)  # the console script's and python -m's


if __name__ == "__main__":
    command()
