"""The frozen patch-whitening layer in front of the ResNet (``--whitening-patch``): its filters
from the training pictures' patches, and the convolution.

Every PATCHxPATCH patch of a picture (3 x PATCH^2 values, the network's input scale) is
projected on the principal components of the training pictures' patches, each divided by the
square root of its variance: the layer's outputs are uncorrelated, of unit variance, so the
first trained convolution starts on decorrelated inputs (Coates and Ng 2012, "Learning Feature
Representations with K-means"; used as a fixed first layer by airbench, Jordan
2024, arXiv:2404.00498, whose ablation credits it with the largest single gain).

The filters are computed once, in the graph, when a job's variables are first initialised (the
initial value of a non-trainable variable), from up to ``SAMPLE_PICTURES`` pictures spread
evenly over the training file; after that they live in the checkpoints, and the evaluation,
the export and a resumed run read them from there.
"""

from typing import Callable, Optional

import tensorflow as tf

# airbench computes its whitening from 5,000 training pictures (arXiv:2404.00498).
SAMPLE_PICTURES = 5_000
# Added to each component's variance before the division: airbench's 5e-4, which is in units
# of its per-channel standardised pixels; the network's -1..1 scale (resnet.py) has a standard
# deviation of about 0.5 per channel on CIFAR-10 and Fashion-MNIST, so 5e-4 x 0.5^2.
EPSILON = 1.25e-4
SCOPE = "whitening"


def channels(patch: int) -> int:
    """Outputs of a layer over PATCHxPATCH patches of 3 channels: one per component."""
    return 3 * patch * patch


def filters_from(images: tf.Tensor, patch: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(filters [patch, patch, 3, 3 patch^2], bias [3 patch^2]) that whiten the patches of
    ``images`` (float32 [N, H, W, 3], the network's -1..1 scale): convolving a picture with the
    filters and adding the bias gives each patch's coordinates on the principal components,
    centred and of unit variance."""
    patches = tf.image.extract_patches(images, [1, patch, patch, 1], [1, 1, 1, 1],
                                       [1, 1, 1, 1], "VALID")
    # extract_patches orders a patch's values by row, column, channel: a kernel's own order.
    flat = tf.reshape(patches, [-1, channels(patch)])
    count = tf.cast(tf.shape(flat)[0], tf.float64)
    mean = tf.reduce_mean(tf.cast(flat, tf.float64), axis=0)
    second = tf.cast(tf.matmul(flat, flat, transpose_a=True), tf.float64) / count
    covariance = second - mean[:, None] * mean[None, :]
    variances, components = tf.linalg.eigh(covariance)
    # A component of (numerically) no variance is scaled by 1 / sqrt(EPSILON), not infinity.
    scaled = components / tf.sqrt(tf.maximum(variances, 0.0) + EPSILON)[None, :]
    bias = -tf.linalg.matvec(scaled, mean, transpose_a=True)
    return (tf.cast(tf.reshape(scaled, [patch, patch, 3, channels(patch)]), tf.float32),
            tf.cast(bias, tf.float32))


def whiten(x: tf.Tensor, patch: int, *, nchw: bool, compute_dtype: tf.DType,
           sample: Optional[Callable[[], tf.Tensor]] = None) -> tf.Tensor:
    """The layer on ``x`` (the network's input, already in ``compute_dtype`` and layout).

    Call it in the network's variable scope. ``sample`` gives float32 [N, 32, 32, 3] training
    pictures in the network's scale, to compute the filters from when the variables are first
    initialised (training); without it they start at zero, to be restored from a checkpoint
    (evaluation, export) or answered by a custom getter (serving).
    """
    computed = {}

    def initial(index):
        def value(shape, dtype=tf.float32, partition_info=None):
            if sample is None:
                return tf.zeros(shape, dtype)
            if not computed:
                # On the CPU whatever device the tower's ops go to: tf.data runs there.
                with tf.compat.v1.device("/cpu:0"):
                    computed["value"] = filters_from(sample(), patch)
            return computed["value"][index]
        return value

    with tf.compat.v1.variable_scope(SCOPE):
        filters = tf.compat.v1.get_variable("filters", [patch, patch, 3, channels(patch)],
                                            tf.float32, initializer=initial(0), trainable=False)
        bias = tf.compat.v1.get_variable("bias", [channels(patch)], tf.float32,
                                         initializer=initial(1), trainable=False)
    layout = "NCHW" if nchw else "NHWC"
    # SAME keeps the picture's size, so the rest of the network is unchanged; the patches at
    # the bottom and right edges read zero padding, as every convolution after them does.
    y = tf.nn.conv2d(x, tf.cast(filters, compute_dtype), [1, 1, 1, 1], "SAME",
                     data_format=layout)
    return tf.nn.bias_add(y, tf.cast(bias, compute_dtype), data_format=layout)
