"""The precision probes' results, kept between runs: ``<cache folder>/precision.json``.

A probe (``precision_probe``) costs seconds, and its answer depends only on the machine and
the work: the CPU's model and ISA flags (as oneDNN sees them), the TensorFlow version, and what
is timed (the network, its batch, layout, towers and threads). That is the entry's key, so a
second run of the same job on the same kind of machine starts without probing, and a new
TensorFlow, another CPU or another network measures anew. Entries of other TensorFlow versions
are dropped when the file is next written.

The command lines put the file in the user's cache folder (``$XDG_CACHE_HOME``, else
``~/.cache``, then ``cifar10_estimator/``, per the XDG Base Directory specification). The
file is a cache, never a source of errors: a damaged or unreadable one is ignored (and rewritten
by the next probe), and one that cannot be written only costs the next run a probe.
"""

import dataclasses
import json
import logging
import os
import time
from typing import Callable, Mapping, Optional

from cifar10_estimator import storage
from cifar10_estimator.platform.precision import Measured, ProbeFailed

log = logging.getLogger("cifar10_estimator")

CACHE_FILE = "precision.json"
PACKAGE_FOLDER = "cifar10_estimator"
_FORMAT = 1  # the file's layout; a file of another layout is ignored


@dataclasses.dataclass(frozen=True)
class Entry:
    """One probe's result: images/s per precision, and when it was measured."""

    images_per_sec: dict  # {"fp32": float, "bf16": float}
    measured: str  # ISO date


class PrecisionCache:
    """The cache file in ``folder`` (None: no cache, every lookup misses)."""

    def __init__(self, folder: Optional[str], tensorflow_version: str):
        self.path = os.path.join(folder, CACHE_FILE) if folder else None
        self.tensorflow_version = tensorflow_version

    def key(self, cpu: str, work: str) -> str:
        """The entry key of ``work`` (what is timed) on ``cpu`` (model and ISA flags)."""
        return f"{cpu} | TensorFlow {self.tensorflow_version} | {work}"

    def _entries(self) -> dict:
        if not self.path:
            return {}
        try:
            with open(self.path) as f:
                body = json.load(f)
            if body.get("format") != _FORMAT or not isinstance(body.get("entries"), dict):
                raise ValueError("not a precision cache of this version")
            return body["entries"]
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError) as e:
            log.info("ignoring the precision cache %s (%s); it will be written anew",
                     self.path, e)
            return {}

    def get(self, key: str) -> Optional[Entry]:
        """The entry of ``key``, or None (missing, or not a valid entry)."""
        raw = self._entries().get(key)
        try:
            rates = {p: float(raw["images_per_sec"][p]) for p in ("fp32", "bf16")}
            if not all(r > 0 for r in rates.values()):
                return None
            return Entry(rates, str(raw["measured"]))
        except (TypeError, KeyError, ValueError):
            return None

    def put(self, key: str, images_per_sec: dict) -> Optional[Entry]:
        """Records a probe's result; returns the entry, or None if the file cannot be written."""
        entry = Entry(dict(images_per_sec), time.strftime("%Y-%m-%d"))
        if not self.path:
            return entry
        suffix = f"| TensorFlow {self.tensorflow_version} |"
        entries = {k: v for k, v in self._entries().items() if suffix in k}
        entries[key] = dataclasses.asdict(entry)
        text = json.dumps({"format": _FORMAT, "entries": entries}, indent=1, sort_keys=True)
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            storage.write_bytes_atomic(self.path, text.encode() + b"\n")
        except OSError as e:
            log.info("cannot write the precision cache %s (%s); the next run measures again",
                     self.path, e.strerror or e)
        return entry


def cache_folder(environ: Mapping[str, str], home: str) -> str:
    """The package's folder in the user's cache: ``$XDG_CACHE_HOME/cifar10_estimator``, or
    ``HOME/.cache/cifar10_estimator`` (a relative XDG_CACHE_HOME is ignored, as the XDG Base
    Directory specification says)."""
    base = environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(home, ".cache")
    return os.path.join(base, PACKAGE_FOLDER)


def cached(cache: PrecisionCache, cpu: str, work: str) -> Optional[Measured]:
    """The cached measurement of ``work`` on ``cpu``, or None; never probes."""
    entry = cache.get(cache.key(cpu, work))
    if entry is None:
        return None
    return Measured(entry.images_per_sec, f"measured {entry.measured}, cached in {cache.path}")


def measured(cache: PrecisionCache, cpu: str, work: str,
             probe: Callable[[], Measured]) -> Measured:
    """The cached measurement of ``work`` on ``cpu``, else ``probe()``'s (then cached).

    Raises:
      ProbeFailed: the probe raised; its first line says why.
    """
    hit = cached(cache, cpu, work)
    if hit is not None:
        return hit
    try:
        result = probe()
    except Exception as e:  # any failure of an optional measurement: the caller falls back
        lines = str(e).strip().splitlines()
        raise ProbeFailed(f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__) from e
    cache.put(cache.key(cpu, work), result.images_per_sec)
    return result
