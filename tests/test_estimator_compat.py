"""``estimator_compat``: tf.estimator 2.15.0 on every TensorFlow from 2.15 to the newest tested.

What it supplies is listed here by name, and so is every private TensorFlow module the estimator
and this package import: a release that removes one more fails here with its name, not deep in
a training run.
"""

import ast
import importlib
import importlib.util
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import tomllib
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


@pytest.mark.parametrize("tensorflow_first", [True, False], ids=["tensorflow-first",
                                                                   "set-up-first"])
def test_tf_estimator_loads_whether_tensorflow_loaded_before_the_set_up(tensorflow_first,
                                                                         tmp_path):
    # A fresh process each: the order is the point (train.run from a program that imported
    # TensorFlow already; a command). RunConfig with a strategy and a TF_CONFIG goes through
    # the supplied coordinator module (multi-worker training's road).
    script = f"""
import json, os
os.environ["TF_CONFIG"] = json.dumps({{"cluster": {{"chief": ["127.0.0.1:1"],
                                                  "worker": ["127.0.0.1:2"]}},
                                      "task": {{"type": "worker", "index": 0}}}})
if {tensorflow_first}:
    import tensorflow
from cifar10_estimator.platform.process import prepare_process
prepare_process(os.environ)
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
from cifar10_estimator import estimator_compat
out = {"package_alone": sys.meta_path == before,
       "installed_by_set_up": estimator_compat.installed(), "changed_by": [], "failed": {}}
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
               and type(f).__module__ != estimator_compat.__name__]
    if removed or any(type(f).__module__.startswith("cifar10_estimator") for f in added):
        out["changed_by"].append(module.name)
    before = list(sys.meta_path)
if not set_up_first:
    from cifar10_estimator.platform.process import prepare_process
    prepare_process(os.environ)
    out["installed_by_set_up"] = estimator_compat.installed()
import tensorflow as tf
out["estimator"] = tf.estimator.Estimator.__module__
out["installed_at_end"] = estimator_compat.installed()
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


# --- the version gate --------------------------------------------------------------------------

def test_release_reads_major_and_minor():
    assert estimator_compat.release("2.21.0") == (2, 21)
    assert estimator_compat.release("2.22.0-rc0") == (2, 22)  # tf.__version__ of 2.22.0rc0
    assert estimator_compat.release("2.15.0.post1") == (2, 15)
    assert estimator_compat.release("nightly") > estimator_compat.NEWEST_TESTED


def test_the_newest_tested_release_is_the_one_below_pyprojects_cap():
    with open(os.path.join(PACKAGE_ROOT, "pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    caps = {re.match(r"[\w-]+", d)[0]: re.search(r"<(\d+)\.(\d+)", d)
            for d in dependencies if d.startswith(("tensorflow>", "tensorflow-serving-api"))}
    major, minor = estimator_compat.NEWEST_TESTED
    assert {name: (int(m[1]), int(m[2])) for name, m in caps.items()} == {
        "tensorflow": (major, minor + 1), "tensorflow-serving-api": (major, minor + 1)}


def _tensorflow_of(version: str) -> types.SimpleNamespace:
    """This process's TensorFlow as the gate sees it, under another version."""
    return types.SimpleNamespace(__version__=version, compat=tf.compat,
                                 estimator=tf.estimator)


@pytest.mark.parametrize("version, warned", [("2.16.2", False), ("2.21.0", False),
                                             ("2.22.0-rc0", True), ("3.0.0", True)])
def test_a_release_newer_than_the_tested_ones_is_patched_with_one_warning(version, warned,
                                                                          monkeypatch, caplog):
    monkeypatch.setattr(estimator_compat, "_warned", False)
    monkeypatch.setitem(sys.modules, "tensorflow", _tensorflow_of(version))
    caplog.set_level(logging.WARNING, logger=estimator_compat.__name__)
    for _ in range(2):  # TensorFlow loaded, then the estimator's first import of the module
        estimator_compat._tensorflow_loaded(sys.modules["tensorflow"])
        estimator_compat._SuppliedModule().exec_module(
            types.ModuleType(estimator_compat.COORDINATOR_MODULE))
    lines = [r.getMessage() for r in caplog.records if r.name == estimator_compat.__name__]
    if not warned:
        assert lines == []
        return
    assert len(lines) == 1 and "\n" not in lines[0]  # once a process, one line
    assert lines[0].startswith(f"TensorFlow {version} is newer than 2.21")


def test_on_the_complete_release_the_finder_takes_itself_out(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    estimator_compat.install()
    if REMOVED:
        assert estimator_compat.installed()
    estimator_compat._tensorflow_loaded(_tensorflow_of("2.15.1"))
    assert not estimator_compat.installed()


# --- every private name the layer and the package use on the estimator's classes ----------------

# (owner, names): each private attribute or method that estimator_compat.py (and, for the
# checkpoint hook, training/precise_bn.py) sets, reads or calls on a class of the estimator or
# of TensorFlow. A release that renames one fails here, by name, instead of deep in a run.
# RunConfig's, from a plain RunConfig(): init_run_config and _take_worker_context set them
# (the layer's setattr(config, "_" + field) names the two distribute fields).
RUN_CONFIG_ATTRIBUTES = (
    "_experimental_distribute", "_train_distribute", "_eval_distribute", "_cluster_spec",
    "_service", "_task_type", "_task_id", "_master", "_evaluation_master", "_is_chief",
    "_global_id_in_cluster", "_num_ps_replicas", "_num_worker_replicas")
RUN_CONFIG_METHODS = ("_init_distributed_setting_from_environment_var",
                      "_maybe_overwrite_session_config_for_distributed_training")
# Set only by init_run_config (the layer's); the estimator reads it (estimator.py).
RUN_CONFIG_SET_FOR_THE_ESTIMATOR = ("_distribute_coordinator_mode",)
# run_config's module functions, with their arity: a task's place in its cluster.
RUN_CONFIG_FUNCTIONS = {"_count_ps": 1, "_count_worker": 2, "_get_global_id_in_cluster": 4}
ESTIMATOR_ATTRIBUTES = ("_config", "_train_distribution", "_eval_distribution")
EXECUTOR_METHODS = ("_start_continuous_evaluation",)  # training._TrainingExecutor's
# TensorFlow's CheckpointSaverHook, which training/estimator/precise_bn.py's CheckpointHook
# extends: what it reads of the base once the hook has begun (the class scan below pins every
# private name the two share), and the names it adds (which the base must not have).
SAVER_HOOK_ATTRIBUTES = ("_timer", "_listeners", "_global_step_tensor")
SAVER_HOOK_ADDED = ("_final_step", "_precise")
PINNED = {*RUN_CONFIG_ATTRIBUTES, *RUN_CONFIG_METHODS, *RUN_CONFIG_SET_FOR_THE_ESTIMATOR,
          *RUN_CONFIG_FUNCTIONS, *ESTIMATOR_ATTRIBUTES, *EXECUTOR_METHODS}


def _private_names_used(path: str) -> set[str]:
    """Private attribute names a module uses on objects other than ``self`` (``config._x``,
    ``run_config._f``)."""
    used = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__") \
                and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            used.add(node.attr)
    return used


def test_the_pin_list_names_every_private_name_the_layer_uses():
    used = _private_names_used(estimator_compat.__file__)
    assert used - PINNED == set(), "pin these below, on the class they belong to"
    # The two the layer builds as strings ("_" + field, and the Estimator's distributions).
    assert {"_train_distribute", "_eval_distribute", "_train_distribution",
            "_eval_distribution"} <= PINNED


def test_every_private_name_the_layer_uses_is_there():
    from tensorflow_estimator.python.estimator import estimator as estimator_lib
    from tensorflow_estimator.python.estimator import run_config, training

    config = tf.estimator.RunConfig()
    missing = [f"RunConfig().{name}" for name in RUN_CONFIG_ATTRIBUTES
               if name not in vars(config)]
    missing += [f"RunConfig.{name}()" for name in RUN_CONFIG_METHODS
                if not callable(getattr(run_config.RunConfig, name, None))]
    source = open(estimator_lib.__file__, encoding="utf-8").read()
    missing += [f"Estimator reading config.{name}" for name in RUN_CONFIG_SET_FOR_THE_ESTIMATOR
                if f"self._config.{name}" not in source]
    for name, arity in RUN_CONFIG_FUNCTIONS.items():
        function = getattr(run_config, name, None)
        if not callable(function) or len(inspect.signature(function).parameters) != arity:
            missing.append(f"run_config.{name} ({arity} arguments)")
    estimator = tf.estimator.Estimator(lambda features, labels, mode: None, config=config)
    missing += [f"Estimator().{name}" for name in ESTIMATOR_ATTRIBUTES
                if name not in vars(estimator)]
    missing += [f"_TrainingExecutor.{name}()" for name in EXECUTOR_METHODS
                if not callable(getattr(getattr(training, "_TrainingExecutor", None), name,
                                        None))]
    assert missing == []


def test_every_name_the_layer_uses_of_the_distribute_coordinator_is_there():
    from tensorflow.python.distribute import distribute_coordinator as coordinator
    from tensorflow.python.distribute import distribute_coordinator_context as context

    assert coordinator.CoordinatorMode.INDEPENDENT_WORKER == "independent_worker"
    parameters = inspect.signature(coordinator.run_distribute_coordinator).parameters
    assert list(parameters)[:4] == ["worker_fn", "strategy", "eval_fn", "eval_strategy"]
    assert {"mode", "cluster_spec", "session_config"} <= set(parameters)
    assert callable(context.get_current_worker_context)
    worker_context = coordinator._WorkerContext  # what get_current_worker_context returns
    for name in ("cluster_spec", "task_type", "task_id", "master_target", "is_chief"):
        assert isinstance(getattr(worker_context, name, None), property), name


def test_the_estimator_calls_only_what_the_supplied_coordinator_module_has():
    # tensorflow-estimator 2.15.0's calls into estimator_training (run_config.py,
    # estimator.py, training.py): each one is a name the supplied module defines.
    called = set()
    for file in ("run_config.py", "estimator.py", "training.py"):
        tree = ast.parse(open(os.path.join(ESTIMATOR_ROOT, "python", "estimator", file),
                              encoding="utf-8").read())
        called |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                   and isinstance(node.value, ast.Name)
                   and node.value.id == "distribute_coordinator_training"}
    assert called == {"init_run_config", "should_run_distribute_coordinator",
                      "train_and_evaluate", "estimator_train", "estimator_evaluate"}
    module = types.ModuleType(estimator_compat.COORDINATOR_MODULE)
    estimator_compat._SuppliedModule().exec_module(module)
    assert all(callable(getattr(module, name, None)) for name in called)


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


def test_no_module_but_the_layer_uses_a_private_name_of_tensorflow():
    found = []
    for module, path in _package_modules().items():
        if module == "cifar10_estimator.estimator_compat":
            continue  # pinned by name above
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
