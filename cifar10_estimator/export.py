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

Each input has its own copy of the network over the same variables, so a request runs only
its own decoding. The export computes in ``channels_last`` on one device with devices cleared,
whatever the training layout (the variables do not depend on it).

``assets.extra/`` holds ``class_names.txt`` (one name per line, for tools) and, when the
optional ``tensorflow-serving-api`` package is installed (``pip install -e '.[serving]'``),
``tf_serving_warmup_requests``: one PredictionLog per signature in TensorFlow Serving's
warm-up format, so a server runs each signature once before it takes traffic.

The SavedModel is written under a temporary name and renamed into
``<export_dir>/<unix time>`` only when complete (the layout TensorFlow Serving watches).
"""

import dataclasses
import logging
import os
import shutil
import time
from typing import Sequence

import numpy as np
import tensorflow as tf

from cifar10_estimator import cifar10, images as image_ops
from cifar10_estimator.errors import UserError
from cifar10_estimator.model_fn import ModelSettings, make_model_fn

log = logging.getLogger("cifar10_estimator")

IMAGES_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
BYTES_SIGNATURE = "serving_bytes"
EXAMPLES_SIGNATURE = "serving_examples"
CLASSIFY_SIGNATURE = "classify"
CLASS_NAMES_FILE = os.path.join("assets.extra", "class_names.txt")
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def _remove_unfinished(export_dir: str) -> None:
    """Deletes temporary export folders that a killed run left behind."""
    for name in os.listdir(export_dir):
        if name.startswith(".") and name.endswith(".tmp"):
            shutil.rmtree(os.path.join(export_dir, name), ignore_errors=True)


def _serving_graph(settings: ModelSettings, class_names: Sequence[str]) -> dict:
    """Builds the serving graph in the default graph; returns its signature defs.

    Each input gets its own copy of the network (the variables are shared), so a signature
    runs only its own decoding: a single copy behind a ``placeholder_with_default`` kept the
    other inputs' (empty) decoding in every signature and served small batches ~10 % slower
    (benchmarks/serving_bench.py).
    """
    names = tf.constant(list(class_names), tf.string, name="class_name_table")
    model_fn = make_model_fn(settings)

    def outputs_for(images: tf.Tensor, reuse: bool) -> dict:
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=reuse):
            spec = model_fn({"image": images}, None, tf.estimator.ModeKeys.PREDICT)
        return {**spec.predictions,
                "class_names": tf.gather(names, spec.predictions["classes"])}

    shape = [None, cifar10.HEIGHT, cifar10.WIDTH, cifar10.CHANNELS]
    images = tf.compat.v1.placeholder(tf.float32, shape, name="images")
    image_bytes = tf.compat.v1.placeholder(tf.string, [None], name="image_bytes")
    examples = tf.compat.v1.placeholder(tf.string, [None], name="examples")
    decoded = tf.map_fn(image_ops.to_cifar_pixels, image_bytes,
                        fn_output_signature=tf.TensorSpec(shape[1:], tf.uint8))
    parsed = cifar10.decode_images(tf.io.parse_example(examples, cifar10.FEATURE_SPEC)["image"])
    by_images = outputs_for(images, reuse=False)
    by_bytes = outputs_for(tf.cast(decoded, tf.float32), reuse=True)
    by_examples = outputs_for(tf.cast(parsed, tf.float32), reuse=True)
    probabilities = by_examples["probabilities"]
    all_names = tf.tile(names[None, :], [tf.shape(probabilities)[0], 1],
                        name="classify_classes")
    predict = tf.compat.v1.saved_model.predict_signature_def
    return {
        IMAGES_SIGNATURE: predict({"images": images}, by_images),
        BYTES_SIGNATURE: predict({"image_bytes": image_bytes}, by_bytes),
        EXAMPLES_SIGNATURE: predict({"examples": examples}, by_examples),
        CLASSIFY_SIGNATURE: tf.compat.v1.saved_model.classification_signature_def(
            examples, all_names, probabilities),
    }


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


def _write_assets(folder: str, class_names: Sequence[str], requests: Sequence[bytes]) -> None:
    os.makedirs(os.path.join(folder, "assets.extra"))
    with open(os.path.join(folder, CLASS_NAMES_FILE), "w") as f:
        f.write("".join(f"{name}\n" for name in class_names))
    if not requests:
        log.info("no %s: install the optional tensorflow-serving-api package "
                 "(pip install -e '.[serving]') to write TF Serving warm-up requests",
                 WARMUP_FILE)
        return
    with tf.io.TFRecordWriter(os.path.join(folder, WARMUP_FILE)) as writer:
        for request in requests:
            writer.write(request)


def export_saved_model(settings: ModelSettings, checkpoint_path: str, export_dir: str,
                       class_names: Sequence[str] = cifar10.CLASS_NAMES) -> str:
    """Writes the SavedModel of ``checkpoint_path`` into a new numbered folder of ``export_dir``.

    ``class_names`` (label order) become the ``class_names`` outputs, the ``classify``
    signature's classes and ``assets.extra/class_names.txt``.

    Returns:
      The path of the new SavedModel folder.

    Raises:
      UserError: the export folder cannot be written.
    """
    serving = dataclasses.replace(settings, data_format="channels_last", devices=("/cpu:0",),
                                  variable_strategy="CPU", compute_dtype="float32",
                                  num_classes=len(class_names))
    version = int(time.time())
    while os.path.exists(os.path.join(export_dir, str(version))):
        version += 1
    final = os.path.join(export_dir, str(version))
    tmp = os.path.join(export_dir, f".{version}.tmp")
    requests = _warmup_requests()  # eagerly, before the export's graph is entered
    with tf.Graph().as_default():
        signatures = _serving_graph(serving, class_names)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, checkpoint_path)
            try:
                os.makedirs(export_dir, exist_ok=True)
                _remove_unfinished(export_dir)
                builder = tf.compat.v1.saved_model.Builder(tmp)
                builder.add_meta_graph_and_variables(
                    sess, [tf.saved_model.SERVING], signature_def_map=signatures,
                    clear_devices=True, strip_default_attrs=True, saver=saver)
                builder.save()
                _write_assets(tmp, class_names, requests)
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
