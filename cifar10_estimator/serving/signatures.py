"""What an export serves: the network with frozen, folded weights, and its four signatures.

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
TensorFlow's "Unknown image file format" error, and the server goes on. Before decoding, the
picture's size is read from its header (``_declared_pixels``; for a GIF every frame's) and a
picture of more than ``MAX_PIXELS`` fails the request: a small file that declares gigapixels (a
decompression bomb) would otherwise make the server allocate gigabytes. ``classify`` serves
TensorFlow Serving's Classify API.

One network function, called by every signature, has the checkpoint's weights frozen into it
as constants and each batch norm folded into the convolution before it. Each choice was
measured with benchmarks/serving_bench.py (docs/serving.md):
- constant weights let oneDNN reorder each convolution's filter once and keep it, instead of
  on every request;
- folded batch norms leave a bias, which oneDNN fuses with the residual add and the ReLU into
  the convolution.
The network is built in ``channels_last`` without device placements, whatever the training
layout and devices (the weights do not depend on them). A checkpoint of another depth or
ResNet version, or of the other ``--model``, is refused before anything is written. The tutorial
CNN crops the 32x32 pictures to their central 24x24 in its network, as its tutorial's evaluation
did, so its signatures take the same inputs.
"""

import numpy as np
import tensorflow as tf

from cifar10_estimator.data import images as image_ops
from cifar10_estimator.data import schema
from cifar10_estimator.errors import UserError
from cifar10_estimator.model import checkpoints, networks
from cifar10_estimator.model.model_settings import ModelSettings

IMAGES_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
BYTES_SIGNATURE = "serving_bytes"
EXAMPLES_SIGNATURE = "serving_examples"
CLASSIFY_SIGNATURE = "classify"
_IMAGE_SHAPE = [schema.HEIGHT, schema.WIDTH, schema.CHANNELS]
# The name ExponentialMovingAverage gives the shadow of ``<variable>``: ``<variable>/<this>``.
AVERAGE_SUFFIX = "ExponentialMovingAverage"
# The most pixels a picture sent to ``serving_bytes`` may have: the bound ``images.check_file``
# applies for ``predict`` and the image-folder generator, so the server refuses what they refuse.
MAX_PIXELS = image_ops.MAX_PIXELS
# The most blocks and sub-blocks of a GIF that ``_gif_pixels`` walks (about 30 us each): a GIF
# encoder writes sub-blocks of 255 bytes, so this allows GIFs of 5 MB, and a hostile GIF of
# 1-byte sub-blocks cannot keep the server walking for minutes.
MAX_GIF_BLOCKS = 20_000


def _header_bytes(encoded, start, count: int):
    """``count`` bytes of ``encoded`` from ``start`` as int64 (zeros past its end)."""
    start = tf.minimum(tf.cast(start, tf.int32), tf.strings.length(encoded))
    chunk = tf.strings.join([tf.strings.substr(encoded, start, count), "\0" * count])
    return tf.cast(tf.io.decode_raw(tf.strings.substr(chunk, 0, count), tf.uint8), tf.int64)


def _gif_pixels(encoded):
    """The pixels TensorFlow's GIF decoder allocates: its canvas (the widest by the tallest
    frame; the logical screen is ignored) and each frame's raster, which giflib reads whole.
    Walks the GIF's blocks: extensions and frames, each followed by sub-blocks; a GIF of more
    than ``MAX_GIF_BLOCKS`` counts as too large (``MAX_PIXELS + 1``)."""
    def table(flags):  # the size of a color table that ``flags`` announces
        return tf.where(flags >= 128, 3 * tf.bitwise.left_shift(
            tf.constant(2, tf.int64), flags % 8), tf.constant(0, tf.int64))

    size = tf.cast(tf.strings.length(encoded), tf.int64)
    zero = tf.constant(0, tf.int64)

    def step(steps, pos, in_blocks, width, height, frames, done):
        b = _header_bytes(encoded, pos, 10)
        # In sub-blocks: a length byte and that many bytes, until a zero length.
        sub_pos = tf.where(b[0] > 0, pos + b[0] + 1, pos + 1)
        is_frame = tf.equal(b[0], 0x2C)
        w, h = b[5] + 256 * b[6], b[7] + 256 * b[8]
        block_pos = tf.where(is_frame, pos + 11 + table(b[9]), pos + 2)
        return (steps + 1, tf.where(in_blocks, sub_pos, block_pos),
                tf.logical_or(tf.logical_not(in_blocks), b[0] > 0),
                tf.where(in_blocks, width, tf.where(is_frame, tf.maximum(width, w), width)),
                tf.where(in_blocks, height, tf.where(is_frame, tf.maximum(height, h), height)),
                tf.where(in_blocks, frames, tf.where(is_frame, frames + w * h, frames)),
                tf.logical_and(tf.logical_not(in_blocks),
                               tf.logical_not(tf.logical_or(is_frame, tf.equal(b[0], 0x21)))))

    steps, pos, _, width, height, frames, done = tf.while_loop(
        lambda steps, pos, in_blocks, w, h, f, done: tf.logical_and(
            tf.logical_and(pos < size, tf.logical_not(done)), steps < MAX_GIF_BLOCKS),
        step, (0, 13 + table(_header_bytes(encoded, 10, 1)[0]), tf.constant(False), zero, zero,
               zero, tf.constant(False)))
    unfinished = tf.logical_and(tf.logical_and(pos < size, tf.logical_not(done)),
                                steps >= MAX_GIF_BLOCKS)
    return tf.where(unfinished, tf.constant(MAX_PIXELS + 1, tf.int64),
                    tf.maximum(width * height, frames))


def _declared_pixels(encoded):
    """How many pixels the header of ``encoded`` (a scalar string) declares, for the formats
    ``tf.io.decode_image`` reads (0 for anything else, which the decoder refuses)."""
    def starts(magic: bytes):
        return tf.equal(tf.strings.substr(encoded, 0, len(magic)), magic)

    def png():  # IHDR, the first chunk: big-endian width and height
        b = _header_bytes(encoded, 16, 8)
        return ((b[0] * 256 + b[1]) * 256 + b[2]) * 256 + b[3], \
            ((b[4] * 256 + b[5]) * 256 + b[6]) * 256 + b[7]

    def bmp():  # BITMAPINFOHEADER: little-endian int32 width and height (negative: top-down)
        b = _header_bytes(encoded, 18, 8)
        def int32(v):
            value = v[0] + 256 * (v[1] + 256 * (v[2] + 256 * v[3]))
            return tf.abs(tf.where(value >= 2 ** 31, value - 2 ** 32, value))
        return int32(b[:4]), int32(b[4:])

    def product(pair):
        return pair[0] * pair[1]

    return tf.case(
        [(starts(b"\x89PNG\r\n\x1a\n"), lambda: product(png())),
         (starts(b"\xff\xd8\xff"), lambda: tf.reduce_prod(
             tf.cast(tf.image.extract_jpeg_shape(encoded)[:2], tf.int64))),
         (starts(b"GIF8"), lambda: _gif_pixels(encoded)),
         (starts(b"BM"), lambda: product(bmp()))],
        default=lambda: tf.constant(0, tf.int64))


def bounded_pixels(encoded):
    """``images.to_cifar_pixels`` of ``encoded``, or an InvalidArgumentError (the request
    fails, and the server goes on) if its header declares more than ``MAX_PIXELS`` pixels."""
    check = tf.debugging.assert_less_equal(
        _declared_pixels(encoded), tf.constant(MAX_PIXELS, tf.int64),
        message=f"image_bytes: the picture declares more than {MAX_PIXELS} pixels (or is a "
                f"GIF of more than {MAX_GIF_BLOCKS} blocks), too large to decode safely; "
                f"shrink it first")
    with tf.control_dependencies([check]):
        return image_ops.to_cifar_pixels(tf.identity(encoded))


class FrozenWeights:
    """A variable-scope custom getter that answers every variable with the checkpoint's value
    as a constant. ``check_all_used`` then refuses a checkpoint of another architecture.

    With ``averaged``, a trainable weight takes the value of its moving average (its
    ``/ExponentialMovingAverage`` shadow): the weights the evaluation used. Batch-norm
    statistics are not trainable and come as they are, the ones that go with those weights.
    """

    def __init__(self, checkpoint_path: str, averaged: bool = False):
        self.checkpoint_path = checkpoint_path
        self.averaged = averaged
        self.reader = checkpoints.reader(checkpoint_path)
        self.shapes = self.reader.get_variable_to_shape_map()
        self.used: set[str] = set()

    def _mismatch(self, what: str) -> UserError:
        return UserError(f"checkpoint {self.checkpoint_path} {what}: export it with the "
                         f"--model (and for a ResNet the --num-layers and --resnet-version) it "
                         f"was trained with")

    def __call__(self, getter, name, shape=None, trainable=True, **_):
        if list(self.shapes.get(name, [-1])) != list(shape):
            found = f"has {name} as {self.shapes[name]}" if name in self.shapes else "lacks it"
            raise self._mismatch(f"{found}, but the model needs {name} of shape {list(shape)}")
        self.used.add(name)
        source = name
        if self.averaged and trainable:
            source = f"{name}/{AVERAGE_SUFFIX}"
            if source not in self.shapes:
                raise UserError(f"checkpoint {self.checkpoint_path} has no moving average of "
                                f"{name}: it was trained without --moving-average-decay")
        return tf.constant(self.reader.get_tensor(source), name=name.replace("/", "_"))

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


class RandomWeights:
    """A custom getter like ``FrozenWeights`` that answers every variable with random constants
    of its shape, for timing the network without a checkpoint (the precision probe): kernels
    scaled by He et al. 2015's sqrt(2 / fan-in), so activations keep their size through the
    depth (no infinities, which some CPUs compute slowly), and batch norm as initialised."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def __call__(self, getter, name, shape=None, **_):
        shape = list(shape)
        if len(shape) > 1:
            value = self.rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[:-1]))
        else:
            value = np.full(shape, 1.0 if name.endswith(("gamma", "variance")) else 0.0)
        return tf.constant(value.astype(np.float32), name=name.replace("/", "_"))

    def check_all_used(self, scope: str) -> None:
        """Every weight is made on demand: none can be left over."""


class ServingModule(tf.Module):
    """The exported functions: one network, and one function per signature around it."""

    def __init__(self, settings: ModelSettings, weights: "FrozenWeights | RandomWeights"):
        super().__init__()
        names = list(settings.class_names)
        scope = networks.SCOPES[settings.model.model]

        # autograph=False throughout: this is graph-building Python whose loops and branches
        # are TensorFlow's own (tf.while_loop, tf.case), and autograph's rewriting of the
        # network's source took most of an export's time (docs/performance.md, "End of
        # training").
        @tf.function(input_signature=[tf.TensorSpec([None, *_IMAGE_SHAPE], tf.float32)],
                     autograph=False)
        def network(images):
            with tf.compat.v1.variable_scope(scope, custom_getter=weights):
                logits = networks.logits(images, settings.model, is_training=False,
                                         num_classes=len(names), fold_batch_norm=True,
                                         compute_dtype=tf.as_dtype(settings.compute_dtype))
            # The names model_fn's predictions use, so Estimator.predict agrees with serving.
            classes = tf.argmax(logits, axis=1, name="classes")
            return {"classes": classes,
                    "probabilities": tf.nn.softmax(logits, name="probabilities"),
                    "class_names": tf.gather(tf.constant(names), classes)}

        def from_pixels(pixels):
            return network(tf.cast(pixels, tf.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, *_IMAGE_SHAPE], tf.float32,
                                                    name="images")], autograph=False)
        def by_images(images):
            # A server does not check a fed tensor's shape against the signature's, and a
            # tensor of another rank aborts the process in the convolutions (a CHECK failure in
            # TF 2.15): refuse it as a bad request.
            return network(tf.ensure_shape(images, [None, *_IMAGE_SHAPE]))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
                     autograph=False)
        def by_bytes(image_bytes):
            return from_pixels(tf.map_fn(bounded_pixels, image_bytes,
                                         fn_output_signature=tf.TensorSpec(_IMAGE_SHAPE,
                                                                           tf.uint8)))

        def parse(serialized):
            return schema.decode_images(
                tf.io.parse_example(serialized, schema.FEATURE_SPEC)["image"])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")],
                     autograph=False)
        def by_examples(examples):
            return from_pixels(parse(examples))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")],
                     autograph=False)
        def classify(inputs):
            probabilities = from_pixels(parse(inputs))["probabilities"]
            # TF Serving's Classify API: "classes" are the labels, "scores" their scores.
            return {"classes": tf.tile(tf.constant(names)[None, :],
                                       [tf.shape(probabilities)[0], 1]),
                    "scores": probabilities}

        network.get_concrete_function()  # traces it: the weights are read now
        weights.check_all_used(scope)
        self.network = network
        self.serving_signatures = {IMAGES_SIGNATURE: by_images, BYTES_SIGNATURE: by_bytes,
                                   EXAMPLES_SIGNATURE: by_examples, CLASSIFY_SIGNATURE: classify}
