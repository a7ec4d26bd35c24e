"""This package on the estimator layer (``tf_estimator_compat``, a distribution of its own,
``tf-estimator-compat/``, whose tests cover the layer itself): every private TensorFlow module
and name the package uses, named, so that a release that removes one fails here with its name;
what importing the package and its process set-up do to the import system; TensorFlow's cap;
and a user's canned estimator in a process the package set up.
"""

import ast
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest
import tensorflow as tf
import tf_estimator_compat as layer
from tf_estimator_compat.private_imports import private_imports, unresolved

import cifar10_estimator

pytestmark = pytest.mark.timeout(120)

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cifar10_estimator.__file__)))
TF_MINOR = tuple(int(part) for part in tf.__version__.split(".")[:2])
REMOVED = TF_MINOR >= (2, 16)  # the release that removed all four pieces


def test_every_private_tensorflow_import_of_the_package_resolves():
    imports = private_imports(os.path.join(PACKAGE_ROOT, "cifar10_estimator"),
                               skip_tests=False)
    # What the package itself reaches into (beyond the estimator): named, so a new one is seen.
    assert {module for module, _ in imports} == {
        "tensorflow.core.protobuf",                   # saved_model_pb2: the export's proto
        "tensorflow.python.util",                     # IsMklEnabled (platform/cpu.py)
        "tensorflow.python.saved_model",              # fingerprinting_utils
        # convert_variables_to_constants_v2: an export's network as one flat graph, for the
        # LiteRT and ONNX converters (serving/conversion.py; TF 2.15 to 2.21 all have it).
        "tensorflow.python.framework.convert_to_constants",
    }
    assert not unresolved(imports)



# Imports every module of the package, in a fresh process, and prints what that did to
# sys.meta_path; argv[1] "set-up-first" runs the process set-up before, "imports-first" after.
# TensorFlow's own dependencies add finders when it loads (absl's ReloadDetector, six's
# importer): "changed_by" names the modules after whose import a finder of the package's own
# was added or one was removed.
_IMPORT_ALL = r"""
import importlib, json, os, pkgutil, sys

set_up_first = sys.argv[1] == "set-up-first"
if set_up_first:
    from cifar10_estimator.platform.process import prepare_process
    prepare_process(os.environ)
before = list(sys.meta_path)
import cifar10_estimator
import tf_estimator_compat as layer
out = {"package_alone": sys.meta_path == before,
       "installed_by_set_up": layer.installed(), "changed_by": [], "failed": {}}
for module in pkgutil.walk_packages(cifar10_estimator.__path__, "cifar10_estimator.",
                                    onerror=lambda name: None):
    if module.name == "cifar10_estimator.__main__":
        continue  # runs the trainer
    try:
        importlib.import_module(module.name)
    except (ImportError, AttributeError) as e:  # tf.estimator without the layer (2.16 on)
        out["failed"][module.name] = str(e)
    added = [f for f in sys.meta_path if f not in before]
    # (On 2.15 the layer's finder, where the set-up put it in, leaves when TensorFlow loads.)
    removed = [f for f in before if f not in sys.meta_path
               and type(f).__module__ != layer.__name__]
    if removed or any(type(f).__module__.startswith("cifar10_estimator") for f in added):
        out["changed_by"].append(module.name)
    before = list(sys.meta_path)
if not set_up_first:
    from cifar10_estimator.platform.process import prepare_process
    prepare_process(os.environ)
    out["installed_by_set_up"] = layer.installed()
import tensorflow as tf
out["estimator"] = tf.estimator.Estimator.__module__
out["installed_at_end"] = layer.installed()
print(json.dumps(out))
"""


def _import_all(order: str, tmp_path) -> dict:
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL, order], capture_output=True,
                          text=True, cwd=tmp_path, timeout=250,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_importing_the_package_leaves_the_import_system_alone(tmp_path):
    out = _import_all("imports-first", tmp_path)
    assert out["package_alone"]  # `import cifar10_estimator`: sys.meta_path exactly as it was
    assert out["changed_by"] == []  # no module of the package adds or removes a finder
    if REMOVED:
        # Without the set-up, the modules that use tf.estimator do not import on 2.16 and
        # later (the layer is not in): the removed coordinator module, or no tf.estimator.
        assert out["failed"], "some module uses tf.estimator"
        assert all("estimator_training" in error or "attribute 'estimator'" in error
                   for error in out["failed"].values()), out["failed"]
    else:
        assert out["failed"] == {}
    # The set-up after the imports puts the layer in; on 2.15, with TensorFlow loaded by
    # then, the gate leaves it out (nothing to supply).
    assert out["installed_by_set_up"] is REMOVED
    assert out["estimator"].startswith("tensorflow_estimator.")
    # On 2.15 the finder takes itself out once TensorFlow has loaded: nothing to supply.
    assert out["installed_at_end"] is REMOVED


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_after_the_set_up_every_module_imports(tmp_path):
    out = _import_all("set-up-first", tmp_path)
    # Before TensorFlow loads, the set-up puts the layer in on every release.
    assert out["installed_by_set_up"] is True and out["package_alone"]
    assert out["failed"] == {} and out["changed_by"] == []
    assert out["installed_at_end"] is REMOVED


# --- the version gate and this package's cap -------------------------------------------------

def test_the_newest_tested_release_is_the_one_below_pyprojects_cap():
    with open(os.path.join(PACKAGE_ROOT, "pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    caps = {re.match(r"[\w-]+", d)[0]: re.search(r"<(\d+)\.(\d+)", d)
            for d in dependencies if d.startswith(("tensorflow>", "tensorflow-serving-api"))}
    major, minor = layer.NEWEST_TESTED
    assert {name: (int(m[1]), int(m[2])) for name, m in caps.items()} == {
        "tensorflow": (major, minor + 1), "tensorflow-serving-api": (major, minor + 1)}


# --- what the package's own classes use of TensorFlow's --------------------------------------

# TensorFlow's CheckpointSaverHook, which training/estimator/precise_bn.py's CheckpointHook
# extends: what it reads of the base once the hook has begun (the class scan below pins every
# private name the two share), and the names it adds (which the base must not have).
SAVER_HOOK_ATTRIBUTES = ("_timer", "_listeners", "_global_step_tensor")
SAVER_HOOK_ADDED = ("_final_step", "_precise")


def test_what_the_checkpoint_hook_extends_is_there(tmp_path):
    hook = tf.estimator.CheckpointSaverHook(str(tmp_path), save_steps=1)
    with tf.Graph().as_default():
        tf.compat.v1.train.create_global_step()
        hook.begin()
    assert [n for n in SAVER_HOOK_ATTRIBUTES if n not in vars(hook)] == []
    assert list(inspect.signature(hook._save).parameters) == ["session", "step"]
    for name in ("update_last_triggered_step", "last_triggered_step"):
        assert callable(getattr(hook._timer, name, None)), name
    # The names CheckpointHook adds are its own, not the base's.
    assert [n for n in SAVER_HOOK_ADDED if hasattr(hook, n)] == []


# --- every class of the package that extends a TensorFlow class ---------------------------------

# Each one's private names that are its TensorFlow base's (what it overrides, reads or sets of
# the base's own): pinned by class, so that a release that renames one fails here by name, and a
# private name a class adds that its base also uses (which would clobber the base's) fails too.
BASE_PRIVATES = {
    "cifar10_estimator.training.estimator.precise_bn.CheckpointHook":
        {"_save", "_timer", "_listeners", "_global_step_tensor"},
}
# Module-level functions with an underscore that are public API.
PUBLIC_UNDERSCORED = {"_exit"}  # os._exit


def _package_modules() -> dict[str, str]:
    root = os.path.join(PACKAGE_ROOT, "cifar10_estimator")
    found = {}
    for folder, _, files in os.walk(root):
        for file in files:
            if file.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, file), PACKAGE_ROOT)[:-3].split(os.sep)
                found[".".join(p for p in parts if p != "__init__")] = os.path.join(folder, file)
    return found


def _tensorflow_subclasses() -> list[tuple[str, ast.ClassDef]]:
    """(module, class) for each class of the package whose base is a ``tf.`` name."""
    found = []
    for module, path in _package_modules().items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ClassDef) and any(
                    ast.unparse(base).startswith("tf.") for base in node.bases):
                found.append((module, node))
    return found


def _private_names_of(cls: ast.ClassDef) -> set[str]:
    """The private names a class uses on itself: ``self._x``, ``super()._x`` and the private
    methods it defines."""
    names = {node.name for node in cls.body if isinstance(node, ast.FunctionDef)}
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and (
                (isinstance(node.value, ast.Name) and node.value.id == "self")
                or (isinstance(node.value, ast.Call) and ast.unparse(node.value) == "super()")):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_every_private_name_a_class_shares_with_its_tensorflow_base_is_pinned():
    classes = _tensorflow_subclasses()
    assert {f"{m}.{c.name}" for m, c in classes} >= set(BASE_PRIVATES)
    shared = {}
    for module, node in classes:
        cls = getattr(importlib.import_module(module), node.name)
        base_source = "".join(inspect.getsource(base) for base in cls.__mro__[1:]
                              if base.__module__.startswith(("tensorflow", "keras")))
        names = {n for n in _private_names_of(node)
                 if f"self.{n}" in base_source or f"def {n}(" in base_source}
        if names:
            shared[f"{module}.{node.name}"] = names
    # Exactly the pinned ones: a shared name not pinned is one more to watch (or a clash), a
    # pinned one no longer shared is gone from the base.
    assert shared == BASE_PRIVATES


def test_no_module_of_the_package_uses_a_private_name_of_tensorflow():
    # (The layer's own are pinned by name in its tests; the classes' above.)
    found = []
    for module, path in _package_modules().items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        tensorflow_names = {"tf"} | {
            alias.asname or alias.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                ("tensorflow", "keras", "tf_keras")) for alias in node.names}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and node.attr not in PUBLIC_UNDERSCORED):
                root = node.value
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in tensorflow_names:
                    found.append(f"{module} line {node.lineno}: {ast.unparse(node)}")
    assert found == []


# --- a user's own estimator code: a canned estimator ---------------------------------------------

# A user's script in a process set up by the package: legacy Keras asked for (the variable the
# `legacy-keras` extra's tf-keras answers), then a canned estimator trained for a few steps.
_CANNED = r"""
import os, sys, tempfile
os.environ["TF_USE_LEGACY_KERAS"] = "1"
from cifar10_estimator.platform.process import prepare_process
prepare_process(os.environ)
import numpy as np, tensorflow as tf

def input_fn():
    x = np.array([[0., 1.], [1., 0.], [1., 1.], [0., 0.]], np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, [1, 0, 1, 0])).repeat().batch(4)

classifier = tf.estimator.LinearClassifier([tf.feature_column.numeric_column("x", (2,))],
                                           model_dir=tempfile.mkdtemp())
classifier.train(input_fn, max_steps=5)
print(classifier.evaluate(input_fn, steps=1)["global_step"], tf.keras.__name__)
"""


@pytest.mark.slow
@pytest.mark.skipif(REMOVED and importlib.util.find_spec("tf_keras") is None,
                    reason="canned estimators need Keras 2 on TensorFlow 2.16 and later: "
                           "pip install 'cifar10_estimator[legacy-keras]' (tf-keras) and "
                           "TF_USE_LEGACY_KERAS=1 (docs/versions.md)")
def test_a_canned_estimator_trains_in_a_process_set_up_by_the_package(tmp_path):
    done = subprocess.run([sys.executable, "-c", _CANNED], capture_output=True, text=True,
                          cwd=tmp_path, timeout=200,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    step, keras = done.stdout.split()[-2:]
    assert step == "5"
    # Keras 2 under it: TensorFlow 2.15's own, or tf-keras from 2.16 on.
    assert keras.startswith("tf_keras" if REMOVED else ("keras", "tf_keras")), keras
