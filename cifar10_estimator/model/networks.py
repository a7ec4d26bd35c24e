"""The networks ``--model`` picks, seen from outside: what builds each one, the variable scope
its weights live in, the weights its weight decay covers, the training augmentation it expects,
and its name in logs and errors.

The model_fn (training, evaluation, prediction) and the export build the network through
``logits`` alone, so a model is added here and in its own builder module.
"""

from typing import Sequence

import tensorflow as tf

from cifar10_estimator.data import pipeline
from cifar10_estimator.model import resnet, tutorial_cnn
from cifar10_estimator.config.settings import RESNET, TUTORIAL_CNN, ModelParams

# The variable scope of each network's weights: the first word of every checkpoint name.
SCOPES = {RESNET: "resnet", TUTORIAL_CNN: "tutorial_cnn"}
AUGMENTATIONS = {RESNET: pipeline.PAD_CROP_FLIP, TUTORIAL_CNN: pipeline.CROP_FLIP_COLOUR}


def describe(params: ModelParams) -> str:
    """The network's name for people: ``ResNet-20 v1``, ``the tutorial CNN``."""
    if params.model == TUTORIAL_CNN:
        return "the tutorial CNN"
    return f"ResNet-{params.num_layers} v{params.resnet_version}"


def logits(images: tf.Tensor, params: ModelParams, *, is_training: bool, num_classes: int,
           data_format: str = "channels_last", compute_dtype: tf.DType = tf.float32,
           batch_norm_decay=None, fold_batch_norm: bool = False) -> tf.Tensor:
    """The network of ``params.model`` on ``images`` (float32 NHWC, 0..255): float32 logits.

    Call it inside ``tf.compat.v1.variable_scope(SCOPES[params.model])``. ``batch_norm_decay``
    (a float or a scalar tensor) defaults to ``params.batch_norm_decay``; the ResNet alone
    has batch norm, a layout and folding. Outside training, ``params.test_time_mirror``
    averages the logits of each picture and its left-right mirror, the flip that training's
    augmentation applies (``AUGMENTATIONS``).
    """
    if params.test_time_mirror and not is_training:
        # Both pictures in one batch: inference-mode batch norm treats each row alone.
        count = tf.shape(images)[0]
        both = _network(tf.concat([images, tf.reverse(images, axis=[2])], axis=0), params,
                        is_training=is_training, num_classes=num_classes,
                        data_format=data_format, compute_dtype=compute_dtype,
                        batch_norm_decay=batch_norm_decay, fold_batch_norm=fold_batch_norm)
        return (both[:count] + both[count:]) / 2.0
    return _network(images, params, is_training=is_training, num_classes=num_classes,
                    data_format=data_format, compute_dtype=compute_dtype,
                    batch_norm_decay=batch_norm_decay, fold_batch_norm=fold_batch_norm)


def _network(images, params: ModelParams, *, is_training, num_classes, data_format,
             compute_dtype, batch_norm_decay, fold_batch_norm) -> tf.Tensor:
    if params.model == TUTORIAL_CNN:
        return tutorial_cnn.tutorial_cnn(images, num_classes=num_classes,
                                         compute_dtype=compute_dtype)
    return resnet.resnet_cifar(
        images, is_training=is_training, num_layers=params.num_layers,
        version=params.resnet_version, data_format=data_format,
        batch_norm_decay=(params.batch_norm_decay if batch_norm_decay is None
                          else batch_norm_decay),
        batch_norm_epsilon=params.batch_norm_epsilon, num_classes=num_classes,
        compute_dtype=compute_dtype, fold_batch_norm=fold_batch_norm,
        zero_init_residual=params.zero_init_residual)


def decayed_weights(params: ModelParams, variables: Sequence[tf.Variable]) -> list:
    """The variables the weight decay covers: all of the ResNet's (the ResNet tutorial's L2
    term covers batch-norm scales and the dense bias too), or with ``params.no_bias_decay``
    its kernels only; the tutorial CNN's hidden-layer weights only
    (``tutorial_cnn.DECAYED_WEIGHTS``)."""
    if params.model == TUTORIAL_CNN:
        return [v for v in variables
                if v.op.name.endswith(tutorial_cnn.DECAYED_WEIGHTS)]
    if params.no_bias_decay:
        return [v for v in variables if v.op.name.endswith(f"/{resnet.KERNEL}")]
    return list(variables)
