"""The end of training: a task's result, the final evaluation's report, the final export, and
whether a job dir already holds all three ("already finished": nothing is trained again).

The chief (or a local run) asks ``finished`` before it trains; after training it exports the
final checkpoint (``export_final``, unless an export of that step exists) and writes the report
of the final evaluation (``write_report``: per-class results in the log and
``JOB/eval_report.json``). The evaluator task writes the report of the evaluation it made of the
final checkpoint.
"""

import dataclasses
import json
import logging
import os
import time
from typing import Callable, Optional

import tensorflow as tf

from cifar10_estimator import storage
from cifar10_estimator.config.plan import Plan
from cifar10_estimator.config.settings import OutputSection
from cifar10_estimator.errors import UserError
from cifar10_estimator.evaluation import offline, report
from cifar10_estimator.model import checkpoints
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.platform import precision_probe
from cifar10_estimator.serving import client
from cifar10_estimator.serving.best_export import BestExport
from cifar10_estimator.serving.export import export_saved_model

log = logging.getLogger("cifar10_estimator")


@dataclasses.dataclass
class TrainResult:
    """What a task produced: final eval metrics (if it evaluated) and the export (if chief)."""

    eval_metrics: Optional[dict]
    export_path: Optional[str]
    report_path: Optional[str] = None  # JOB/eval_report.json, by the task that evaluated
    steps_trained: int = 0  # global steps this run added (0 for an evaluator)
    role: str = "local"  # the task's type in TF_CONFIG's cluster, or "local"
    images_trained: int = 0  # the images of this task's batches in those steps


# The evaluation's log line, for the loop (training/) that logs each evaluation.
evaluation_line = report.evaluation_line


def serving_settings(trained: ModelSettings, requested: str, trained_in: str,
                     machine: precision_probe.Machine) -> ModelSettings:
    """What the task's exports compute with: the model of ``trained`` (trained in
    ``trained_in``) in the precision ``requested`` (``--serving-precision``, probed where it
    must be)."""
    return precision_probe.choose_serving(trained, requested, trained_in, machine)


def best_export(plan: Plan, serving: ModelSettings) -> Optional[BestExport]:
    """``--export-best``'s exporter for the task that evaluates (``plan.exports_best``), else
    None."""
    if not plan.exports_best:
        return None
    role = plan.role
    if role.in_cluster and "evaluator" not in role.cluster_spec and role.is_chief:
        log.info("--export-best: the best export is made by the evaluator task, and this "
                 "cluster lists none (start one with the same flags and "
                 "TF_CONFIG task type 'evaluator')")
    return BestExport(serving, plan.export_dir)


def conclude(plan: Plan, output: OutputSection, metrics: Optional[dict],
             serving: Callable[[], ModelSettings],
             evaluate: Callable[[], dict], check: Callable[[], None]
             ) -> tuple[Optional[dict], str, Optional[str], int]:
    """The chief's end of a run that trained: the final checkpoint evaluated if this run did
    not (``evaluate()``, where the chief evaluates at the end: ``Role.evaluates_at_end``),
    exported unless an export of it exists, and reported.
    ``check`` re-checks the job dir's lock before each of these. Returns the final metrics,
    the export, the report (or None) and the final step."""
    step = checkpoints.latest_step(output.job_dir)
    if plan.role.evaluates_at_end and (not metrics or metrics.get("global_step") != step):
        # Estimator evaluates only a checkpoint it saved in this run: the last one of a run
        # that stopped between its final save and its report is evaluated here, once.
        metrics = evaluate()
        log.info(evaluation_line(metrics))
        check()
    export = export_of(plan, step) or export_final(plan, output, serving(), metrics)
    check()  # before the report
    return metrics, export, write_report(plan, output.job_dir, metrics), step


def export_final(plan: Plan, output: OutputSection, serving: ModelSettings,
                 metrics: Optional[dict]) -> str:
    """Exports the job's latest checkpoint with ``serving``'s settings; ``metrics`` go with it
    when they are that checkpoint's."""
    checkpoint = tf.train.latest_checkpoint(output.job_dir)
    evaluated = metrics if metrics and metrics.get("global_step") == (
        checkpoints.checkpoint_step(checkpoint)) else None
    path = export_saved_model(serving, checkpoint, plan.export_dir, evaluated)
    log.info("exported SavedModel to %s", path)
    return path


def export_of(plan: Plan, step: int) -> Optional[str]:
    """The newest export, if it was made of the checkpoint of ``step``."""
    try:
        export = client.newest_export(plan.export_dir)
    except UserError:
        return None
    return export if offline.export_info(export).get("global_step") == step else None


def _report_of(job_dir: str, step: int) -> Optional[dict]:
    """JOB/eval_report.json, if it reports the evaluation of ``step``."""
    try:
        final = json.loads(storage.read_bytes(storage.join(job_dir, report.REPORT_FILE)))
        return final if final["global_step"] == step else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def wait_for_end(plan: Plan, output: OutputSection, step: int, timeout_secs: float,
                 poll_secs: float = 0.5) -> None:
    """Waits until the chief has exported ``step`` and, where it evaluates at the end
    (``Role.chief_evaluates``), reported it: what a worker of an all-reduce job waits for
    before it leaves. One line naming ``--cluster-timeout-secs`` after ``timeout_secs``."""
    deadline = time.monotonic() + timeout_secs
    while export_of(plan, step) is None or (plan.role.chief_evaluates
                                              and _report_of(output.job_dir, step) is None):
        if time.monotonic() > deadline:
            raise UserError(f"the chief's export of step {step} did not appear in "
                            f"{plan.export_dir} within {timeout_secs:g} s "
                            f"(--cluster-timeout-secs)")
        time.sleep(poll_secs)


def finished(plan: Plan, output: OutputSection, serving: Callable[[], ModelSettings]
             ) -> Optional[TrainResult]:
    """The result of a job that already trained to its last step and exported it (and, run
    locally, reported its final evaluation), else None. A job that trained to its end and
    reported that step's evaluation but lost or never finished its export (a full disk) is
    exported here, once, with the report's figures and ``serving()``'s settings: nothing is
    trained or evaluated again."""
    job_dir = output.job_dir
    step = checkpoints.latest_step(job_dir)
    if step < plan.train_steps:
        return None
    export = export_of(plan, step)
    final = _report_of(job_dir, step)
    if final is None and not (export and not plan.role.evaluates_at_end):
        return None  # the task evaluates and reports below; the export is not made twice
    metrics = {"accuracy": float(final["accuracy"]), "global_step": step} if final else None
    path = os.path.join(job_dir, report.REPORT_FILE) if final else None
    shown = f", final accuracy {100 * metrics['accuracy']:.2f}%" if metrics else ""
    if export is None:
        export = export_final(plan, output, serving(), metrics)
        log.info("already trained to step %d in %s%s: nothing to train; exported its final "
                 "checkpoint, which had no export, to %s", step, job_dir, shown, export)
    else:
        log.info("already trained to step %d in %s%s: nothing to train or export (%s); its "
                 "export is %s%s", step, job_dir, shown, _longer(plan), export,
                 f" and its report {path}" if path else "")
    return TrainResult(metrics, export, path, 0, plan.role.kind)


def _longer(plan: Plan) -> str:
    """How to train a finished job longer, as its schedule allows: a length-shaped schedule
    recorded its length (``jobdir.settings_record``), so a longer run changes its course and
    needs --change-settings."""
    flag = "--train-epochs" if plan.length_from == "--train-epochs" else "--train-steps"
    if plan.schedule.length_shaped:
        return (f"to train longer, raise {flag} with --change-settings: the "
                f"{plan.schedule.kind} schedule then spans the new length")
    return f"raise {flag} to train longer"


def write_report(plan: Plan, job_dir: str, metrics: Optional[dict]) -> Optional[str]:
    """Logs the final evaluation's per-class results and writes ``job_dir``/eval_report.json."""
    if not metrics or "confusion_matrix" not in metrics:
        return None
    content = report.build(metrics, plan.class_names, plan.dataset)
    for line in report.log_lines(content):
        log.info(line)
    return report.write(job_dir, content)
