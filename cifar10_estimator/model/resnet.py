"""The ResNet for CIFAR-10 as a pure graph builder: images in, logits out.

He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition", CVPR 2016
(arXiv:1512.03385), section 4.2: depth 6n+2; a 3x3 stem with 16 filters; three stages of n
basic blocks with 16, 32 and 64 filters at strides 1, 2 and 2; global average pooling; a dense
layer to 10 classes. Shortcuts are option A (parameter-free: subsample spatially, zero-pad the
new channels), so the trainable parameter counts equal the paper's Table 6: ResNet-20 269,722,
ResNet-32 464,154, ResNet-44 658,586, ResNet-56 853,018, ResNet-110 1,727,962.

``version=1`` builds those post-activation blocks; ``version=2`` builds the pre-activation
blocks of He et al., "Identity Mappings in Deep Residual Networks", ECCV 2016
(arXiv:1603.05027), with the final batch norm and ReLU that design needs before pooling.

The builder knows nothing about losses, optimizers, devices or summaries. Variables are made
with ``tf.compat.v1.get_variable`` so the caller's variable scope (reuse across towers) and
device functions (where variables live) apply to them. Batch-norm moving-average updates are
added to the ``UPDATE_OPS`` collection; the caller decides which tower's updates to run. For
serving, ``fold_batch_norm`` folds every batch norm that directly follows a convolution into
it, over the same variables (so the same checkpoint fits).
"""

from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from cifar10_estimator.config.settings import blocks_per_stage
from cifar10_estimator.model import whitening

DATA_FORMATS = ("channels_last", "channels_first")
NUM_FILTERS = (16, 16, 32, 64)  # stem, then stages 1-3 (paper, section 4.2)
STAGE_STRIDES = (1, 2, 2)
# The last part of every convolution's and the dense layer's weight-matrix name.
KERNEL = "kernel"
STEM = "stem"  # the first convolution's name
# The last parts of the names of the batch norms' trainable scale and shift.
BATCH_NORM_PARAMETERS = ("/gamma", "/beta")


def _dirac(initializer):
    """``initializer`` with its first min(in, out) filters made the identity: filter j passes
    input channel j through (a 1 at the kernel's centre), so a stack of such convolutions
    starts as an implicit residual path. airbench's dirac initialisation (Jordan 2024,
    github.com/KellerJordan/cifar10-zoo, airbench_ablations/main2_dirac.py: PyTorch's
    ``dirac_`` on the first in-channels output filters), which cut its epochs to 94 % on
    CIFAR-10 from 21 to 18."""
    def init(shape, dtype=tf.float32, partition_info=None):
        height, width, channels_in, channels_out = shape
        identity = np.zeros(shape, np.float32)
        keep = np.ones(shape, np.float32)
        for j in range(min(channels_in, channels_out)):
            keep[..., j] = 0.0
            identity[height // 2, width // 2, j, j] = 1.0
        return (initializer(shape, dtype, partition_info=partition_info) * keep
                + tf.constant(identity, dtype))

    return init


class _Builder:
    """Holds the per-graph settings shared by every layer of one forward pass."""

    def __init__(self, is_training, data_format, batch_norm_decay, batch_norm_epsilon,
                 compute_dtype, fold_batch_norm=False, zero_init_residual=False,
                 dirac_init=False):
        if data_format not in DATA_FORMATS:
            raise ValueError(f"data_format must be one of {DATA_FORMATS}, got {data_format!r}")
        if fold_batch_norm and is_training:
            raise ValueError("batch norm can be folded into convolutions only for inference")
        self.is_training = is_training
        self.fold = fold_batch_norm
        self.nchw = data_format == "channels_first"
        self.bn_decay = batch_norm_decay
        self.bn_epsilon = batch_norm_epsilon
        self.dtype = compute_dtype
        self.zero_init_residual = zero_init_residual
        self.dirac_init = dirac_init

    @property
    def channel_axis(self):
        return 1 if self.nchw else 3

    def _strides(self, s):
        return [1, 1, s, s] if self.nchw else [1, s, s, 1]

    def _kernel(self, in_filters, filters, name):
        # He et al. 2015 ("Delving Deep into Rectifiers", arXiv:1502.01852) initialisation,
        # which the ResNet paper uses (section 3.4).
        initializer = tf.compat.v1.variance_scaling_initializer(
            scale=2.0, mode="fan_in", distribution="truncated_normal")
        if self.dirac_init and name != STEM:
            initializer = _dirac(initializer)
        return tf.compat.v1.get_variable(f"{name}/{KERNEL}", [3, 3, in_filters, filters],
                                         tf.float32, initializer=initializer)

    def _convolve(self, x, kernel, stride):
        if stride > 1:
            # Pad explicitly and symmetrically: SAME padding at stride 2 pads only the bottom
            # and right edges of an even-sized input, which shifts every feature map.
            pads = [[0, 0], [0, 0], [1, 1], [1, 1]] if self.nchw else [[0, 0], [1, 1], [1, 1], [0, 0]]
            x = tf.pad(x, pads)
            padding = "VALID"
        else:
            padding = "SAME"
        return tf.nn.conv2d(x, tf.cast(kernel, self.dtype), self._strides(stride), padding,
                            data_format="NCHW" if self.nchw else "NHWC")

    def conv(self, x, filters, stride, name):
        """3x3 convolution without bias (batch norm follows every convolution)."""
        return self._convolve(x, self._kernel(x.shape[self.channel_axis], filters, name), stride)

    def _bn_variables(self, channels, name, zero_gamma=False):
        """gamma (1, or 0 with ``zero_gamma``), beta, moving mean, moving variance.

        Under a tf.distribute strategy every replica updates the moving statistics with its
        own batch's; MEAN aggregation makes each update the replicas' average, so every copy
        holds the same values (the towers' design, on one worker, takes tower 0's alone).
        """
        with tf.compat.v1.variable_scope(name):
            return tuple(tf.compat.v1.get_variable(
                var, [channels], tf.float32, trainable=trainable, initializer=init(),
                aggregation=(tf.VariableAggregation.NONE if trainable
                             else tf.VariableAggregation.MEAN))
                for var, trainable, init in (
                    ("gamma", True, (tf.compat.v1.zeros_initializer if zero_gamma
                                     else tf.compat.v1.ones_initializer)),
                    ("beta", True, tf.compat.v1.zeros_initializer),
                    ("moving_mean", False, tf.compat.v1.zeros_initializer),
                    ("moving_variance", False, tf.compat.v1.ones_initializer)))

    def batch_norm(self, x, name, zero_gamma=False):
        """Fused batch norm; in training, queues the moving-average updates in UPDATE_OPS."""
        gamma, beta, moving_mean, moving_variance = self._bn_variables(
            x.shape[self.channel_axis], name, zero_gamma)
        fmt = "NCHW" if self.nchw else "NHWC"
        if self.is_training:
            # Fused batch norm computes its statistics in float32 even for bfloat16 inputs.
            y, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                x, gamma, beta, epsilon=self.bn_epsilon, data_format=fmt, is_training=True)
            for var, value in ((moving_mean, mean), (moving_variance, variance)):
                update = tf.compat.v1.assign_sub(var, (var - value) * (1.0 - self.bn_decay))
                tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
        else:
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(
                x, gamma, beta, mean=moving_mean, variance=moving_variance,
                epsilon=self.bn_epsilon, data_format=fmt, is_training=False)
        return y

    def conv_bn(self, x, filters, stride, conv_name, bn_name, zero_gamma=False):
        """A convolution and the batch norm right after it.

        Folded (inference only), they are one convolution: the batch norm's per-channel
        scale gamma / sqrt(variance + epsilon) multiplies the kernel's output channels and
        the rest of the affine map becomes a bias. With constant weights TensorFlow
        precomputes both, and the bias, the residual add and the ReLU fuse into the
        convolution (Ioffe and Szegedy 2015, arXiv:1502.03167, section 3: at inference batch
        norm is a linear transform).
        """
        if not self.fold:
            return self.batch_norm(self.conv(x, filters, stride, conv_name), bn_name, zero_gamma)
        kernel = self._kernel(x.shape[self.channel_axis], filters, conv_name)
        gamma, beta, mean, variance = self._bn_variables(filters, bn_name, zero_gamma)
        scale = gamma * tf.math.rsqrt(variance + self.bn_epsilon)
        return tf.nn.bias_add(self._convolve(x, kernel * scale, stride),
                              tf.cast(beta - mean * scale, self.dtype),
                              data_format="NCHW" if self.nchw else "NHWC")

    def shortcut(self, x, out_filters, stride):
        """Option A: average-pool by the stride, zero-pad the added channels on both sides."""
        in_filters = x.shape[self.channel_axis]
        if stride > 1:
            x = tf.nn.avg_pool2d(x, stride, stride, "VALID",
                                 data_format="NCHW" if self.nchw else "NHWC")
        if out_filters != in_filters:
            extra = out_filters - in_filters
            pad = [extra // 2, extra - extra // 2]
            x = tf.pad(x, [[0, 0], pad, [0, 0], [0, 0]] if self.nchw
                       else [[0, 0], [0, 0], [0, 0], pad])
        return x

    def block_v1(self, x, out_filters, stride, name):
        """Post-activation basic block: conv-BN-ReLU-conv-BN, add shortcut, ReLU."""
        with tf.compat.v1.variable_scope(name):
            y = tf.nn.relu(self.conv_bn(x, out_filters, stride, "conv1", "bn1"))
            y = self.conv_bn(y, out_filters, 1, "conv2", "bn2", self.zero_init_residual)
            return tf.nn.relu(y + self.shortcut(x, out_filters, stride))

    def block_v2(self, x, out_filters, stride, name):
        """Pre-activation basic block: BN-ReLU-conv-BN-ReLU-conv, add shortcut (no final ReLU)."""
        with tf.compat.v1.variable_scope(name):
            y = tf.nn.relu(self.batch_norm(x, "bn1"))
            y = tf.nn.relu(self.conv_bn(y, out_filters, stride, "conv1", "bn2"))
            y = self.conv(y, out_filters, 1, "conv2")
            return y + self.shortcut(x, out_filters, stride)


def _network_scale(images: tf.Tensor) -> tf.Tensor:
    """0..255 to [-1, 1), as the original tutorial scaled its pictures (x / 128 - 1)."""
    return tf.cast(images, tf.float32) / 128.0 - 1.0


def resnet_cifar(images: tf.Tensor, *, is_training: bool, num_layers: int, version: int = 1,
                 data_format: str = "channels_last", batch_norm_decay=0.997,
                 batch_norm_epsilon: float = 1e-5, num_classes: int = 10,
                 compute_dtype: tf.DType = tf.float32,
                 fold_batch_norm: bool = False, zero_init_residual: bool = False,
                 dirac_init: bool = False, whitening_patch: int = 0,
                 whitening_sample: Optional[Callable[[], tf.Tensor]] = None) -> tf.Tensor:
    """Builds the ResNet forward pass.

    Args:
      images: float32 [batch, 32, 32, 3] (HWC) with values in 0..255.
      is_training: batch norm uses batch statistics and queues moving-average updates.
      num_layers: depth, 6n+2.
      version: 1 (post-activation, the paper's CIFAR model) or 2 (pre-activation).
      data_format: compute layout; 'channels_first' (NCHW) suits GPUs, 'channels_last' CPUs.
      batch_norm_decay: batch-norm moving-average decay, a float or a scalar float32 tensor
        (the model_fn's decay grows with the step in early training).
      batch_norm_epsilon: batch-norm epsilon.
      num_classes: width of the logits.
      compute_dtype: tf.float32, or tf.bfloat16 for reduced-precision convolutions (variables
        and the returned logits stay float32).
      fold_batch_norm: inference only: fold each batch norm that follows a convolution into
        it (the same function up to float rounding; faster with constant weights).
      zero_init_residual: version 1 only: initialise the scale of each block's last batch
        norm to 0, so that each block starts as the identity of its shortcut (Goyal et al.
        2017, arXiv:1706.02677, section 5.1).
      dirac_init: initialise every convolution after the stem with its first filters as the
        identity (``_dirac``).
      whitening_patch: 0, or the patch size of a frozen whitening layer before the stem
        (``whitening``): the stem then reads its 3 x patch^2 channels.
      whitening_sample: training: gives the pictures (float32 [N, 32, 32, 3], 0..255) the
        whitening filters are computed from when first initialised.

    Returns:
      float32 logits [batch, num_classes].

    Raises:
      ValueError: bad depth, version or data format, or zero_init_residual with version 2.
    """
    n = blocks_per_stage(num_layers)
    if version not in (1, 2):
        raise ValueError(f"ResNet version must be 1 or 2, got {version}")
    if zero_init_residual and version != 1:
        raise ValueError("zero_init_residual needs version 1: a v2 block ends in a convolution")
    b = _Builder(is_training, data_format, batch_norm_decay, batch_norm_epsilon, compute_dtype,
                 fold_batch_norm, zero_init_residual, dirac_init)
    block = b.block_v1 if version == 1 else b.block_v2

    x = _network_scale(images)
    if b.nchw:
        x = tf.transpose(x, [0, 3, 1, 2])
    x = tf.cast(x, compute_dtype)
    if whitening_patch:
        x = whitening.whiten(
            x, whitening_patch, nchw=b.nchw, compute_dtype=compute_dtype,
            sample=whitening_sample and (lambda: _network_scale(whitening_sample())))

    if version == 1:
        x = tf.nn.relu(b.conv_bn(x, NUM_FILTERS[0], 1, STEM, "stem_bn"))  # 32x32x16
    else:
        x = b.conv(x, NUM_FILTERS[0], 1, STEM)
    for stage, (filters, stride) in enumerate(zip(NUM_FILTERS[1:], STAGE_STRIDES), start=1):
        for i in range(n):
            x = block(x, filters, stride if i == 0 else 1, f"stage{stage}/block{i}")
        # stage 1: 32x32x16, stage 2: 16x16x32, stage 3: 8x8x64
    if version == 2:
        x = tf.nn.relu(b.batch_norm(x, "final_bn"))

    x = tf.reduce_mean(tf.cast(x, tf.float32), axis=[2, 3] if b.nchw else [1, 2])  # 64
    kernel = tf.compat.v1.get_variable(
        f"dense/{KERNEL}", [NUM_FILTERS[-1], num_classes], tf.float32,
        initializer=tf.compat.v1.glorot_uniform_initializer())
    bias = tf.compat.v1.get_variable("dense/bias", [num_classes], tf.float32,
                                     initializer=tf.compat.v1.zeros_initializer())
    return tf.matmul(x, kernel) + bias
