"""The files an export converts to for runtimes other than TensorFlow: their formats, names and
manifest (no TensorFlow here: the commands read it before TensorFlow loads).

An export's numbered folder gains ``converted/`` (``CONVERTED_DIR``), written whole by the
convert command: a file per format that passed the accuracy gate, and ``manifest.json``, one
entry per file with its format, runtime, precision, sha256, size, input, class names and the
accuracy measured beside the SavedModel's. TensorFlow Serving reads only the SavedModel's own
files and ignores the folder.

| format | file | runtime | what it holds |
|---|---|---|---|
| ``litert-float32`` | ``model-float32.tflite`` | LiteRT | float32 weights and arithmetic |
| ``litert-dynamic-int8`` | ``model-dynamic-int8.tflite`` | LiteRT | int8 weights, float32 activations (dynamic-range quantization) |
| ``litert-int8`` | ``model-int8.tflite`` | LiteRT | int8 weights and activations (full-integer), float32 input and output |
| ``onnx-float32`` | ``model-float32.onnx`` | ONNX Runtime | float32 weights and arithmetic |
| ``onnx-int8`` | ``model-int8.onnx`` | ONNX Runtime | int8 weights, uint8 activations, as QuantizeLinear/DequantizeLinear pairs (QDQ) |

Every file takes ``images``, float32 [N, 32, 32, 3] RGB in 0..255 (the SavedModel's
``serving_default`` input), and gives the class probabilities, float32 [N, C].
"""

import dataclasses
import os
from typing import Optional

from cifar10_estimator import storage
from cifar10_estimator.data import schema
from cifar10_estimator.errors import UserError

CONVERTED_DIR = "converted"
MANIFEST_FILE = "manifest.json"
LITERT, ONNX = "LiteRT", "ONNX Runtime"
# What each runtime's files end in, the module that runs them, and the extra that installs it.
SUFFIXES = {LITERT: ".tflite", ONNX: ".onnx"}
MODULES = {LITERT: "ai_edge_litert.interpreter", ONNX: "onnxruntime"}
EXTRAS = {LITERT: "litert", ONNX: "onnx"}
# The input every file takes (the SavedModel's serving_default input), as the manifest says it.
INPUT_SPEC = {"name": "images", "dtype": "float32",
              "shape": [None, schema.HEIGHT, schema.WIDTH, schema.CHANNELS],
              "range": [0, 255], "channels": "RGB"}


@dataclasses.dataclass(frozen=True)
class Format:
    key: str  # the --formats name
    runtime: str  # LITERT or ONNX
    precision: str  # "float32", "dynamic-int8" or "int8"
    calibrated: bool  # whether conversion needs calibration pictures

    @property
    def file_name(self) -> str:
        return f"model-{self.precision}{SUFFIXES[self.runtime]}"


FORMATS = {f.key: f for f in (
    Format("litert-float32", LITERT, "float32", False),
    Format("litert-dynamic-int8", LITERT, "dynamic-int8", False),
    Format("litert-int8", LITERT, "int8", True),
    Format("onnx-float32", ONNX, "float32", False),
    Format("onnx-int8", ONNX, "int8", True),
)}


def require(runtime: str, module: str = ""):
    """Imports ``module`` (default: the runtime's own) of a runtime's packages; UserError naming
    the extra that installs them if they are missing."""
    import importlib

    name = module or MODULES[runtime]
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise UserError(f"{runtime} is not installed here ({e.name or name} is missing): "
                        f"pip install 'cifar10_estimator[{EXTRAS[runtime]}]' "
                        f"(docs/versions.md says which Python and TensorFlow have it)") from None


def runtime_of(path: str) -> Optional[str]:
    """The runtime a model file is for, by its name (LITERT or ONNX), or None for anything
    else (a SavedModel folder)."""
    for runtime, suffix in SUFFIXES.items():
        if path.lower().endswith(suffix):
            return runtime
    return None


def manifest_path(path: str) -> str:
    """The manifest beside a model file."""
    return storage.join(storage.parent(path), MANIFEST_FILE)


def manifest_entry(path: str) -> dict:
    """The manifest's entry for the model file at ``path`` ({} if there is no manifest beside
    it, or it has no entry for the file, or it cannot be read: the file is still usable)."""
    try:
        manifest = storage.read_json(manifest_path(path))
    except (OSError, ValueError, UserError):
        return {}
    files = manifest.get("files") if isinstance(manifest, dict) else None
    for entry in files if isinstance(files, list) else ():
        if isinstance(entry, dict) and entry.get("file") == storage.basename(path):
            return entry
    return {}


def class_names(path: str, num_classes: int) -> tuple[str, ...]:
    """A model file's class names, from its manifest entry; CIFAR-10's for a 10-class file
    without them, ``class 0``, ``class 1``, ... for any other (as an export's)."""
    names = manifest_entry(path).get("class_names")
    if (isinstance(names, list) and len(names) == num_classes
            and all(isinstance(n, str) for n in names)):
        return tuple(names)
    if num_classes == schema.NUM_CLASSES:
        return schema.CLASS_NAMES
    return schema.placeholder_class_names(num_classes)


def converted_dir(export_version: str) -> str:
    return storage.join(export_version, CONVERTED_DIR)


def parse_formats(text: str) -> list[Format]:
    """``--formats``: comma-separated keys of ``FORMATS`` (or ``all``), in FORMATS' order."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if keys == ["all"]:
        return list(FORMATS.values())
    unknown = [k for k in keys if k not in FORMATS]
    if unknown or not keys:
        what = "unknown " + ", ".join(unknown) if unknown else "empty"
        raise UserError(f"--formats {text!r}: {what}; choose from all, {', '.join(FORMATS)}")
    return [f for f in FORMATS.values() if f.key in keys]


def local_path(path: str) -> str:
    """``path`` made absolute when it is local (URLs are kept)."""
    return path if storage.is_url(path) else os.path.abspath(path)
