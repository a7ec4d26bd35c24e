"""The first line every benchmark prints: which CPU, which ISA flags, oneDNN, cores and load.

Figures from different CPUs are not comparable (an AVX2-only Zen 3 trains this ResNet at a
quarter of the speed of an AVX-512 Zen 5), so each benchmark names its machine before any
figure. ``ONEDNN_MAX_CPU_ISA`` (oneDNN's own dispatcher cap, e.g. ``AVX2``) is shown because it
lets an AVX-512 machine run oneDNN's AVX2 kernels, as a stand-in for an AVX2-only CPU.
"""

import os

from cifar10_estimator.platform import cpu


def machine_line() -> str:
    """``CPU: <model> (<flags>); TF_ENABLE_ONEDNN_OPTS=...; 2 cores; load 0.31``."""
    info = cpu.read_cpu_info().as_seen_by_onednn(os.environ.get(cpu.ONEDNN_CAP_ENV))
    onednn = os.environ.get(cpu.ONEDNN_ENV, "unset")
    parts = [f"CPU: {info.describe()}", f"{cpu.ONEDNN_ENV}={onednn}"]
    parts.append(f"{os.cpu_count()} cores")
    try:
        parts.append(f"load {os.getloadavg()[0]:.2f}")
    except OSError:
        pass
    return "; ".join(parts)


def print_machine_line() -> None:
    print(machine_line(), flush=True)
