"""SavedModel export: the trained ResNet with two serving signatures.

- ``serving_default``: ``images`` float32 [N, 32, 32, 3], HWC RGB values in 0..255.
- ``serving_examples``: ``examples`` string [N], serialized ``tf.train.Example`` in the record
  schema of ``cifar10`` (what the TFRecord files hold).

Both return ``classes`` (int64 [N]) and ``probabilities`` (float32 [N, 10]). One copy of the
network serves both: the examples path parses into a ``placeholder_with_default`` that the
images signature feeds directly.

The export always computes in ``channels_last`` on one device with devices cleared, whatever
the training layout: the variables do not depend on the layout, and NHWC runs on every CPU.
It is written under a temporary name and renamed into ``<export_dir>/<unix time>`` only when
complete (the numbered-version layout TensorFlow Serving watches).
"""

import dataclasses
import os
import shutil
import time
from typing import Sequence

import tensorflow as tf

from cifar10_estimator import cifar10
from cifar10_estimator.errors import UserError
from cifar10_estimator.model_fn import ModelSettings, make_model_fn

IMAGES_SIGNATURE = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
EXAMPLES_SIGNATURE = "serving_examples"
CLASS_NAMES_FILE = os.path.join("assets.extra", "class_names.txt")


def _remove_unfinished(export_dir: str) -> None:
    """Deletes temporary export folders that a killed run left behind."""
    for name in os.listdir(export_dir):
        if name.startswith(".") and name.endswith(".tmp"):
            shutil.rmtree(os.path.join(export_dir, name), ignore_errors=True)


def export_saved_model(settings: ModelSettings, checkpoint_path: str, export_dir: str,
                       class_names: Sequence[str] = cifar10.CLASS_NAMES) -> str:
    """Writes the SavedModel of ``checkpoint_path`` into a new numbered folder of ``export_dir``.

    ``class_names`` (label order) go to ``assets.extra/class_names.txt``, one per line, where
    SavedModel keeps files for tools rather than for loading the graph; ``predict`` reads them.

    Returns:
      The path of the new SavedModel folder.

    Raises:
      UserError: the export folder cannot be written.
    """
    serving = dataclasses.replace(settings, data_format="channels_last", devices=("/cpu:0",),
                                  variable_strategy="CPU", compute_dtype="float32")
    version = int(time.time())
    while os.path.exists(os.path.join(export_dir, str(version))):
        version += 1
    final = os.path.join(export_dir, str(version))
    tmp = os.path.join(export_dir, f".{version}.tmp")
    with tf.Graph().as_default():
        examples = tf.compat.v1.placeholder(tf.string, [None], name="examples")
        parsed = tf.io.parse_example(examples, cifar10.FEATURE_SPEC)
        images = tf.compat.v1.placeholder_with_default(
            tf.cast(cifar10.decode_images(parsed["image"]), tf.float32),
            [None, cifar10.HEIGHT, cifar10.WIDTH, cifar10.CHANNELS], name="images")
        spec = make_model_fn(serving)({"image": images}, None, tf.estimator.ModeKeys.PREDICT)
        signatures = {
            IMAGES_SIGNATURE: tf.compat.v1.saved_model.predict_signature_def(
                {"images": images}, spec.predictions),
            EXAMPLES_SIGNATURE: tf.compat.v1.saved_model.predict_signature_def(
                {"examples": examples}, spec.predictions),
        }
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
                os.makedirs(os.path.join(tmp, "assets.extra"))
                with open(os.path.join(tmp, CLASS_NAMES_FILE), "w") as f:
                    f.write("".join(f"{name}\n" for name in class_names))
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
