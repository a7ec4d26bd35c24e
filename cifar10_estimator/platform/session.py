"""The session configuration every session of a task uses: threads, soft placement, logical CPU
devices, XLA and, in a cluster, the tasks a trainer's sessions may reach."""

from typing import Sequence

import tensorflow as tf

from cifar10_estimator.config.settings import DevicesSection


def session_config(devices: DevicesSection, log_device_placement: bool = False,
                   device_filters: Sequence[str] = ()) -> tf.compat.v1.ConfigProto:
    """Threading, placement and logical CPU devices for every session of the job;
    ``log_device_placement`` logs every op's device (``--log-device-placement``).

    ``device_filters`` limits a cluster task's sessions to the tasks it needs
    (``task.peers.device_filters``).
    """
    proto = tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        log_device_placement=log_device_placement,
        intra_op_parallelism_threads=devices.num_intra_threads,
        inter_op_parallelism_threads=devices.num_inter_threads,
        # Pinned host memory makes host-to-GPU copies of input batches faster.
        gpu_options=tf.compat.v1.GPUOptions(force_gpu_compatible=True))
    if devices.logical_cpus:
        proto.device_count["CPU"] = devices.logical_cpus
    if devices.xla:
        proto.graph_options.optimizer_options.global_jit_level = (
            tf.compat.v1.OptimizerOptions.ON_1)
    proto.device_filters.extend(device_filters)
    return proto
