"""Hostile and damaged input for every kind of file and request the package reads: each module
names its kinds (``KINDS``), and ``harness`` holds the property they all must keep."""

import importlib

# The modules of kinds, in the order data flows: the downloaded data, users' pictures, the
# records and settings the trainer reads, the export and the requests it serves, and the
# LiteRT and ONNX files converted from it.
MODULES = ("data_files", "pictures", "config_files", "serving", "model_files")


def all_kinds() -> list:
    """Every kind of every module (``harness.Kind``), in ``MODULES`` order."""
    return [kind for module in MODULES
            for kind in importlib.import_module(f"fuzz.{module}").KINDS]
