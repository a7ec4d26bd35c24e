"""LiteRT and ONNX Runtime: the convert command on real exports, its accuracy gate, predict and
evaluate on the converted files, and the check of a model file before its runtime loads it.

Every file is made by the real converters (TensorFlow's tf.lite, tf2onnx, ONNX Runtime's
quantizer) and run by the real runtimes (LiteRT's interpreter, ONNX Runtime)."""

import hashlib
import json
import os

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("ai_edge_litert.interpreter")
pytest.importorskip("onnxruntime")
pytest.importorskip("tf2onnx")

import onnx  # noqa: E402

from cifar10_estimator.config.settings import ModelSection  # noqa: E402
from cifar10_estimator.data import schema  # noqa: E402
from cifar10_estimator.errors import UserError  # noqa: E402
from cifar10_estimator.model.model_settings import ModelSettings  # noqa: E402
from cifar10_estimator.serving import client, conversion, export, formats, runtimes  # noqa: E402
from cifar10_estimator.serving.formats import FORMATS  # noqa: E402
from test_export_trust import our_exports  # noqa: E402,F401  (the exports of every variant)
from trainer_fixtures import run_module  # noqa: E402

pytestmark = pytest.mark.slow

CONVERT = "cifar10_estimator.convert"
RNG = np.random.default_rng(0)
PICTURES = RNG.uniform(0, 255, (6, 32, 32, 3)).astype(np.float32)


def _convert(export_dir, data_dir, *flags, cwd=None):
    return run_module(CONVERT, export_dir, "--data-dir", data_dir, *flags, cwd=cwd,
                      timeout=240)


@pytest.fixture(scope="module")
def converted(tiny_export, tiny_records, tmp_path_factory):
    """The suite's tiny export with every format converted by the command (its output kept).
    Every file is kept: the tiny model (3 steps) and its 37 eval pictures make the int8
    files' accuracy a matter of one or two pictures, which the gate's own test covers."""
    data_dir, _ = tiny_records
    proc = _convert(tiny_export, data_dir, "--calibration-pictures", "32",
                    "--max-accuracy-drop", "100")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tiny_export, proc.stdout


def test_convert_writes_every_format_with_a_manifest_and_a_table(converted):
    export_dir, out = converted
    folder = formats.converted_dir(export_dir)
    manifest = json.load(open(os.path.join(folder, formats.MANIFEST_FILE)))
    assert sorted(os.listdir(folder)) == sorted(
        [formats.MANIFEST_FILE] + [f.file_name for f in FORMATS.values()])
    assert [e["format"] for e in manifest["files"]] == list(FORMATS)
    names = [n.strip() for n in open(os.path.join(export_dir, export.CLASS_NAMES_FILE))]
    for entry in manifest["files"]:
        data = open(os.path.join(folder, entry["file"]), "rb").read()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["bytes"] == len(data) and entry["class_names"] == names
        assert entry["input"]["shape"] == [None, 32, 32, 3]
        assert 0 <= entry["accuracy"] <= 1 and 0 <= entry["agreement"] <= 1
        assert entry["delta_points"] == pytest.approx(
            (entry["accuracy"] - manifest["savedmodel_accuracy"]) * 100, abs=1e-3)
        assert entry["format"] in out and entry["file"] in out
    assert manifest["max_accuracy_drop_points"] == 100
    assert manifest["pictures"] == 37 and manifest["calibration"] == {
        "split": "train", "pictures": 32}
    assert "tensorflow" in manifest["versions"] and "onnxruntime" in manifest["versions"]
    # Only the command's own lines: not the calibrator's progress nor a runtime's notices.
    assert not [line for line in out.splitlines() if not line.startswith(
        tuple(FORMATS) + ("eval split", "  ", "written: "))], out
    # int8 files are a fraction of the float32 ones (ResNet-8: about a third).
    sizes = {e["format"]: e["bytes"] for e in manifest["files"]}
    assert sizes["litert-int8"] < sizes["litert-float32"] / 2
    assert sizes["onnx-int8"] < sizes["onnx-float32"] / 2
    assert not [n for n in os.listdir(export_dir) if n.startswith(".")]  # no temporaries


def test_predict_and_evaluate_give_the_savedmodels_classes_on_every_file(converted, tmp_path,
                                                                         tiny_records):
    export_dir, _ = converted
    data_dir, _ = tiny_records
    files = []
    for i, picture in enumerate(PICTURES[:3]):
        path = tmp_path / f"p{i}.png"
        path.write_bytes(tf.io.encode_png(picture.astype(np.uint8)).numpy())
        files.append(str(path))

    def top(model):
        proc = run_module("cifar10_estimator.predict", "--model", model, "--json", *files,
                          cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [json.loads(line)["top"][0]["class_name"] for line in proc.stdout.splitlines()]

    expected = top(export_dir)
    folder = formats.converted_dir(export_dir)
    manifest = json.load(open(os.path.join(folder, formats.MANIFEST_FILE)))
    for key in ("litert-float32", "onnx-float32"):
        assert top(os.path.join(folder, FORMATS[key].file_name)) == expected, key
    for entry in manifest["files"]:
        path = os.path.join(folder, entry["file"])
        report = tmp_path / f"{entry['format']}.json"
        proc = run_module("cifar10_estimator.evaluate", path, "--data-dir", data_dir,
                          "--report", str(report), cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert formats.LITERT in proc.stdout or formats.ONNX in proc.stdout
        # The gate's figure, read again by evaluate's own pass over the same records.
        assert json.load(open(report))["accuracy"] == pytest.approx(entry["accuracy"], abs=1e-6)


def _copy(export_dir: str, tmp_path) -> str:
    """A copy of an export this test may convert into (the module's fixture converts into the
    suite's own)."""
    import shutil

    return shutil.copytree(export_dir, str(tmp_path / "export" / os.path.basename(export_dir)),
                           ignore=shutil.ignore_patterns(formats.CONVERTED_DIR))


def test_the_gate_refuses_a_file_that_loses_accuracy_and_keeps_the_others(
        tiny_export, tmp_path):
    tiny_export = _copy(tiny_export, tmp_path)
    # Int8 files calibrated on pictures unlike the ones they meet: the training records are
    # near-black, the eval records span every brightness (the tiny model's classes follow
    # brightness), labelled with the SavedModel's own classes, so it scores 100 %. The int8
    # activation ranges clip every brighter picture; the float32 file is unaffected.
    _, signature = client.load_model(tiny_export)
    levels = (np.linspace(0, 255, 100)[:, None, None, None] * np.ones((1, 32, 32, 3))
              + RNG.normal(0, 10, (100, 32, 32, 3))).clip(0, 255).round().astype(np.float32)
    labels = signature(images=tf.constant(levels))["probabilities"].numpy().argmax(axis=1)
    assert len(set(labels)) > 2  # classes the int8 files can confuse
    dark = RNG.uniform(0, 4, (64, 32, 32, 3)).round()
    data = tmp_path / "records"
    data.mkdir()
    for split, (pictures, classes) in {"eval": (levels, labels),
                                       "train": (dark, np.zeros(64, int))}.items():
        with tf.io.TFRecordWriter(schema.record_path(str(data), split)) as writer:
            for picture, label in zip(pictures, classes):
                chw = picture.astype(np.uint8).transpose(2, 0, 1).tobytes()
                writer.write(schema.encode_example(chw, int(label)))
    proc = _convert(tiny_export, str(data), "--formats", "litert-float32,litert-int8,onnx-int8",
                    cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    error = proc.stderr.strip().splitlines()
    assert len(error) == 1 and "not kept, more than --max-accuracy-drop 0.5 points" in error[0]
    assert "litert-int8 lost" in error[0] and "onnx-int8 lost" in error[0], error
    assert "litert-float32" not in error[0]
    folder = formats.converted_dir(tiny_export)
    assert sorted(os.listdir(folder)) == [formats.MANIFEST_FILE, "model-float32.tflite"]
    manifest = json.load(open(os.path.join(folder, formats.MANIFEST_FILE)))
    assert manifest["savedmodel_accuracy"] == 1.0
    assert [e["format"] for e in manifest["files"]] == ["litert-float32"]
    rows = [line.split() for line in proc.stdout.splitlines() if "int8" in line and "%" in line]
    assert [row[-1] for row in rows] == ["no", "no"], proc.stdout


def _variant_export(folder, params: ModelSection, dtype: str) -> str:
    from test_export_trust import _checkpoint

    os.makedirs(folder)
    return export.export_saved_model(ModelSettings(params, compute_dtype=dtype),
                                     _checkpoint(params, str(folder)),
                                     os.path.join(str(folder), "export"))


@pytest.mark.parametrize("fields,dtype", [
    ({"num_layers": 8, "test_time_mirror": True}, "bfloat16"),
    ({"num_layers": 8, "whitening_patch": 2, "test_time_shift": 1}, "float32"),
    ({"model": "tutorial-cnn"}, "bfloat16"),
], ids=["resnet-bf16-mirror", "resnet-whitening-shifts", "cnn-bf16"])
def test_every_network_and_precision_converts_to_float32_files_that_agree(
        fields, dtype, tmp_path):
    # bfloat16 exports are rewritten to float32 (neither runtime runs bfloat16 on a CPU): the
    # graph holds no bfloat16, and the files compute what the SavedModel computes, to bf16's
    # precision.
    export_dir = _variant_export(tmp_path / "export", ModelSection(**fields), dtype)
    _, signature = client.load_model(export_dir)
    graph = conversion.float32_graph(signature)
    assert not [n.name for n in graph.graph_def.node if "bfloat16" in str(n.attr)]
    expected = signature(images=tf.constant(PICTURES))["probabilities"].numpy()
    tolerance = 2e-2 if dtype == "bfloat16" else 1e-4
    for key in ("litert-float32", "onnx-float32"):
        path = tmp_path / FORMATS[key].file_name
        path.write_bytes(conversion.convert(graph, FORMATS[key]))
        found = runtimes.load(str(path), threads=1).probabilities(PICTURES)
        np.testing.assert_allclose(found, expected, atol=tolerance, err_msg=key)


def test_bad_flags_are_one_line_and_write_nothing(tiny_export, tiny_records, tmp_path):
    data_dir, _ = tiny_records
    tiny_export = _copy(tiny_export, tmp_path)
    for flags, says in ((["--formats", "litert-int4"], "--formats 'litert-int4': unknown"),
                        (["--max-accuracy-drop", "-1"], "--max-accuracy-drop"),
                        (["--calibration-pictures", "0"], "--calibration-pictures")):
        proc = _convert(tiny_export, data_dir, *flags, cwd=tmp_path)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    (tmp_path / "empty").mkdir()
    proc = _convert(str(tmp_path / "empty"), data_dir, cwd=tmp_path)
    assert proc.returncode == 2 and "is not a SavedModel folder" in proc.stderr
    assert not os.path.exists(formats.converted_dir(tiny_export))


def test_a_missing_runtime_is_refused_in_one_line_naming_its_extra(converted, tmp_path):
    export_dir, _ = converted
    path = os.path.join(formats.converted_dir(export_dir), "model-float32.onnx")
    # A module set to None in sys.modules fails to import, as an uninstalled one does.
    code = ("import sys; sys.modules['onnxruntime'] = None; "
            "from cifar10_estimator import predict; sys.exit(predict.main(sys.argv[1:]))")
    picture = tmp_path / "p.png"
    picture.write_bytes(tf.io.encode_png(PICTURES[0].astype(np.uint8)).numpy())
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code, "--model", path, str(picture)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ONNX Runtime is not installed" in lines[0], lines
    assert "pip install 'cifar10_estimator[onnx]'" in lines[0], lines


# ---------------------------------------------------------------------------------------------
# Foreign files: refused before their runtime loads them.


def _function_graph(body) -> conversion.Float32Graph:
    """A Float32Graph of ``body`` (images -> probabilities), frozen."""
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2)

    function = tf.function(body, input_signature=[tf.TensorSpec([None, 32, 32, 3],
                                                                 tf.float32)])
    frozen = convert_variables_to_constants_v2(function.get_concrete_function())
    return conversion.Float32Graph(frozen.graph.as_graph_def(), frozen.inputs[0].name,
                                   frozen.outputs[0].name)


def _refused(path: str, says: str) -> None:
    with pytest.raises(UserError) as refused:
        runtimes.load(path)
    message = str(refused.value)
    assert path in message and says in message and "\n" not in message, message
    assert "--trust-export" in message or "not a file beside it" in message


def _tflite(tmp_path, body, name: str, **converter_flags) -> str:
    graph = _function_graph(body)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([graph.function])
    for key, value in converter_flags.items():
        if key == "supported_ops":
            converter.target_spec.supported_ops = value
        else:
            setattr(converter, key, value)
    path = tmp_path / name
    path.write_bytes(converter.convert())
    return str(path)


def test_a_litert_file_with_a_flex_or_custom_op_is_refused_before_it_loads(tmp_path):
    def with_tf_op(images):  # a TensorFlow op LiteRT has no builtin for: TF Select runs it
        codes = tf.strings.length(tf.strings.as_string(images[:, 0, 0, 0]))
        return tf.nn.softmax(tf.stack([tf.cast(codes, tf.float32)] * 2, axis=1))

    flex = _tflite(tmp_path, with_tf_op, "flex.tflite", supported_ops=[
        tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS])
    _refused(flex, "TF Select (Flex) op")
    custom = _tflite(tmp_path, with_tf_op, "custom.tflite", allow_custom_ops=True)
    _refused(custom, "custom op")


def _onnx_model(tmp_path):
    graph = _function_graph(lambda images: tf.nn.softmax(tf.reduce_mean(images, [1, 2])))
    return onnx.ModelProto.FromString(conversion.convert(graph, FORMATS["onnx-float32"]))


def test_an_onnx_file_with_a_foreign_domain_a_function_or_far_data_is_refused(tmp_path):
    model = _onnx_model(tmp_path)
    foreign = onnx.ModelProto()
    foreign.CopyFrom(model)
    foreign.graph.node[0].domain = "com.example.ops"
    path = tmp_path / "custom.onnx"
    path.write_bytes(foreign.SerializeToString())
    _refused(str(path), "of the domain 'com.example.ops'")

    functional = onnx.ModelProto()
    functional.CopyFrom(model)
    functional.functions.add(name="Helper", domain="com.example")
    path = tmp_path / "function.onnx"
    path.write_bytes(functional.SerializeToString())
    _refused(str(path), "defines the function 'Helper'")

    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\0" * 64)
    inner = tmp_path / "model"
    inner.mkdir()
    (inner / "link.bin").symlink_to(outside)
    for location in ("../outside.bin", str(outside), "link.bin"):
        far = onnx.ModelProto()
        far.CopyFrom(model)
        tensor = far.graph.initializer.add(name="w", data_type=onnx.TensorProto.FLOAT,
                                           dims=[16])
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value=location)
        path = inner / "far.onnx"
        path.write_bytes(far.SerializeToString())
        _refused(str(path), f"from {location!r}, outside its folder")


def test_predict_refuses_a_foreign_file_in_one_line(tmp_path):
    model = _onnx_model(tmp_path)
    model.graph.node[0].domain = "com.microsoft"
    path = tmp_path / "foreign.onnx"
    path.write_bytes(model.SerializeToString())
    picture = tmp_path / "p.png"
    picture.write_bytes(tf.io.encode_png(PICTURES[0].astype(np.uint8)).numpy())
    proc = run_module("cifar10_estimator.predict", "--model", str(path), str(picture),
                      cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "of the domain 'com.microsoft'" in lines[0], lines


def test_the_op_allow_lists_are_the_ops_every_conversion_uses(our_exports):
    # Every export variant of the SavedModel check's test (both networks, fp32 and bf16,
    # test-time views, the whitening layer) in every format: the lists hold each op a
    # conversion uses (else our own files would be refused), and none that no conversion uses
    # (a list that grows by accident admits kernels no file of ours needs).
    from ai_edge_litert import schema_py_generated as schema

    from cifar10_estimator.serving import runtime_trust

    names = {code: name for name, code in vars(schema.BuiltinOperator).items()
             if not name.startswith("_")}
    used = {formats.LITERT: set(), formats.ONNX: set()}
    calibration = RNG.uniform(0, 255, (4, 32, 32, 3)).astype(np.float32)
    for name, export_dir in our_exports.items():
        _, signature = client.load_model(export_dir)
        graph = conversion.float32_graph(signature)
        for fmt in FORMATS.values():
            data = conversion.convert(graph, fmt, calibration)
            if fmt.runtime == formats.LITERT:
                model = schema.Model.GetRootAs(data, 0)
                codes = (model.OperatorCodes(i) for i in range(model.OperatorCodesLength()))
                used[fmt.runtime] |= {names[max(c.BuiltinCode(), c.DeprecatedBuiltinCode())]
                                      for c in codes}
            else:
                used[fmt.runtime] |= {n.op_type for n in
                                      onnx.ModelProto.FromString(data).graph.node}
    assert sorted(used[formats.LITERT]) == list(runtime_trust.LITERT_OPS)
    assert sorted(used[formats.ONNX]) == list(runtime_trust.ONNX_OPS)


def test_an_op_outside_the_allow_list_is_refused(tmp_path):
    model = _onnx_model(tmp_path)
    model.graph.node[-1].op_type = "Hardmax"  # an ONNX op, and the classifier's last
    path = tmp_path / "hardmax.onnx"
    path.write_bytes(model.SerializeToString())
    _refused(str(path), "runs the ONNX op 'Hardmax'")
    litert = _tflite(tmp_path, lambda images: tf.nn.softmax(tf.math.tanh(
        tf.reduce_mean(images, [1, 2]))), "tanh.tflite")
    _refused(litert, "runs the LiteRT op TANH")
