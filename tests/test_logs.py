"""What the trainer's log shows a person, in a real process: its own lines, TensorFlow's warnings
and the few INFO lines of ``logs.TF_INFO_SHOWN``, and none of the rest unless ``--verbose``.
The processes here start cold (``python -m``, not ``warm_start``): TensorFlow's load is part of
what they show."""

import importlib.util
import pathlib
import re

import pytest

from cifar10_estimator import logs
from trainer_fixtures import run_module, trainer_args

pytestmark = pytest.mark.slow  # every test here reads real trainer processes

# The line each kept TensorFlow template produces (the template with its values filled in).
_KEPT = {
    "Saving checkpoints for %d into %s.": re.compile(r"Saving checkpoints for \d+ into \S+\."),
    "Restoring parameters from %s": re.compile(r"Restoring parameters from \S+model\.ckpt-\d+"),
    "Loss for final step: %s.": re.compile(r"Loss for final step: [0-9.]+\."),
}
# Lines TensorFlow prints in every run that say nothing a user can act on.
_NOISE = ("Calling model_fn", "Graph was finalized", "Running local_init_op", "Using config:",
          "is deprecated", "Instructions for updating",
          # Errors TensorFlow 2.15's CPU-and-GPU build logs while it loads, on a machine
          # without CUDA (its cuDNN, cuFFT and cuBLAS factories registered twice).
          "Unable to register")

# An error or fatal line of TensorFlow's C++ log (``E0000 00:00:...``), or of Python's logging
# in its default format (``ERROR:tensorflow:...``).
_ERROR_LINE = re.compile(r"[EF]\d{4} |ERROR:")


@pytest.fixture(scope="module")
def two_runs(tiny_records, tmp_path_factory):
    """A run of 2 steps, then the same job resumed to 4: what the user reads of both, the
    flags, and the first run's output alone."""
    data_dir, _ = tiny_records
    job_dir = str(tmp_path_factory.mktemp("logs") / "job")
    base = trainer_args(data_dir, job_dir, "--save-checkpoints-steps", "2",
                        "--eval-throttle-secs", "100000")
    first = run_module("cifar10_estimator", *base, "--train-steps", "2", cold=True)
    second = run_module("cifar10_estimator", *base, "--train-steps", "4", cold=True)
    assert first.returncode == 0 and second.returncode == 0, second.stderr[-3000:]
    return first.stderr + second.stderr, base, first.stderr


def test_every_kept_tensorflow_template_still_appears_in_a_real_run(two_runs):
    # A template TensorFlow rewords would vanish silently from the log: this catches it.
    text, _, _ = two_runs
    assert set(_KEPT) == set(logs.TF_INFO_SHOWN)
    for template, line in _KEPT.items():
        assert line.search(text), f"no line from {template!r} in:\n{text[-3000:]}"


def test_the_log_has_our_lines_and_none_of_tensorflows_chatter(two_runs):
    text, _, _ = two_runs
    assert re.search(r"evaluation at step 4: accuracy = [0-9.]+, cross_entropy = ", text)
    assert "run summary: wall time" in text and "resuming from" in text
    # Default flags: the final checkpoint's batch-norm statistics are recomputed first.
    assert re.search(r"precise batch norm: statistics of the final weights over 50 training "
                     r"batches \([0-9.]+ s\)", text)
    for noise in _NOISE:
        assert noise not in text, noise


def test_a_healthy_run_logs_no_error_level_line(two_runs):
    # An error on every run teaches users to skip errors. TensorFlow 2.21's oneDNN pass logged
    # one ("oneDNN supports DT_UINT8 only on platforms with AVX-512") for the input pipeline's
    # uint8 transpose, on every CPU; schema.decode_images no longer transposes.
    text, _, _ = two_runs
    errors = [line for line in text.splitlines() if _ERROR_LINE.match(line)]
    assert not errors, errors


def test_verbose_shows_all_of_tensorflows_log(two_runs, tmp_path):
    _, base, _ = two_runs
    job = base.index("--job-dir") + 1
    flags = base[:job] + [str(tmp_path / "job")] + base[job + 1:]
    verbose = run_module("cifar10_estimator", *flags, "--train-steps", "1", "--verbose",
                         cold=True)
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "Calling model_fn" in verbose.stderr and "Graph was finalized" in verbose.stderr


def test_the_phases_benchmark_reads_every_phase_of_a_real_runs_log(two_runs, tmp_path):
    # benchmarks/run_phases.py splits a run's seconds by the lines above: a reworded one would
    # leave a phase out of its table, or every log unreadable.
    _, _, first = two_runs
    path = pathlib.Path(__file__).parents[1] / "benchmarks" / "run_phases.py"
    spec = importlib.util.spec_from_file_location("run_phases", path)
    run_phases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_phases)
    log = tmp_path / "log.txt"  # stamped as convergence.py stamps it: line i at i seconds
    log.write_text("".join(f"{i:9.2f} {line}\n" for i, line in enumerate(first.splitlines())))
    seconds = run_phases.phases(str(log))
    lines = first.splitlines()
    evaluated = next(i for i, line in enumerate(lines) if "evaluation at step 2:" in line)
    saved = max(i for i, line in enumerate(lines[:evaluated]) if "Saving checkpoints for 2" in line)
    assert seconds["evaluations"] == evaluated - saved > 0
    assert seconds["start"] == next(i for i, line in enumerate(lines) if "Saving checkpoints" in line)
    assert run_phases.PRECISE_BN.search(first)
    assert seconds["export and exit"] == len(lines) - 1 - evaluated
    assert sum(seconds[name] for name in run_phases.PHASES) == seconds["total"] == len(lines) - 1
