"""The networks ``--model`` picks, seen from outside: what builds each one, the variable scope
its weights live in, the weights its weight decay covers, the training augmentation it expects,
and its name in logs and errors.

The model_fn (training, evaluation, prediction) and the export build the network through
``logits`` alone, so a model is added here and in its own builder module.
"""

from typing import Callable, Optional, Sequence

import tensorflow as tf

from cifar10_estimator.data import pipeline
from cifar10_estimator.model import resnet, tutorial_cnn
from cifar10_estimator.config.settings import RESNET, TUTORIAL_CNN, ModelSection

# The variable scope of each network's weights: the first word of every checkpoint name.
SCOPES = {RESNET: "resnet", TUTORIAL_CNN: "tutorial_cnn"}
AUGMENTATIONS = {RESNET: pipeline.PAD_CROP_FLIP, TUTORIAL_CNN: pipeline.CROP_FLIP_COLOUR}


def describe(params: ModelSection) -> str:
    """The network's name for people: ``ResNet-20 v1``, ``the tutorial CNN``."""
    if params.model == TUTORIAL_CNN:
        return "the tutorial CNN"
    return f"ResNet-{params.num_layers} v{params.resnet_version}"


def logits(images: tf.Tensor, params: ModelSection, *, is_training: bool, num_classes: int,
           data_format: str = "channels_last", compute_dtype: tf.DType = tf.float32,
           batch_norm_decay=None, fold_batch_norm: bool = False,
           whitening_sample: Optional[Callable[[], tf.Tensor]] = None) -> tf.Tensor:
    """The network of ``params.model`` on ``images`` (float32 NHWC, 0..255): float32 logits.

    Call it inside ``tf.compat.v1.variable_scope(SCOPES[params.model])``. ``batch_norm_decay``
    (a float or a scalar tensor) defaults to ``params.batch_norm_decay``; the ResNet alone
    has batch norm, a layout, folding and a whitening layer (``whitening_sample``: training
    pictures for its filters, in training). Outside training the logits are averaged over the
    test-time views (``test_time_views``).
    """
    def forward(x):
        return _network(x, params, is_training=is_training, num_classes=num_classes,
                        data_format=data_format, compute_dtype=compute_dtype,
                        batch_norm_decay=batch_norm_decay, fold_batch_norm=fold_batch_norm,
                        whitening_sample=whitening_sample)

    views = [(images, 1.0)] if is_training else test_time_views(images, params)
    if len(views) == 1:
        return forward(images)
    # Every view in one batch: inference-mode batch norm treats each row alone.
    count = tf.shape(images)[0]
    every = forward(tf.concat([view for view, _ in views], axis=0))
    # Summed with AddV2, an op every export has already (serving.trust lists what they use).
    weighed = [every[i * count:(i + 1) * count] * weight for i, (_, weight) in enumerate(views)]
    total = weighed[0]
    for part in weighed[1:]:
        total = total + part
    return total


def test_time_views(images: tf.Tensor, params: ModelSection) -> list[tuple[tf.Tensor, float]]:
    """The views of ``images`` whose logits evaluation and serving average, with their
    weights (summing to 1): the pictures; with ``test_time_mirror`` each also mirrored left to
    right, the flip training applies (``AUGMENTATIONS``); with ``test_time_shift`` S, also the
    pictures shifted S pixels up-left and S down-right, edges reflected, weighing 1/4 each and
    the pictures 1/2 (airbench's multi-crop evaluation, Jordan 2024, arXiv:2404.00498)."""
    shift = params.test_time_shift
    views = [(images, 1.0)]
    if shift:
        padded = tf.pad(images, [[0, 0], [shift, shift], [shift, shift], [0, 0]], "REFLECT")
        height, width = images.shape[1], images.shape[2]
        views = [(images, 0.5), (padded[:, :height, :width], 0.25),
                 (padded[:, 2 * shift:, 2 * shift:], 0.25)]
    if params.test_time_mirror:
        views = [mirrored for view, weight in views
                 for mirrored in ((view, weight / 2), (tf.reverse(view, axis=[2]), weight / 2))]
    return views


def _network(images, params: ModelSection, *, is_training, num_classes, data_format,
             compute_dtype, batch_norm_decay, fold_batch_norm, whitening_sample) -> tf.Tensor:
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
        zero_init_residual=params.zero_init_residual, dirac_init=params.dirac_init,
        whitening_patch=params.whitening_patch,
        whitening_sample=whitening_sample)


def decayed_weights(params: ModelSection, variables: Sequence[tf.Variable]) -> list:
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
