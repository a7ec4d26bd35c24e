"""What a sweep's trial runs on its Ray node: Ray Tune's function trainable (``tuner``).

- It checks that its node sees the sweep dir: the driver wrote ``sweep.json`` with this run's
  id before any trial started, and a local sweep dir that a node does not show with that id
  is not shared (each node would keep its own trials). A bucket is shared by nature.
- It runs the trainer, ``python -m cifar10_estimator`` with the trial's flags, as a process
  of its own (a fresh TensorFlow for every trial), through ``ray_node.TaskRunner``: the node's
  environment, which Ray gives the trial's actor (``OMP_NUM_THREADS`` = the CPUs asked for),
  plus the driver's storage and TensorFlow variables and the two of Vertex AI's hypertune
  convention, through which the trainer hands back its final evaluation's scalars
  (``engines``: ``CLOUD_ML_TRIAL_ID`` = the trial's name, ``CLOUD_ML_HP_METRIC_FILE`` = a
  file in a temporary folder of the node). The trainer dies with its actor.
- Its output goes to ``JOB/trial.log`` as it comes; for a job dir in a bucket, to a local file
  whose text goes to the driver with the result, and the driver writes it into the bucket: the
  trial itself touches no bucket, so it loads no TensorFlow (only its trainer does).
- It reports the scalars to Ray Tune (``ray.tune.report``), or, when the trainer exited
  non-zero, raises ``TrialFailed`` with the trainer's last error line, which Ray Tune shows as
  the trial's error (status ERROR); the driver records both (``records``).
"""

import os
import signal
import tempfile
import time
from typing import Mapping, Optional

from cifar10_estimator import engines, storage
from cifar10_estimator.launch.ray_node import TaskRunner
from cifar10_estimator.sweeps import records

# How often the trial moves the trainer's new output to its log (as ray_actors reads it).
_READ_SECS = 0.2
# A trainer's one-line error: ``<command>: error: <what>`` (errors.run_cli).
_ERROR_MARK = ": error: "
# The result's key of a trial's whole log, for a job dir in a bucket (the driver writes it).
LOG_RESULT = "trial_log"


class TrialFailed(Exception):
    """A trial's trainer exited non-zero; the message is its last error line. ``exit_status``
    is the trainer's."""

    def __init__(self, message: str, exit_status: Optional[int] = None,
                 log: Optional[str] = None):
        super().__init__(message, exit_status, log)  # all in args: what pickle rebuilds from
        self.message, self.exit_status, self.log = message, exit_status, log

    def __str__(self) -> str:
        return self.message


def not_shared(record: str, run_id: str, node: str) -> Optional[str]:
    """Why this node cannot take part (it does not see the driver's ``sweep.json`` of this
    run), or None. A bucket's path is not checked."""
    if storage.is_url(record):
        return None
    try:
        with open(record, "rb") as f:
            seen = run_id.encode() in f.read()
    except OSError:
        seen = False
    if seen:
        return None
    return (f"--sweep-dir {storage.parent(record)} is not shared by the Ray cluster's nodes "
            f"(this trial's node, {node}, does not see its {records.RECORD_FILE}): use a bucket "
            f"(s3://, gs://) or a folder every node mounts at the same path")


def last_error(lines: list[str]) -> str:
    """The trainer's error line: its last ``...: error: ...`` line, else its last line."""
    shown = [line.strip() for line in lines if line.strip()]
    marked = [line for line in shown if _ERROR_MARK in line]
    return (marked or shown or ["the trainer said nothing"])[-1][:1000]


def run(config: Mapping, env: Mapping[str, str]) -> None:
    """Ray Tune's trainable: one trial (``config["trial"]``: its name, trainer flags, job dir,
    the sweep's record and run id); ``env``: the driver's variables for the trainer."""
    from ray import tune
    import ray

    spec = config["trial"]
    refusal = not_shared(spec["record"], spec["run_id"], ray.util.get_node_ip_address())
    if refusal:
        raise TrialFailed(refusal)
    with tempfile.TemporaryDirectory(prefix="cifar10-sweep-trial-") as temp:
        metric_file = os.path.join(temp, "output.metrics")
        variables = {**env, engines.TRIAL_ID_ENV: spec["name"],
                     engines.METRIC_FILE_ENV: metric_file}
        code, tail, log = _run_trainer(spec["argv"], variables, spec["job_dir"], temp)
        if code != 0:
            raise TrialFailed(last_error(tail), code, log)
        try:
            with open(metric_file) as f:
                metrics, step = engines.read(f.read())
        except (OSError, ValueError) as e:
            raise TrialFailed(f"the trainer ended without its final evaluation's figures in "
                              f"{metric_file} ({e})", code, log) from None
    tune.report({**metrics, "global_step": step or 0,
                 **({LOG_RESULT: log} if log is not None else {})})


def _run_trainer(argv: list[str], variables: Mapping[str, str], job_dir: str, temp: str
                 ) -> tuple[int, list[str], Optional[str]]:
    """Runs the trainer to its end, its output into the trial's log: (exit status, its last
    lines, the whole log where the job dir is a bucket's, for the driver to write there)."""
    log = storage.join(job_dir, records.TRIAL_LOG_FILE)
    local = not storage.is_url(log)
    if local:
        os.makedirs(job_dir, exist_ok=True)
    path = log if local else os.path.join(temp, records.TRIAL_LOG_FILE)
    tail: list[str] = []
    runner = TaskRunner()
    with open(path, "w") as out:
        runner.start(argv, dict(variables))
        try:
            while True:
                lines, code = runner.read()
                out.writelines(lines)
                out.flush()
                tail = (tail + lines)[-50:]
                if code is not None:
                    break
                time.sleep(_READ_SECS)
        finally:
            if runner.poll() is None:  # the log could not be written: the trainer saves, stops
                runner.send(signal.SIGTERM)
    if local:
        return code, tail, None
    with open(path, errors="replace") as f:
        return code, tail, f.read()
