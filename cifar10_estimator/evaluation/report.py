"""What an evaluation says: one log line per evaluation; per-class results and ``eval_report.json``.

Every evaluation is logged as one line of its scalars (``evaluation_line``). After the final
evaluation, the task that ran it (the chief locally, the evaluator in a
cluster) logs a compact per-class table and the three most confused pairs, and writes
``eval_report.json`` atomically: accuracy, per-class accuracy, the confusion matrix (rows:
true class, columns: predicted), the global step, the dataset and the class names.
"""

import json
import os
from typing import Mapping, Sequence

import numpy as np

from cifar10_estimator import storage

REPORT_FILE = "eval_report.json"
# The scalars of an evaluation's line; the per-class ones and the confusion matrix go to the
# per-class table and eval_report.json instead.
_LINE_METRICS = ("accuracy", "cross_entropy", "loss")


def evaluation_line(metrics: Mapping) -> str:
    """``evaluation at step 400: accuracy = 0.9995, cross_entropy = 0.003382, loss = 0.2258``."""
    shown = ", ".join(f"{k} = {float(metrics[k]):.4g}" for k in _LINE_METRICS if k in metrics)
    return f"evaluation at step {int(metrics.get('global_step', -1))}: {shown}"


def per_class_accuracy(confusion: np.ndarray) -> np.ndarray:
    """Right predictions of each class among its own images (0 for a class with none)."""
    totals = confusion.sum(axis=1)
    return np.divide(np.diag(confusion), totals, out=np.zeros(len(confusion)),
                     where=totals > 0)


def most_confused(confusion: np.ndarray, names: Sequence[str], count: int = 3
                  ) -> list[tuple[str, str, int]]:
    """The ``count`` largest off-diagonal cells: (true class, predicted as, images)."""
    off = confusion.astype(np.float64).copy()
    np.fill_diagonal(off, 0)
    order = np.argsort(-off, axis=None, kind="stable")[:count]
    pairs = []
    for flat in order:
        true, predicted = divmod(int(flat), len(names))
        if off[true, predicted] > 0:
            pairs.append((names[true], names[predicted], int(round(off[true, predicted]))))
    return pairs


def table(confusion: np.ndarray, names: Sequence[str], columns: int = 4) -> list[str]:
    """Per-class accuracy in a few aligned columns: ``cat 81.2% (812/1000)``."""
    accuracy = per_class_accuracy(confusion)
    totals = confusion.sum(axis=1)
    cells = [f"{name} {100 * a:5.1f}% ({int(round(confusion[i, i]))}/{int(round(totals[i]))})"
             for i, (name, a) in enumerate(zip(names, accuracy))]
    width = max(len(c) for c in cells)
    return ["  " + "  ".join(c.ljust(width) for c in cells[i:i + columns]).rstrip()
            for i in range(0, len(cells), columns)]


def build(metrics: Mapping, names: Sequence[str], dataset: str) -> dict:
    """The report's content from the final evaluation's metrics."""
    confusion = np.asarray(metrics["confusion_matrix"], np.float64)
    accuracy = per_class_accuracy(confusion)
    return {
        "global_step": int(metrics["global_step"]),
        "dataset": dataset,
        "class_names": list(names),
        "accuracy": float(metrics["accuracy"]),
        "per_class_accuracy": {n: float(a) for n, a in zip(names, accuracy)},
        "confusion_matrix": [[int(round(v)) for v in row] for row in confusion],
        "most_confused": [{"true": t, "predicted": p, "images": n}
                          for t, p, n in most_confused(confusion, names)],
    }


def write(job_dir: str, report: dict) -> str:
    """Writes ``JOB/eval_report.json`` atomically; returns its path."""
    return write_file(os.path.join(job_dir, REPORT_FILE), report)


def write_file(path: str, report: dict) -> str:
    """Writes the report to ``path`` atomically; returns the path."""
    storage.write_bytes_atomic(path, (json.dumps(report, indent=1) + "\n").encode())
    return path


def log_lines(report: dict) -> list[str]:
    """What the log shows: the per-class table and the most confused pairs."""
    confusion = np.asarray(report["confusion_matrix"], np.float64)
    step = report["global_step"]
    at = f" at step {step}" if step >= 0 else ""
    lines = [f"per-class accuracy{at} ({report['dataset']}):"]
    lines += table(confusion, report["class_names"])
    pairs = report["most_confused"]
    if pairs:
        lines.append("most confused: " + "; ".join(
            f"{p['true']} taken for {p['predicted']} ({p['images']} "
            f"image{'' if p['images'] == 1 else 's'})" for p in pairs))
    return lines
