"""SavedModel export: the trained ResNet with the signatures TensorFlow Serving users call.

| signature | method | input | outputs |
|---|---|---|---|
| ``serving_default`` | predict | ``images`` float32 [N, 32, 32, 3], RGB 0..255 | ``classes``, ``probabilities``, ``class_names`` |
| ``serving_bytes`` | predict | ``image_bytes`` string [N]: PNG, JPEG, GIF or BMP files, any size and mode | the same |
| ``serving_examples`` | predict | ``examples`` string [N]: serialized ``tf.train.Example`` of the record schema | the same |
| ``classify`` | classify | ``inputs``: serialized ``tf.train.Example`` | ``classes`` (class-name strings [N, C]), ``scores`` [N, C] |

``classes`` is the int64 top class, ``probabilities`` float32 [N, C], ``class_names`` the top
class's name (string [N]), so clients need no side file. ``image_bytes`` ends in ``_bytes``:
TensorFlow Serving's REST API decodes ``{"b64": "..."}`` values for such inputs. The bytes are
decoded and resized in the graph by ``images.to_cifar_pixels``, the conversion ``predict``
and the image-folder generator use; bytes that are no image fail the request with
TensorFlow's "Unknown image file format" error, and the server goes on. ``classify`` serves
TensorFlow Serving's Classify API.

The export is a TF2 SavedModel made for inference: one network function, called by every
signature, with the checkpoint's weights frozen into it as constants and each batch norm folded
into the convolution before it (the checkpoints in the job dir stay the training state). Each
choice was measured with benchmarks/serving_bench.py:
- constant weights let oneDNN reorder each convolution's filter once and keep it, instead of
  on every request;
- folded batch norms leave a bias, which oneDNN fuses with the residual add and the ReLU into
  the convolution;
- ``tf.saved_model.load`` turns a TF1-format SavedModel's signatures into functions whose
  Python signature is empty, so every call first fails to bind its inputs, formats the whole
  input tensor into an error message it then drops, and retries (TF 2.15,
  ``function_type_utils.bind_function_inputs``): 10 % of the time at batch 32.
The network is built in ``channels_last`` without device placements, whatever the training
layout and devices (the weights do not depend on them). A checkpoint of another depth or
ResNet version is refused before anything is written.

``assets.extra/`` holds ``class_names.txt`` (one name per line, for tools),
``eval_metrics.json`` (the scalars of the checkpoint's evaluation, when there was one) and, when the
optional ``tensorflow-serving-api`` package is installed (``pip install -e '.[serving]'``),
``tf_serving_warmup_requests``: one PredictionLog per signature in TensorFlow Serving's
warm-up format, so a server runs each signature once before it takes traffic.

The SavedModel is written under a temporary name and renamed into
``<export_dir>/<unix time>`` only when complete (the layout TensorFlow Serving watches).
``BestExport`` keeps ``<export_dir>/best/<version>``, the export of the best evaluation so far
(``--export-best``).
"""

import concurrent.futures
import json
import logging
import os
import shutil
import time
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from cifar10_estimator import cifar10, images as image_ops, resnet
from cifar10_estimator.errors import UserError
from cifar10_estimator.evaluator import checkpoint_gone
from cifar10_estimator.model_fn import ModelSettings

log = logging.getLogger("cifar10_estimator")

IMAGES_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
BYTES_SIGNATURE = "serving_bytes"
EXAMPLES_SIGNATURE = "serving_examples"
CLASSIFY_SIGNATURE = "classify"
CLASS_NAMES_FILE = os.path.join("assets.extra", "class_names.txt")
EVAL_METRICS_FILE = os.path.join("assets.extra", "eval_metrics.json")
BEST_SUBDIR = "best"
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
_IMAGE_SHAPE = [cifar10.HEIGHT, cifar10.WIDTH, cifar10.CHANNELS]


def _remove_unfinished(export_dir: str) -> None:
    """Deletes temporary export folders that a killed run left behind."""
    for name in os.listdir(export_dir):
        if name.startswith(".") and name.endswith(".tmp"):
            shutil.rmtree(os.path.join(export_dir, name), ignore_errors=True)


class _FrozenWeights:
    """A variable-scope custom getter that answers every variable with the checkpoint's value
    as a constant. ``check_all_used`` then refuses a checkpoint of another architecture."""

    def __init__(self, checkpoint_path: str):
        self.checkpoint_path = checkpoint_path
        self.reader = tf.train.load_checkpoint(checkpoint_path)
        self.shapes = self.reader.get_variable_to_shape_map()
        self.used: set[str] = set()

    def _mismatch(self, what: str) -> UserError:
        return UserError(f"checkpoint {self.checkpoint_path} {what}: export it with the "
                         f"--num-layers and --resnet-version it was trained with")

    def __call__(self, getter, name, shape=None, **_):
        if list(self.shapes.get(name, [-1])) != list(shape):
            found = f"has {name} as {self.shapes[name]}" if name in self.shapes else "lacks it"
            raise self._mismatch(f"{found}, but the model needs {name} of shape {list(shape)}")
        self.used.add(name)
        return tf.constant(self.reader.get_tensor(name), name=name.replace("/", "_"))

    def check_all_used(self, scope: str) -> None:
        """Raises UserError if the checkpoint has network weights under ``scope`` that the
        model did not ask for (a shallower model fits inside a deeper one's checkpoint).
        Optimizer slots (``<variable>/Momentum``) are not weights."""
        names = {name for name in self.shapes if name.startswith(scope + "/")}
        unused = sorted(name for name in names - self.used
                        if not any(name.startswith(owner + "/") for owner in names))
        if unused:
            raise self._mismatch(f"has {len(unused)} weights this model does not use "
                                 f"(such as {unused[0]})")


class _ServingModule(tf.Module):
    """The exported functions: one network, and one function per signature around it."""

    def __init__(self, settings: ModelSettings, weights: _FrozenWeights,
                 class_names: Sequence[str]):
        super().__init__()
        names = list(class_names)

        @tf.function(input_signature=[tf.TensorSpec([None, *_IMAGE_SHAPE], tf.float32)])
        def network(images):
            with tf.compat.v1.variable_scope("resnet", custom_getter=weights):
                logits = resnet.resnet_cifar(
                    images, is_training=False, num_layers=settings.num_layers,
                    version=settings.resnet_version, data_format="channels_last",
                    batch_norm_epsilon=settings.batch_norm_epsilon,
                    num_classes=len(names), fold_batch_norm=True)
            # The names model_fn's predictions use, so Estimator.predict agrees with serving.
            classes = tf.argmax(logits, axis=1, name="classes")
            return {"classes": classes,
                    "probabilities": tf.nn.softmax(logits, name="probabilities"),
                    "class_names": tf.gather(tf.constant(names), classes)}

        def from_pixels(pixels):
            return network(tf.cast(pixels, tf.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, *_IMAGE_SHAPE], tf.float32,
                                                    name="images")])
        def by_images(images):
            return network(images)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
        def by_bytes(image_bytes):
            return from_pixels(tf.map_fn(image_ops.to_cifar_pixels, image_bytes,
                                         fn_output_signature=tf.TensorSpec(_IMAGE_SHAPE,
                                                                           tf.uint8)))

        def parse(serialized):
            return cifar10.decode_images(
                tf.io.parse_example(serialized, cifar10.FEATURE_SPEC)["image"])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def by_examples(examples):
            return from_pixels(parse(examples))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(inputs):
            probabilities = from_pixels(parse(inputs))["probabilities"]
            # TF Serving's Classify API: "classes" are the labels, "scores" their scores.
            return {"classes": tf.tile(tf.constant(names)[None, :],
                                       [tf.shape(probabilities)[0], 1]),
                    "scores": probabilities}

        network.get_concrete_function()  # traces it: the weights are read now
        weights.check_all_used("resnet")
        self.network = network
        self.serving_signatures = {IMAGES_SIGNATURE: by_images, BYTES_SIGNATURE: by_bytes,
                           EXAMPLES_SIGNATURE: by_examples, CLASSIFY_SIGNATURE: classify}


def _set_classify_method(folder: str) -> None:
    """Gives the ``classify`` signature TF Serving's classify method.

    ``tf.saved_model.save`` writes every signature as a predict signature and has no
    argument for the method, so the saved proto is edited, and its fingerprint rewritten.
    """
    path = os.path.join(folder, "saved_model.pb")
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


def _warmup_requests(model_name: str = "cifar10") -> list[bytes]:
    """Serialized PredictionLog records, one per signature (TF Serving's warm-up format).

    Returns [] when ``tensorflow-serving-api`` is not installed.
    """
    try:
        from tensorflow_serving.apis import (classification_pb2, input_pb2, predict_pb2,
                                             prediction_log_pb2)
    except ImportError:
        return []
    grey = np.full((1, cifar10.HEIGHT, cifar10.WIDTH, cifar10.CHANNELS), 128, np.uint8)
    png = tf.io.encode_png(grey[0]).numpy()
    example = tf.train.Example.FromString(
        cifar10.encode_example(np.transpose(grey[0], (2, 0, 1)).tobytes(), 0))
    logs = []
    for signature, key, value in ((IMAGES_SIGNATURE, "images", grey.astype(np.float32)),
                                  (BYTES_SIGNATURE, "image_bytes", np.array([png], object)),
                                  (EXAMPLES_SIGNATURE, "examples",
                                   np.array([example.SerializeToString()], object))):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        request.model_spec.signature_name = signature
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
        logs.append(prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request)))
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = model_name
    classify.model_spec.signature_name = CLASSIFY_SIGNATURE
    classify.input.CopyFrom(input_pb2.Input(
        example_list=input_pb2.ExampleList(examples=[example])))
    logs.append(prediction_log_pb2.PredictionLog(
        classify_log=prediction_log_pb2.ClassifyLog(request=classify)))
    return [entry.SerializeToString() for entry in logs]


def _write_assets(folder: str, class_names: Sequence[str], requests: Sequence[bytes],
                  metrics: Optional[dict]) -> None:
    os.makedirs(os.path.join(folder, "assets.extra"))
    with open(os.path.join(folder, CLASS_NAMES_FILE), "w") as f:
        f.write("".join(f"{name}\n" for name in class_names))
    if metrics is not None:
        with open(os.path.join(folder, EVAL_METRICS_FILE), "w") as f:
            json.dump(_scalar_metrics(metrics), f, indent=1, sort_keys=True)
    if not requests:
        log.info("no %s: install the optional tensorflow-serving-api package "
                 "(pip install -e '.[serving]') to write TF Serving warm-up requests",
                 WARMUP_FILE)
        return
    with tf.io.TFRecordWriter(os.path.join(folder, WARMUP_FILE)) as writer:
        for request in requests:
            writer.write(request)


def _scalar_metrics(metrics: dict) -> dict:
    """The scalar metrics of an evaluation (accuracy, loss, global_step, ...) as JSON values."""
    out = {}
    for key, value in metrics.items():
        value = np.asarray(value)
        if value.shape == () and value.dtype.kind in "iuf":
            out[key] = value.item()
    return out


def export_saved_model(settings: ModelSettings, checkpoint_path: str, export_dir: str,
                       class_names: Sequence[str] = cifar10.CLASS_NAMES,
                       metrics: Optional[dict] = None) -> str:
    """Writes the SavedModel of ``checkpoint_path`` into a new numbered folder of ``export_dir``.

    ``class_names`` (label order) become the ``class_names`` outputs, the ``classify``
    signature's classes and ``assets.extra/class_names.txt``. ``metrics``, the checkpoint's
    evaluation, go to ``assets.extra/eval_metrics.json`` (its scalars).

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
                               class_names, metrics).result()
    weights = _FrozenWeights(checkpoint_path)
    version = int(time.time())
    while os.path.exists(os.path.join(export_dir, str(version))):
        version += 1
    final = os.path.join(export_dir, str(version))
    tmp = os.path.join(export_dir, f".{version}.tmp")
    requests = _warmup_requests()
    module = _ServingModule(settings, weights, class_names)
    try:
        os.makedirs(export_dir, exist_ok=True)
        _remove_unfinished(export_dir)
        tf.saved_model.save(module, tmp, signatures=module.serving_signatures)
        _set_classify_method(tmp)
        _write_assets(tmp, class_names, requests, metrics)
        # The rename is the commit: a numbered folder is always a complete export.
        os.rename(tmp, final)
    except (OSError, tf.errors.OpError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = e.strerror if isinstance(e, OSError) else e.message.splitlines()[0]
        raise UserError(f"cannot write the SavedModel under {export_dir}: {reason}; "
                        f"free space or choose another --export-dir") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


class BestExport:
    """Keeps ``<export_dir>/best/<version>``: the export of the best evaluation so far.

    ``consider`` exports a checkpoint whose evaluation has a higher accuracy than every earlier
    one, then deletes the older best exports, so the folder (a TF Serving model base path of
    its own) holds one version. The best accuracy so far is read back from the exports'
    ``eval_metrics.json``, so a resumed job goes on with the same contest.
    """

    def __init__(self, settings: ModelSettings, export_dir: str,
                 class_names: Sequence[str] = cifar10.CLASS_NAMES):
        self.settings = settings
        self.folder = os.path.join(export_dir, BEST_SUBDIR)
        self.class_names = class_names

    def _versions(self) -> list[str]:
        if not os.path.isdir(self.folder):
            return []
        return [os.path.join(self.folder, v) for v in os.listdir(self.folder) if v.isdigit()]

    def best_accuracy(self) -> Optional[float]:
        """The highest accuracy among the best exports there are (None if there is none)."""
        best = None
        for version in self._versions():
            try:
                with open(os.path.join(version, EVAL_METRICS_FILE)) as f:
                    accuracy = float(json.load(f)["accuracy"])
            except (OSError, ValueError, KeyError):
                continue  # not one of ours
            best = accuracy if best is None else max(best, accuracy)
        return best

    def consider(self, metrics: dict, checkpoint_path: str) -> Optional[str]:
        """Exports ``checkpoint_path`` if ``metrics["accuracy"]`` beats the best so far.

        Returns the new export's path, or None (not better, or the checkpoint was deleted by
        ``--keep-checkpoint-max`` before it could be read).
        """
        accuracy = float(metrics["accuracy"])
        best = self.best_accuracy()
        if best is not None and accuracy <= best:
            return None
        older = self._versions()
        try:
            path = export_saved_model(self.settings, checkpoint_path, self.folder,
                                      self.class_names, metrics)
        except (tf.errors.NotFoundError, ValueError):
            if not checkpoint_gone(checkpoint_path):
                raise
            log.info("checkpoint %s was deleted before it could be exported "
                     "(--keep-checkpoint-max); keeping the best export there is",
                     os.path.basename(checkpoint_path))
            return None
        for version in older:
            shutil.rmtree(version, ignore_errors=True)
        log.info("best accuracy so far, %.2f%%: exported to %s", 100 * accuracy, path)
        return path
