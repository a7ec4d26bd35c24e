"""The original TensorFlow CIFAR-10 tutorial's network as a pure graph builder: images in,
logits out.

TensorFlow's first CIFAR-10 tutorial (``tensorflow/models``, ``tutorials/image/cifar10/
cifar10.py``, 2015-2018), which the ResNet estimator tutorial grew out of: a central 24x24 crop
(a no-op on the 24x24 training crops), per-image standardisation, then

    conv 5x5x64 -> ReLU -> max-pool 3x3/2 -> LRN -> conv 5x5x64 -> ReLU -> LRN
    -> max-pool 3x3/2 -> fully connected 384 -> ReLU -> 192 -> ReLU -> linear to the classes.

Every layer has a bias; the variable names are the tutorial's (``conv1/weights``,
``local3/biases``, ``softmax_linear/weights``, ...), and so are the initial values: truncated
normals of standard deviation 0.05 (convolutions), 0.04 (the two hidden layers) and 1/192 (the
output), and biases of 0, 0.1, 0.1, 0.1 and 0. Weight decay applies to the two hidden layers'
weights only (``DECAYED_WEIGHTS``, 0.004 in the tutorial; the model's defaults are in
``config.overlays.MODELS``). For 10 classes the network has 1,068,298 trainable parameters.

The standardisation and the crop sit in the network, not in the input pipeline, so that the
export serves 32x32 pictures as the tutorial's evaluation read them. Its training augmentation
(random 24x24 crops, flips, brightness and contrast) is the input pipeline's
``crop-flip-colour`` (``data.pipeline``).

Local response normalisation exists in TensorFlow for the channels-last layout only, so the
network computes in that layout whatever the trainer's ``--data-format``; with ``bfloat16`` the
convolutions and fully connected layers compute in it and the normalisations in float32.
"""

import math

import tensorflow as tf

from cifar10_estimator.data.pipeline import TUTORIAL_CROP

# The tutorial's cifar10_input.IMAGE_SIZE: the crop it trains and evaluates on.
IMAGE_SIZE = TUTORIAL_CROP
CONV_FILTERS = 64  # both convolutions (cifar10.py inference())
KERNEL_SIZE = 5
HIDDEN_UNITS = (384, 192)  # local3, local4
# LRN as the tutorial's cifar10.py called it (norm1 and norm2).
LRN = {"depth_radius": 4, "bias": 1.0, "alpha": 0.001 / 9.0, "beta": 0.75}
# The weights the tutorial's weight decay covers (_variable_with_weight_decay with wd=0.004).
DECAYED_WEIGHTS = ("local3/weights", "local4/weights")


def _variable(name, shape, stddev=None, constant=None):
    initializer = (tf.compat.v1.truncated_normal_initializer(stddev=stddev) if stddev
                   else tf.compat.v1.constant_initializer(constant or 0.0))
    return tf.compat.v1.get_variable(name, shape, tf.float32, initializer=initializer)


def _conv(x, name, in_filters, bias, dtype):
    with tf.compat.v1.variable_scope(name):
        kernel = _variable("weights", [KERNEL_SIZE, KERNEL_SIZE, in_filters, CONV_FILTERS],
                           stddev=5e-2)
        biases = _variable("biases", [CONV_FILTERS], constant=bias)
    y = tf.nn.conv2d(x, tf.cast(kernel, dtype), [1, 1, 1, 1], "SAME")
    return tf.nn.relu(tf.nn.bias_add(y, tf.cast(biases, dtype)))


def _dense(x, name, units, stddev, bias, dtype):
    with tf.compat.v1.variable_scope(name):
        weights = _variable("weights", [x.shape[-1], units], stddev=stddev)
        biases = _variable("biases", [units], constant=bias)
    return tf.matmul(x, tf.cast(weights, dtype)) + tf.cast(biases, dtype)


def _pool(x):
    return tf.nn.max_pool2d(x, 3, 2, "SAME")


def _lrn(x):
    return tf.cast(tf.nn.local_response_normalization(tf.cast(x, tf.float32), **LRN), x.dtype)


def standardise(images: tf.Tensor) -> tf.Tensor:
    """The central 24x24 crop of each picture (none for 24x24 ones), standardised per picture
    to mean 0 and variance 1 (``tf.image.per_image_standardization``), as the tutorial's
    ``cifar10_input`` did for training and evaluation."""
    crop = tf.image.resize_with_crop_or_pad(tf.cast(images, tf.float32), IMAGE_SIZE, IMAGE_SIZE)
    return tf.image.per_image_standardization(crop)


def tutorial_cnn(images: tf.Tensor, *, num_classes: int = 10,
                 compute_dtype: tf.DType = tf.float32) -> tf.Tensor:
    """Builds the tutorial network's forward pass.

    Args:
      images: float32 [batch, H, W, 3] with values in 0..255, H and W 24 (training crops) or
        more (centrally cropped to 24x24).
      num_classes: width of the logits.
      compute_dtype: tf.float32, or tf.bfloat16 for the convolutions and fully connected layers
        (variables and the returned logits stay float32).

    Returns:
      float32 logits [batch, num_classes].
    """
    x = tf.cast(standardise(images), compute_dtype)
    x = _lrn(_pool(_conv(x, "conv1", 3, 0.0, compute_dtype)))
    x = _pool(_lrn(_conv(x, "conv2", CONV_FILTERS, 0.1, compute_dtype)))
    x = tf.reshape(x, [-1, math.prod(x.shape[1:])])  # 6x6x64 = 2,304
    for name, units in zip(("local3", "local4"), HIDDEN_UNITS):
        x = tf.nn.relu(_dense(x, name, units, 0.04, 0.1, compute_dtype))
    logits = _dense(x, "softmax_linear", num_classes, 1.0 / HIDDEN_UNITS[-1], 0.0,
                    compute_dtype)
    return tf.cast(logits, tf.float32)
