"""Data-parallel plumbing: which devices run towers, where variables live, how shards and
gradients move. It places ops on the towers' devices (named by the plan,
``config.plan.tower_devices``) and names the variables' device; the cluster's devices are named
in ``task/peers.py``.

A training step on one worker splits its batch into one equal, contiguous shard per tower
(tower i gets examples [i*B/N, (i+1)*B/N)), runs the same ResNet on every shard with shared
variables, and averages the towers' gradients on each variable's own device before one
optimizer update. Towers run on GPUs (``/gpu:i``) or, with no GPUs, on N logical CPU devices
(``/cpu:i``, made by the session's ``device_count``) so the same code is exercised without
GPUs.

Variable placement follows the original tutorial: strategy ``CPU`` keeps every variable on
``/cpu:0``; strategy ``GPU`` spreads them over the tower devices, each new variable going to
the device with the fewest bytes so far. Byte sizes come from each variable op's ``shape`` and
``dtype`` attributes: on TF 2.15 variables are resource handles whose output tensor has shape
``()`` and dtype ``resource``, so sizing by the output tensor would put every variable on the
first device.
"""

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

# Op types that create variables (reference variables for old graphs, resource handles now).
VARIABLE_OP_TYPES = frozenset({"Variable", "VariableV2", "VarHandleOp"})


def ensure_logical_cpus(count: int) -> bool:
    """Makes this process's TensorFlow runtime show ``count`` logical CPU devices, for a
    tf.distribute strategy to place replicas on (sessions make their own with
    ``device_count``). Possible only before the runtime starts: returns whether it has them."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:  # the runtime started already: it has what it has
        pass
    return len(tf.config.list_logical_devices("CPU")) >= count


def consolidation_device(variable_strategy: str, devices: Sequence[str]) -> str:
    """Where the optimizer update, learning rate and metrics run (the tutorial's choice)."""
    return "/cpu:0" if variable_strategy == "CPU" else devices[0]


def variable_byte_size(op: tf.Operation) -> int:
    """Bytes of the variable that ``op`` creates, from its shape and dtype attributes."""
    shape = tf.TensorShape(op.get_attr("shape"))
    dtype = tf.as_dtype(op.get_attr("dtype"))
    return int(np.prod(shape.as_list(), dtype=np.int64)) * dtype.size


class GreedyPlacer:
    """Puts each new variable on the device holding the fewest bytes so far (ties: lowest)."""

    def __init__(self, devices: Sequence[str]):
        self.devices = list(devices)
        self.loads = [0] * len(self.devices)

    def __call__(self, op: tf.Operation) -> str:
        i = int(np.argmin(self.loads))
        self.loads[i] += variable_byte_size(op)
        return self.devices[i]


def device_setter(worker_device: str, variable_device: Callable[[tf.Operation], str]
                  ) -> Callable[[tf.Operation], str]:
    """A device function for ``tf.compat.v1.device``: variables go where ``variable_device``
    says, every other op to ``worker_device``. A device already set on an op (an inner
    ``device`` scope) wins field by field, as in ``tf.compat.v1.train.replica_device_setter``,
    so the Estimator's own parameter-server setter can add ``/job:ps`` around ours.
    """
    def choose(op: tf.Operation) -> str:
        current = tf.compat.v1.DeviceSpec.from_string(op.device or "")
        if op.type in VARIABLE_OP_TYPES:
            spec = tf.compat.v1.DeviceSpec.from_string(variable_device(op))
        else:
            spec = tf.compat.v1.DeviceSpec.from_string(worker_device)
        spec.merge_from(current)
        return spec.to_string()
    return choose


def make_device_setters(devices: Sequence[str], variable_strategy: str
                        ) -> list[Callable[[tf.Operation], str]]:
    """One device function per tower for the given variable strategy ('CPU' or 'GPU')."""
    if variable_strategy == "CPU":
        place = lambda op: "/cpu:0"  # noqa: E731
    elif variable_strategy == "GPU":
        place = GreedyPlacer(devices)
    else:
        raise ValueError(f"variable strategy must be 'CPU' or 'GPU', got {variable_strategy!r}")
    return [device_setter(d, place) for d in devices]


def split_batch(tensor: tf.Tensor, num_shards: int) -> list[tf.Tensor]:
    """Splits a batch along axis 0 into ``num_shards`` equal contiguous shards."""
    if num_shards == 1:
        return [tensor]
    return tf.split(tensor, num_shards, axis=0)


def average_gradients(tower_grads: Sequence[Sequence[tuple[tf.Tensor, tf.Variable]]]
                      ) -> list[tuple[tf.Tensor, tf.Variable]]:
    """Averages per-tower (gradient, variable) lists, each average on its variable's device.

    Averaging where the variable lives means each gradient crosses to that device once and
    the update needs no further copy. Variables without a gradient in any tower are dropped.
    """
    if len(tower_grads) == 1:
        return [(g, v) for g, v in tower_grads[0] if g is not None]
    averaged = []
    with tf.name_scope("gradient_averaging"):
        for pairs in zip(*tower_grads):
            var = pairs[0][1]
            grads = [g for g, _ in pairs if g is not None]
            if not grads:
                continue
            with tf.compat.v1.device(var.device):
                avg = grads[0] if len(grads) == 1 else tf.math.add_n(grads) * (1.0 / len(grads))
            averaged.append((avg, var))
    return averaged
