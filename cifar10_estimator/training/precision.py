"""The compute precision that fits the machine: ``--precision auto|fp32|bf16`` resolved.

bf16 is chosen only where it is fast: on CPUs with native bfloat16 instructions (AVX512_BF16 or
AMX-BF16) through oneDNN, ~1.6x faster than fp32; elsewhere oneDNN emulates it and ResNet-20
trains at ~22 images/s instead of ~150-265 in fp32, so ``auto`` keeps fp32 there and an
explicit ``bf16`` is refused (figures: docs/cpus.md). On GPUs, bf16 needs compute capability 8.0
(Ampere) or newer; ``auto`` keeps fp32 on GPUs, which this package's suite cannot test.
"""

from typing import Sequence

from cifar10_estimator.errors import UserError
from cifar10_estimator.training.cpu import NATIVE_BF16_FLAGS, ONEDNN_ENV, CpuInfo

# bf16 on NVIDIA GPUs needs tensor cores that take it: compute capability 8.0 (Ampere) or newer.
GPU_BF16_MIN_CAPABILITY = (8, 0)
PRECISIONS = ("auto", "fp32", "bf16")


def gpu_capabilities(num_gpus: int) -> list[tuple[int, int]]:
    """The compute capability of each of the first ``num_gpus`` GPUs TensorFlow sees."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")[:num_gpus]
    return [tuple(tf.config.experimental.get_device_details(gpu).get(
        "compute_capability", (0, 0))) for gpu in gpus]


def resolve_precision(requested: str, cpu: CpuInfo, *, onednn: bool,
                      gpu_capabilities: Sequence[tuple[int, int]] = ()) -> tuple[str, str]:
    """The compute precision to train in, and why.

    Args:
      requested: 'auto', 'fp32' or 'bf16' (the ``--precision`` flag).
      cpu: the processor (for CPU training).
      onednn: whether TensorFlow's oneDNN kernels are on (bf16 on a CPU needs them).
      gpu_capabilities: compute capability of each GPU that trains; empty for CPU training.

    Returns:
      ('fp32' or 'bf16', a sentence that says why).

    Raises:
      UserError: ``bf16`` asked for where it has no fast kernels.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {requested!r}")
    if gpu_capabilities:
        slow = [c for c in gpu_capabilities if tuple(c) < GPU_BF16_MIN_CAPABILITY]
        if requested == "bf16":
            if slow:
                raise UserError(
                    f"--precision bf16 needs GPUs of compute capability 8.0 or newer (Ampere); "
                    f"these GPUs have {', '.join('%d.%d' % tuple(c) for c in slow)}: use "
                    f"--precision fp32")
            return "bf16", "asked for with --precision bf16 on GPUs of compute capability >= 8.0"
        # bf16 on GPUs is untested by this package's suite (no GPU here), so auto keeps fp32.
        return "fp32", ("fp32 on GPUs (auto); bf16 is available with --precision bf16 on "
                        "Ampere or newer")
    if requested == "fp32":
        return "fp32", "asked for with --precision fp32"
    if not cpu.native_bf16:
        if requested == "bf16":
            raise UserError(
                f"--precision bf16: this CPU ({cpu.model}) has no native bfloat16 "
                f"instructions (avx512_bf16 or amx_bf16), so bf16 would train many times "
                f"slower than fp32; use --precision fp32 or auto")
        return "fp32", f"auto: this CPU has no native bfloat16 (no {' or '.join(NATIVE_BF16_FLAGS)})"
    if not onednn:
        if requested == "bf16":
            raise UserError(
                f"--precision bf16 runs its convolutions through oneDNN, which is off in this "
                f"process; set {ONEDNN_ENV}=1 (or unset it) or use --precision fp32")
        return "fp32", f"auto: oneDNN is off ({ONEDNN_ENV}), and bf16 needs it"
    if requested == "bf16":
        return "bf16", "asked for with --precision bf16; this CPU has native bfloat16"
    have = " and ".join(f for f in NATIVE_BF16_FLAGS if f in cpu.flags)
    return "bf16", f"auto: this CPU has native bfloat16 ({have}), ~1.6x faster than fp32"
