"""``estimator_compat``: tf.estimator 2.15.0 on every TensorFlow from 2.15 to the newest tested.

What it supplies is listed here by name, and so is every private TensorFlow module the estimator
and this package import: a release that removes one more fails here with its name, not deep in
a training run.
"""

import ast
import importlib
import os
import subprocess
import sys
import types

import pytest
import tensorflow as tf
import tensorflow_estimator

from cifar10_estimator import estimator_compat

pytestmark = pytest.mark.timeout(120)

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(estimator_compat.__file__)))
ESTIMATOR_ROOT = os.path.dirname(os.path.abspath(tensorflow_estimator.__file__))
TF_MINOR = tuple(int(part) for part in tf.__version__.split(".")[:2])
REMOVED = TF_MINOR >= (2, 16)  # the release that removed all four pieces


def _private_imports(root: str, skip_tests: bool) -> set[tuple[str, str]]:
    """(module, name) of every ``from tensorflow.python/core... import name`` under root;
    (module, "") for ``import tensorflow.python...``."""
    found = set()
    for folder, _, files in os.walk(root):
        for file in files:
            if not file.endswith(".py") or (skip_tests and file.endswith("_test.py")):
                continue
            tree = ast.parse(open(os.path.join(folder, file), encoding="utf-8").read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    if node.module.startswith(("tensorflow.python", "tensorflow.core")):
                        found.update((node.module, alias.name) for alias in node.names)
                elif isinstance(node, ast.Import):
                    found.update((alias.name, "") for alias in node.names
                                 if alias.name.startswith(("tensorflow.python.",
                                                           "tensorflow.core.")))
    return found


def _unresolved(imports: set[tuple[str, str]]) -> list[str]:
    missing = []
    for module, name in sorted(imports):
        try:
            loaded = importlib.import_module(module)
            if name and not hasattr(loaded, name):
                importlib.import_module(f"{module}.{name}")
        except ImportError as e:
            missing.append(f"{module} {name}: {e}")
    return missing


def test_every_private_tensorflow_import_of_the_estimator_resolves():
    imports = _private_imports(os.path.join(ESTIMATOR_ROOT, "python"), skip_tests=True)
    assert len(imports) > 100  # the estimator's own list, not an empty walk
    assert (estimator_compat.COORDINATOR_MODULE.rpartition(".")[0], "estimator_training") \
        in imports
    assert not _unresolved(imports)


def test_every_private_tensorflow_import_of_the_package_resolves():
    imports = _private_imports(os.path.join(PACKAGE_ROOT, "cifar10_estimator"),
                               skip_tests=False)
    # What the package itself reaches into (beyond the estimator): named, so a new one is seen.
    assert {module for module, _ in imports} == {
        "tensorflow.core.protobuf",                   # saved_model_pb2: the export's proto
        "tensorflow.python.util",                     # IsMklEnabled; tf_export, LazyLoader
        "tensorflow.python.saved_model",              # fingerprinting_utils
        "tensorflow.python.distribute",               # the distribute coordinator
        "tensorflow.python.training",                 # server_lib.ClusterSpec
        # convert_variables_to_constants_v2: an export's network as one flat graph, for the
        # LiteRT and ONNX converters (serving/conversion.py; TF 2.15 to 2.21 all have it).
        "tensorflow.python.framework.convert_to_constants",
    }
    assert not _unresolved(imports)


def test_what_the_layer_supplies_on_this_tensorflow():
    from tensorflow.python.util import tf_export

    coordinator = importlib.import_module(estimator_compat.COORDINATOR_MODULE)
    tpu = [importlib.import_module(name) for name in estimator_compat.TPU_MODULES]
    supplied = [m for m in (coordinator, *tpu) if getattr(m, "__file__", None) is None]
    # On 2.15 TensorFlow's own modules are used; from 2.16 on, all four are the layer's.
    assert len(supplied) == (4 if REMOVED else 0)
    assert tf_export.ESTIMATOR_API_NAME == "estimator"
    assert tf_export.API_ATTRS["estimator"].names == "_estimator_api_names"
    assert tf_export.API_ATTRS_V1["estimator"].constants == "_estimator_api_constants_v1"
    assert tf.estimator.Estimator is tf.compat.v2.estimator.Estimator
    assert tf.compat.v1.estimator.RunConfig is tf.estimator.RunConfig
    assert tf.compat.v1.estimator.Estimator is not tf.estimator.Estimator  # v1's own class
    # v1 keeps what v2 dropped (the same split TF 2.15 made).
    assert hasattr(tf.compat.v1.estimator, "tpu") and hasattr(tf.compat.v1.estimator,
                                                              "inputs")


@pytest.mark.skipif(not REMOVED, reason="TensorFlow 2.15 has its own TPU modules")
def test_a_tpu_piece_refuses_in_one_line():
    from tensorflow.python.tpu import session_support, tpu_embedding

    with pytest.raises(estimator_compat.TPUUnavailable) as refused:
        session_support.start_worker_watchdog(None)
    message = str(refused.value)
    assert "\n" not in message and "TensorFlow 2.15" in message
    assert message.startswith("tensorflow.python.tpu.session_support.start_worker_watchdog")
    with pytest.raises(estimator_compat.TPUUnavailable):
        tpu_embedding.TPUEmbedding()
    assert not isinstance(object(), tpu_embedding.FeatureConfig)
    with pytest.raises(AttributeError):
        tpu_embedding.__wrapped__  # noqa: B018 - what inspect and import machinery probe


@pytest.mark.skipif(not REMOVED, reason="TensorFlow 2.15 has the standalone client")
def test_the_standalone_client_refuses_in_one_line():
    # What RunConfig reads of experimental_distribute (tf.contrib's DistributeConfig, gone).
    remote = types.SimpleNamespace(
        train_distribute=tf.distribute.OneDeviceStrategy("/cpu:0"), eval_distribute=None,
        remote_cluster={"worker": ["127.0.0.1:1"]})
    with pytest.raises(NotImplementedError, match="remote_cluster.*TensorFlow 2.15") as refused:
        tf.estimator.RunConfig(experimental_distribute=remote)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("first", ["tensorflow", "cifar10_estimator"])
def test_tf_estimator_loads_whichever_is_imported_first(first, tmp_path):
    # A fresh process each: the import order is the point. RunConfig with a strategy and a
    # TF_CONFIG goes through the supplied coordinator module (multi-worker training's road).
    second = "cifar10_estimator" if first == "tensorflow" else "tensorflow"
    script = f"""
import json, os
os.environ["TF_CONFIG"] = json.dumps({{"cluster": {{"chief": ["127.0.0.1:1"],
                                                  "worker": ["127.0.0.1:2"]}},
                                      "task": {{"type": "worker", "index": 0}}}})
import {first}, {second}
import tensorflow as tf
config = tf.estimator.RunConfig(train_distribute=tf.distribute.MirroredStrategy(["/cpu:0"]))
print(config._distribute_coordinator_mode, bool(config.cluster_spec),
      tf.compat.v1.estimator.RunConfig is tf.estimator.RunConfig)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=tmp_path, timeout=100,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["independent_worker", "True", "True"]
