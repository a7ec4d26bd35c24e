"""What a LiteRT or ONNX model file may hold: the check before ``predict`` or ``evaluate`` hands
one to its runtime.

A model file is a program of the runtime's ops, as a SavedModel is one of TensorFlow's, and each
format has ways out of its runtime's own ops:

- LiteRT: a custom op (``BuiltinOperator.CUSTOM`` with a ``custom_code``) runs whatever kernel the
  loading process registered under that name, and TF Select's Flex ops (custom ops named
  ``Flex<TensorFlow op>``) run TensorFlow kernels, ``WriteFile`` and ``ReadFile`` included, where
  the Flex delegate is linked in.
- ONNX: an op of a domain other than ONNX's own (``com.microsoft`` contrib ops, or a custom-op
  library's domain), a model-local function, or an initializer whose data lies in an external
  file, which the runtime opens wherever ``location`` points.

``check_model_file`` reads the file's bytes (LiteRT's flatbuffer through the schema module that
``ai-edge-litert`` ships, ONNX's protobuf through ``onnx``; parsing runs nothing) and refuses,
in one line naming the file and what it found: a file over ``MAX_MODEL_FILE_BYTES``; an op
outside the allow-list of its format (``LITERT_OPS``, ``ONNX_OPS``: the builtin ops the
converters make of this package's exports); a LiteRT file with a custom or Flex op, more
operator codes, subgraphs, tensors or operators than a
classifier has, tensors whose declared shapes take more memory than ``MAX_TENSOR_BYTES`` each or
``MAX_DECLARED_BYTES`` in all, an operator output that is no tensor, or a quantization scale
that is not a positive normal number or zero point outside its type, or an elementwise,
activation, pooling or shape operator whose inputs and output differ in type (each of which
made LiteRT take 16 GB or crash the process); an ONNX file with a node outside the ONNX
domain (in the graph or any subgraph of If, Loop or Scan), a model-local function, or external
data anywhere but a regular file inside the model's folder.
Both runtimes verify the rest of the structure themselves as they load (LiteRT's flatbuffer
verifier, ONNX Runtime's graph resolution and type inference); ``benchmarks/fuzz_campaign.py``
feeds both damaged files and looks for a native crash.
"""

import os
from typing import Iterator

from cifar10_estimator import storage
from cifar10_estimator.errors import UserError
from cifar10_estimator.serving.formats import LITERT, ONNX, require, runtime_of
from cifar10_estimator.serving.trust import TRUST_FLAG

# The largest model file read: the SavedModel's bound (trust.MAX_SAVED_MODEL_BYTES), since a
# converted file holds the same weights (float32: about 4 bytes a weight; ResNet-1202 ~78 MB).
MAX_MODEL_FILE_BYTES = 256 << 20
# LiteRT's builtin operators number about 210 (schema.fbs, BuiltinOperator); a file naming more
# operator codes than this, or more subgraphs than a classifier with control flow needs, is not
# one of ours, and the bounds keep the walk below short on a hostile file.
MAX_OPERATOR_CODES = 1024
MAX_SUBGRAPHS = 64
# The tensors a LiteRT file declares, and the memory their declared shapes take: LiteRT's
# XNNPACK delegate plans memory for the shapes the file declares before it resizes them, so a
# 4 KB file declaring a [1, 33554464, 32, 16] activation made the process take 16 GB (in 30 s)
# as it allocated (the fuzzing campaign, litert-file). Our ResNet-20 file declares 86 tensors
# and 2.3 MiB at batch 1 (ResNet-1202: about 5,000 and 140 MiB).
MAX_TENSORS = 1 << 18
MAX_OPERATORS = 1 << 18  # ResNet-20's file has 34 operators (ResNet-1202: about 2,500)
MAX_TENSOR_BYTES = 1 << 28  # one tensor: 256 MiB ([1, 32, 32, 64] float32 is 256 KiB)
MAX_DECLARED_BYTES = 1 << 31  # all tensors of all subgraphs: 2 GiB
# The values LiteRT's quantized integer types hold (TensorType: INT8, UINT8, INT16, UINT16,
# INT4), which their zero points must be among.
_LITERT_RANGES = {9: (-128, 127), 3: (0, 255), 7: (-32768, 32767), 16: (0, 65535), 17: (-8, 7)}
# Bytes per element of LiteRT's TensorType values (schema.fbs); others count 1 (int4, string).
_LITERT_ITEMSIZE = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 6: 1, 7: 2, 8: 8, 9: 1, 10: 8, 11: 16, 12: 8,
                    15: 4, 16: 2, 18: 2}
# The builtin ops the converters make of this package's exports, the only ones a file may
# use (as trust.SERVING_OPS for a SavedModel): derived from conversions of every export
# variant tests/test_export_trust.py builds (both networks, fp32 and bf16, test-time views,
# the whitening layer) in every format, the same on TensorFlow 2.15 and 2.21, and pinned by
# tests/test_runtimes.py, which fails on an op a conversion uses that a list lacks. Fuzzing
# found LiteRT kernels that trust what their inputs declare (a SOFTMAX writing float32 into an
# int8 output); the fewer kernels a file can reach, the fewer such bugs it can.
LITERT_OPS = (
    "ADD", "AVERAGE_POOL_2D", "CONCATENATION", "CONV_2D", "DEQUANTIZE", "DIV",
    "FULLY_CONNECTED", "LOCAL_RESPONSE_NORMALIZATION", "MAXIMUM", "MAX_POOL_2D", "MEAN",
    "MIRROR_PAD", "MUL", "PACK", "PAD", "QUANTIZE", "RESHAPE", "REVERSE_V2", "SHAPE", "SLICE",
    "SOFTMAX", "SQRT", "SQUARED_DIFFERENCE", "STRIDED_SLICE", "SUB",
)
ONNX_OPS = (
    "Add", "AveragePool", "BatchNormalization", "Cast", "Concat", "Conv", "DequantizeLinear",
    "Div", "Equal", "Expand", "Gather", "GlobalAveragePool", "LRN", "MatMul", "Max", "MaxPool",
    "Mul", "Pad", "QuantizeLinear", "Reciprocal", "ReduceMean", "ReduceProd", "Relu", "Reshape",
    "ReverseSequence", "Shape", "Slice", "Softmax", "Sqrt", "Squeeze", "Sub", "Transpose",
    "Unsqueeze",
)
# ONNX Runtime's own ops are the ONNX domain's, named "" or "ai.onnx" (onnx/defs/schema.h).
ONNX_DOMAINS = ("", "ai.onnx")
# How deep an ONNX graph may nest subgraphs (If, Loop, Scan bodies), and how many nodes in all
# the walk visits: ResNet-110's graph has about 600 nodes.
MAX_ONNX_DEPTH = 16
MAX_ONNX_NODES = 200_000
# TensorProto.DataLocation.EXTERNAL (onnx.proto3).
_EXTERNAL = 1


def _refuse(path: str, what: str) -> UserError:
    return UserError(f"{path} {what}, which this package's converted files never hold: a model "
                     f"file is a program; add {TRUST_FLAG} to load it anyway if you trust its "
                     f"source")


def read_model_file(path: str) -> bytes:
    """The bytes of a model file, refused in one line if it cannot be read or is too large."""
    try:
        size = storage.size(path)
        if size > MAX_MODEL_FILE_BYTES:
            raise UserError(f"{path} has {size:,} bytes, more than the {MAX_MODEL_FILE_BYTES:,} "
                            f"a model file of this package may have")
        return storage.read_bytes(path)
    except OSError as e:
        raise UserError(f"cannot read model file {path}: {e.strerror or e}") from None


def check_model_file(path: str, data: bytes) -> None:
    """Raises UserError unless ``data``, the bytes of the model file ``path``, holds only its
    runtime's builtin ops and no data outside its folder (see the module)."""
    runtime = runtime_of(path)
    if runtime == LITERT:
        _check_litert(path, data)
    elif runtime == ONNX:
        _check_onnx(path, data)
    else:
        raise UserError(f"{path} is neither a .tflite nor an .onnx file")


def _BUILTIN_NAMES(schema) -> dict:
    """LiteRT's builtin operator codes -> names (``BuiltinOperator`` of the schema)."""
    return {code: name for name, code in vars(schema.BuiltinOperator).items()
            if not name.startswith("_")}


def _check_litert(path: str, data: bytes) -> None:
    schema = require(LITERT, "ai_edge_litert.schema_py_generated")

    # A LiteRT flatbuffer names its schema at bytes 4-8 ("TFL3"); without it the runtime's own
    # verifier would refuse the file, and nothing below may be read.
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise UserError(f"{path} is not a LiteRT model (no TFL3 identifier)")
    custom = schema.BuiltinOperator.CUSTOM
    try:
        model = schema.Model.GetRootAs(data, 0)
        codes, subgraphs = model.OperatorCodesLength(), model.SubgraphsLength()
        if codes > MAX_OPERATOR_CODES or subgraphs > MAX_SUBGRAPHS:
            raise UserError(f"{path} names {codes:,} operator codes in {subgraphs:,} subgraphs, "
                            f"more than a LiteRT classifier has")
        builtins = []
        for i in range(codes):
            code = model.OperatorCodes(i)
            # builtin_code replaced deprecated_builtin_code (int8) at 127 operators; a file
            # carries the larger of the two (schema.fbs, "OperatorCode").
            builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            builtins.append(builtin)
            name = (code.CustomCode() or b"").decode("utf-8", "replace")
            if name.startswith("Flex"):
                raise _refuse(path, f"runs the TF Select (Flex) op {name[4:]!r}")
            if builtin == custom or name:
                raise _refuse(path, f"runs the custom op {name!r}")
            op = _BUILTIN_NAMES(schema).get(builtin, str(builtin))
            if op not in LITERT_OPS:
                raise _refuse(path, f"runs the LiteRT op {op}")
        _check_litert_tensors(path, model, subgraphs, builtins, schema)
    except UserError:
        raise
    except Exception:  # an offset past the end: what the runtime's verifier would refuse
        raise UserError(f"{path} is not a valid LiteRT model (its flatbuffer is damaged)") from None


# LiteRT's kernels of these ops compute in their first input's type and write their output
# in it without checking that it is the output's type (SOFTMAX's float32 kernel wrote an int8
# output 4 bytes an element: a heap overflow, "free(): invalid pointer"): their inputs (all of
# them for the ops of several data inputs, the first for the others) and output share a type,
# but for int8 SOFTMAX to int16, which LiteRT runs.
_SAME_TYPE_ALL = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE",
                  "CONCATENATION")
_SAME_TYPE_FIRST = ("SOFTMAX", "LOG_SOFTMAX", "LOGISTIC", "TANH", "RELU", "RELU6",
                    "RELU_N1_TO_1", "RELU_0_TO_1", "LEAKY_RELU", "HARD_SWISH", "PRELU", "ELU",
                    "ABS", "NEG", "SQUARE", "SQRT", "RSQRT", "EXP", "LOG", "MEAN", "SUM",
                    "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "AVERAGE_POOL_2D",
                    "MAX_POOL_2D", "L2_POOL_2D", "PAD", "PADV2", "MIRROR_PAD", "RESHAPE",
                    "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "SLICE", "STRIDED_SLICE", "TILE",
                    "BROADCAST_TO", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "L2_NORMALIZATION")


def _check_operator_types(path: str, graph, builtins: list, types: list, schema) -> None:
    """Refuses an operator of ``_SAME_TYPE_ALL`` or ``_SAME_TYPE_FIRST`` whose inputs and
    output differ in type (see there)."""
    import numpy as np

    ops = schema.BuiltinOperator
    every = {getattr(ops, n) for n in _SAME_TYPE_ALL if hasattr(ops, n)}
    first = {getattr(ops, n) for n in _SAME_TYPE_FIRST if hasattr(ops, n)}
    names = {getattr(ops, n): n for n in _SAME_TYPE_ALL + _SAME_TYPE_FIRST if hasattr(ops, n)}
    for i in range(graph.OperatorsLength()):
        operator = graph.Operators(i)
        index = operator.OpcodeIndex()
        builtin = builtins[index] if index < len(builtins) else None
        if builtin not in every and builtin not in first:
            continue
        inputs, outputs = operator.InputsAsNumpy(), operator.OutputsAsNumpy()
        if (not isinstance(inputs, np.ndarray) or not isinstance(outputs, np.ndarray)
                or not len(outputs)):
            continue
        inputs = [int(t) for t in (inputs if builtin in every else inputs[:1])
                  if 0 <= t < len(types)]
        found = {types[t] for t in inputs} | {types[int(outputs[0])]}
        if len(found) > 1 and not (builtin == ops.SOFTMAX and found == {9, 7}):  # int8, int16
            raise UserError(f"{path} has a {names[builtin]} operator whose inputs and output "
                            f"differ in type ({sorted(found)}; its flatbuffer is damaged)")


def _check_litert_tensors(path: str, model, subgraphs: int, builtins: list, schema) -> None:
    """Refuses a LiteRT model whose tensors, as declared (shape and shape signature, a free
    dimension counted 1), take more than MAX_TENSOR_BYTES each or MAX_DECLARED_BYTES in all,
    that declares more than MAX_TENSORS tensors or MAX_OPERATORS operators, whose operator
    writes an output that is no tensor (-1, LiteRT's "optional", crashed the process in the
    DEQUANTIZE kernel as it prepared), or that quantizes a tensor with a scale that is not a
    positive normal float32 (0, negative, subnormal, NaN or infinite) or a zero point its type
    cannot hold (int8: -128..127): the XNNPACK delegate crashed the process on either, for a
    QUANTIZE output, as it allocated. The converter's scales are positive and normal and its
    zero points in range, as LiteRT's quantization spec asks. Then each operator's types
    (``_check_operator_types``)."""
    import numpy as np

    tensors, operators, declared = 0, 0, 0.0
    for g in range(subgraphs):
        graph = model.Subgraphs(g)
        count = graph.TensorsLength()
        tensors += count
        operators += graph.OperatorsLength()
        if tensors > MAX_TENSORS or operators > MAX_OPERATORS:
            raise UserError(f"{path} declares {tensors:,} tensors and {operators:,} operators, "
                            f"more than the {MAX_TENSORS:,} and {MAX_OPERATORS:,} a LiteRT "
                            f"classifier has")
        for i in range(graph.OperatorsLength()):
            outputs = graph.Operators(i).OutputsAsNumpy()
            if isinstance(outputs, np.ndarray) and len(outputs) and (
                    outputs.min() < 0 or outputs.max() >= count):
                raise UserError(f"{path} has an operator whose outputs {outputs.tolist()[:8]} "
                                f"are not all tensors of its {count:,} (its flatbuffer is "
                                f"damaged)")
        types = []
        for i in range(count):
            tensor = graph.Tensors(i)
            types.append(tensor.Type())
            largest = 0.0
            for shape in (tensor.ShapeAsNumpy(), tensor.ShapeSignatureAsNumpy()):
                if isinstance(shape, np.ndarray):  # 0 where the file has none
                    largest = max(largest, float(np.prod(np.maximum(shape, 1),
                                                         dtype=np.float64)))
            size = largest * _LITERT_ITEMSIZE.get(tensor.Type(), 1)
            declared += size
            if size > MAX_TENSOR_BYTES or declared > MAX_DECLARED_BYTES:
                raise UserError(f"{path} declares tensors of {declared:,.0f} bytes "
                                f"({_tensor_name(tensor)}: {size:,.0f}), more than the "
                                f"{MAX_TENSOR_BYTES:,} a tensor and {MAX_DECLARED_BYTES:,} all "
                                f"tensors of a LiteRT classifier take")
            quantization = tensor.Quantization()
            scales = quantization.ScaleAsNumpy() if quantization is not None else 0
            if isinstance(scales, np.ndarray) and not np.all(
                    np.isfinite(scales) & (scales >= np.finfo(np.float32).tiny)):
                bad = next(float(s) for s in scales
                           if not (np.isfinite(s) and s >= np.finfo(np.float32).tiny))
                raise UserError(f"{path} quantizes the tensor {_tensor_name(tensor)} with the "
                                f"scale {bad!r}, not a positive normal number (its flatbuffer "
                                f"is damaged)")
            zero_points = quantization.ZeroPointAsNumpy() if quantization is not None else 0
            low, high = _LITERT_RANGES.get(tensor.Type(), (-2 ** 63, 2 ** 63 - 1))
            if isinstance(zero_points, np.ndarray) and len(zero_points) and (
                    zero_points.min() < low or zero_points.max() > high):
                bad = next(int(z) for z in zero_points if not low <= z <= high)
                raise UserError(f"{path} quantizes the tensor {_tensor_name(tensor)} with the "
                                f"zero point {bad}, outside its type's {low}..{high} (its "
                                f"flatbuffer is damaged)")
        _check_operator_types(path, graph, builtins, types, schema)


def _tensor_name(tensor) -> str:
    return repr((tensor.Name() or b"").decode("utf-8", "replace")[:100])


def _onnx_nodes(graph, depth: int = 0) -> Iterator:
    """Every node of ``graph`` and of the subgraphs its nodes' attributes hold."""
    if depth > MAX_ONNX_DEPTH:
        raise ValueError("nesting")
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                yield from _onnx_nodes(sub, depth + 1)


def _onnx_tensors(graph, depth: int = 0) -> Iterator:
    """Every tensor of ``graph`` and its subgraphs that may hold data: initializers, sparse
    initializers' values and indices, and the tensors of node attributes."""
    if depth > MAX_ONNX_DEPTH:
        raise ValueError("nesting")
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sparse in (*([attribute.sparse_tensor] if attribute.HasField("sparse_tensor")
                              else []), *attribute.sparse_tensors):
                yield sparse.values
                yield sparse.indices
            for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                yield from _onnx_tensors(sub, depth + 1)


def _check_external(path: str, tensor) -> None:
    """An external tensor's file must be a regular file inside the model's folder, named by a
    relative path that stays there, links resolved."""
    entries = {entry.key: entry.value for entry in tensor.external_data}
    location = entries.get("location", "")
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    target = os.path.realpath(os.path.join(folder, location))
    inside = (location and not os.path.isabs(location) and not storage.is_url(location)
              and os.path.commonpath([folder, target]) == folder and target != folder)
    if not inside:
        raise _refuse(path, f"reads the tensor {tensor.name!r} from {location!r}, outside its "
                            f"folder")
    if storage.is_url(path) or not os.path.isfile(target):
        raise UserError(f"{path} reads the tensor {tensor.name!r} from {location!r}, which is "
                        f"not a file beside it")


def _check_onnx(path: str, data: bytes) -> None:
    onnx = require(ONNX, "onnx")
    from google.protobuf.message import DecodeError

    try:
        model = onnx.ModelProto.FromString(data)
    except (DecodeError, RuntimeWarning, ValueError):
        raise UserError(f"{path} is not an ONNX model (its protobuf does not parse)") from None
    if not model.HasField("graph"):
        raise UserError(f"{path} is not an ONNX model (it has no graph)")
    if len(model.functions):
        raise _refuse(path, f"defines the function {model.functions[0].name!r}")
    try:
        for count, node in enumerate(_onnx_nodes(model.graph)):
            if count > MAX_ONNX_NODES:
                raise UserError(f"{path} has more than {MAX_ONNX_NODES:,} nodes, more than a "
                                f"classifier of this package has")
            if node.domain not in ONNX_DOMAINS:
                raise _refuse(path, f"runs the op {node.op_type!r} of the domain "
                                    f"{node.domain!r}, not ONNX's own")
        for tensor in _onnx_tensors(model.graph):
            if tensor.data_location == _EXTERNAL or len(tensor.external_data):
                _check_external(path, tensor)
        # The ONNX ops last: a file is refused for the way out it takes (a foreign op in an
        # If's branch, a Constant's external data) before the op that holds it.
        for node in _onnx_nodes(model.graph):
            if node.op_type not in ONNX_OPS:
                raise _refuse(path, f"runs the ONNX op {node.op_type!r}")
    except ValueError:
        raise UserError(f"{path} nests subgraphs more than {MAX_ONNX_DEPTH} deep, more than a "
                        f"classifier of this package does") from None


def has_external_data(data: bytes) -> bool:
    """Whether the ONNX model ``data`` keeps a tensor in an external file (which its runtime
    resolves against the model's folder, so it must load from the path)."""
    onnx = require(ONNX, "onnx")
    try:
        model = onnx.ModelProto.FromString(data)
        return any(t.data_location == _EXTERNAL or len(t.external_data)
                   for t in _onnx_tensors(model.graph))
    except Exception:  # not parsed: the runtime says why as it loads the bytes
        return False
