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
TensorFlow's "Unknown image file format" error, and the server goes on. ``classify`` serves
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
from cifar10_estimator.model.model_fn import ModelSettings

IMAGES_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
BYTES_SIGNATURE = "serving_bytes"
EXAMPLES_SIGNATURE = "serving_examples"
CLASSIFY_SIGNATURE = "classify"
_IMAGE_SHAPE = [schema.HEIGHT, schema.WIDTH, schema.CHANNELS]
# The name ExponentialMovingAverage gives the shadow of ``<variable>``: ``<variable>/<this>``.
AVERAGE_SUFFIX = "ExponentialMovingAverage"


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
        scope = networks.SCOPES[settings.params.model]

        @tf.function(input_signature=[tf.TensorSpec([None, *_IMAGE_SHAPE], tf.float32)])
        def network(images):
            with tf.compat.v1.variable_scope(scope, custom_getter=weights):
                logits = networks.logits(images, settings.params, is_training=False,
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
                                                    name="images")])
        def by_images(images):
            return network(images)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
        def by_bytes(image_bytes):
            return from_pixels(tf.map_fn(image_ops.to_cifar_pixels, image_bytes,
                                         fn_output_signature=tf.TensorSpec(_IMAGE_SHAPE,
                                                                           tf.uint8)))

        def parse(serialized):
            return schema.decode_images(
                tf.io.parse_example(serialized, schema.FEATURE_SPEC)["image"])

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
        weights.check_all_used(scope)
        self.network = network
        self.serving_signatures = {IMAGES_SIGNATURE: by_images, BYTES_SIGNATURE: by_bytes,
                                   EXAMPLES_SIGNATURE: by_examples, CLASSIFY_SIGNATURE: classify}
