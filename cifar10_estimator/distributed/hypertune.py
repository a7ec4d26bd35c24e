"""Vertex AI's hyperparameter-tuning metric file: what a trial reports to the study, and how
the sweep reads it back.

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
- the whole file is written again at each report, with at most the 100 newest lines.

The trainer reports every scalar of its final evaluation, one line each, so that whatever
metric id the study names (``accuracy``, ``loss``, ``cross_entropy``, a class's
``per_class_accuracy/<name>``) is in the file: the whole set's scalars first, then the
classes' while the lines stay within the 100 (CIFAR-100's 100 classes leave them out). The file
is written atomically (a temporary name, then a rename), so the service never reads half of it.

No TensorFlow here, and no environment read: the trainer command reads the two variables and
passes their values down (docs/architecture.md).
"""

import json
import os
import time
from typing import Mapping, Optional

from cifar10_estimator import storage
from cifar10_estimator.errors import UserError

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


def wanted(trial_id: Optional[str], metric_file: Optional[str]) -> bool:
    """Whether a run reports to the tuning service: either variable is set (not empty)."""
    return bool(trial_id) or bool(metric_file)


def scalars(metrics: Mapping) -> dict[str, float]:
    """The evaluation's scalars as the file reports them, in order: the whole set's, then the
    rest by name (per-class accuracies), without ``global_step``; within ``MAX_LINES``."""
    found = {}
    for name, value in metrics.items():
        if name == "global_step" or isinstance(value, (str, bytes)):
            continue
        if isinstance(value, (int, float)) or getattr(value, "ndim", None) == 0:
            found[name] = float(value)
    first = [n for n in WHOLE_SET_SCALARS if n in found]
    rest = sorted(n for n in found if n not in first)
    names = first + (rest if len(first) + len(rest) <= MAX_LINES else [])
    return {n: found[n] for n in names}


def lines(trial_id: Optional[str], metrics: Mapping, checkpoint_path: str = "",
          timestamp: Optional[float] = None) -> str:
    """The file's content for the final evaluation's ``metrics``: one line per scalar."""
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
    """Writes the metric file (``path``, else ``DEFAULT_METRIC_FILE``) atomically; returns
    its path and the tags it reported. UserError naming the variable if it cannot be written."""
    path = path or DEFAULT_METRIC_FILE
    content = lines(trial_id, metrics, checkpoint_path)
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
