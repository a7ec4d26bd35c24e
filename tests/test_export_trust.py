"""A SavedModel is a program: ``predict`` and ``evaluate`` check an export before they load it
(``serving.trust``), and refuse one that holds more than this package's exports hold.

The allow-lists are derived here from real exports of both networks in both serving precisions,
with and without test-time mirroring, both ResNet versions, and the whitening layer with
multi-crop test-time views; a change to the export that uses
another op fails ``test_the_allow_lists_are_the_ops_our_exports_use`` until the op is added to
the list, consciously. The hostile SavedModels are real (built with TensorFlow, or our export
with its proto edited: ``fuzz.serving``), and are shown to act when loaded unchecked.
"""

import os
import subprocess
import sys

import pytest

from cifar10_estimator.errors import UserError
from cifar10_estimator.serving import trust
from fuzz import serving as hostile
from trainer_fixtures import REPO, built_once, run_concurrently, run_module

# The exports the allow-lists come from: each network in each serving precision, each with
# test-time mirroring, and both ResNet versions (--model, --num-layers 8, --resnet-version,
# --serving-precision, --test-time-mirror). The op set depends only on these settings: the
# weights are frozen in as constants, so training a few steps would change no op.
VARIANTS = {
    "resnet-fp32": ({"num_layers": 8}, "float32"),
    "resnet-bf16-mirror": ({"num_layers": 8, "test_time_mirror": True}, "bfloat16"),
    "resnet-v2-fp32": ({"num_layers": 8, "resnet_version": 2}, "float32"),
    # The whitening layer and the six test-time views of multi-crop evaluation.
    "resnet-levers-bf16": ({"num_layers": 8, "whitening_patch": 2, "test_time_shift": 1,
                            "test_time_mirror": True}, "bfloat16"),
    "cnn-fp32-mirror": ({"model": "tutorial-cnn", "test_time_mirror": True}, "float32"),
    "cnn-bf16": ({"model": "tutorial-cnn"}, "bfloat16"),
}
# What each hostile build's refusal names: its op.
BUILD_OPS = {name: hostile.HOSTILE_BUILD_OPS.get(name, name) for name in hostile.HOSTILE_BUILDS}


def _checkpoint(params, folder: str) -> str:
    """A checkpoint of the network ``params`` describe (initial weights, global step 0), as
    Estimator names them."""
    import tensorflow as tf

    from cifar10_estimator.model import networks

    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope(networks.SCOPES[params.model]):
            networks.logits(tf.zeros([1, 32, 32, 3]), params, is_training=False, num_classes=10)
        step = tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(
                session, os.path.join(folder, "model.ckpt"), global_step=step)


@pytest.fixture(scope="module")
def our_exports(tmp_path_factory, tiny_export) -> dict[str, str]:
    """Name -> SavedModel folder: the VARIANTS, written by the export the trainer runs
    (``export.export_saved_model``, about 1 s each) once for the whole run (``built_once``:
    under pytest-xdist, by the first test process that asks; each reads a copy of its own),
    and the trained ``tiny_export``."""
    from cifar10_estimator.config.settings import ModelSection
    from cifar10_estimator.model.model_settings import ModelSettings
    from cifar10_estimator.serving import export

    def build(root: str) -> None:
        for name, (fields, dtype) in VARIANTS.items():
            folder = os.path.join(root, name)
            os.makedirs(folder)
            params = ModelSection(**fields)
            export.export_saved_model(
                ModelSettings(params, compute_dtype=dtype), _checkpoint(params, folder),
                os.path.join(folder, "export"))

    root = built_once(tmp_path_factory, "export-trust-variants", build)
    exports = {"trained-resnet": tiny_export}
    for name in VARIANTS:
        (version,) = os.listdir(os.path.join(root, name, "export"))  # export/<version>
        exports[name] = os.path.join(root, name, "export", version)
    return exports


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> tuple[dict[str, str], str]:
    """The hostile SavedModels (name -> folder) and the folder their writes go to."""
    root = tmp_path_factory.mktemp("hostile")
    canaries = str(root / "canaries")
    return hostile.hostile_exports(str(root / "builds"), canaries), canaries


@pytest.fixture(scope="module")
def picture(tmp_path_factory) -> str:
    from PIL import Image

    path = tmp_path_factory.mktemp("picture") / "picture.png"
    Image.new("RGB", (40, 30), (200, 30, 90)).save(path)
    return str(path)


def _one_line_naming(message: str, *names: str) -> None:
    assert "\n" not in message.strip(), message
    for name in names:
        assert name in message, (name, message)


def _refusal(folder: str) -> str:
    with pytest.raises(UserError) as refused:
        trust.check_export(folder)
    return str(refused.value)


# --- the lists ------------------------------------------------------------------------------


def test_the_lists_are_sorted_literals_without_a_file_or_python_op_for_signatures():
    for listed in (trust.SERVING_OPS, trust.SAVE_OPS, trust.RESTORE_OPS, trust.OBJECT_KINDS,
                   trust.COLLECTIONS):
        assert list(listed) == sorted(set(listed)), listed
    assert not set(trust.SERVING_OPS) & set(trust.SAVE_OPS + trust.RESTORE_OPS)
    # Every op that acts outside the model is refused in a signature; the saver's own
    # functions alone may hold its checkpoint ops.
    assert not set(hostile.HOSTILE_OPS) & set(trust.SERVING_OPS)
    assert set(hostile.HOSTILE_OPS) & set(trust.SAVE_OPS) == {"MergeV2Checkpoints", "SaveV2"}
    assert set(hostile.HOSTILE_OPS) & set(trust.RESTORE_OPS) == {"RestoreV2"}


def test_the_file_name_is_tensorflows():
    import tensorflow as tf

    assert trust.SAVED_MODEL_FILE == tf.saved_model.SAVED_MODEL_FILENAME_PB


def test_the_commands_read_the_flag_without_loading_tensorflow():
    # predict and evaluate import trust.TRUST_FLAG before TensorFlow loads.
    code = ("import sys; import cifar10_estimator.serving.trust; "
            "sys.exit('tensorflow' in sys.modules or 'google.protobuf' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=60).returncode == 0


@pytest.mark.slow
def test_the_allow_lists_are_the_ops_our_exports_use(our_exports):
    used = {role: set() for role in (trust.GRAPH, trust.SERVING, trust.SAVE, trust.RESTORE)}
    collections, kinds = set(), set()
    for folder in our_exports.values():
        for meta_graph in trust.read_saved_model(folder).meta_graphs:
            for use in trust.op_uses(meta_graph):
                used[use.role].add(use.op)
            collections |= set(meta_graph.collection_def)
            kinds |= {o.WhichOneof("kind") for o in meta_graph.object_graph_def.nodes}
    serving = used[trust.GRAPH] | used[trust.SERVING]
    derived = {"SERVING_OPS": serving, "SAVE_OPS": used[trust.SAVE] - serving,
               "RESTORE_OPS": used[trust.RESTORE] - serving, "COLLECTIONS": collections,
               "OBJECT_KINDS": kinds}
    for name, found in derived.items():
        listed = set(getattr(trust, name))
        assert not found - listed, (
            f"our exports use {sorted(found - listed)}, which trust.{name} lacks: add them to "
            f"the list if the export needs them (a SavedModel is a program: docs/serving.md)")
        assert not listed - found, (
            f"trust.{name} lists {sorted(listed - found)}, which no export uses any more: "
            f"remove them")


@pytest.mark.slow
def test_our_exports_pass_and_the_walk_sees_what_tensorflows_own_misses(our_exports):
    from tensorflow.python.framework import meta_graph as meta_graph_lib

    for name, folder in our_exports.items():
        trust.check_export(folder)
        for meta_graph in trust.read_saved_model(folder).meta_graphs:
            ours = {use.op for use in trust.op_uses(meta_graph)}
            theirs = set(meta_graph_lib.ops_used_by_graph_def(meta_graph.graph_def))
            assert theirs <= ours, (name, theirs - ours)
            # saved_model_cli scan's walk follows no While body: the picture decoding of
            # serving_bytes, in map_fn's body, escapes it.
            assert "DecodeImage" in ours - theirs, name


# --- hostile SavedModels --------------------------------------------------------------------


@pytest.mark.slow
def test_the_hostile_builds_act_when_loaded_without_the_check(builds):
    # Loaded unchecked, as before: the main_op and the resource's initializer write while the
    # SavedModel loads, the others when serving_default is called.
    import tensorflow as tf

    folders, canaries = builds
    try:
        for name in ("tf1-main-op", "resource-init"):
            tf.saved_model.load(folders[name])
        assert sorted(os.listdir(canaries)) == ["main_op", "resource"]
        for name in ("WriteFile", "SaveV2", "Save", "nested-WriteFile"):
            tf.saved_model.load(folders[name]).signatures["serving_default"](
                images=tf.zeros([1, 32, 32, 3]))
        assert {"write", "save", "nested"} <= set(os.listdir(canaries))
    finally:
        for written in os.listdir(canaries):
            os.remove(os.path.join(canaries, written))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILD_OPS))
def test_a_hostile_export_is_refused_in_one_line_naming_its_op(builds, name):
    from cifar10_estimator.serving import client

    folders, canaries = builds
    with pytest.raises(UserError) as refused:
        client.load_model(folders[name])
    _one_line_naming(str(refused.value), BUILD_OPS[name],
                     os.path.join(folders[name], "saved_model.pb"), trust.TRUST_FLAG)
    assert not os.listdir(canaries)


@pytest.mark.slow
def test_saved_model_cli_scans_walk_misses_a_write_file_in_a_while_body(builds):
    # saved_model_cli scan checks the ops meta_graph.ops_used_by_graph_def finds, which follows
    # no If branch or While body: the nested WriteFile escapes its deny-list.
    from tensorflow.python.framework import meta_graph as meta_graph_lib

    folders, _ = builds
    meta_graph = trust.read_saved_model(folders["nested-WriteFile"]).meta_graphs[0]
    assert "WriteFile" not in meta_graph_lib.ops_used_by_graph_def(meta_graph.graph_def)
    assert "WriteFile" in {use.op for use in trust.op_uses(meta_graph)}


@pytest.mark.slow
@pytest.mark.parametrize("case", [case for kind in hostile.KINDS if kind.name == "hostile-export"
                                  for case in kind.regressions if "edit" in case],
                         ids=lambda case: f"{case['edit']}-{case.get('kind', case['op'])}")
def test_our_export_with_an_op_or_init_op_edited_in_is_refused(our_exports, tmp_path, case):
    import shutil

    folder = str(tmp_path / "1700000000")
    shutil.copytree(our_exports["resnet-fp32"], folder)
    named = hostile.edit_export(folder, case)
    _one_line_naming(_refusal(folder), named, trust.TRUST_FLAG)


def test_a_saved_model_pb_past_the_bound_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "saved_model.pb"
    with open(path, "wb") as f:  # a sparse file: the bound's size, plus one byte
        f.truncate(trust.MAX_SAVED_MODEL_BYTES + 1)
    message = _refusal(str(tmp_path))
    _one_line_naming(message, str(path), f"{trust.MAX_SAVED_MODEL_BYTES + 1:,} bytes",
                     trust.TRUST_FLAG)


def test_a_damaged_saved_model_pb_is_refused_in_one_line(tmp_path):
    (tmp_path / "saved_model.pb").write_bytes(b"\x0a\xff\xff\xff\xff\x0f")
    _one_line_naming(_refusal(str(tmp_path)), str(tmp_path / "saved_model.pb"), "parsed")


def test_names_in_the_file_are_shown_on_one_line(tmp_path):
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    graph = proto.meta_graphs.add().graph_def
    function = graph.library.function.add()
    function.signature.name = "f\nrm -rf"
    function.node_def.add(name="n", op="Write\nFile" + "x" * 10_000)
    (tmp_path / "saved_model.pb").write_bytes(proto.SerializeToString())
    message = _refusal(str(tmp_path))
    _one_line_naming(message, "'Write\\nFile", "'f\\nrm -rf'")
    assert len(message) < 600, message


def test_a_function_attribute_naming_no_function_is_checked_as_an_op(tmp_path):
    # TensorFlow instantiates the registered op of a name the library lacks: a call whose "f"
    # says WriteFile runs WriteFile.
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    node = proto.meta_graphs.add().graph_def.node.add(name="call", op="StatefulPartitionedCall")
    node.attr["f"].func.name = "WriteFile"
    (tmp_path / "saved_model.pb").write_bytes(proto.SerializeToString())
    _one_line_naming(_refusal(str(tmp_path)), "runs the op WriteFile in its graph")


# --- the commands, as a user runs them ------------------------------------------------------


def _with_a_convolution_made_write_file(export: str, folder: str) -> str:
    """A copy of ``export`` in ``folder`` whose network's first Conv2D node is a WriteFile."""
    import shutil

    from tensorflow.core.protobuf import saved_model_pb2

    shutil.copytree(export, folder)
    path = os.path.join(folder, "saved_model.pb")
    proto = saved_model_pb2.SavedModel()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    network = next(f for f in proto.meta_graphs[0].graph_def.library.function
                   if f.signature.name.startswith("__inference_network"))
    next(n for n in network.node_def if n.op == "Conv2D").op = "WriteFile"
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return folder


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if "error:" in line]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["WriteFile", "nested-WriteFile", "PyFunc", "tf1-main-op",
                                  "our-export-edited"])
def test_predict_refuses_a_hostile_export_and_nothing_is_written(
        builds, our_exports, picture, tmp_path, name):
    folders, canaries = builds
    if name == "our-export-edited":  # the trained export, its first convolution made WriteFile
        folder = _with_a_convolution_made_write_file(our_exports["trained-resnet"],
                                                     str(tmp_path / "1700000000"))
        op = "WriteFile"
    else:
        folder, op = folders[name], BUILD_OPS[name]
    proc = run_module("cifar10_estimator.predict", "--saved-model", folder, picture)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == ""
    errors = _error_lines(proc)
    assert len(errors) == 1, proc.stderr[-2000:]
    _one_line_naming(errors[0], f"runs the op {op}", os.path.join(folder, "saved_model.pb"),
                     trust.TRUST_FLAG)
    assert not os.listdir(canaries)


@pytest.mark.slow
def test_evaluate_refuses_a_hostile_export_and_nothing_is_written(builds, tiny_records):
    # The TF1 main_op, which tf.saved_model.load runs while it loads: evaluate loads an export
    # through the same client.load_model as predict.
    folders, canaries = builds
    name = "tf1-main-op"
    proc = run_module("cifar10_estimator.evaluate", folders[name], "--data-dir",
                      tiny_records[0])
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = _error_lines(proc)
    assert len(errors) == 1, proc.stderr[-2000:]
    _one_line_naming(errors[0], f"runs the op {BUILD_OPS[name]}", folders[name],
                     trust.TRUST_FLAG)
    assert not os.listdir(canaries)
    assert not [n for n in os.listdir(os.path.dirname(folders[name])) if n.startswith("eval")]


@pytest.mark.slow
def test_a_benign_foreign_export_is_refused_and_loads_with_trust_export(
        tmp_path, tiny_records, picture):
    folder = hostile.benign_foreign_export(str(tmp_path / "foreign" / "1"))
    message = _refusal(folder)
    _one_line_naming(message, "runs the op", trust.TRUST_FLAG)
    # predict and evaluate, each in a process of its own, at once.
    predicted, evaluated = run_concurrently(
        lambda: run_module("cifar10_estimator.predict", "--saved-model", folder,
                           "--trust-export", picture),
        lambda: run_module("cifar10_estimator.evaluate", str(tmp_path / "foreign"),
                           "--data-dir", tiny_records[0], "--trust-export"))
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    assert predicted.stdout.startswith(f"{picture}: "), predicted.stdout
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "accuracy = " in evaluated.stdout
