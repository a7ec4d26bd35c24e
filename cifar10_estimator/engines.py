"""The managed engines' conventions, in one place: what SageMaker, Vertex AI and Ray Train
tell a training program through its environment, and what the program hands back to them.

- The folders (``VARIABLES``, ``settings``): SageMaker and Vertex AI name the folders a job
  must use in environment variables rather than flags. The trainer takes them as defaults
  under the flags given (a flag wins): ``settings`` returns them from an environment the
  command passes in. The TF_CONFIG shapes the engines write are ``task.tf_config``'s;
  docs/distributed.md, "Engines", has the table of both.
- Vertex AI's hyperparameter-tuning metric file (``TRIAL_ID_ENV``, ``METRIC_FILE_ENV``,
  ``write``, ``read``, ``reports``, ``evaluation_reporter``, ``report_to_tuning``): what a trial
  reports to the study, each evaluation as it comes and the final one, and how a sweep reads
  them back.
- Ray Train (``report_to_ray_train``): a run's final figures handed to the training function
  that called the trainer.

Vertex AI (and AI Platform before it) starts each trial with ``CLOUD_ML_TRIAL_ID`` and, on
some images, ``CLOUD_ML_HP_METRIC_FILE`` in its environment, and reads the trial's metric from
that file. Google's ``cloudml-hypertune`` package writes it; this module writes the same format
itself (the facts below are from cloudml-hypertune 0.1.0.dev6, ``hypertune/hypertune.py``):

- the file is ``CLOUD_ML_HP_METRIC_FILE``, else ``/tmp/hypertune/output.metrics``; its folder
  is made when missing;
- one JSON object per line, keys sorted: ``timestamp`` (seconds since the epoch, a number),
  ``trial`` (the trial id as a string, ``"0"`` without ``CLOUD_ML_TRIAL_ID``), the metric's
  tag with its value as a string (``"0.9123"``), ``global_step`` (a string) and
  ``checkpoint_path`` (a string, possibly empty);
- the whole file is written again at each report, with at most the 100 newest lines: a
  report adds its lines to the ones before, so a study sees every measurement by its
  ``global_step`` (Vertex AI's early stopping reads these intermediate measurements).

The trainer reports every scalar of each evaluation, one line each, as the evaluation ends,
and the final evaluation's once more at the end, so that whatever metric id the study names
(``accuracy``, ``loss``, ``cross_entropy``, a class's ``per_class_accuracy/<name>``) is in the
file: the whole set's scalars first, then the classes' while one report's lines stay within
the 100 (CIFAR-100's 100 classes leave them out). An evaluation's report adds two lines of its
own, ``epoch`` (the global step in epochs of the training file) and ``images_per_sec`` (this
task's training images per second since it started), which a sweep's schedulers use. The file
is written atomically (a temporary name, then a rename), so the service never reads half of
it.

A foundation: it needs only ``storage`` and ``errors``, so the settings (``config``), the
trainer command and the sweeps all import it. No TensorFlow at import time (the trainer
resolves its settings before it loads; the report to the tuning service loads it to find the
last checkpoint, after training), and no environment read: the commands read the variables
and pass their values down (docs/architecture.md).
"""

import json
import logging
import os
import sys
import time
from typing import Callable, Mapping, Optional

from cifar10_estimator import storage
from cifar10_estimator.errors import UserError

log = logging.getLogger("cifar10_estimator")

# (variable, setting, engine, what the engine means by it). Sources: SageMaker's training
# toolkit environment (sagemaker-training-toolkit, "Environment variables": SM_MODEL_DIR, the
# folder uploaded as the model artifact; SM_CHANNEL_<NAME>, a channel's local copy) and Vertex
# AI's custom training (cloud.google.com/vertex-ai/docs/training/code-requirements:
# AIP_MODEL_DIR, AIP_CHECKPOINT_DIR under the job's baseOutputDirectory).
VARIABLES = (
    ("SM_MODEL_DIR", "export_dir", "SageMaker", "the folder it uploads as the model artifact"),
    ("SM_CHANNEL_TRAINING", "data_dir", "SageMaker", "the 'training' channel's local copy"),
    ("AIP_MODEL_DIR", "export_dir", "Vertex AI", "where the model's artifacts go"),
    ("AIP_CHECKPOINT_DIR", "job_dir", "Vertex AI", "where checkpoints go"),
)

TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"
METRIC_FILE_ENV = "CLOUD_ML_HP_METRIC_FILE"
# cloudml-hypertune's _DEFAULT_METRIC_PATH, where the service looks without the variable.
DEFAULT_METRIC_FILE = "/tmp/hypertune/output.metrics"
# cloudml-hypertune's _MAX_NUM_METRIC_ENTRIES_TO_PRESERVE: the lines a file keeps.
MAX_LINES = 100
# The keys of a line that are not the metric's tag (cloudml-hypertune's metric_body).
_FIELDS = ("timestamp", "trial", "global_step", "checkpoint_path")
# The final evaluation's scalars over the whole set (model/metrics.py's accuracy and
# cross_entropy, and Estimator's loss), reported before the per-class ones.
WHOLE_SET_SCALARS = ("accuracy", "cross_entropy", "loss")
# What an evaluation's report adds to its scalars: where the run is (epochs of the training
# file) and how fast it trains; kept with the whole set's scalars.
PROGRESS_SCALARS = ("epoch", "images_per_sec")


def settings(environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Setting -> (value, the variable that gave it), for the engines' variables set (not
    empty) in ``environ``; a later row of ``VARIABLES`` never overrides an earlier one."""
    found: dict[str, tuple[str, str]] = {}
    for variable, name, _, _ in VARIABLES:
        if environ.get(variable) and name not in found:
            found[name] = (environ[variable], variable)
    return found


def wanted(trial_id: Optional[str], metric_file: Optional[str]) -> bool:
    """Whether a run reports to the tuning service: either variable is set (not empty)."""
    return bool(trial_id) or bool(metric_file)


def _is_scalar(value) -> bool:
    return isinstance(value, (int, float)) or getattr(value, "ndim", None) == 0


def scalars(metrics: Mapping) -> dict[str, float]:
    """The evaluation's scalars as the file reports them, in order: the whole set's, then the
    rest by name (per-class accuracies), without ``global_step``; within ``MAX_LINES``."""
    found = {}
    for name, value in metrics.items():
        if name == "global_step" or isinstance(value, (str, bytes)):
            continue
        if _is_scalar(value):
            found[name] = float(value)
    first = [n for n in WHOLE_SET_SCALARS + PROGRESS_SCALARS if n in found]
    rest = sorted(n for n in found if n not in first)
    names = first + (rest if len(first) + len(rest) <= MAX_LINES else [])
    return {n: found[n] for n in names}


def lines(trial_id: Optional[str], metrics: Mapping, checkpoint_path: str = "",
          timestamp: Optional[float] = None) -> str:
    """One report's lines for an evaluation's ``metrics``: one line per scalar."""
    stamp = time.time() if timestamp is None else timestamp
    step = metrics.get("global_step")
    body = []
    for name, value in scalars(metrics).items():
        line = {"timestamp": stamp, "trial": str(trial_id or 0), name: str(value),
                "global_step": str(int(step) if step else 0),
                "checkpoint_path": checkpoint_path}
        body.append(json.dumps(line, sort_keys=True) + "\n")
    return "".join(body)


def write(path: Optional[str], trial_id: Optional[str], metrics: Mapping,
          checkpoint_path: str = "") -> tuple[str, list[str]]:
    """Adds a report of ``metrics`` to the metric file (``path``, else
    ``DEFAULT_METRIC_FILE``), written again atomically with its ``MAX_LINES`` newest lines;
    returns its path and the tags it reported. UserError naming the variable if it cannot be
    written."""
    path = path or DEFAULT_METRIC_FILE
    try:
        earlier = storage.read_bytes(path).decode(errors="replace").splitlines(keepends=True)
    except OSError:  # the first report (a file that cannot be read is written anew)
        earlier = []
    content = "".join((earlier + lines(trial_id, metrics, checkpoint_path).splitlines(
        keepends=True))[-MAX_LINES:])
    try:
        folder = os.path.dirname(path)
        if folder:
            storage.makedirs(folder)
        storage.write_bytes_atomic(path, content.encode())
    except OSError as e:
        raise UserError(f"the hyperparameter-tuning metric file {path} ({METRIC_FILE_ENV}) "
                        f"cannot be written ({e.strerror or e}); point {METRIC_FILE_ENV} at a "
                        f"writable file") from None
    return path, list(scalars(metrics))


def read(text: str) -> tuple[dict[str, float], Optional[int]]:
    """The metrics a metric file reports (a later line wins for the same tag) and the global
    step; ValueError for a line that is not one of the format's."""
    metrics: dict[str, float] = {}
    step = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            tags = [k for k in entry if k not in _FIELDS] if isinstance(entry, dict) else []
            if len(tags) != 1:
                raise ValueError(f"{len(tags)} metric tags")
            value = float(entry[tags[0]])
            step = int(entry.get("global_step") or 0)
        except (ValueError, TypeError) as e:
            raise ValueError(f"line {number} is not a metric line ({e})") from None
        metrics[tags[0]] = value
    return metrics, step


def reports(text: str) -> list[dict[str, float]]:
    """Each report of a metric file, in order: its lines' tags and ``global_step``, grouped by
    the report they came in (one timestamp); lines that are not the format's are skipped (the
    file may be cut at ``MAX_LINES``, or read while a report was being added)."""
    found: list[dict[str, float]] = []
    stamp = None
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            tags = [k for k in entry if k not in _FIELDS]
            value, step = float(entry[tags[0]]), int(entry.get("global_step") or 0)
            when = float(entry["timestamp"])
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            continue
        if when != stamp:
            found.append({"global_step": step})
            stamp = when
        found[-1][tags[0]] = value
    return found


def evaluation_reporter(trial_id: Optional[str], metric_file: Optional[str]
                        ) -> Optional[Callable[[Mapping, str, float, float], None]]:
    """With ``CLOUD_ML_TRIAL_ID`` or ``CLOUD_ML_HP_METRIC_FILE`` set, what reports each
    evaluation as it ends (its metrics, its checkpoint, its epoch and the task's images per
    second) to the metric file; elsewhere None."""
    if not wanted(trial_id, metric_file):
        return None

    def report(metrics: Mapping, checkpoint: str, epoch: float, images_per_sec: float
               ) -> None:
        write(metric_file, trial_id, {**metrics, "epoch": epoch,
                                      "images_per_sec": images_per_sec}, checkpoint)

    return report


def report_to_tuning(job_dir: str, result, trial_id: Optional[str],
                     metric_file: Optional[str]) -> None:
    """With ``CLOUD_ML_TRIAL_ID`` or ``CLOUD_ML_HP_METRIC_FILE`` set (a Vertex AI trial, or a
    sweep's: docs/sweeps.md), the final evaluation's scalars of ``result`` (the trainer's
    ``TrainResult``) to the metric file, by the task that ran it; elsewhere nothing."""
    if not wanted(trial_id, metric_file) or not result.eval_metrics:
        return
    import tensorflow as tf  # after training: the trainer has loaded it

    checkpoint = tf.train.latest_checkpoint(job_dir) or ""
    path, tags = write(metric_file, trial_id, result.eval_metrics, checkpoint)
    per_class = [t for t in tags if t not in WHOLE_SET_SCALARS]
    log.info("reported %s%s to the hyperparameter-tuning metric file %s (trial %s)",
             ", ".join(t for t in tags if t not in per_class),
             f" and {len(per_class)} per-class accuracies" if per_class else "", path,
             trial_id or 0)


def report_to_ray_train(result) -> None:
    """Inside Ray Train's training function (``TensorflowTrainer``), hands the run's final
    figures to Ray Train (``ray.train.report``, which every worker calls), with the export as
    the chief's checkpoint where it is a local folder (Ray Train keeps a run's figures only
    with a checkpoint, and copies it to its storage); elsewhere nothing."""
    if "ray.train" not in sys.modules:  # Ray Train's worker has imported it
        return
    import ray.train

    try:
        ray.train.get_context()
    except RuntimeError:  # not in a training function
        return
    figures = {name: float(value) for name, value in (result.eval_metrics or {}).items()
               if _is_scalar(value)}
    figures.update(steps_trained=result.steps_trained,
                   exported=int(result.export_path is not None))
    checkpoint = None
    if result.export_path and not storage.is_url(result.export_path):
        checkpoint = ray.train.Checkpoint.from_directory(result.export_path)
    ray.train.report(figures, checkpoint=checkpoint)
