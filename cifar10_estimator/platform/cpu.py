"""What this machine's processor offers TensorFlow: its ISA flags, and oneDNN.

The one place that reads the CPU's model and ISA flags (``read_cpu_info``, from Linux's
``/proc/cpuinfo``; tests inject a ``CpuInfo`` instead) and asks TensorFlow whether its oneDNN
kernels are on (``onednn_enabled``). ``precision`` turns these facts into ``--precision``.

Why it matters, measured on TensorFlow 2.15 (the figures: docs/performance.md, "Training
throughput", and docs/cpus.md, "CPUs measured so far"):

- oneDNN. TF 2.15 turns its oneDNN kernels on by default only on x86 CPUs with AVX512_VNNI,
  AVX512_BF16 or AMX (tensorflow/core/util/util.cc, ``IsMKLEnabled``); elsewhere, e.g. on an
  AVX2-only AMD Zen 3, its Eigen kernels run, which train this ResNet much slower and have
  no NCHW pooling at all (``channels_first`` fails on a CPU). So the command lines turn
  oneDNN on when the user has not chosen (``prefer_onednn``), and the trainer refuses
  ``channels_first`` on a CPU where oneDNN is off by the user's choice.
- bfloat16. On CPUs with native bf16 instructions (AVX512_BF16 or AMX-BF16) bf16 convolutions
  through oneDNN can be much faster than fp32, or slower, by CPU; without them oneDNN emulates
  bf16 and ResNet-20 trains many times slower than in fp32 (``precision`` acts on this).

``prefer_onednn`` changes the process environment and must run before TensorFlow is imported;
only command-line entry points call it. Everything else here takes explicit arguments.
"""

import dataclasses
from typing import MutableMapping


ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
# The flags a benchmark line shows: what decides oneDNN's kernels and bf16 speed.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
# Native bfloat16 arithmetic: AVX512_BF16 (Intel Cooper Lake+, AMD Zen 4+) or AMX (Intel
# Sapphire Rapids+). oneDNN runs bf16 convolutions on these at full speed.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
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
