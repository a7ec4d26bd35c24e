"""What a checkpoint of this model is: its global step, whether it still exists, its network.

Checkpoints are TensorFlow's (``model.ckpt-<step>.index`` and data files, listed in the job
dir's ``checkpoint`` file). The network is read from the variable names the builders give
(``resnet/stage1/block<i>/...``, ``resnet/final_bn`` for version 2, ``resnet/dense/bias``;
``tutorial_cnn/softmax_linear/biases``), so this also works on job dirs this package did not
write.
"""

import re
from typing import Optional

import tensorflow as tf

from cifar10_estimator.data import schema
from cifar10_estimator.config.settings import RESNET, TUTORIAL_CNN, ModelSection, depth

_BLOCK = re.compile(r"^resnet/stage(\d)/block(\d+)/")
_TUTORIAL_OUTPUT = "tutorial_cnn/softmax_linear/biases"  # its class count is its shape


_STEP_SUFFIX = re.compile(r"-(\d+)$")


def checkpoint_step(checkpoint_path: str) -> int:
    """The global step of a checkpoint: from its path as Estimator names it (``.../model.ckpt-1200``
    -> 1200), else (a checkpoint saved under another name) from its ``global_step`` variable."""
    match = _STEP_SUFFIX.search(checkpoint_path)
    if match:
        return int(match.group(1))
    return int(reader(checkpoint_path).get_tensor(tf.compat.v1.GraphKeys.GLOBAL_STEP))


def reader(checkpoint_path: str):
    """A reader of one checkpoint's variables, by its path prefix (``.../model.ckpt-1200``).

    Not ``tf.train.load_checkpoint``: that first asks whether the path is a folder, and
    TensorFlow's ``ram://`` file system says yes to any prefix of a file's name, so it looks for
    a ``checkpoint`` file inside ``model.ckpt-1200`` and fails.
    """
    return tf.compat.v1.train.NewCheckpointReader(checkpoint_path)


def variable_shapes(checkpoint_path: str) -> dict[str, list[int]]:
    """Every variable of a checkpoint and its shape."""
    return reader(checkpoint_path).get_variable_to_shape_map()


def latest_step(job_dir: str) -> int:
    """The global step of the latest checkpoint in ``job_dir``; 0 if there is none."""
    latest = tf.train.latest_checkpoint(job_dir)
    return checkpoint_step(latest) if latest else 0


def checkpoint_gone(checkpoint_path: str) -> bool:
    """True once a checkpoint's files are deleted (as ``--keep-checkpoint-max`` does)."""
    return not tf.io.gfile.glob(checkpoint_path + ".index")


def checkpoint_model(checkpoint_path: str) -> Optional[tuple[ModelSection, int]]:
    """The network in a checkpoint, from its variables: its ``ModelSection`` (``model``, and
    for a ResNet ``num_layers`` and ``resnet_version``) and its class count; None if it holds
    neither network. Raises ``tf.errors.OpError`` if it cannot be read."""
    shapes = variable_shapes(checkpoint_path)
    if _TUTORIAL_OUTPUT in shapes:
        return ModelSection(model=TUTORIAL_CNN), shapes[_TUTORIAL_OUTPUT][0]
    blocks = {int(m.group(2)) for m in map(_BLOCK.match, shapes) if m and m.group(1) == "1"}
    if not blocks:
        return None
    version = 2 if "resnet/final_bn/gamma" in shapes else 1
    classes = shapes.get("resnet/dense/bias", [schema.NUM_CLASSES])[0]
    return ModelSection(num_layers=depth(max(blocks) + 1), resnet_version=version), classes


def model_flags(params: ModelSection) -> str:
    """The flags that ask for the network of ``params``."""
    if params.model == TUTORIAL_CNN:
        return f"--model {TUTORIAL_CNN}"
    return f"--model {RESNET} --num-layers {params.num_layers} --resnet-version " \
           f"{params.resnet_version}"
