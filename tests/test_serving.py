"""The export as TF Serving users call it, checked with real clients.

One tiny model is trained and exported for the module; the clients are a fresh Python
process with ``tf.saved_model.load``, ``saved_model_cli run`` (``--input_exprs`` for the bytes
signature), a REST-style JSON body decoded by TF Serving's documented rule (``{"b64": ...}``
for inputs named ``*_bytes``), and the warm-up file read with ``tensorflow_serving.apis``.
"""

import base64
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.data import schema
from cifar10_estimator.training.estimator import model_fn
from cifar10_estimator.config.settings import ModelSection
from cifar10_estimator.serving import client, export, warmup
from cifar10_estimator.errors import UserError
from trainer_fixtures import checkpoint_of, run_module, trainer_args

_SAVED_MODEL_CLI = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")


@pytest.fixture
def exported(tiny_export) -> str:
    """The suite's tiny export (3 steps), which these tests only read."""
    return tiny_export


def _pictures(tmp_path) -> list[str]:
    """PNG (RGB, grayscale, RGBA), JPEG, GIF-free set of files of odd sizes."""
    rng = np.random.default_rng(0)
    files = []
    for name, data in (
            ("rgb.png", tf.io.encode_png(rng.integers(0, 256, (45, 37, 3), dtype=np.uint8))),
            ("grey.png", tf.io.encode_png(rng.integers(0, 256, (20, 64, 1), dtype=np.uint8))),
            ("rgba.png", tf.io.encode_png(rng.integers(0, 256, (33, 33, 4), dtype=np.uint8))),
            ("photo.jpg", tf.io.encode_jpeg(rng.integers(0, 256, (70, 50, 3), dtype=np.uint8)))):
        path = tmp_path / name
        path.write_bytes(data.numpy())
        files.append(str(path))
    return files


_FRESH = """
import json, sys
import numpy as np, tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
paths = json.loads(sys.argv[2])
blobs = [open(p, "rb").read() for p in paths]
out = {name: {k: v.numpy().tolist() if v.dtype != tf.string else [s.decode() for s in
              v.numpy().reshape(-1)] for k, v in model.signatures[name](**inputs).items()}
       for name, inputs in (("serving_bytes", {"image_bytes": tf.constant(blobs)}),)}
out["signatures"] = sorted(model.signatures)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_bytes_signature_in_a_fresh_process_matches_predict_for_the_same_files(
        exported, tmp_path):
    files = _pictures(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _FRESH, exported, json.dumps(files)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["signatures"] == ["classify", "serving_bytes", "serving_default",
                                 "serving_examples"]
    served = np.array(out["serving_bytes"]["probabilities"])
    # predict's own path: decode in Python with the same conversion, then the images input.
    model = tf.saved_model.load(exported)
    local = model.signatures["serving_default"](
        images=tf.stack([client.load_image(p) for p in files]))
    np.testing.assert_allclose(served, local["probabilities"].numpy(), rtol=1e-5, atol=1e-6)
    names = [line.strip() for line in open(os.path.join(exported, export.CLASS_NAMES_FILE))]
    assert out["serving_bytes"]["class_names"] == [names[i] for i in served.argmax(1)]


@pytest.mark.slow
def test_every_predict_signature_names_its_top_class_and_classify_returns_names(exported):
    model = tf.saved_model.load(exported)
    rng = np.random.default_rng(1)
    chw = rng.integers(0, 256, (3, schema.IMAGE_BYTES), dtype=np.uint8)
    examples = tf.constant([schema.encode_example(row.tobytes(), 1) for row in chw])
    hwc = chw.reshape(3, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float32)
    by_images = model.signatures["serving_default"](images=tf.constant(hwc))
    by_examples = model.signatures["serving_examples"](examples=examples)
    np.testing.assert_allclose(by_images["probabilities"], by_examples["probabilities"],
                               rtol=1e-5, atol=1e-6)
    assert by_images["class_names"].dtype == tf.string
    assert by_images["class_names"].numpy().tolist() == [
        schema.CLASS_NAMES[i].encode() for i in by_images["classes"].numpy()]
    classified = model.signatures["classify"](inputs=examples)
    assert classified["classes"].numpy()[0].tolist() == [n.encode() for n in schema.CLASS_NAMES]
    np.testing.assert_allclose(classified["scores"], by_examples["probabilities"], rtol=1e-5)


@pytest.mark.slow
def test_the_classify_signature_has_the_classify_method_for_tf_serving(exported, tmp_path):
    proc = subprocess.run([_SAVED_MODEL_CLI, "show", "--dir", exported, "--all"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    block = proc.stdout.split("signature_def['classify']")[1].split("signature_def[")[0]
    assert "Method name is: tensorflow/serving/classify" in block
    assert "inputs['inputs']" in block and "outputs['classes']" in block
    bytes_block = proc.stdout.split("signature_def['serving_bytes']")[1].split("signature_def[")[0]
    assert "inputs['image_bytes']" in bytes_block and "dtype: DT_STRING" in bytes_block


@pytest.mark.slow
def test_a_session_runs_every_signature_by_tensor_names_as_tf_serving_does(exported):
    """TF Serving's C++ loader restores the MetaGraph into a Session and runs each signature
    by its tensor names; ``tf.compat.v1.saved_model.load`` does the same from Python."""
    png = tf.io.encode_png(np.full((9, 13, 3), 200, np.uint8)).numpy()
    record = schema.encode_example(bytes(schema.IMAGE_BYTES), 0)
    feeds = {"serving_default": {"images": np.zeros((2, 32, 32, 3), np.float32)},
             "serving_bytes": {"image_bytes": [png, png]},
             "serving_examples": {"examples": [record, record]},
             "classify": {"inputs": [record, record]}}
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as sess:
        meta_graph = tf.compat.v1.saved_model.load(sess, ["serve"], exported)
        for name, inputs in feeds.items():
            signature = meta_graph.signature_def[name]
            out = sess.run({k: v.name for k, v in signature.outputs.items()},
                           {signature.inputs[k].name: v for k, v in inputs.items()})
            assert out["scores" if name == "classify" else "probabilities"].shape == (2, 10)
    assert meta_graph.signature_def["classify"].method_name == "tensorflow/serving/classify"


@pytest.mark.slow
def test_signatures_bind_inputs_by_name_and_carry_frozen_weights(exported, tmp_path):
    """The export is a TF2 SavedModel: its loaded signatures know their input names (a TF1
    export's do not, and TF formats the whole input into a dropped error on every call), and
    the weights are constants (no variables to read per request). Its fingerprint is the
    one TensorFlow computes for the edited proto."""
    from tensorflow.python.saved_model import fingerprinting_utils

    model = tf.saved_model.load(exported)
    for name, key in (("serving_default", "images"), ("serving_bytes", "image_bytes"),
                      ("serving_examples", "examples"), ("classify", "inputs")):
        assert list(model.signatures[name].function_type.parameters) == [key]
    assert not model.signatures["serving_default"].variables
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    os.remove(copy / "fingerprint.pb")
    fingerprinting_utils.write_fingerprint(str(copy))
    assert (tf.saved_model.experimental.read_fingerprint(str(copy)) ==
            tf.saved_model.experimental.read_fingerprint(exported))


@pytest.mark.parametrize("trained, asked", [(14, 8), (8, 14)])
def test_a_checkpoint_of_another_depth_is_refused_and_nothing_is_written(
        trained, asked, tmp_path):
    checkpoint = checkpoint_of(trained, tmp_path)
    out = tmp_path / "export"
    with pytest.raises(UserError, match="--num-layers and --resnet-version") as error:
        export.export_saved_model(model_fn.ModelSettings(ModelSection(num_layers=asked)),
                                  checkpoint, str(out))
    assert ("weights this model does not use" if trained > asked else "lacks it") in str(
        error.value)
    assert not out.exists() or not os.listdir(out)


@pytest.mark.slow
def test_saved_model_cli_runs_the_bytes_signature_from_input_exprs(exported, tmp_path):
    png = tf.io.encode_png(np.full((9, 13, 3), 200, np.uint8)).numpy()
    proc = subprocess.run(
        [_SAVED_MODEL_CLI, "run", "--dir", exported, "--tag_set", "serve", "--signature_def",
         "serving_bytes", "--input_exprs", f"image_bytes=[{png!r}]"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Result for output key class_names" in proc.stdout
    assert "Result for output key probabilities" in proc.stdout


def _decode_rest_instances(body: dict) -> dict:
    """TF Serving's REST rule: a ``{"b64": ...}`` value becomes the bytes it encodes."""
    columns: dict[str, list] = {}
    for instance in body["instances"]:
        for key, value in instance.items():
            if isinstance(value, dict) and set(value) == {"b64"}:
                value = base64.b64decode(value["b64"])
            columns.setdefault(key, []).append(value)
    return columns


@pytest.mark.slow
def test_a_rest_request_with_b64_image_bytes_is_served(exported, tmp_path):
    files = _pictures(tmp_path)
    body = json.loads(json.dumps({"signature_name": "serving_bytes", "instances": [
        {"image_bytes": {"b64": base64.b64encode(open(p, "rb").read()).decode()}}
        for p in files]}))
    inputs = _decode_rest_instances(body)
    model = tf.saved_model.load(exported)
    out = model.signatures[body["signature_name"]](
        image_bytes=tf.constant(inputs["image_bytes"]))
    assert out["probabilities"].shape == (len(files), 10)


@pytest.mark.slow
def test_bad_bytes_are_a_clear_error_of_the_request_and_the_model_serves_on(exported):
    model = tf.saved_model.load(exported)
    with pytest.raises(tf.errors.InvalidArgumentError, match="image"):
        model.signatures["serving_bytes"](image_bytes=tf.constant([b"this is no picture"]))
    png = tf.io.encode_png(np.zeros((8, 8, 3), np.uint8))
    assert model.signatures["serving_bytes"](image_bytes=tf.stack([png]))[
        "probabilities"].shape == (1, 10)


@pytest.mark.slow
def test_the_warmup_file_parses_with_serving_protos_and_every_request_runs(exported):
    from tensorflow_serving.apis import prediction_log_pb2

    path = os.path.join(exported, warmup.WARMUP_FILE)
    logs = [prediction_log_pb2.PredictionLog.FromString(r.numpy())
            for r in tf.data.TFRecordDataset(path)]
    model = tf.saved_model.load(exported)
    ran = []
    for entry in logs:
        if entry.HasField("predict_log"):
            request = entry.predict_log.request
            inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            out = model.signatures[request.model_spec.signature_name](
                **{k: tf.constant(v) for k, v in inputs.items()})
            assert out["probabilities"].shape[1] == 10
        else:
            request = entry.classify_log.request
            examples = [e.SerializeToString() for e in request.input.example_list.examples]
            out = model.signatures[request.model_spec.signature_name](
                inputs=tf.constant(examples))
            assert out["scores"].shape == (1, 10)
        ran.append(request.model_spec.signature_name)
    assert sorted(ran) == ["classify", "serving_bytes", "serving_default", "serving_examples"]


@pytest.mark.slow
def test_with_a_moving_average_the_export_serves_the_averaged_weights(tiny_records, tmp_path):
    data_dir, rows = tiny_records
    job_dir = str(tmp_path / "job")
    result = train.run(trainer_args(data_dir, job_dir, "--train-steps", "12",
                                    "--moving-average-decay", "0.5",
                                    "--eval-throttle-secs", "100000"))
    records = tf.constant([r.numpy() for r in tf.data.TFRecordDataset(
        schema.record_path(data_dir, "eval"))])
    served = tf.saved_model.load(result.export_path).signatures["serving_examples"](
        examples=records)
    # The export's accuracy is the final evaluation's: both use the averaged weights.
    accuracy = np.mean(served["classes"].numpy() == rows["eval"][1])
    assert accuracy == pytest.approx(result.eval_metrics["accuracy"], abs=1e-6)
    # The same checkpoint exported with its raw weights gives other probabilities.
    raw = export.export_saved_model(model_fn.ModelSettings(ModelSection(num_layers=8)),
                                    tf.train.latest_checkpoint(job_dir), str(tmp_path / "raw"))
    raw_served = tf.saved_model.load(raw).signatures["serving_examples"](examples=records)
    assert not np.allclose(raw_served["probabilities"], served["probabilities"], atol=1e-4)


@pytest.mark.slow
def test_predict_takes_the_export_folder_and_prints_json(exported, tmp_path):
    files = _pictures(tmp_path)[:2]
    base = os.path.dirname(exported)
    older = os.path.join(base, "1000000000")  # an older version: the newest one is used
    shutil.copytree(exported, older)
    proc = run_module("cifar10_estimator.predict", "--saved-model", base, "--json", "--top",
                      "2", *files, cwd=tmp_path, timeout=120)
    shutil.rmtree(older)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    names = [line.strip() for line in open(os.path.join(exported, export.CLASS_NAMES_FILE))]
    assert [r["file"] for r in rows] == files
    for row in rows:
        assert row["saved_model"] == exported and len(row["top"]) == 2
        assert all(t["class_name"] in names and 0 <= t["probability"] <= 1 for t in row["top"])
        assert row["top"][0]["probability"] >= row["top"][1]["probability"]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_module("cifar10_estimator.predict", "--saved-model", str(empty), *files,
                      cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "holds no numbered versions" in proc.stderr
