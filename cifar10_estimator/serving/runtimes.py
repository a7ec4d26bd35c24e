"""Running a converted model file on its own runtime: a ``.tflite`` file on LiteRT's interpreter
(``ai-edge-litert``), an ``.onnx`` file on ONNX Runtime's CPU provider.

``load`` reads the file once, checks it (``runtime_trust``) unless trusted, hands the checked
bytes to the runtime (so the runtime runs what was checked, not what the path holds a moment
later), and checks that it is a classifier of 32x32 RGB pictures: one float32 input
[N, 32, 32, 3] and one float32 output [N, C]. ``RuntimeModel.probabilities`` then runs a batch of
any size. ``predict`` and ``evaluate`` use it as they use a SavedModel.
"""

import contextlib
import io
import os
from typing import Optional

import numpy as np

from cifar10_estimator.data import schema
from cifar10_estimator.errors import UserError
from cifar10_estimator.logs import native_stderr_silenced
from cifar10_estimator.serving import formats
from cifar10_estimator.serving.formats import LITERT, ONNX
from cifar10_estimator.serving.runtime_trust import (check_model_file, has_external_data,
                                                      read_model_file)

_IMAGE_SHAPE = (schema.HEIGHT, schema.WIDTH, schema.CHANNELS)


def _unusable(path: str, runtime: str, error: BaseException) -> UserError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return UserError(f"{path} is not a usable {runtime} model of this package: {first}")


class RuntimeModel:
    """A model file loaded on its runtime: ``probabilities(images)`` for float32
    [N, 32, 32, 3] pictures in 0..255 gives float32 [N, C]."""

    def __init__(self, path: str, runtime: str, num_classes: int, run):
        self.path = path
        self.runtime = runtime
        self.num_classes = num_classes
        self._run = run

    def probabilities(self, images) -> np.ndarray:
        images = np.ascontiguousarray(np.asarray(images, dtype=np.float32))
        if images.ndim != 4 or images.shape[1:] != _IMAGE_SHAPE:
            raise UserError(f"{self.path} takes pictures of shape [N, 32, 32, 3], got "
                            f"{list(images.shape)}")
        if not len(images):
            return np.zeros([0, self.num_classes], np.float32)
        probabilities = self._run(images)
        # A file's declared output shape need not be what its ops compute (a damaged shape
        # gave 64 rows for 2 pictures, or 2 classes of 10: the fuzzing campaign, litert-file).
        if probabilities.dtype != np.float32 or probabilities.shape != (len(images),
                                                                       self.num_classes):
            raise UserError(f"{self.path} gave {probabilities.dtype.name} "
                            f"{list(probabilities.shape)} for {len(images)} pictures of its "
                            f"{self.num_classes} classes; it is not a usable {self.runtime} "
                            f"model of this package")
        return probabilities


def _classes_of(path: str, runtime: str, inputs: list, outputs: list) -> int:
    """The class count of a model whose input and output specs are (shape, dtype) pairs;
    UserError unless it is one float32 input [N, 32, 32, 3] and one float32 output [N, C]."""
    fits = (len(inputs) == 1 and len(outputs) == 1
            and inputs[0][1] == "float32" and outputs[0][1] == "float32"
            and len(inputs[0][0]) == 4 and tuple(inputs[0][0][1:]) == _IMAGE_SHAPE
            and len(outputs[0][0]) == 2 and isinstance(outputs[0][0][1], int)
            and outputs[0][0][1] >= 1)
    if not fits:
        raise UserError(f"{path} is not a classifier of 32x32 RGB pictures (its {runtime} "
                        f"inputs {inputs} and outputs {outputs}); convert an export with "
                        f"cifar10-convert")
    return outputs[0][0][1]


def _load_litert(path: str, data: bytes, threads: Optional[int]) -> RuntimeModel:
    interpreter_module = formats.require(LITERT)
    try:
        # LiteRT's own kernels prepare every node first, without delegates: the XNNPACK
        # delegate takes the nodes it runs before they are prepared and trusts what the
        # kernels' checks would refuse (an optional input where an op needs one crashed the
        # process: the fuzzing campaign, litert-file). Preparing takes milliseconds.
        interpreter_module.Interpreter(
            model_content=data, num_threads=1,
            experimental_op_resolver_type=(
                interpreter_module.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        ).allocate_tensors()
        # LiteRT announces its XNNPACK delegate on stderr as it loads a model.
        with native_stderr_silenced():
            interpreter = interpreter_module.Interpreter(model_content=data, num_threads=threads)
        inputs, outputs = interpreter.get_input_details(), interpreter.get_output_details()
    except (ValueError, RuntimeError) as e:
        raise _unusable(path, LITERT, e) from None
    num_classes = _classes_of(
        path, LITERT,
        [([int(n) for n in d["shape_signature"]], np.dtype(d["dtype"]).name) for d in inputs],
        [([int(n) for n in d["shape_signature"]], np.dtype(d["dtype"]).name) for d in outputs])
    state = {"batch": None}
    source, target = inputs[0]["index"], outputs[0]["index"]

    def run(images: np.ndarray) -> np.ndarray:
        try:
            if state["batch"] != len(images):
                interpreter.resize_tensor_input(source, list(images.shape), strict=True)
                with native_stderr_silenced():  # where LiteRT may announce its delegate
                    interpreter.allocate_tensors()
                state["batch"] = len(images)
            interpreter.set_tensor(source, images)
            interpreter.invoke()
            return np.array(interpreter.get_tensor(target))
        except (ValueError, RuntimeError) as e:
            state["batch"] = None
            raise _unusable(path, LITERT, e) from None

    return RuntimeModel(path, LITERT, num_classes, run)


def _onnx_spec(value) -> tuple[list, str]:
    # ONNX Runtime names element types "tensor(float)"; a dimension is an int, or a name or
    # None where it is free.
    dtype = {"tensor(float)": "float32"}.get(value.type, value.type)
    return [d if isinstance(d, int) else None for d in value.shape or []], dtype


def _load_onnx(path: str, data: bytes, threads: Optional[int]) -> RuntimeModel:
    ort = formats.require(ONNX)
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        # From the checked bytes; external data, which the check allowed only inside the
        # model's folder, needs the folder to resolve its relative names.
        # A session that fails to build is built again by ONNX Runtime's Python wrapper, which
        # first prints why on stdout ("EP Error ... Falling back"), where predict --json
        # writes its answers: the refusal below says why instead.
        with contextlib.redirect_stdout(io.StringIO()):
            session = ort.InferenceSession(path if has_external_data(data) else data, options,
                                           providers=["CPUExecutionProvider"])
        inputs, outputs = session.get_inputs(), session.get_outputs()
    except Exception as e:  # ONNX Runtime's own error classes: Fail, InvalidGraph, ...
        raise _unusable(path, ONNX, e) from None
    num_classes = _classes_of(path, ONNX, [_onnx_spec(v) for v in inputs],
                              [_onnx_spec(v) for v in outputs])
    name = inputs[0].name

    def run(images: np.ndarray) -> np.ndarray:
        try:
            return np.asarray(session.run(None, {name: images})[0])
        except Exception as e:
            raise _unusable(path, ONNX, e) from None

    return RuntimeModel(path, ONNX, num_classes, run)


def load(path: str, threads: Optional[int] = None, trusted: bool = False) -> RuntimeModel:
    """The model file at ``path`` on its runtime, with ``threads`` threads (default: the
    runtime's own choice). Unless ``trusted``, the file is checked first
    (``runtime_trust.check_model_file``).

    Raises:
      UserError: the file cannot be read, is refused by the check, its runtime is not
        installed, the runtime cannot load it, or it is no classifier of 32x32 pictures.
    """
    runtime = formats.runtime_of(path)
    if runtime is None:
        raise UserError(f"{path} is neither a .tflite nor an .onnx file")
    formats.require(runtime)  # before reading: a missing runtime is the first thing to fix
    data = read_model_file(path)
    if not trusted:
        check_model_file(path, data)
    if runtime == LITERT:
        return _load_litert(path, data, threads)
    return _load_onnx(path, data, threads)


def default_threads() -> int:
    """The threads a runtime is given by the commands: every core this process may use."""
    return len(os.sched_getaffinity(0))
