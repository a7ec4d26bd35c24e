"""Writing a SavedModel export: a TF2 SavedModel in a new numbered folder, all or nothing.

``export_saved_model`` builds the serving module of a checkpoint (``signatures``), saves it with
``tf.saved_model.save``, gives the ``classify`` signature TF Serving's classify method, and adds
``assets.extra/``: ``class_names.txt`` (one name per line, for tools), ``export.json`` (the
checkpoint and its global step, and the dtype the network computes in), ``eval_metrics.json`` (the
scalars of the checkpoint's evaluation, when there was one) and the warm-up requests
(``warmup``). A TF2 SavedModel, because ``tf.saved_model.load`` turns a TF1-format export's
signatures into functions whose Python signature is empty, so every call first fails to bind its
inputs, formats the whole input tensor into an error message it then drops, and retries (TF 2.15,
``function_type_utils.bind_function_inputs``): 10 % of the time at batch 32.

The SavedModel is written under a temporary name and renamed into ``<export_dir>/<unix time>``
only when complete (the layout TensorFlow Serving watches). On object storage, which renames a
folder object by object, it is written in a local temporary folder and uploaded with
``saved_model.pb`` last: a numbered folder without it is an export still arriving (or cut
short), and readers here skip it.
"""

import concurrent.futures
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from cifar10_estimator import storage
from cifar10_estimator.errors import UserError
from cifar10_estimator.model.checkpoints import checkpoint_step
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.serving import warmup
from cifar10_estimator.serving.signatures import CLASSIFY_SIGNATURE, FrozenWeights, ServingModule

log = logging.getLogger("cifar10_estimator")

CLASS_NAMES_FILE = os.path.join(warmup.ASSETS_EXTRA, "class_names.txt")
EVAL_METRICS_FILE = os.path.join(warmup.ASSETS_EXTRA, "eval_metrics.json")
# What the export was made of: the checkpoint and its global step, and the dtype the network
# computes in (float32 or bfloat16; a bfloat16 export is fast only on machines with native bf16,
# docs/serving.md).
EXPORT_INFO_FILE = os.path.join(warmup.ASSETS_EXTRA, "export.json")


def _remove_unfinished(export_dir: str) -> None:
    """Deletes temporary export folders that a killed run left behind."""
    for name in storage.listdir(export_dir):
        if name.startswith(".") and name.endswith(".tmp"):
            storage.rmtree(storage.join(export_dir, name))


def _set_classify_method(folder: str) -> None:
    """Gives the ``classify`` signature TF Serving's classify method.

    ``tf.saved_model.save`` writes every signature as a predict signature and has no
    argument for the method, so the saved proto is edited, and its fingerprint rewritten.
    """
    path = os.path.join(folder, tf.saved_model.SAVED_MODEL_FILENAME_PB)
    proto = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    for meta_graph in proto.meta_graphs:
        meta_graph.signature_def[CLASSIFY_SIGNATURE].method_name = (
            tf.saved_model.CLASSIFY_METHOD_NAME)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    from tensorflow.python.saved_model import fingerprinting_utils  # not in the public API

    fingerprinting_utils.write_fingerprint(folder)


def _write_assets(folder: str, settings: ModelSettings, requests: list,
                  metrics: Optional[dict], checkpoint_path: str) -> None:
    os.makedirs(os.path.join(folder, warmup.ASSETS_EXTRA))
    with open(os.path.join(folder, CLASS_NAMES_FILE), "w") as f:
        f.write("".join(f"{name}\n" for name in settings.class_names))
    with open(os.path.join(folder, EXPORT_INFO_FILE), "w") as f:
        json.dump({"checkpoint": os.path.basename(checkpoint_path),
                   "global_step": checkpoint_step(checkpoint_path),
                   "compute_dtype": settings.compute_dtype}, f, indent=1, sort_keys=True)
    if metrics is not None:
        with open(os.path.join(folder, EVAL_METRICS_FILE), "w") as f:
            json.dump(_scalar_metrics(metrics), f, indent=1, sort_keys=True)
    warmup.write_warmup_requests(folder, requests)


def _scalar_metrics(metrics: dict) -> dict:
    """The scalar metrics of an evaluation (accuracy, loss, global_step, ...) as JSON values."""
    out = {}
    for key, value in metrics.items():
        value = np.asarray(value)
        if value.shape == () and value.dtype.kind in "iuf":
            out[key] = value.item()
    return out


def export_saved_model(settings: ModelSettings, checkpoint_path: str, export_dir: str,
                       metrics: Optional[dict] = None) -> str:
    """Writes the SavedModel of ``checkpoint_path`` into a new numbered folder of ``export_dir``.

    The settings' ``class_names`` (label order) become the ``class_names`` outputs, the
    ``classify`` signature's classes and ``assets.extra/class_names.txt``. ``metrics``, the
    checkpoint's evaluation, go to ``assets.extra/eval_metrics.json`` (its scalars).

    Returns:
      The path of the new SavedModel folder.

    Raises:
      UserError: the export folder cannot be written.
    """
    if not tf.executing_eagerly():
        # Estimator calls exporters inside its own finalized graph, and tf.saved_model.save
        # needs eager execution; a new thread starts in it (both are per thread).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(export_saved_model, settings, checkpoint_path, export_dir,
                               metrics).result()
    weights = FrozenWeights(checkpoint_path, averaged=bool(settings.model.moving_average_decay))
    requests = warmup.warmup_requests()
    module = ServingModule(settings, weights)
    remote = storage.is_url(export_dir)
    final = tmp = None
    try:
        storage.makedirs(export_dir)
        version = int(time.time())
        while storage.exists(storage.join(export_dir, str(version))):
            version += 1
        final = storage.join(export_dir, str(version))
        if remote:
            tmp = tempfile.mkdtemp(prefix=f".{version}.", suffix=".tmp")
        else:
            _remove_unfinished(export_dir)
            tmp = storage.join(export_dir, f".{version}.tmp")
        tf.saved_model.save(module, tmp, signatures=module.serving_signatures)
        _set_classify_method(tmp)
        _write_assets(tmp, settings, requests, metrics, checkpoint_path)
        if remote:
            storage.upload_tree(tmp, final, last=tf.saved_model.SAVED_MODEL_FILENAME_PB)
        else:
            # The rename is the commit: a numbered folder is always a complete export.
            os.rename(tmp, final)
    except (OSError, tf.errors.OpError) as e:
        _clean_up(tmp, final if remote else None)
        raise UserError(f"cannot write the SavedModel under {export_dir}: {storage.reason(e)}; "
                        f"free space or choose another --export-dir") from None
    except BaseException:
        _clean_up(tmp, final if remote else None)
        raise
    if remote:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _clean_up(tmp: Optional[str], partial: Optional[str]) -> None:
    """Removes a failed export's temporary folder and (object storage) what it uploaded."""
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    if partial:
        storage.rmtree(partial)
