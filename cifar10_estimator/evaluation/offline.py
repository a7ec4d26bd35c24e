"""Evaluating a trained model once, outside training: what the ``evaluate`` command runs.

The model is a SavedModel export (a numbered folder, or the export folder above the numbered
ones, whose newest version is taken), a LiteRT or ONNX file converted from one (run on its own
runtime, ``serving.runtimes``), or a checkpoint of a job dir (the latest, or a named one),
which is built with the settings the job dir recorded (``settings_record``) and, when those say
the run averaged its weights, with the averaged ones, as the trainer's evaluation is. Both become
one function from 32x32 pictures to probabilities: the export's ``serving_default`` signature,
or the export's own network over the checkpoint (``serving.signatures``), so a checkpoint and
its export evaluate alike.

It reads one ordered pass over a split of a records folder, counts every record once (the
pipeline's padding rows weigh 0), and gives the metrics the trainer's final evaluation gives:
accuracy, cross-entropy and the confusion matrix, from which ``report`` makes the per-class table,
the most confused pairs and the report JSON.
"""

import dataclasses
import os
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from cifar10_estimator import storage
from cifar10_estimator.data import metadata, schema
from cifar10_estimator.data.pipeline import Cifar10DataSet
from cifar10_estimator.errors import UserError
from cifar10_estimator.model import checkpoints
from cifar10_estimator.model.checkpoints import checkpoint_gone, checkpoint_model, checkpoint_step
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.config.overlays import TUTORIAL_CNN_AVERAGE_DECAY
from cifar10_estimator.config.settings import EXPORT_SUBDIR, ModelSection
from cifar10_estimator.serving import client, formats, runtimes
from cifar10_estimator.serving.export import EVAL_METRICS_FILE, EXPORT_INFO_FILE
from cifar10_estimator.serving.signatures import AVERAGE_SUFFIX, FrozenWeights, ServingModule
from cifar10_estimator.jobdir import settings_record

@dataclasses.dataclass
class Evaluated:
    """A model ready to evaluate: what it is, its function and class names, its step."""

    what: str  # "SavedModel PATH" or "checkpoint PATH"
    probabilities: Callable[[tf.Tensor], tf.Tensor]  # float32 [B, 32, 32, 3] 0..255 -> [B, C]
    class_names: tuple[str, ...]
    global_step: Optional[int]
    job_dir: Optional[str] = None  # set for a checkpoint
    export: Optional[str] = None  # set for an export: its numbered folder


def default_report_path(model: Evaluated, split: str) -> str:
    """Where ``evaluate`` writes its report unless told: in the job dir for a checkpoint
    (``eval_report_<split>_step<N>.json``), beside the numbered folder for an export
    (``eval_report_<split>_<version>.json`` in the export folder, which TensorFlow Serving
    ignores); never in the current folder."""
    if model.job_dir:
        return storage.join(model.job_dir,
                            f"eval_report_{split}_step{model.global_step}.json")
    export = model.export if storage.is_url(model.export) else os.path.abspath(model.export)
    return storage.join(storage.parent(export),
                        f"eval_report_{split}_{storage.basename(export)}.json")


def load(path: str, checkpoint: Optional[str] = None,
         class_names: Optional[tuple[str, ...]] = None,
         compute_dtype: Optional[Callable[[ModelSettings, str], str]] = None,
         trusted: bool = False) -> Evaluated:
    """The model at ``path``: an export, an export folder or a job dir.

    Args:
      path: the folder.
      checkpoint: for a job dir, a checkpoint's path or global step (default: the latest).
      class_names: a job dir's class names (its records'); an export has its own.
      compute_dtype: for a job dir without an export in JOB/export (whose dtype it takes), the
        dtype its network computes in, given the settings and the precision the job trained in
        ('fp32' or 'bf16'), as the job's export would (``precision_probe.serving_choice``);
        default float32. An export computes in its own.
      trusted: load an export without checking that it holds only what this package's exports
        hold (``client.load_model``); a job dir's checkpoint is no program, and is read as such.

    Raises:
      UserError: ``path`` is none of those, the checkpoint does not exist, or (unless
        ``trusted``) the export holds more than this package's exports (``serving.trust``).
    """
    if formats.runtime_of(path):
        if checkpoint is not None:
            raise UserError(f"--checkpoint applies to a job dir, and {path} is a model file")
        return _load_model_file(path, trusted)
    try:
        folder = storage.isdir(path)
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror})") from None
    if not folder:
        raise UserError(f"{path} is not a folder; pass a SavedModel export or a job dir")
    version = _export_version(path)
    if version:
        if checkpoint is not None:
            raise UserError(f"--checkpoint applies to a job dir, and {path} is an export")
        return _load_export(version, trusted)
    if tf.train.latest_checkpoint(path) or checkpoint is not None:
        return _load_checkpoint(path, _checkpoint_path(path, checkpoint), class_names,
                                compute_dtype)
    raise UserError(f"{path} is neither a SavedModel export (no {client.SAVED_MODEL_FILE}, nor "
                    f"numbered folders with one) nor a job dir (no checkpoint); pass a "
                    f"trainer's JOB_DIR, JOB_DIR/export or JOB_DIR/export/<version>")


def _export_version(path: str) -> Optional[str]:
    """``path`` if it is an export, its newest numbered version if it holds them, else None."""
    try:
        return client.newest_export(path)
    except UserError:
        return None


def _load_export(folder: str, trusted: bool) -> Evaluated:
    _, signature = client.load_model(folder, trusted)
    num_classes = int(signature.structured_outputs["probabilities"].shape[-1])
    return Evaluated(f"SavedModel {folder}{_computes_in(_export_dtype(folder))}",
                     lambda images: signature(images=images)["probabilities"],
                     client.class_names(folder, num_classes), export_step(folder),
                     export=folder)


def _load_model_file(path: str, trusted: bool) -> Evaluated:
    model = runtimes.load(path, runtimes.default_threads(), trusted)
    precision = formats.manifest_entry(path).get("precision")
    what = f"{model.runtime} {path}" + (f" ({precision})" if isinstance(precision, str) else "")
    # The step of the export it was converted from: the file sits in EXPORT/<version>/converted.
    return Evaluated(what, model.probabilities,
                     formats.class_names(path, model.num_classes),
                     export_step(storage.parent(storage.parent(path))), export=path)


def export_step(folder: str) -> Optional[int]:
    """The global step of an export's evaluation (``eval_metrics.json``), None without one."""
    try:
        return int(storage.read_json(storage.join(folder, EVAL_METRICS_FILE))["global_step"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError):  # Overflow: Infinity
        return None  # an export without its evaluation's scalars


def export_info(folder: str) -> dict:
    """An export's ``export.json``: its checkpoint, global step and compute dtype (empty for an
    export older than the file)."""
    try:
        info = storage.read_json(storage.join(folder, EXPORT_INFO_FILE))
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def _export_dtype(folder: str) -> str:
    """The dtype an export computes in (float32 for exports older than the file that says)."""
    return str(export_info(folder).get("compute_dtype", "float32"))


def _job_export_dtype(job_dir: str) -> Optional[str]:
    """What the job dir's newest export (in JOB/export) computes in, if it has one: a checkpoint
    evaluates as its export does."""
    try:
        export = client.newest_export(os.path.join(job_dir, EXPORT_SUBDIR))
    except UserError:
        return None
    return export_info(export).get("compute_dtype")


def _computes_in(dtype: str) -> str:
    return "" if dtype == "float32" else f" (computing in {dtype})"


def _checkpoint_path(job_dir: str, checkpoint: Optional[str]) -> str:
    if checkpoint is None:
        return tf.train.latest_checkpoint(job_dir)
    path = (os.path.join(job_dir, f"model.ckpt-{checkpoint}") if checkpoint.isdigit()
            else checkpoint)
    if checkpoint_gone(path):
        state = tf.train.get_checkpoint_state(job_dir)
        kept = [checkpoint_step(p) for p in state.all_model_checkpoint_paths] if state else []
        raise UserError(f"--checkpoint {checkpoint}: {path} does not exist; {job_dir} keeps "
                        f"the checkpoints of steps {', '.join(map(str, kept)) or 'none'}")
    return path


def _recorded_params(job_dir: str, checkpoint: str,
                     found: Optional[tuple[ModelSection, int]]) -> tuple[ModelSection, str]:
    """The network and its averaging as the job dir recorded them, and the precision it trained
    in; for a job dir without ``settings.json`` (older versions), as the checkpoint's variables
    show them (``found``, from ``checkpoint_model``), and fp32."""
    recorded = settings_record.read(job_dir)
    if recorded is not None:
        fields = {f.name for f in dataclasses.fields(ModelSection)}
        values = {k: tuple(v) if isinstance(v, list) else v
                  for k, v in recorded.items() if k in fields}
        return ModelSection(**values), recorded.get("precision", "fp32")
    if found is None:
        raise UserError(f"{checkpoint} holds neither network's variables; pass a job dir of "
                        f"this package")
    averaged = any(name.endswith("/" + AVERAGE_SUFFIX)
                   for name in checkpoints.variable_shapes(checkpoint))
    # Any positive decay: only whether the run averaged its weights matters here.
    decay = TUTORIAL_CNN_AVERAGE_DECAY if averaged else 0.0
    return dataclasses.replace(found[0], moving_average_decay=decay), "fp32"


def _load_checkpoint(job_dir: str, checkpoint: str, class_names: Optional[tuple[str, ...]],
                     compute_dtype: Optional[Callable[[ModelSettings, str], str]]) -> Evaluated:
    found = checkpoint_model(checkpoint)  # the variable list, read once
    params, trained = _recorded_params(job_dir, checkpoint, found)
    num_classes = found[1] if found else schema.NUM_CLASSES
    if class_names is None or len(class_names) != num_classes:
        class_names = schema.placeholder_class_names(num_classes)
    settings = ModelSettings(model=params, class_names=class_names)
    exported = _job_export_dtype(job_dir)
    if exported or compute_dtype:
        settings = dataclasses.replace(
            settings, compute_dtype=exported or compute_dtype(settings, trained))
    weights = FrozenWeights(checkpoint, averaged=params.moving_average_decay > 0)
    network = ServingModule(settings, weights).network
    return Evaluated(f"checkpoint {checkpoint}{_computes_in(settings.compute_dtype)}",
                     lambda images: network(images)["probabilities"],
                     class_names, checkpoint_step(checkpoint), job_dir)


def evaluate(model: Evaluated, data_dir: str, split: str, batch_size: int = 100) -> dict:
    """The metrics of one pass over ``split``: accuracy, cross_entropy, confusion_matrix,
    global_step (-1 if unknown) and examples.

    Raises:
      UserError: the split is missing, or its classes are not the model's.
    """
    info = metadata.dataset_info(data_dir)
    classes = len(model.class_names)
    if info.num_classes != classes:
        raise UserError(f"the records in {data_dir} have {info.num_classes} classes, and "
                        f"{model.what} has {classes}; evaluate it on the records it was trained "
                        f"on, or on records with the same classes")
    data = Cifar10DataSet(data_dir, split, use_distortion=False)
    metadata.verify_split(data_dir, split)
    confusion = np.zeros([classes, classes])
    cross_entropy = 0.0
    for features, labels in data.one_pass(batch_size):
        probabilities = np.asarray(model.probabilities(features["image"]))
        weight, labels = features["weight"].numpy(), labels.numpy()
        np.add.at(confusion, (labels, probabilities.argmax(axis=1)), weight)
        picked = probabilities[np.arange(len(labels)), labels]
        # As the trainer's metric: the softmax cross-entropy of the true class, averaged.
        cross_entropy += float(np.sum(-np.log(np.maximum(picked, 1e-30)) * weight))
    examples = confusion.sum()
    return {"accuracy": float(np.trace(confusion) / max(examples, 1)),
            "cross_entropy": cross_entropy / max(examples, 1),
            "confusion_matrix": confusion,
            "global_step": model.global_step if model.global_step is not None else -1,
            "examples": int(examples)}
