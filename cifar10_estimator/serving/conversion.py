"""Converting an export for LiteRT and ONNX Runtime: the float32 graph of its ``serving_default``
signature, and the files of each format (``formats.FORMATS``) made from it.

The graph is the network function's, frozen (its weights are constants already: the export
folds them in, ``signatures``) with its calls inlined, from the ``images`` input to the
``probabilities`` output. The other outputs stay out: ``class_names`` is a string gather, which
neither runtime's builtin ops convert cleanly, and the manifest carries the names; the bytes
signature's picture decoding (``DecodeImage``) converts to neither (LiteRT would need TF Select,
ONNX has no image decoder), so a client decodes and resizes, as ``predict`` does.

An export that computes in bfloat16 (``--serving-precision``) has bfloat16 casts around its
convolutions; neither runtime runs bfloat16 on a CPU, so the graph is rewritten to float32 (each
cast to or from bfloat16 becomes an identity, every bfloat16 type and constant float32): the
export's own float32 weights in float32 arithmetic, the network an fp32 export of the same
checkpoint holds.

- LiteRT: TensorFlow's ``tf.lite.TFLiteConverter`` (TF 2.15 to 2.21 ship it; LiteRT's own
  Python package has the interpreter only), builtin ops only. ``dynamic-int8`` is its
  dynamic-range quantization (``Optimize.DEFAULT``, no data); ``int8`` its full-integer
  quantization (``TFLITE_BUILTINS_INT8``) calibrated on the given pictures, with float32 input
  and output so that callers feed the same pictures to every file.
- ONNX: ``tf2onnx`` at ``ONNX_OPSET``, the input and output renamed ``images`` and
  ``probabilities``; ``int8`` is ONNX Runtime's static quantization in the QDQ format
  (QuantizeLinear/DequantizeLinear pairs, ONNX's own ops), int8 weights per channel and uint8
  activations: x86's byte dot products (AVX2's VPMADDUBSW, AVX512-VNNI's VPDPBUSD) multiply
  unsigned by signed bytes, and on a Zen 5 uint8 activations served 4,220 pictures/s at batch
  256 on one thread, int8 activations 1,618 and float32 2,067, at the same accuracy. Without
  VNNI, VPMADDUBSW adds pairs of products in 16 bits, which can saturate: the gate measures the
  file on the converting machine's kernels, so convert (or ``cifar10-evaluate`` the file) on the
  kind of CPU that serves it. Each activation's range set by the 99.999th percentile of its values
  over the calibration pictures (``CalibrationMethod.Percentile`` at ONNX Runtime's default),
  not by their extremes. Wu et al. 2020 (arXiv:2004.09602) compare max, entropy and percentile
  calibration and turn to percentile or entropy where max loses accuracy; here, on a
  Fashion-MNIST ResNet-20 with the fast recipe's whitening layer (whose outputs have rare large
  values), the extremes lost 6.07 points of the float32 file's accuracy and the percentile 0.02
  (docs/serving.md). LiteRT's converter calibrates by the extremes only.
"""

import contextlib
import io
import logging
import os
import tempfile
from typing import Optional

import numpy as np
import tensorflow as tf

from cifar10_estimator.errors import UserError
from cifar10_estimator.serving import formats
from cifar10_estimator.serving.formats import LITERT, ONNX, Format

# ONNX opset 17 (ONNX 1.12, 2022): every op the network needs, and what ONNX Runtime 1.14 and
# later run with their full CPU kernels; tf2onnx 1.17's default is 15.
ONNX_OPSET = 17
INPUT_NAME, OUTPUT_NAME = "images", "probabilities"
_BF16, _F32 = tf.bfloat16.as_datatype_enum, tf.float32.as_datatype_enum


class Float32Graph:
    """The export's network as a frozen float32 GraphDef, and as a concrete function of it."""

    def __init__(self, graph_def, input_tensor: str, output_tensor: str):
        self.graph_def = graph_def
        self.input_tensor = input_tensor
        self.output_tensor = output_tensor
        self.onnx_float32 = None  # the ONNX model, once converted (``convert``)

        def imported():
            tf.compat.v1.import_graph_def(graph_def, name="")

        wrapped = tf.compat.v1.wrap_function(imported, [])
        self.function = wrapped.prune(
            feeds=[wrapped.graph.get_tensor_by_name(input_tensor)],
            fetches=[wrapped.graph.get_tensor_by_name(output_tensor)])


def _to_float32(graph_def) -> int:
    """Rewrites bfloat16 to float32 in ``graph_def`` (see the module); returns how many casts it
    removed."""
    casts = 0
    for node in graph_def.node:
        if node.op == "Cast" and _BF16 in (node.attr["SrcT"].type, node.attr["DstT"].type):
            node.op = "Identity"
            for name in ("SrcT", "DstT", "Truncate"):
                node.attr.pop(name, None)
            node.attr["T"].type = _F32
            casts += 1
        for value in node.attr.values():
            if value.type == _BF16:
                value.type = _F32
            if value.HasField("tensor") and value.tensor.dtype == _BF16:
                value.tensor.CopyFrom(tf.make_tensor_proto(
                    tf.make_ndarray(value.tensor).astype(np.float32)))
            if _BF16 in value.list.type:
                value.list.type[:] = [_F32 if t == _BF16 else t for t in value.list.type]
    return casts


def float32_graph(signature) -> Float32Graph:
    """The network behind an export's ``serving_default`` signature (``client.load_model``'s,
    which checks the export first) as a frozen float32 graph from ``images`` to
    ``probabilities``."""
    from tensorflow.python.framework.convert_to_constants import (  # not in the public API
        convert_variables_to_constants_v2)

    @tf.function(input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.float32,
                                                name=INPUT_NAME)], autograph=False)
    def probabilities(images):
        return signature(images=images)[OUTPUT_NAME]

    frozen = convert_variables_to_constants_v2(probabilities.get_concrete_function())
    graph_def = frozen.graph.as_graph_def()
    _to_float32(graph_def)
    return Float32Graph(graph_def, frozen.inputs[0].name, frozen.outputs[0].name)


def _batches(pictures: np.ndarray):
    """Calibration input for both converters: one picture at a time."""
    for picture in pictures:
        yield picture[None].astype(np.float32)


def to_litert(graph: Float32Graph, precision: str,
              calibration: Optional[np.ndarray] = None) -> bytes:
    """The LiteRT flatbuffer of ``graph`` in ``precision`` (a Format's)."""
    lite = getattr(tf, "lite", None)
    if lite is None or not hasattr(lite, "TFLiteConverter"):
        raise UserError(f"TensorFlow {tf.__version__} has no LiteRT converter (tf.lite); LiteRT "
                        f"files convert with TensorFlow 2.15 to 2.21 (docs/versions.md)")
    converter = lite.TFLiteConverter.from_concrete_functions([graph.function])
    converter.target_spec.supported_ops = [lite.OpsSet.TFLITE_BUILTINS]
    if precision in ("dynamic-int8", "int8"):
        converter.optimizations = [lite.Optimize.DEFAULT]
    if precision == "int8":
        converter.representative_dataset = lambda: ([b] for b in _batches(calibration))
        converter.target_spec.supported_ops = [lite.OpsSet.TFLITE_BUILTINS_INT8]
    try:
        return converter.convert()
    except Exception as e:  # the converter's ConverterError and friends, per release
        raise _failed(LITERT, precision, e) from None


def _failed(runtime: str, precision: str, error: BaseException) -> UserError:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    return UserError(f"the {runtime} {precision} conversion failed on TensorFlow "
                     f"{tf.__version__}: {first}; docs/versions.md says which TensorFlow "
                     f"releases convert it")


def _rename(model, old: str, new: str) -> None:
    """Renames a graph input or output of an ONNX model wherever it is used."""
    for value in (*model.graph.input, *model.graph.output):
        if value.name == old:
            value.name = new
    for node in model.graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]


def _onnx_float32(graph: Float32Graph):
    tf2onnx = formats.require(ONNX, "tf2onnx")
    logging.getLogger("tf2onnx").setLevel(logging.ERROR)
    try:
        model, _ = tf2onnx.convert.from_graph_def(
            graph.graph_def, input_names=[graph.input_tensor],
            output_names=[graph.output_tensor], opset=ONNX_OPSET)
    except Exception as e:  # tf2onnx raises what its handlers raise
        raise _failed(ONNX, "float32", e) from None
    _rename(model, graph.input_tensor, INPUT_NAME)
    _rename(model, graph.output_tensor, OUTPUT_NAME)
    model.producer_name = "cifar10_estimator"
    return model


def _onnx_int8(model, calibration: np.ndarray) -> bytes:
    quantization = formats.require(ONNX, "onnxruntime.quantization")

    class Pictures(quantization.CalibrationDataReader):
        def __init__(self):
            self.batches = iter(_batches(calibration))

        def get_next(self):
            batch = next(self.batches, None)
            return None if batch is None else {INPUT_NAME: batch}

    with tempfile.TemporaryDirectory(prefix="onnx-int8-") as work:
        source, target = os.path.join(work, "float32.onnx"), os.path.join(work, "int8.onnx")
        with open(source, "wb") as f:
            f.write(model.SerializeToString())
        try:
            # The percentile calibrator prints its progress on stdout, where the command's
            # table goes.
            with contextlib.redirect_stdout(io.StringIO()):
                quantization.quantize_static(
                    source, target, Pictures(), quant_format=quantization.QuantFormat.QDQ,
                    per_channel=True, activation_type=quantization.QuantType.QUInt8,
                    weight_type=quantization.QuantType.QInt8,
                    calibrate_method=quantization.CalibrationMethod.Percentile)
        except Exception as e:
            raise _failed(ONNX, "int8", e) from None
        onnx = formats.require(ONNX, "onnx")
        quantized = onnx.load(target)
    # The quantizer declares Microsoft's domains whether or not a node uses them; a file of
    # ours imports only the domains its nodes use (runtime_trust refuses nodes of others).
    used = {node.domain for node in quantized.graph.node}
    kept = [o for o in quantized.opset_import if o.domain in used or o.domain in ("", "ai.onnx")]
    del quantized.opset_import[:]
    quantized.opset_import.extend(kept)
    quantized.producer_name = "cifar10_estimator"
    return quantized.SerializeToString()


def convert(graph: Float32Graph, fmt: Format, calibration: Optional[np.ndarray] = None) -> bytes:
    """The bytes of ``graph`` in the format ``fmt`` (``calibration``: float32 [N, 32, 32, 3]
    pictures, for the calibrated formats)."""
    if fmt.calibrated and (calibration is None or not len(calibration)):
        raise UserError(f"{fmt.key} needs calibration pictures")
    if fmt.runtime == LITERT:
        return to_litert(graph, fmt.precision, calibration)
    if graph.onnx_float32 is None:  # converted once for both ONNX formats
        graph.onnx_float32 = _onnx_float32(graph)
    model = graph.onnx_float32
    if fmt.precision == "int8":
        return _onnx_int8(model, calibration)
    return model.SerializeToString()
