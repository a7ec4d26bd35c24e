"""The last lines of a run: what it produced, how fast, and the commands that use it.

The commands name this Python and the virtual environment's tools by their paths, so they work
when pasted whether or not the environment is active.
"""

import os
import shlex
import sys
from typing import Optional

from cifar10_estimator import storage
from cifar10_estimator.serving.warmup import SERVING_MODEL_NAME
from cifar10_estimator.training.end import TrainResult
from cifar10_estimator.training.estimator.progress import format_duration


def run_summary(data_dir: str, job_dir: str, result: TrainResult, seconds: float
                ) -> list[str]:
    """The run summary: wall time, final accuracy, throughput over the run, and the commands
    that use what it wrote in ``job_dir`` from ``data_dir`` (predict, TF Serving,
    TensorBoard)."""
    lines = [_head(result, seconds)]
    python, tensorboard = shlex.quote(sys.executable), _tool("tensorboard")
    if result.export_path:
        export = shlex.quote(result.export_path)
        lines.append(f"  SavedModel: {result.export_path}")
        lines.append(f"  predict:    {python} -m cifar10_estimator.predict --saved-model "
                     f"{export} IMAGE...")
        lines.append(f"  evaluate:   {python} -m cifar10_estimator.evaluate {export} "
                     f"--data-dir {shlex.quote(data_dir)}")
        lines.append(f"  serve:      tensorflow_model_server --rest_api_port=8501 "
                     f"--model_name={SERVING_MODEL_NAME} --model_base_path="
                     f"{shlex.quote(_base_path(result.export_path))}")
    if result.report_path:
        lines.append(f"  report:     {result.report_path}")
    lines.append(f"  TensorBoard: {tensorboard} --logdir {shlex.quote(job_dir)}")
    return lines


def _base_path(export_path: str) -> str:
    """The export folder above a numbered export (TF Serving's model base path)."""
    base = storage.parent(export_path)
    return base if storage.is_url(base) else os.path.abspath(base)


def _tool(name: str) -> str:
    """A console script beside this Python (the virtual environment's, active or not), else
    the bare name for the shell to find."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return shlex.quote(path) if os.access(path, os.X_OK) else name


def _head(result: TrainResult, seconds: float) -> str:
    head = f"run summary: wall time {format_duration(seconds)}"
    metrics: Optional[dict] = result.eval_metrics
    if metrics and "accuracy" in metrics:
        head += (f", final accuracy {100 * metrics['accuracy']:.2f}% at step "
                 f"{int(metrics.get('global_step', 0))}")
    steps = result.steps_trained
    if steps > 0 and seconds > 0:
        # Over the whole run, start-up and evaluations included.
        head += (f", {steps} steps, {result.images_trained / seconds:.1f} images/s "
                 f"over the run")
    return head
