"""What this machine's processor offers TensorFlow, and the settings that fit it.

The one place that reads the CPU's model and ISA flags (``read_cpu_info``, from Linux's
``/proc/cpuinfo``; tests inject a ``CpuInfo`` instead), asks TensorFlow whether its oneDNN
kernels are on (``onednn_enabled``), and turns ``--precision auto|fp32|bf16`` into a precision
with a reason (``resolve_precision``).

Why it matters, measured on TensorFlow 2.15 (figures in the README's Performance section):

- oneDNN. TF 2.15 turns its oneDNN kernels on by default only on x86 CPUs with AVX512_VNNI,
  AVX512_BF16 or AMX (tensorflow/core/util/util.cc, ``IsMKLEnabled``); elsewhere, e.g. on an
  AVX2-only AMD Zen 3, its Eigen kernels run, which train this ResNet about half as fast and
  have no NCHW pooling at all (``channels_first`` fails on a CPU). So the command lines turn
  oneDNN on when the user has not chosen (``prefer_onednn``), and the trainer refuses
  ``channels_first`` on a CPU where oneDNN is off by the user's choice.
- bfloat16. On CPUs with native bf16 instructions (AVX512_BF16 or AMX-BF16) bf16 convolutions
  through oneDNN are ~1.6x faster than fp32; without them oneDNN emulates bf16 and ResNet-20
  trains at ~22 images/s instead of ~150-265 in fp32. ``auto`` therefore picks bf16 only where
  it is native, and an explicit ``bf16`` on other CPUs is refused.

``prefer_onednn`` changes the process environment and must run before TensorFlow is imported;
only command-line entry points call it. Everything else here takes explicit arguments.
"""

import dataclasses
import os
from typing import MutableMapping, Sequence

from cifar10_estimator.errors import UserError

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
# The flags a benchmark line shows: what decides oneDNN's kernels and bf16 speed.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
# Native bfloat16 arithmetic: AVX512_BF16 (Intel Cooper Lake+, AMD Zen 4+) or AMX (Intel
# Sapphire Rapids+). oneDNN runs bf16 convolutions on these at full speed.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# bf16 on NVIDIA GPUs needs tensor cores that take it: compute capability 8.0 (Ampere) or newer.
GPU_BF16_MIN_CAPABILITY = (8, 0)
PRECISIONS = ("auto", "fp32", "bf16")
# oneDNN's dispatcher cap (``ONEDNN_MAX_CPU_ISA``; oneDNN developer guide, "CPU Dispatcher
# Control"): the values at or above which its kernels use native bf16 instructions. Any other
# cap (AVX2, AVX512_CORE, ...) leaves oneDNN without native bf16 even where the CPU has it.
ONEDNN_CAP_ENV = "ONEDNN_MAX_CPU_ISA"
_ONEDNN_BF16_ISAS = frozenset({
    "ALL", "DEFAULT", "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX",
    "AVX512_CORE_AMX_FP16", "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16"})


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    """The processor's model name and its ISA flags (lower case, as ``/proc/cpuinfo`` has them)."""

    model: str
    flags: frozenset

    @property
    def native_bf16(self) -> bool:
        return any(f in self.flags for f in NATIVE_BF16_FLAGS)

    def as_seen_by_onednn(self, max_isa: str | None) -> "CpuInfo":
        """This CPU as oneDNN uses it under an ``ONEDNN_MAX_CPU_ISA`` cap (None: no cap)."""
        if not max_isa or max_isa.strip().upper() in _ONEDNN_BF16_ISAS:
            return self
        return CpuInfo(f"{self.model} [oneDNN capped at {max_isa.strip().upper()}]",
                       self.flags - frozenset(NATIVE_BF16_FLAGS))

    def describe(self) -> str:
        """One line: ``AMD EPYC 7B13 (avx2 fma; no avx512f avx512_vnni ...)``."""
        have = [f for f in ISA_FLAGS if f in self.flags]
        lack = [f for f in ISA_FLAGS if f not in self.flags]
        parts = " ".join(have) or "none of " + " ".join(ISA_FLAGS)
        if have and lack:
            parts += "; no " + " ".join(lack)
        return f"{self.model} ({parts})"


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor's model and flags from the text of ``/proc/cpuinfo``."""
    model, flags = "unknown CPU", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model, flags)


def read_cpu_info(path: str = "/proc/cpuinfo") -> CpuInfo:
    """This machine's CPU; an unknown CPU with no flags where ``path`` cannot be read."""
    try:
        with open(path) as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return CpuInfo("unknown CPU", frozenset())


def prefer_onednn(environ: MutableMapping[str, str]) -> bool:
    """Turns TensorFlow's oneDNN kernels on unless the user chose (command lines only).

    Must run before TensorFlow is imported: TensorFlow reads the variable once, at load.
    Returns True if it set the variable.
    """
    if ONEDNN_ENV in environ:
        return False
    environ[ONEDNN_ENV] = "1"
    return True


def onednn_enabled() -> bool:
    """Whether the TensorFlow loaded in this process runs its oneDNN kernels."""
    from tensorflow.python.util import _pywrap_util_port  # the flag TF itself consults

    return bool(_pywrap_util_port.IsMklEnabled())


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
