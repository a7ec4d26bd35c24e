"""The test suite's time: wall seconds and the CPU-seconds the whole machine was busy meanwhile.

The machine's busy time (user, nice, system, irq and softirq jiffies of ``/proc/stat``'s
``cpu`` line) counts every process the suite causes, Ray's nodes and the processes they start
included, which ``time``'s figure for pytest and the children it waits for misses. Run it on an
otherwise quiet machine; arguments after ``--`` go to pytest.

    python benchmarks/suite_time.py                       # the suite as `pytest` runs it
    CIFAR10_TESTS_COLD=1 python benchmarks/suite_time.py  # every command started cold
    python benchmarks/suite_time.py -- tests/test_faults.py
"""

import os
import subprocess
import sys
import time

from machine import print_machine_line

_BUSY_FIELDS = (0, 1, 2, 5, 6)  # user nice system irq softirq (proc(5))


def busy_seconds() -> float:
    """CPU-seconds this machine has been busy since it booted, all cores together."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    return sum(int(fields[i]) for i in _BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str]) -> int:
    args = argv[argv.index("--") + 1:] if "--" in argv else []
    print_machine_line()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    busy, started = busy_seconds(), time.monotonic()
    status = subprocess.call([sys.executable, "-m", "pytest", "-q", *args], cwd=repo)
    wall, cpu = time.monotonic() - started, busy_seconds() - busy
    print(f"pytest exit status {status}: {wall:.1f} s wall, the machine busy {cpu:,.0f} "
          f"CPU-seconds ({cpu / wall:.2f} cores on average)")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
