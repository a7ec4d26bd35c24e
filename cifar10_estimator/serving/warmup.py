"""TF Serving's warm-up requests: one ``PredictionLog`` per signature, in ``assets.extra``.

A server that finds ``assets.extra/tf_serving_warmup_requests`` in a SavedModel replays its
requests before it takes traffic, so the first real request does not pay for graph
optimisation. The records are TF Serving's request protos, from ``tensorflow-serving-api`` (a
dependency of the package).
"""

import os
from typing import Sequence

import numpy as np
import tensorflow as tf

from tensorflow_serving.apis import (classification_pb2, input_pb2, predict_pb2,
                                     prediction_log_pb2)

from cifar10_estimator.data import schema
from cifar10_estimator.serving.signatures import (BYTES_SIGNATURE, CLASSIFY_SIGNATURE,
                                                  EXAMPLES_SIGNATURE, IMAGES_SIGNATURE)

# TensorFlow Serving's folder for files beside a SavedModel (its warm-up requests among them).
ASSETS_EXTRA = "assets.extra"
WARMUP_FILE = os.path.join(ASSETS_EXTRA, "tf_serving_warmup_requests")
# The model name of the requests and of the serving command the run summary prints.
SERVING_MODEL_NAME = "cifar10"


def warmup_requests(model_name: str = SERVING_MODEL_NAME) -> list[bytes]:
    """Serialized PredictionLog records, one per signature (TF Serving's warm-up format)."""
    grey = np.full((1, schema.HEIGHT, schema.WIDTH, schema.CHANNELS), 128, np.uint8)
    png = tf.io.encode_png(grey[0]).numpy()
    example = tf.train.Example.FromString(
        schema.encode_example(np.transpose(grey[0], (2, 0, 1)).tobytes(), 0))
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


def write_warmup_requests(folder: str, requests: Sequence[bytes]) -> None:
    """Writes ``requests`` as the SavedModel folder's warm-up file."""
    with tf.io.TFRecordWriter(os.path.join(folder, WARMUP_FILE)) as out:
        for request in requests:
            out.write(request)
