"""Fuzzing the model files ``predict`` and ``evaluate`` run on LiteRT and ONNX Runtime: two kinds.

``litert-file`` and ``onnx-file``: a ``.tflite`` or ``.onnx`` file as ``serving.runtimes.load``
reads it (``serving.runtime_trust.check_model_file`` first, then the runtime, from the checked
bytes), and ``RuntimeModel.probabilities`` runs it on two pictures. Each case must be accepted
(float32 probabilities of shape [2, C]) or refused in one line naming the file; a native crash
(which ends the campaign's child for the kind) or hang of either runtime is a failure.

The seeds are real converted files (``serving.conversion``: the float32, dynamic-int8 and int8
LiteRT files; the float32 and int8 QDQ ONNX files) of a tiny network made in-process at
``start`` (a 5x5 convolution, ReLU, a mean, a dense layer and a softmax over [N, 32, 32, 3];
a few seconds), so no export or earlier run is needed. The cases:

- the seeds' bytes damaged (``harness.mutated``);
- a number, string or bytes field anywhere in the seed's structure set to a hostile value (0,
  -1, 2^31-1, -2^63, NaN, inf, "", another tensor's name, data cut short or emptied), or a
  repeated element deleted or duplicated: LiteRT's flatbuffer through the schema's object API
  and rebuilt (so it passes the flatbuffer verifier and reaches the interpreter's own checks),
  ONNX's protobuf;
- targeted edits: an initializer's dims, type or data no longer matching one another, a Conv's
  strides, pads, dilations, kernel_shape or group out of bounds, a graph output or input
  renamed to nothing or to another name, a node's input or output renamed, an op replaced by
  another ONNX op, opset and IR versions out of range, QDQ scales of 0, NaN or inf; a LiteRT
  tensor's shape, type, buffer or quantization, an operator's tensors or opcode, a Conv2D's
  options, the subgraph's inputs and outputs;
- hostile files, each refused by the check, in a line naming what it found: a LiteRT file
  with a TF Select (Flex) ``WriteFile`` (whose canary must not appear) or a custom op, an
  operator code made custom or given a custom name; an ONNX node of another domain (in the
  graph or in an If's branch), a model-local function, external data at ``../outside.bin``,
  at a path out of the case's folder, at an absolute path, through a symlink out of the
  folder; the files outside the model's folder are watched (inotify) and must not be opened;
- external data inside the model's folder (allowed: loaded from the path), with offsets and
  lengths out of range, a folder, a pipe or nothing in its place;
- a pipe, socket, /dev/zero or /dev/null in the model file's place.

Without ``ai-edge-litert`` (the LiteRT kind) or ``onnxruntime``, ``onnx`` and ``tf2onnx`` (the
ONNX kind), the kind is left out of ``KINDS``.
"""

import ctypes
import ctypes.util
import dataclasses
import functools
import importlib.util
import math
import os
import struct

import numpy as np
from hypothesis import strategies as st

from fuzz import harness
from fuzz.data_files import SPECIALS, special_file

BATCH = 2
_RNG = np.random.default_rng(0)
PICTURES = _RNG.uniform(0, 255, (BATCH, 32, 32, 3)).astype(np.float32)
CALIBRATION = _RNG.uniform(0, 255, (8, 32, 32, 3)).astype(np.float32)
NUM_CLASSES = 10
CANARIES = "canaries"


def _installed(*modules: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except (ImportError, ValueError):
        return False


HAS_LITERT = _installed("ai_edge_litert.interpreter", "flatbuffers", "tensorflow")
HAS_ONNX = _installed("onnxruntime", "onnx", "tf2onnx", "tensorflow")


# ---------------------------------------------------------------------------------------------
# The tiny network and its converted files.


def _network(images):
    """images [N, 32, 32, 3] in 0..255 -> probabilities [N, 10]: a 5x5 convolution of 16
    filters (1,200 weights: dynamic-range quantization skips smaller tensors), ReLU, a mean,
    a dense layer and a softmax, with weights drawn once."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    kernel = tf.constant(rng.normal(0, 0.1, (5, 5, 3, 16)).astype(np.float32))
    bias = tf.constant(rng.normal(0, 0.1, 16).astype(np.float32))
    dense = tf.constant(rng.normal(0, 0.5, (16, 10)).astype(np.float32))
    features = tf.nn.relu(tf.nn.conv2d(images / 255.0, kernel, 1, "SAME") + bias)
    return tf.nn.softmax(tf.matmul(tf.reduce_mean(features, [1, 2]), dense))


def _graph(body):
    """A ``conversion.Float32Graph`` of ``body`` (images -> probabilities), frozen."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2)

    from cifar10_estimator.serving import conversion

    function = tf.function(body, input_signature=[
        tf.TensorSpec([None, 32, 32, 3], tf.float32, name="images")], autograph=False)
    frozen = convert_variables_to_constants_v2(function.get_concrete_function())
    return conversion.Float32Graph(frozen.graph.as_graph_def(), frozen.inputs[0].name,
                                   frozen.outputs[0].name)


def _converted(runtime: str) -> dict[str, bytes]:
    """The seed files of ``runtime`` ("litert" or "onnx"), by precision."""
    from cifar10_estimator.serving import conversion
    from cifar10_estimator.serving.formats import FORMATS

    graph = _graph(_network)
    return {f.precision: conversion.convert(graph, f, CALIBRATION)
            for f in FORMATS.values() if f.key.startswith(runtime + "-")}


def _tflite(body, **flags) -> bytes:
    """``body`` converted by TensorFlow's converter with ``flags`` (``supported_ops`` or a
    converter attribute such as ``allow_custom_ops``)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_concrete_functions([_graph(body).function])
    for key, value in flags.items():
        if key == "supported_ops":
            converter.target_spec.supported_ops = value
        else:
            setattr(converter, key, value)
    return converter.convert()


def _hostile_litert(canary: str) -> dict[str, tuple[bytes, str]]:
    """LiteRT files the check must refuse, with what the refusal names: a TF Select (Flex)
    WriteFile that writes ``canary`` on every call, and a custom op (TensorFlow's AsString,
    which has no builtin)."""
    import tensorflow as tf

    def writes(images):
        with tf.control_dependencies([tf.raw_ops.WriteFile(filename=canary, contents="x")]):
            return tf.identity(_network(images))

    def as_string(images):
        codes = tf.strings.length(tf.strings.as_string(images[:, 0, 0, :1]))
        return _network(images) * tf.cast(codes, tf.float32)

    lite = tf.lite.OpsSet
    return {"flex": (_tflite(writes, supported_ops=[lite.TFLITE_BUILTINS, lite.SELECT_TF_OPS]),
                     "'WriteFile'"),
            "custom": (_tflite(as_string, allow_custom_ops=True), "'AsString'")}


# ---------------------------------------------------------------------------------------------
# A watch on files outside a case's folder: inotify's IN_OPEN and IN_ACCESS.


class _Watch:
    """Reports whether any of the watched paths were opened or read since the last ``opened``
    (Linux inotify through libc; stat and realpath do not count)."""

    IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000

    def __init__(self, paths: list[str]):
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self.libc.inotify_init1(self.IN_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.names = {}
        for path in paths:
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path),
                                             self.IN_OPEN | self.IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
            self.names[wd] = path

    def opened(self) -> list[str]:
        found = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return sorted(set(found))
            at = 0
            while at + 16 <= len(data):
                wd, _, _, length = struct.unpack_from("iIII", data, at)
                found.append(self.names.get(wd, "?"))
                at += 16 + length

    def close(self) -> None:
        os.close(self.fd)


# ---------------------------------------------------------------------------------------------
# The run's seeds.


@dataclasses.dataclass
class Seeds:
    """What ``start`` made for a kind: the converted files by precision, hostile files, the
    canaries' folder, the file outside every case's folder that external data may name, and a
    watch on it."""

    runtime: str
    files: dict
    hostile: dict
    canaries: str
    outside: str
    watch: _Watch


_SEEDS: dict[str, Seeds] = {}  # by runtime: the strategies draw from the run's seeds


def _start(runtime: str, folder: str) -> Seeds:
    from cifar10_estimator.serving import runtimes  # noqa: F401  (imports the runtime once)

    canaries = os.path.join(folder, CANARIES)
    os.makedirs(canaries, exist_ok=True)
    files = _converted(runtime)
    hostile = _hostile_litert(os.path.join(canaries, "flex")) if runtime == "litert" else {}
    outside = os.path.join(folder, "outside.bin")
    with open(outside, "wb") as f:  # the conv kernel's data: a load that reads it works
        f.write(_onnx_conv_weight(files["float32"]) if runtime == "onnx" else b"\0" * 64)
    seeds = Seeds(runtime, files, hostile, canaries, outside, _Watch([outside]))
    _SEEDS[runtime] = seeds
    return seeds


def _stop(seeds: Seeds) -> None:
    seeds.watch.close()
    _SEEDS.pop(seeds.runtime, None)


def _seed(runtime: str, precision: str) -> bytes:
    return _SEEDS[runtime].files[precision]


# ---------------------------------------------------------------------------------------------
# Generic structural edits: any number, string or bytes field of a parsed model set to a
# hostile value, or a repeated element dropped or doubled. A case names the field by its
# position in a walk of the structure (taken modulo the number of fields, so every position
# names one).

_INTS = (0, -1, 1, 2, 3, 7, 16, 255, 256, 65535, 2 ** 31 - 1, -2 ** 31, 2 ** 32, 2 ** 62,
         -2 ** 63, 2 ** 63 - 1)
_FLOATS = (0.0, -0.0, -1.0, 1e-45, 1e30, -1e30, math.nan, math.inf, -math.inf)
_STRINGS = ("", "x", "images", "probabilities", "\u00e9", "a" * 300)


def _value_strategy():
    return st.one_of(st.sampled_from(_INTS), st.sampled_from(_FLOATS),
                     st.sampled_from(_STRINGS), st.sampled_from(("drop", "double", "cut", "empty",
                                                                 "grow")))


def _fit_int(value, kind: str):
    """``value`` as an integer field of ``kind`` ("int32", "uint32", "int64", "uint64", "int8",
    "uint8", "int16", "uint16") holds it: wrapped around."""
    bits = int("".join(c for c in kind if c.isdigit()) or 64)
    value = int(value) % (1 << bits)
    if not kind.startswith("u") and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


# ONNX: protobuf fields.


def _proto_leaves(message, out: list) -> list:
    """(message, field, index) of every scalar field set in ``message`` and its sub-messages,
    and (message, field, None) for every repeated field (to drop or double an element)."""
    for field, value in message.ListFields():
        repeated = field.label == field.LABEL_REPEATED
        if field.type == field.TYPE_MESSAGE:
            for item in (value if repeated else [value]):
                _proto_leaves(item, out)
        elif repeated:
            out.extend((message, field, i) for i in range(len(value)))
        else:
            out.append((message, field, None))
        if repeated:
            out.append((message, field, "list"))
    return out


_PROTO_INTS = {3: "int64", 4: "uint64", 5: "int32", 13: "uint32", 17: "int32", 18: "int64",
               6: "uint64", 7: "uint32", 15: "int32", 16: "int64", 14: "int32"}


def _edit_proto_field(model, at: int, value) -> None:
    leaves = _proto_leaves(model, [])
    message, field, index = leaves[at % len(leaves)]
    current = getattr(message, field.name)
    if index == "list":
        if value == "drop" and len(current):
            del current[len(current) - 1]
        elif value in ("double", "grow") and len(current):
            if field.type == field.TYPE_MESSAGE:
                current.add().CopyFrom(current[0])
            else:
                current.append(current[0])
        elif value in ("empty", "cut"):
            del current[:]
        return
    old = current if index is None else current[index]
    if field.type in (field.TYPE_STRING, field.TYPE_BYTES):
        if isinstance(value, str) and value not in ("drop", "double", "cut", "empty", "grow"):
            new = value if field.type == field.TYPE_STRING else value.encode()
        elif value == "cut":
            new = old[:len(old) // 2]
        elif value in ("double", "grow"):
            new = old * 2
        elif value == "empty" or value == "drop":
            new = old[:0]
        else:
            new = str(value) if field.type == field.TYPE_STRING else struct.pack("<d", value)
    elif field.type in (field.TYPE_FLOAT, field.TYPE_DOUBLE):
        new = float(value) if isinstance(value, (int, float)) else old
        if field.type == field.TYPE_FLOAT and math.isfinite(new) and abs(new) > 3.4e38:
            new = math.copysign(math.inf, new)
    elif field.type == field.TYPE_BOOL:
        new = bool(value) if isinstance(value, (int, float)) else not old
    elif field.type == field.TYPE_ENUM:  # a closed enum holds only its own numbers
        numbers = sorted(field.enum_type.values_by_number)
        new = numbers[value % len(numbers)] if isinstance(value, int) else old
    elif field.type in _PROTO_INTS:
        new = (_fit_int(value, _PROTO_INTS[field.type]) if isinstance(value, int)
               else _fit_int(2 * old if value in ("double", "grow") else old // 2,
                             _PROTO_INTS[field.type]))
    else:
        return
    if index is None:
        setattr(message, field.name, new)
    else:
        current[index] = new


# LiteRT: the schema's object API (ModelT and the T classes below it).


def _flat_leaves(obj, out: list, depth: int = 0) -> list:
    """(object, attribute, index) of every number or vector in a LiteRT object tree."""
    if depth > 12:
        return out
    for name, value in sorted(vars(obj).items()):
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            out.append((obj, name, None))
        elif isinstance(value, (list, np.ndarray)):
            if len(value) and not isinstance(value[0], (int, float, np.number)):
                for item in value:
                    if hasattr(item, "__dict__"):
                        _flat_leaves(item, out, depth + 1)
            else:
                out.extend((obj, name, i) for i in range(min(len(value), 64)))
            out.append((obj, name, "list"))
        elif isinstance(value, bytes):
            out.append((obj, name, None))
        elif hasattr(value, "__dict__"):
            _flat_leaves(value, out, depth + 1)
    return out


def _edit_flat_field(model, at: int, value) -> None:
    leaves = _flat_leaves(model, [])
    obj, name, index = leaves[at % len(leaves)]
    current = getattr(obj, name)
    if index == "list":
        items = list(current)
        if value == "drop" and items:
            items = items[:-1]
        elif value in ("double", "grow") and items:
            items = items + items[:1]
        elif value in ("empty", "cut"):
            items = items[:len(items) // 2] if value == "cut" else []
        else:
            return None
        setattr(obj, name, np.array(items, dtype=current.dtype)
                if isinstance(current, np.ndarray) else items)
        return None
    old = current if index is None else current[index]
    if isinstance(old, bytes):
        new = {"cut": old[:len(old) // 2], "double": old * 2, "grow": old + b"\0" * 64}.get(
            value, old[:0] if value in ("empty", "drop") else old)
    elif isinstance(old, (float, np.floating)):
        new = float(value) if isinstance(value, (int, float)) else old * 2
    else:
        if not isinstance(value, int) or isinstance(value, bool):
            value = int(old) * 2 if value in ("double", "grow") else -int(old)
        dtype = current.dtype.name if isinstance(current, np.ndarray) else "int64"
        new = _fit_int(value, dtype if dtype.startswith(("int", "uint")) else "int64")
    _set_flat(obj, name, index, new)
    return obj, name, index


def _set_flat(obj, name: str, index, value) -> None:
    current = getattr(obj, name)
    if index is None:
        setattr(obj, name, value)
    elif isinstance(current, np.ndarray):
        with np.errstate(over="ignore", invalid="ignore"):
            current[index] = np.array(value).astype(current.dtype)
    else:
        current[index] = value


# ---------------------------------------------------------------------------------------------
# LiteRT files: parsed and rebuilt with the schema's object API.


def _litert_model(data: bytes):
    from ai_edge_litert import schema_py_generated as schema

    return schema.ModelT.InitFromPackedBuf(bytearray(data), 0)


def _litert_bytes(model, leaf=None) -> bytes:
    """``model`` packed as a LiteRT file. The schema's field types are known only to the
    packer: a number edited into ``leaf`` (object, attribute, index) that its field cannot hold
    is wrapped to the field's type, which the packer's error names."""
    import re

    import flatbuffers

    for _ in range(4):
        builder = flatbuffers.Builder(1 << 16)
        try:
            builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
            return bytes(builder.Output())
        except TypeError as e:
            found = re.match(r"bad number (\S+) for type (\w+)", str(e))
            if leaf is None or found is None:
                raise
            obj, name, index = leaf
            kind = found.group(2)
            value = float(found.group(1))
            _set_flat(obj, name, index,
                      float(value) if kind.startswith("float") else
                      bool(value) if kind == "bool" else _fit_int(int(value), kind))
    raise ValueError("the edited model does not pack")


def _operator_of(model, name: str):
    """The first operator of the builtin ``name`` (a regression's edit names its operator)."""
    from ai_edge_litert import schema_py_generated as schema

    code = getattr(schema.BuiltinOperator, name)
    return next(op for op in model.subgraphs[0].operators
                if max(model.operatorCodes[op.opcodeIndex].builtinCode,
                       model.operatorCodes[op.opcodeIndex].deprecatedBuiltinCode) == code)


def _tensor_of(model, spec: str) -> int:
    """The index of the tensor ``spec`` names, "OP:in:i" or "OP:out:i": an input or output of
    the first operator of the builtin OP (a regression's edit names its tensor so, as the
    order of tensors may change with the converter)."""
    from ai_edge_litert import schema_py_generated as schema

    op_name, side, index = spec.split(":")
    code = getattr(schema.BuiltinOperator, op_name)
    graph = model.subgraphs[0]
    for op in graph.operators:
        found = model.operatorCodes[op.opcodeIndex]
        if max(found.builtinCode, found.deprecatedBuiltinCode) == code:
            return int((op.inputs if side == "in" else op.outputs)[int(index)])
    raise ValueError(f"no {op_name} in the seed")


def _litert_edit(model, case: dict) -> None:
    """The targeted edit ``case["edit"]`` of a LiteRT model (see the module)."""
    from ai_edge_litert import schema_py_generated as schema

    graph = model.subgraphs[0]
    edit, value = case["edit"], case["value"]
    pick = case["pick"] if "of" not in case else _tensor_of(model, case["of"])
    if edit == "tensor-shape":
        tensor = graph.tensors[pick % len(graph.tensors)]
        shape = list(tensor.shape) if tensor.shape is not None else []
        if isinstance(value, int) and shape:
            shape[case["dim"] % len(shape)] = _fit_int(value, "int32")
        elif value == "grow":
            shape.append(2)
        elif shape:
            shape.pop()
        tensor.shape = np.array(shape, np.int32)
        if tensor.shapeSignature is not None and case["dim"] >= 4:  # the signature too
            tensor.shapeSignature = np.array(shape, np.int32)
    elif edit == "tensor-type":
        graph.tensors[pick % len(graph.tensors)].type = _fit_int(value, "int8")
    elif edit == "tensor-buffer":
        graph.tensors[pick % len(graph.tensors)].buffer = _fit_int(value, "uint32")
    elif edit == "buffer-data":
        buffers = [b for b in model.buffers if b.data is not None and len(b.data)]
        buffer = buffers[pick % len(buffers)]
        data = bytes(np.asarray(buffer.data, np.uint8))
        data = data[:len(data) // 2] if value == "cut" else data + data if value == "grow" \
            else b"" if value == "empty" else data[:-1]
        buffer.data = np.frombuffer(data, np.uint8)
    elif edit in ("op-inputs", "op-outputs"):
        op = (graph.operators[pick % len(graph.operators)] if "op" not in case
              else _operator_of(model, case["op"]))
        attr = "inputs" if edit == "op-inputs" else "outputs"
        items = list(getattr(op, attr))
        if isinstance(value, int):
            items[case["dim"] % len(items)] = _fit_int(value, "int32")
        elif value == "grow":
            items.append(items[0])
        else:
            items = items[:-1]
        setattr(op, attr, np.array(items, np.int32))
    elif edit == "opcode-index":
        graph.operators[pick % len(graph.operators)].opcodeIndex = _fit_int(value, "uint32")
    elif edit == "opcode":
        code = (model.operatorCodes[pick % len(model.operatorCodes)] if "code" not in case
                else next(c for c in model.operatorCodes if max(
                    c.builtinCode, c.deprecatedBuiltinCode) == getattr(
                        schema.BuiltinOperator, case["code"])))
        code.builtinCode = _fit_int(value, "int32")
        code.deprecatedBuiltinCode = _fit_int(min(max(value, -128), 127), "int8")
    elif edit == "conv-options":
        convs = [op for op in graph.operators
                 if isinstance(op.builtinOptions, schema.Conv2DOptionsT)]
        options = convs[pick % len(convs)].builtinOptions
        field = ("strideW", "strideH", "dilationWFactor", "dilationHFactor", "padding",
                 "fusedActivationFunction")[case["dim"] % 6]
        setattr(options, field, _fit_int(value, "int8" if field in (
            "padding", "fusedActivationFunction") else "int32"))
    elif edit in ("subgraph-inputs", "subgraph-outputs"):
        attr = "inputs" if edit == "subgraph-inputs" else "outputs"
        items = list(getattr(graph, attr))
        if isinstance(value, int):
            items[0] = _fit_int(value, "int32")
        elif value == "grow":
            items.append(items[0])
        else:
            items = []
        setattr(graph, attr, np.array(items, np.int32))
    elif edit == "quantization":
        quantized = [t for t in graph.tensors if t.quantization is not None
                     and t.quantization.scale is not None and len(t.quantization.scale)]
        if not quantized:
            return
        q = (graph.tensors[pick] if "of" in case else quantized[pick % len(quantized)]
             ).quantization
        field = ("scale", "zeroPoint", "quantizedDimension")[case["dim"] % 3]
        if field == "quantizedDimension":
            q.quantizedDimension = _fit_int(value, "int32") if isinstance(value, int) else 9
        elif field == "scale":
            q.scale = (np.full(len(q.scale), value, np.float32) if isinstance(value, float)
                       else q.scale[:0] if value == "empty" else np.append(q.scale, 1.0))
        else:
            q.zeroPoint = (np.full(len(q.zeroPoint), value, np.int64)
                           if isinstance(value, int) and abs(value) < 2 ** 63
                           else np.append(q.zeroPoint, 0))
    else:
        raise ValueError(f"no edit {edit!r}")


_LITERT_EDITS = ("tensor-shape", "tensor-type", "tensor-buffer", "buffer-data", "op-inputs",
                 "op-outputs", "opcode-index", "opcode", "conv-options", "subgraph-inputs",
                 "subgraph-outputs", "quantization")
_LITERT_VALUES = {
    "tensor-shape": st.one_of(st.sampled_from((0, -1, 1, 2, 3, 31, 33, 1 << 16, 2 ** 31 - 1,
                                               -2 ** 31)), st.just("grow"), st.just("drop")),
    "tensor-type": st.integers(-128, 127),
    "tensor-buffer": st.sampled_from((0, 1, 2, 3, 5, 100, 2 ** 31, 2 ** 32 - 1)),
    "buffer-data": st.sampled_from(("cut", "grow", "empty", "last")),
    "op-inputs": st.one_of(st.sampled_from((-1, -2, 0, 1, 2, 50, 2 ** 31 - 1, -2 ** 31)),
                           st.just("grow"), st.just("drop")),
    "opcode-index": st.sampled_from((1, 2, 5, 100, 2 ** 31, 2 ** 32 - 1)),
    "opcode": st.one_of(st.integers(-1, 220), st.sampled_from((2 ** 31 - 1, -2 ** 31))),
    "conv-options": st.sampled_from((0, -1, 2, 3, 100, 1 << 20, 2 ** 31 - 1, -2 ** 31)),
    "subgraph-inputs": st.one_of(st.sampled_from((-1, 0, 1, 100, 2 ** 31 - 1)),
                                 st.just("grow"), st.just("drop")),
    "quantization": st.one_of(st.sampled_from((0.0, -1.0, math.nan, math.inf, 1e-45, 1e30)),
                              st.sampled_from((-1, 1, 4, 127, 128, -129, 255, 2 ** 31 - 1,
                                               -2 ** 31)),
                              st.just("empty"), st.just("grow")),
}
_LITERT_VALUES["op-outputs"] = _LITERT_VALUES["op-inputs"]
_LITERT_VALUES["subgraph-outputs"] = _LITERT_VALUES["subgraph-inputs"]
_LITERT_VALUES["opcode-index"] = _LITERT_VALUES["opcode-index"]

# Names a custom op may be given, and what its refusal then names.
_CUSTOM_NAMES = ("FlexWriteFile", "FlexReadFile", "FlexPyFunc", "AsString", "Hostile",
                 "TFLite_Detection_PostProcess", "x")


@st.composite
def _litert_case(draw) -> dict:
    precision = draw(st.sampled_from(("float32", "dynamic-int8", "int8")))
    how = draw(st.sampled_from(("bytes", "bytes", "bytes", "field", "field", "edit", "edit",
                                "hostile", "custom-code", "seed", "special")))
    case = {"how": how, "seed": precision}
    if how == "bytes":
        case["data"] = draw(harness.mutated(_seed("litert", precision)))
    elif how == "field":
        case.update(at=draw(st.integers(0, 1 << 20)), value=draw(_value_strategy()))
    elif how == "edit":
        edit = draw(st.sampled_from(_LITERT_EDITS))
        case.update(edit=edit, pick=draw(st.integers(0, 1 << 10)),
                    dim=draw(st.integers(0, 7)), value=draw(_LITERT_VALUES[edit]))
    elif how == "hostile":
        case = {"how": how, "hostile": draw(st.sampled_from(("flex", "custom")))}
        if draw(st.booleans()):  # damaged too: still refused, or not a model at all
            case["data"] = draw(harness.mutated(_SEEDS["litert"].hostile[case["hostile"]][0]))
    elif how == "custom-code":
        case.update(pick=draw(st.integers(0, 1 << 10)),
                    name=draw(st.sampled_from(_CUSTOM_NAMES + ("",))),
                    builtin=draw(st.sampled_from(("custom", "keep", "deprecated"))))
    elif how == "special":
        case["special"] = draw(st.sampled_from(SPECIALS))
    return case


def _litert_file(case: dict, seeds: Seeds) -> tuple[bytes, tuple]:
    """The bytes of a LiteRT case, and what its refusal must name beyond the path (a hostile
    case must be refused)."""
    how = case["how"]
    if how == "hostile":
        data, named = seeds.hostile[case["hostile"]]
        if "data" in case:
            return case["data"], ()
        return data, (named,)
    data = seeds.files[case["seed"]]
    if how == "bytes":
        return case["data"], ()
    if how == "seed":
        return data, ()
    model = _litert_model(data)
    named: tuple = ()
    leaf = None
    if how == "field":
        leaf = _edit_flat_field(model, case["at"], case["value"])
    elif how == "edit":
        _litert_edit(model, case)
    elif how == "custom-code":
        from ai_edge_litert import schema_py_generated as schema

        code = model.operatorCodes[case["pick"] % len(model.operatorCodes)]
        custom = schema.BuiltinOperator.CUSTOM
        if case["builtin"] == "custom":
            code.builtinCode = custom
        elif case["builtin"] == "deprecated":
            code.deprecatedBuiltinCode = custom
            code.builtinCode = 0
        code.customCode = case["name"] or None
        # The runtime, as the check, takes the larger of the two codes (schema.fbs): a
        # deprecated code above CUSTOM's (MEAN's 40) keeps the op builtin.
        if case["name"] or max(code.builtinCode, code.deprecatedBuiltinCode) == custom:
            named = ("TF Select (Flex) op" if case["name"].startswith("Flex")
                     else "custom op",
                     repr(case["name"][4:] if case["name"].startswith("Flex") else case["name"]))
    return _litert_bytes(model, leaf), named


# ---------------------------------------------------------------------------------------------
# ONNX files.


def _onnx_model(data: bytes):
    import onnx

    return onnx.ModelProto.FromString(data)


def _conv(model):
    return next(n for n in model.graph.node if n.op_type == "Conv")


def _onnx_conv_weight(data: bytes) -> bytes:
    """The raw data of the float32 seed's Conv kernel (the outside file holds it, so a load
    that read the file would work)."""
    model = _onnx_model(data)
    name = _conv(model).input[1]
    return next(t for t in model.graph.initializer if t.name == name).raw_data


_ONNX_EDITS = ("init-dims", "init-type", "init-data", "conv-attr", "output-name",
               "input-name", "node-input", "node-output", "op-type", "opset", "ir-version",
               "input-type", "input-shape", "qdq-scale", "qdq-axis", "reshape-shape",
               "node-attr")
_ONNX_OPS = ("Relu", "Conv", "Reshape", "Expand", "Tile", "Pad", "Resize", "Loop", "If",
             "Scan", "ConstantOfShape", "Gather", "Slice", "MaxPool", "Einsum", "NonZero",
             "TopK", "Range", "Split", "Concat", "QuantizeLinear", "DequantizeLinear",
             "Softmax", "Identity", "NoSuchOp", "")
_CONV_ATTRS = ("strides", "pads", "dilations", "kernel_shape", "group", "auto_pad")
_ONNX_INTS = (0, -1, 1, 2, 3, 5, 7, 32, 1 << 16, 2 ** 31 - 1, -2 ** 31, 2 ** 62, -2 ** 63)


@st.composite
def _onnx_value(draw, edit: str):
    if edit in ("init-dims", "reshape-shape", "input-shape", "conv-attr", "node-attr"):
        return draw(st.one_of(st.sampled_from(_ONNX_INTS),
                              st.lists(st.sampled_from(_ONNX_INTS), max_size=6)))
    if edit in ("init-type", "input-type"):
        return draw(st.integers(0, 26))
    if edit == "init-data":
        return draw(st.sampled_from(("cut", "empty", "grow", "float_data", "one-short")))
    if edit in ("output-name", "input-name", "node-input", "node-output"):
        return draw(st.sampled_from(("", "nothing", "images", "probabilities", "same-as-other")))
    if edit == "op-type":
        return draw(st.sampled_from(_ONNX_OPS))
    if edit in ("opset", "ir-version"):
        return draw(st.sampled_from((0, 1, 6, 7, 13, 17, 22, 23, 99, 2 ** 31, 2 ** 62)))
    if edit == "qdq-scale":
        return draw(st.sampled_from((0.0, -1.0, math.nan, math.inf, 1e-45, 1e30)))
    if edit == "qdq-axis":
        return draw(st.sampled_from((-5, -1, 0, 1, 3, 4, 100, 2 ** 62)))
    raise ValueError(edit)


def _ints_attribute(name: str, values: list):
    """An INTS attribute (``onnx.helper.make_attribute`` cannot type an empty list)."""
    import onnx

    attribute = onnx.AttributeProto(name=name, type=onnx.AttributeProto.INTS)
    attribute.ints.extend(values)
    return attribute


def _ints(value) -> list:
    return list(value) if isinstance(value, list) else [value]


def _onnx_edit(model, case: dict) -> None:
    """The targeted edit ``case["edit"]`` of an ONNX model (see the module)."""
    import onnx

    graph = model.graph
    edit, value, pick = case["edit"], case["value"], case["pick"]
    if edit in ("init-dims", "init-type", "init-data"):
        tensor = graph.initializer[pick % len(graph.initializer)]
        if edit == "init-dims":
            if isinstance(value, list):
                tensor.dims[:] = value
            elif len(tensor.dims):
                tensor.dims[case["dim"] % len(tensor.dims)] = value
            else:
                tensor.dims.append(value)
        elif edit == "init-type":
            tensor.data_type = value
        elif value == "float_data":  # the data moved to float_data, one value short
            values = np.frombuffer(tensor.raw_data, np.uint8)[:len(tensor.raw_data) // 4 * 4]
            tensor.ClearField("raw_data")
            tensor.float_data[:] = values.view(np.float32)[:-1].tolist()
        else:
            raw = tensor.raw_data
            tensor.raw_data = {"cut": raw[:len(raw) // 2], "empty": b"",
                               "grow": raw + raw[:8] + b"\0" * 8, "one-short": raw[:-1]}[value]
    elif edit == "conv-attr":
        conv = _conv(model)
        name = _CONV_ATTRS[case["dim"] % len(_CONV_ATTRS)]
        kept = [a for a in conv.attribute if a.name != name]
        del conv.attribute[:]
        conv.attribute.extend(kept)
        if name == "group":
            conv.attribute.append(onnx.helper.make_attribute(name, _ints(value)[0] if _ints(
                value) else 0))
        elif name == "auto_pad":
            conv.attribute.append(onnx.helper.make_attribute(name, ("SAME_UPPER", "SAME_LOWER",
                                                                    "VALID", "NOTSET", "X")[
                pick % 5]))
        else:
            conv.attribute.append(_ints_attribute(name, _ints(value)))
    elif edit in ("output-name", "input-name"):
        values = graph.output if edit == "output-name" else graph.input
        other = graph.input[0].name if edit == "output-name" else graph.output[0].name
        values[0].name = {"same-as-other": other, "nothing": "nothing"}.get(value, value)
    elif edit in ("node-input", "node-output"):
        node = graph.node[pick % len(graph.node)]
        names = node.input if edit == "node-input" else node.output
        if not len(names):
            return
        other = graph.node[(pick + 1) % len(graph.node)]
        names[case["dim"] % len(names)] = {
            "same-as-other": (other.output[0] if len(other.output) else ""),
            "nothing": "nothing"}.get(value, value)
    elif edit == "op-type":
        graph.node[pick % len(graph.node)].op_type = value
    elif edit == "opset":
        model.opset_import[0].version = value
    elif edit == "ir-version":
        model.ir_version = value
    elif edit in ("input-type", "input-shape"):
        values = (graph.input, graph.output)[case["dim"] % 2]
        tensor_type = values[0].type.tensor_type
        if edit == "input-type":
            tensor_type.elem_type = value
        else:
            del tensor_type.shape.dim[:]
            for size in _ints(value):
                tensor_type.shape.dim.add().dim_value = size
    elif edit in ("qdq-scale", "qdq-axis"):
        nodes = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
        if not nodes:
            return
        node = nodes[pick % len(nodes)]
        if edit == "qdq-axis":
            kept = [a for a in node.attribute if a.name != "axis"]
            del node.attribute[:]
            node.attribute.extend(kept)
            node.attribute.append(onnx.helper.make_attribute("axis", value))
        else:
            scale = next((t for t in graph.initializer if t.name == node.input[1]), None)
            if scale is not None:  # every value, or one of a per-channel scale's
                from onnx import numpy_helper

                values = np.array(numpy_helper.to_array(scale), np.float32).reshape(-1)
                values[pick % max(1, len(values)) if case["dim"] % 2 else slice(None)] = value
                scale.ClearField("float_data")
                scale.raw_data = values.tobytes()
    elif edit == "node-attr":
        node = graph.node[pick % len(graph.node)]
        name = ("axis", "perm", "axes", "keepdims", "to", "block_size")[case["dim"] % 6]
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(kept)
        if isinstance(value, list) or name in ("perm", "axes"):
            node.attribute.append(_ints_attribute(name, _ints(value)))
        else:
            node.attribute.append(onnx.helper.make_attribute(name, value))
    elif edit == "reshape-shape":  # the shape, axes or repeats a node takes as an input
        shapes = [t for n in graph.node
                  if n.op_type in ("Reshape", "Expand", "Tile", "Squeeze", "Unsqueeze")
                  for t in graph.initializer if len(n.input) > 1 and t.name == n.input[1]]
        if not shapes:
            return
        tensor = shapes[pick % len(shapes)]
        sizes = _ints(value)
        tensor.ClearField("int64_data")
        tensor.dims[:] = [len(sizes)]
        tensor.raw_data = np.array(sizes, np.int64).tobytes()
    else:
        raise ValueError(f"no edit {edit!r}")


# Hostile ONNX edits, and domains outside ONNX's own.
_DOMAINS = ("com.microsoft", "com.example.ops", "ai.onnx.ml", "ai.onnx.preview.training",
            "com.microsoft.nchwc", "ai.onnx ", "org.pytorch.aten")
_FUNCTION_NAMES = ("Helper", "Conv", "Relu", "x")


def _external_locations(folder: str, seeds: Seeds) -> dict:
    """The external-data locations a case may draw, out of the model's folder ``folder``
    (the watched file ``seeds.outside`` and a copy in the case's folder) or in it."""
    return {"parent": "../outside.bin",
            "out-of-scratch": os.path.relpath(seeds.outside, folder),
            "absolute": seeds.outside,
            "symlink": "link.bin",
            "dot-dot-inside": "sub/../../outside.bin",
            "file-url": "file://" + seeds.outside,
            "folder": ".",
            "empty": "",
            "inside": "weights.bin",
            "inside-sub": "sub/weights.bin",
            "missing": "missing.bin",
            "subfolder": "sub",
            "fifo": "fifo.bin"}


_LOCATIONS = ("parent", "out-of-scratch", "absolute", "symlink", "dot-dot-inside", "file-url",
              "folder", "empty", "inside", "inside-sub", "missing", "subfolder", "fifo")
_OUTSIDE = ("parent", "out-of-scratch", "absolute", "symlink", "dot-dot-inside", "file-url",
            "folder", "empty")


@st.composite
def _onnx_case(draw) -> dict:
    precision = draw(st.sampled_from(("float32", "int8")))
    how = draw(st.sampled_from(("bytes", "bytes", "bytes", "field", "field", "edit", "edit",
                                "edit", "domain", "function", "external", "seed", "special")))
    case = {"how": how, "seed": precision}
    if how == "bytes":
        case["data"] = draw(harness.mutated(_seed("onnx", precision)))
    elif how == "field":
        case.update(at=draw(st.integers(0, 1 << 20)), value=draw(_value_strategy()))
    elif how == "edit":
        edit = draw(st.sampled_from(_ONNX_EDITS))
        case.update(edit=edit, pick=draw(st.integers(0, 1 << 10)), dim=draw(st.integers(0, 7)),
                    value=draw(_onnx_value(edit)))
    elif how == "domain":
        case.update(domain=draw(st.sampled_from(_DOMAINS)), pick=draw(st.integers(0, 1 << 10)),
                    where=draw(st.sampled_from(("graph", "if-branch", "loop-body"))))
    elif how == "function":
        case.update(name=draw(st.sampled_from(_FUNCTION_NAMES)),
                    called=draw(st.booleans()), domain=draw(st.sampled_from(("", "local"))))
    elif how == "external":
        case.update(location=draw(st.sampled_from(_LOCATIONS)),
                    offset=draw(st.sampled_from((None, 0, 4, -1, 2 ** 40, 2 ** 63 - 1))),
                    length=draw(st.sampled_from((None, 0, 4, -1, 2 ** 40, "exact"))),
                    tensor=draw(st.sampled_from(("conv", "new", "attribute"))))
    elif how == "special":
        case["special"] = draw(st.sampled_from(SPECIALS))
    return case


def _onnx_file(case: dict, seeds: Seeds, folder: str) -> tuple[bytes, tuple, bool]:
    """The bytes of an ONNX case written in ``folder`` (with any files beside it), what its
    refusal must name beyond the path, and whether it must be refused."""
    import onnx

    how = case["how"]
    data = seeds.files[case["seed"]]
    if how == "bytes":
        return case["data"], (), False
    if how == "seed":
        return data, (), False
    model = _onnx_model(data)
    named: tuple = ()
    hostile = False
    if how == "field":
        _edit_proto_field(model, case["at"], case["value"])
    elif how == "edit":
        _onnx_edit(model, case)
    elif how == "domain":
        hostile, named = True, (f"of the domain {case['domain']!r}",)
        node = model.graph.node[case["pick"] % len(model.graph.node)]
        if case["where"] == "graph":
            node.domain = case["domain"]
        else:  # an If (or a Loop) whose branch holds the node, the node in the graph kept
            inner = onnx.helper.make_node("Relu", ["x_in"], ["x_out"], domain=case["domain"])
            body = onnx.helper.make_graph(
                [inner], "branch", [], [onnx.helper.make_tensor_value_info(
                    "x_out", onnx.TensorProto.FLOAT, None)])
            if case["where"] == "if-branch":
                wrapper = onnx.helper.make_node("If", [node.input[0]], ["hidden"],
                                                then_branch=body, else_branch=body)
            else:
                wrapper = onnx.helper.make_node("Loop", ["", ""], ["hidden"], body=body)
            model.graph.node.append(wrapper)
    elif how == "function":
        hostile, named = True, (f"defines the function {case['name']!r}",)
        domain = case["domain"]
        function = model.functions.add(name=case["name"], domain=domain)
        function.input.append("x")
        function.output.append("y")
        function.node.append(onnx.helper.make_node("Relu", ["x"], ["y"]))
        function.opset_import.add(domain="", version=model.opset_import[0].version)
        if case["called"]:
            relu = next((n for n in model.graph.node if n.op_type == "Relu"), None)
            if relu is not None:
                relu.op_type, relu.domain = case["name"], domain
            if domain and not any(o.domain == domain for o in model.opset_import):
                model.opset_import.add(domain=domain, version=1)
    elif how == "external":
        hostile, named = _external(model, case, seeds, folder)
    return model.SerializeToString(), named, hostile


def _external(model, case: dict, seeds: Seeds, folder: str) -> tuple[bool, tuple]:
    """Moves a tensor's data to an external file at the case's location (see
    ``_external_locations``), with the files that location needs; returns whether the case
    must be refused and what the refusal names."""
    import onnx

    scratch = os.path.dirname(folder)
    kernel = _onnx_conv_weight(seeds.files["float32"])
    with open(os.path.join(scratch, "outside.bin"), "wb") as f:
        f.write(kernel)
    os.makedirs(os.path.join(folder, "sub"), exist_ok=True)
    for inside in ("weights.bin", "sub/weights.bin"):
        with open(os.path.join(folder, inside), "wb") as f:
            f.write(b"\0" * 16 + kernel)
    os.symlink(seeds.outside, os.path.join(folder, "link.bin"))
    os.mkfifo(os.path.join(folder, "fifo.bin"))
    location = _external_locations(folder, seeds)[case["location"]]
    graph = model.graph
    if case["tensor"] == "conv" and case["seed"] == "float32":
        tensor = next(t for t in graph.initializer if t.name == _conv(model).input[1])
        size = len(tensor.raw_data)
        tensor.ClearField("raw_data")
    elif case["tensor"] == "attribute":  # a Constant node's value, not an initializer
        tensor = onnx.helper.make_tensor("constant_external", onnx.TensorProto.FLOAT, [4],
                                         [0.0] * 4)
        graph.node.insert(0, onnx.helper.make_node("Constant", [], ["constant_external"],
                                                   value=tensor))
        tensor = graph.node[0].attribute[0].t
        tensor.ClearField("float_data")
        size = 16
    else:
        tensor = graph.initializer.add(name="external_extra", data_type=onnx.TensorProto.FLOAT,
                                       dims=[4])
        size = 16
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    offset = 16 if case["location"].startswith("inside") and case["offset"] is None \
        else case["offset"]
    if offset is not None:
        tensor.external_data.add(key="offset", value=str(offset))
    if case["length"] is not None:
        tensor.external_data.add(key="length",
                                 value=str(size if case["length"] == "exact" else case["length"]))
    if case["location"] in _OUTSIDE:
        return True, (f"from {location!r}, outside its folder",)
    return False, ()


# ---------------------------------------------------------------------------------------------
# The check: load and run.


def _run(path: str) -> str:
    from cifar10_estimator.serving import runtimes

    def load_and_run():
        model = runtimes.load(path, threads=1)
        return model.num_classes, model.probabilities(PICTURES)

    outcome, value = harness.refused(load_and_run, path)
    if outcome == harness.ACCEPTED:
        classes, probabilities = value
        if (not isinstance(probabilities, np.ndarray) or probabilities.dtype != np.float32
                or probabilities.shape != (BATCH, classes)):
            raise harness.Violation(
                f"probabilities of {getattr(probabilities, 'dtype', type(probabilities))} "
                f"{getattr(probabilities, 'shape', '')} for {BATCH} pictures and {classes} "
                f"classes")
    return outcome


def _judge(path: str, seeds: Seeds, named: tuple, hostile: bool) -> str:
    from cifar10_estimator.serving import runtimes

    seeds.watch.opened()  # what the case's own set-up opened
    if hostile:
        outcome, _ = harness.refused(lambda: runtimes.load(path, threads=1), path, *named)
    else:
        outcome = _run(path)
    read = seeds.watch.opened()
    written = os.listdir(seeds.canaries)
    for name in written:
        os.remove(os.path.join(seeds.canaries, name))
    if read:
        raise harness.Violation(f"{path} made its runtime open {read}, outside its folder")
    if written:
        raise harness.Violation(f"{path} wrote {written}")
    if hostile and outcome != harness.REFUSED:
        raise harness.Violation(f"the hostile file {path} was loaded")
    return outcome


def _check_litert(case: dict, scratch: str, seeds: Seeds) -> str:
    path = os.path.join(scratch, "model.tflite")
    if case["how"] == "special":
        special_file(path, case["special"])
        return _judge(path, seeds, (), False)
    data, named = _litert_file(case, seeds)
    with open(path, "wb") as f:
        f.write(data)
    return _judge(path, seeds, named, bool(named))


def _check_onnx(case: dict, scratch: str, seeds: Seeds) -> str:
    folder = os.path.join(scratch, "model")
    os.makedirs(folder)
    path = os.path.join(folder, "model.onnx")
    if case["how"] == "special":
        special_file(path, case["special"])
        return _judge(path, seeds, (), False)
    data, named, hostile = _onnx_file(case, seeds, folder)
    with open(path, "wb") as f:
        f.write(data)
    return _judge(path, seeds, named, hostile)


KINDS = []
if HAS_LITERT:
    KINDS.append(harness.Kind(
        name="litert-file",
        reader="serving.runtimes.load (runtime_trust.check_model_file, then LiteRT's "
               "Interpreter) and RuntimeModel.probabilities",
        tried="converted float32, dynamic-int8 and int8 files of a tiny network mutated; any "
              "number or vector of the flatbuffer set to 0, -1, 2^31-1, -2^63, NaN, inf, cut, "
              "emptied or doubled and the file rebuilt; tensors' shapes, types, buffers and "
              "quantization, operators' tensors and opcodes, Conv2D options and the subgraph's "
              "inputs and outputs out of range; a TF Select (Flex) WriteFile, a custom op, an "
              "operator code made custom or named Flex...; a pipe, socket, /dev/zero or "
              "/dev/null in the file's place",
        strategy=_litert_case(),
        check=_check_litert,
        start=functools.partial(_start, "litert"),
        stop=_stop,
        time_limit=30.0,
        regressions=(
            # Found by the campaign: a convolution's output declared [1, 33554464, 32, 16]
            # made the XNNPACK delegate take 16 GB in 30 s as it allocated (4 KB of file).
            {"how": "edit", "seed": "int8", "edit": "tensor-shape", "of": "CONV_2D:out:0",
             "dim": 1, "value": 33_554_464},
            # A QUANTIZE output's scale NaN (or 0, negative, subnormal, infinite): the XNNPACK
            # delegate crashed the process (SIGSEGV) as it allocated.
            {"how": "edit", "seed": "int8", "edit": "quantization", "of": "QUANTIZE:out:0",
             "dim": 0, "value": math.nan},
            {"how": "edit", "seed": "int8", "edit": "quantization", "of": "QUANTIZE:out:0",
             "dim": 0, "value": 1e-45},
            # Its zero point 128 (an int8 tensor's are -128..127): the same crash.
            {"how": "edit", "seed": "int8", "edit": "quantization", "of": "QUANTIZE:out:0",
             "dim": 1, "value": 128},
            # The mean's axes a scalar, or the dense weights [2, 16]: the file ran and gave 64
            # rows for 2 pictures, or 2 classes where it declares 10 (accepted unsoundly).
            {"how": "edit", "seed": "dynamic-int8", "edit": "tensor-shape", "of": "MEAN:in:1",
             "dim": 0, "value": "drop"},
            {"how": "edit", "seed": "float32", "edit": "tensor-shape",
             "of": "FULLY_CONNECTED:in:1", "dim": 0, "value": 2},
            # The dense layer's op made CONCATENATION (code 2), its optional bias (-1) an
            # input: the XNNPACK delegate read tensor -1 and crashed the process (SIGSEGV).
            {"how": "edit", "seed": "int8", "edit": "opcode", "code": "FULLY_CONNECTED",
             "pick": 0, "dim": 0, "value": 2},
            # The SOFTMAX's input made the float32 pictures (its output int8): its float32
            # kernel wrote 4 bytes an element into the int8 output, past its end (a heap
            # overflow; glibc aborted the process, "free(): invalid pointer").
            {"how": "edit", "seed": "int8", "edit": "op-inputs", "op": "SOFTMAX",
             "pick": 0, "dim": 0, "value": 0},
            # The last DEQUANTIZE's output made -1 (LiteRT's "optional"): its kernel crashed
            # the process (SIGSEGV) as it prepared, with or without the XNNPACK delegate.
            {"how": "edit", "seed": "int8", "edit": "op-outputs", "op": "DEQUANTIZE",
             "pick": 0, "dim": 0, "value": -1},
        )))
if HAS_ONNX:
    KINDS.append(harness.Kind(
        name="onnx-file",
        reader="serving.runtimes.load (runtime_trust.check_model_file, then ONNX Runtime's "
               "InferenceSession) and RuntimeModel.probabilities",
        tried="converted float32 and int8 QDQ files of a tiny network mutated; any field of "
              "the protobuf set to 0, -1, 2^31-1, -2^63, NaN, inf, \"\", cut, emptied or "
              "doubled; initializers whose dims, type and data disagree; Conv strides, pads, "
              "dilations, kernel_shape and group out of bounds; graph inputs and outputs and "
              "node inputs and outputs renamed; ops replaced; opset and IR versions out of "
              "range; QDQ scales 0, NaN, inf and axes out of range; nodes of 7 other domains "
              "(in the graph, an If's branch, a Loop's body); model-local functions; external "
              "data at ../, out of the case's folder, absolute, file://, through a symlink, "
              "and inside with bad offsets and lengths, a folder or a pipe; a pipe, socket, "
              "/dev/zero or /dev/null in the file's place",
        strategy=_onnx_case(),
        check=_check_onnx,
        start=functools.partial(_start, "onnx"),
        stop=_stop,
        time_limit=30.0,
        regressions=()))
KINDS = tuple(KINDS)
