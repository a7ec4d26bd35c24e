"""The compute precision that fits the machine: ``--precision auto|fp32|bf16`` resolved.

Where the CPU has no native bfloat16 instructions (AVX512_BF16 or AMX-BF16), oneDNN emulates
bf16 and ResNet-20 trains many times slower than in fp32, so ``auto`` keeps fp32 there without
measuring and an explicit ``bf16`` is refused. Where it has them, the flags still do not say
which is faster (bf16 trains ResNet-20 faster than fp32 on an AMD Zen 4 or 5 and slower on an
Intel Xeon without AMX: docs/cpus.md, "CPUs measured so far"), so ``auto`` measures both
(``precision_probe``, cached by ``precision_cache``) and takes bf16 only when it is at least
``BF16_MIN_SPEEDUP`` times as fast. An explicit ``bf16`` that measured slower trains as asked,
with a warning that gives both figures.

A job keeps one precision: once the job dir has recorded it (``settings_record``), ``auto``
follows the record on every task and every restart, so a cluster on a mixed node pool, or a
run resumed on another machine, does not change precision half-way.

On GPUs, bf16 needs compute capability 8.0 (Ampere) or newer; ``auto`` keeps fp32 on GPUs, which
this package's suite cannot test.
"""

import dataclasses
from typing import Callable, Optional, Sequence

from cifar10_estimator.errors import UserError
from cifar10_estimator.platform.cpu import NATIVE_BF16_FLAGS, ONEDNN_ENV, CpuInfo

# bf16 on NVIDIA GPUs needs tensor cores that take it: compute capability 8.0 (Ampere) or newer.
GPU_BF16_MIN_CAPABILITY = (8, 0)
PRECISIONS = ("auto", "fp32", "bf16")
# auto takes bf16 only when it measured at least this much faster. Below it, a difference is
# within what two probes of the same precision on a shared 2-core host differ by (up to ~7 %
# in the probe tests of docs/cpus.md), and fp32 keeps the loss and logits exact.
BF16_MIN_SPEEDUP = 1.1


@dataclasses.dataclass(frozen=True)
class Measured:
    """A probe's answer: images/s per precision (``{"fp32": ..., "bf16": ...}``) and where it
    came from (``measured in 4.1 s``, ``measured 2026-11-24, cached in PATH``)."""

    images_per_sec: dict
    source: str

    @property
    def speedup(self) -> float:
        return self.images_per_sec["bf16"] / self.images_per_sec["fp32"]

    def figures(self, first: str) -> str:
        """``fp32 (723 images/s) over bf16 (496)``, the chosen precision first."""
        other = "bf16" if first == "fp32" else "fp32"
        return (f"{first} ({self.images_per_sec[first]:,.0f} images/s) over {other} "
                f"({self.images_per_sec[other]:,.0f})")


class ProbeFailed(Exception):
    """A probe could not time both precisions; the message says why."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """The precision to compute in; why, as the trainer's line ``precision REQUESTED: REASON``
    shows it (the reason starts with the precision chosen); and a warning for a choice that
    measured slower (None if there is none)."""

    precision: str
    reason: str
    warning: Optional[str] = None


def gpu_capabilities(num_gpus: int) -> list[tuple[int, int]]:
    """The compute capability of each of the first ``num_gpus`` GPUs TensorFlow sees (none
    for CPU training)."""
    if not num_gpus:
        return []
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")[:num_gpus]
    return [tuple(tf.config.experimental.get_device_details(gpu).get(
        "compute_capability", (0, 0))) for gpu in gpus]


def _no_measurement() -> Measured:
    raise ProbeFailed("no measurement was asked for")


def resolve_precision(requested: str, cpu: CpuInfo, *, onednn: bool,
                      gpu_capabilities: Sequence[tuple[int, int]] = (),
                      measure: Callable[[], Measured] = _no_measurement,
                      cached: Optional[Measured] = None,
                      recorded: Optional[str] = None) -> Choice:
    """The compute precision to train in, and why.

    Args:
      requested: 'auto', 'fp32' or 'bf16' (the ``--precision`` flag).
      cpu: the processor (for CPU training), as oneDNN sees it.
      onednn: whether TensorFlow's oneDNN kernels are on (bf16 on a CPU needs them).
      gpu_capabilities: compute capability of each GPU that trains; empty for CPU training.
      measure: times both precisions (the cache, else a probe); called only where the choice
        depends on it: ``auto`` without a recorded choice, and ``bf16``, on a CPU with native
        bf16 and oneDNN on. It raises ``ProbeFailed`` when it cannot.
      cached: this CPU's earlier measurement, if the cache has one (never a probe): an explicit
        ``fp32``, or ``auto`` following the record, says when it points the other way.
      recorded: the precision the job dir recorded at the job's first start, if any; ``auto``
        follows it.

    Raises:
      UserError: ``bf16`` asked for (or recorded for ``auto``) where it has no fast kernels.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {requested!r}")
    if gpu_capabilities:
        return _on_gpus(requested, gpu_capabilities)
    fast_bf16 = cpu.native_bf16 and onednn
    if requested == "fp32" or (requested == "auto" and recorded == "fp32"):
        why = "as asked" if requested == "fp32" else "the job's recorded precision"
        if fast_bf16 and cached and cached.speedup >= BF16_MIN_SPEEDUP:
            return Choice("fp32", f"fp32, {why}; bf16 measured {cached.speedup:.2f}x as fast "
                                  f"on this CPU ({cached.source})")
        return Choice("fp32", f"fp32, {why}")
    wanted = "bf16" if requested == "bf16" else recorded  # bf16, or None for a fresh choice
    if not cpu.native_bf16:
        if wanted == "bf16":
            raise UserError(f"{_bf16_source(requested)}: this CPU ({cpu.model}) has no native "
                            f"bfloat16 instructions ({' or '.join(NATIVE_BF16_FLAGS)}), so bf16 "
                            f"would train many times slower than fp32; {_bf16_fix(requested)}")
        return Choice("fp32", f"fp32: this CPU has no native bfloat16 "
                              f"(no {' or '.join(NATIVE_BF16_FLAGS)})")
    if not onednn:
        if wanted == "bf16":
            raise UserError(f"{_bf16_source(requested)}: bf16 runs its convolutions through "
                            f"oneDNN, which is off in this process; set {ONEDNN_ENV}=1 (or "
                            f"unset it), or {_bf16_fix(requested)}")
        return Choice("fp32", f"fp32: oneDNN is off ({ONEDNN_ENV}), and bf16 needs it")
    if requested == "auto" and recorded == "bf16":
        if cached and cached.speedup < 1:
            return Choice("bf16", f"bf16, the job's recorded precision; it measured "
                                  f"{cached.speedup:.2f}x fp32's speed on this CPU "
                                  f"({cached.source})", _slower_bf16(requested, cached))
        return Choice("bf16", "bf16, the job's recorded precision")
    try:
        measured = measure()
    except ProbeFailed as e:
        if requested == "bf16":
            return Choice("bf16", f"bf16, as asked (its speed could not be measured: {e})")
        return Choice("fp32", f"fp32: the probe of bf16 failed ({e})")
    if requested == "bf16":
        warning = _slower_bf16(requested, measured) if measured.speedup < 1 else None
        return Choice("bf16", f"bf16, as asked: {measured.figures('bf16')}; {measured.source}",
                      warning)
    chosen = "bf16" if measured.speedup >= BF16_MIN_SPEEDUP else "fp32"
    rule = (f"{measured.speedup:.2f}x" if chosen == "bf16" else
            f"bf16 is taken at {BF16_MIN_SPEEDUP:g}x or more")
    return Choice(chosen, f"{measured.figures(chosen)}: {rule}; {measured.source}")


def check_requested(requested: str, cpu: CpuInfo, *, onednn: bool,
                    gpu_capabilities: Sequence[tuple[int, int]] = ()) -> None:
    """Refuses an explicit ``bf16`` that has no fast kernels here, before anything is written
    (the refusal ``resolve_precision`` makes, without measuring)."""
    if requested == "bf16":
        resolve_precision(requested, cpu, onednn=onednn, gpu_capabilities=gpu_capabilities)


def _slower_bf16(requested: str, measured: Measured) -> str:
    """The warning for a run that computes in bf16 where it measured slower than fp32."""
    how = "--precision fp32 --change-settings" if requested == "auto" else "--precision fp32"
    return (f"--precision {requested} trains in bf16, which measured slower than fp32 on this "
            f"CPU: {measured.figures('fp32')} ({measured.source}); {how} would train "
            f"{1 / measured.speedup:.2f}x as fast")


def resolve_serving_precision(requested: str, trained: str, cpu: CpuInfo, *, onednn: bool,
                              measure: Callable[[], Measured] = _no_measurement) -> Choice:
    """The precision an export computes in: ``auto`` gives fp32 unless the model trained in
    bf16 and bf16 serves at least ``BF16_MIN_SPEEDUP`` times as fast here (``measure`` times the
    serving network); ``fp32`` and ``bf16`` as asked (``bf16`` only where it is native).

    An export is often served on another machine: one computing in bf16 is fast only where that
    machine has native bf16 too (docs/serving.md).
    """
    if requested == "auto" and trained == "fp32":
        return Choice("fp32", "fp32, as the model trained")
    if requested == "bf16" and not cpu.native_bf16:
        raise UserError(f"--serving-precision bf16: this CPU ({cpu.model}) has no native "
                        f"bfloat16 instructions ({' or '.join(NATIVE_BF16_FLAGS)}), so the "
                        f"export would run here many times slower than in fp32; use "
                        f"--serving-precision fp32 or auto")
    if requested == "bf16":
        return Choice("bf16", "bf16, as asked")
    return resolve_precision(requested, cpu, onednn=onednn, measure=measure)


def _bf16_source(requested: str) -> str:
    return ("--precision bf16" if requested == "bf16" else
            "--precision auto: this job trains in bf16 (its recorded precision), but")


def _bf16_fix(requested: str) -> str:
    if requested == "bf16":
        return "use --precision fp32 or auto"
    return ("run it on a CPU with native bf16, or add --precision fp32 --change-settings on the "
            "chief to go on in fp32")


def _on_gpus(requested: str, capabilities: Sequence[tuple[int, int]]) -> Choice:
    slow = [c for c in capabilities if tuple(c) < GPU_BF16_MIN_CAPABILITY]
    if requested == "bf16":
        if slow:
            raise UserError(
                f"--precision bf16 needs GPUs of compute capability 8.0 or newer (Ampere); "
                f"these GPUs have {', '.join('%d.%d' % tuple(c) for c in slow)}: use "
                f"--precision fp32")
        return Choice("bf16", "bf16, as asked, on GPUs of compute capability 8.0 or newer")
    # bf16 on GPUs is untested by this package's suite (no GPU here), so auto keeps fp32.
    return Choice("fp32", "fp32 on GPUs; --precision bf16 gives bf16 on Ampere or newer")
