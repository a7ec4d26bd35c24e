"""The layer: tf.estimator 2.15.0 on every TensorFlow from 2.15 to the newest tested.

What it supplies is listed here by name, and so is every private TensorFlow module the
estimator imports and every private name the layer uses: a release that removes one more fails
here with its name, not deep in a training run.
"""

import ast
import importlib
import inspect
import logging
import os
import re
import subprocess
import sys
import sysconfig
import types

import tf_estimator_compat as layer

# The layer in the tests' own process, as a program that uses it installs it: before anything
# imports the estimator. (No conftest.py: a second one beside the package's tests/ would shadow
# the helpers its tests import from theirs.)
layer.install()

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_estimator  # noqa: E402

from tf_estimator_compat.private_imports import private_imports, unresolved  # noqa: E402

pytestmark = pytest.mark.timeout(120)

DISTRIBUTION_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ESTIMATOR_ROOT = os.path.dirname(os.path.abspath(tensorflow_estimator.__file__))
TF_MINOR = tuple(int(part) for part in tf.__version__.split(".")[:2])
REMOVED = TF_MINOR >= (2, 16)  # the release that removed all four pieces


def test_every_private_tensorflow_import_of_the_estimator_resolves():
    imports = private_imports(os.path.join(ESTIMATOR_ROOT, "python"), skip_tests=True)
    assert len(imports) > 100  # the estimator's own list, not an empty walk
    assert (layer.COORDINATOR_MODULE.rpartition(".")[0], "estimator_training") \
        in imports
    assert not unresolved(imports)


def test_the_checker_names_each_private_import_of_a_users_code_that_does_not_resolve(
        tmp_path):
    code = tmp_path / "trainer"
    code.mkdir()
    (code / "model.py").write_text(
        "from tensorflow.python.training import server_lib\n"
        "from tensorflow.python.ops import no_such_module_here\n"
        "import tensorflow.python.no_such_package\n"
        "from tensorflow import estimator\n")  # public: not checked
    (code / "model_test.py").write_text("from tensorflow.python.nothing import x\n")
    done = subprocess.run([sys.executable, "-m", "tf_estimator_compat.private_imports",
                           str(code), "--skip-tests"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == [
        "tensorflow.python.no_such_package", "tensorflow.python.ops no_such_module_here"]
    assert done.stderr.strip().splitlines()[-1].startswith(
        "1 of 3 private TensorFlow imports resolve on TensorFlow ")
    missing = subprocess.run([sys.executable, "-m", "tf_estimator_compat.private_imports",
                              str(tmp_path / "nowhere")], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 2 and "nowhere: no such file or folder" in missing.stderr


def test_what_the_layer_supplies_on_this_tensorflow():
    from tensorflow.python.util import tf_export

    coordinator = importlib.import_module(layer.COORDINATOR_MODULE)
    tpu = [importlib.import_module(name) for name in layer.TPU_MODULES]
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


def test_a_symbol_the_estimator_exports_is_known_by_its_estimator_names():
    # What tensorflow/estimator's estimator_export_test.py asks (testExportClassInEstimator),
    # and what TensorFlow's API tools read.
    from tensorflow.python.util import tf_export
    from tensorflow_estimator.python.estimator import estimator_export

    class Exported:
        pass

    estimator_export.estimator_export("estimator.Exported")(Exported)
    assert "_tf_api_names" not in Exported.__dict__
    assert tf_export.get_v1_names(Exported) == ["estimator.Exported"]
    assert tf_export.get_v2_names(Exported) == ["estimator.Exported"]
    assert tf_export.get_v2_names(tf.estimator.Estimator) == ["estimator.Estimator"]
    assert tf_export.get_v1_names(tf.compat.v1.estimator.Estimator) == ["estimator.Estimator"]
    # TensorFlow's own symbols answer as before, once (the patch is not applied twice).
    layer._patch_tensorflow(tf)
    assert tf_export.get_v2_names(tf.constant) == ["constant"]


@pytest.mark.skipif(not REMOVED, reason="TensorFlow 2.15 has its own TPU modules")
def test_a_tpu_piece_refuses_in_one_line():
    from tensorflow.python.tpu import session_support, tpu_embedding

    with pytest.raises(layer.TPUUnavailable) as refused:
        session_support.start_worker_watchdog(None)
    message = str(refused.value)
    assert "\n" not in message and "TensorFlow 2.15" in message
    assert message.startswith("tensorflow.python.tpu.session_support.start_worker_watchdog")
    with pytest.raises(layer.TPUUnavailable):
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


AT_START = os.path.join(sysconfig.get_path("purelib"), layer.AT_START_FILE)


@pytest.mark.parametrize("how", ["tensorflow-first", "install-first", "at-start"])
def test_tf_estimator_loads_however_the_layer_comes_in(how, tmp_path):
    # A fresh process each: the order is the point (a program that imported TensorFlow before
    # it installs the layer; one that installs it first; one that cannot be edited, the layer
    # installed at the interpreter's start). RunConfig with a strategy and a TF_CONFIG goes
    # through the supplied coordinator module (multi-worker training's road).
    if how == "at-start" and not os.path.exists(AT_START):
        pytest.skip(f"{AT_START} is not installed (the layer was not installed by pip)")
    script = f"""
import json, os, sys
os.environ["TF_CONFIG"] = json.dumps({{"cluster": {{"chief": ["127.0.0.1:1"],
                                                  "worker": ["127.0.0.1:2"]}},
                                      "task": {{"type": "worker", "index": 0}}}})
if {how == "tensorflow-first"}:
    import tensorflow
if {how != "at-start"}:
    import tf_estimator_compat
    tf_estimator_compat.install()
import tensorflow as tf
config = tf.estimator.RunConfig(train_distribute=tf.distribute.MirroredStrategy(["/cpu:0"]))
print(config._distribute_coordinator_mode, bool(config.cluster_spec),
      tf.compat.v1.estimator.RunConfig is tf.estimator.RunConfig)
"""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop(layer.AT_START_VARIABLE, None)
    if how == "at-start":
        env[layer.AT_START_VARIABLE] = "1"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=tmp_path, timeout=100, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["independent_worker", "True", "True"]


def test_the_start_hook_calls_install_under_its_variable_only():
    with open(os.path.join(DISTRIBUTION_ROOT, "src", layer.AT_START_FILE)) as f:
        lines = f.read().splitlines()
    # site.py runs a line of a .pth file only if it starts with "import".
    assert len(lines) == 1 and lines[0].startswith("import os;")
    assert (f'os.environ.get("{layer.AT_START_VARIABLE}") == "1" and '
            f'__import__("{layer.__name__}").install()') in lines[0]


@pytest.mark.skipif(not REMOVED, reason="TensorFlow 2.15 has tf.estimator without the layer")
def test_without_the_variable_the_start_hook_leaves_the_interpreter_alone(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != layer.AT_START_VARIABLE}
    done = subprocess.run([sys.executable, "-c", "import sys; print(any(type(f).__module__ == "
                           "'tf_estimator_compat' for f in sys.meta_path), "
                           "'tf_estimator_compat' in sys.modules)"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60, env=env)
    assert done.stdout.split() == ["False", "False"], done.stderr[-2000:]


# --- the version gate --------------------------------------------------------------------------

def test_release_reads_major_and_minor():
    assert layer.release("2.21.0") == (2, 21)
    assert layer.release("2.22.0-rc0") == (2, 22)  # tf.__version__ of 2.22.0rc0
    assert layer.release("2.15.0.post1") == (2, 15)
    assert layer.release("nightly") > layer.NEWEST_TESTED


def test_the_newest_tested_release_is_the_one_below_the_distributions_cap():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    with open(os.path.join(DISTRIBUTION_ROOT, "pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    (cap,) = [re.search(r"<(\d+)\.(\d+)", d) for d in dependencies
              if d.startswith("tensorflow>")]
    major, minor = layer.NEWEST_TESTED
    assert (int(cap[1]), int(cap[2])) == (major, minor + 1)


def _tensorflow_of(version: str) -> types.SimpleNamespace:
    """This process's TensorFlow as the gate sees it, under another version."""
    return types.SimpleNamespace(__version__=version, compat=tf.compat,
                                 estimator=tf.estimator)


@pytest.mark.parametrize("version, warned", [("2.16.2", False), ("2.21.0", False),
                                             ("2.22.0-rc0", True), ("3.0.0", True)])
def test_a_release_newer_than_the_tested_ones_is_patched_with_one_warning(version, warned,
                                                                          monkeypatch, caplog):
    monkeypatch.setattr(layer, "_warned", False)
    monkeypatch.setitem(sys.modules, "tensorflow", _tensorflow_of(version))
    caplog.set_level(logging.WARNING, logger=layer.__name__)
    for _ in range(2):  # TensorFlow loaded, then the estimator's first import of the module
        layer._tensorflow_loaded(sys.modules["tensorflow"])
        layer._SuppliedModule().exec_module(
            types.ModuleType(layer.COORDINATOR_MODULE))
    lines = [r.getMessage() for r in caplog.records if r.name == layer.__name__]
    if not warned:
        assert lines == []
        return
    assert len(lines) == 1 and "\n" not in lines[0]  # once a process, one line
    assert lines[0].startswith(f"TensorFlow {version} is newer than 2.21")


def test_on_the_complete_release_the_finder_takes_itself_out(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    layer.install()
    if REMOVED:
        assert layer.installed()
    layer._tensorflow_loaded(_tensorflow_of("2.15.1"))
    assert not layer.installed()


# --- every private name the layer and the package use on the estimator's classes ----------------

# (owner, names): each private attribute or method that layer.py (and, for the
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
RUN_CONFIG_FUNCTIONS = {"_count_ps": 1, "_count_worker": 2}
ESTIMATOR_ATTRIBUTES = ("_config", "_train_distribution", "_eval_distribution")
EXECUTOR_METHODS = ("_start_continuous_evaluation",)  # training._TrainingExecutor's
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
    used = _private_names_used(layer.__file__)
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
    module = types.ModuleType(layer.COORDINATOR_MODULE)
    layer._SuppliedModule().exec_module(module)
    assert all(callable(getattr(module, name, None)) for name in called)


@pytest.mark.parametrize("cluster, task, expected", [
    ({"chief": 1, "worker": 2, "ps": 1}, ("chief", 0), 0),
    ({"chief": 1, "worker": 2, "ps": 1}, ("worker", 1), 2),
    ({"chief": 1, "worker": 2, "ps": 2}, ("ps", 1), 4),
    ({"chief": 1, "worker": 2, "evaluator": 1}, ("worker", 0), 2),  # "evaluator" sorts first
    ({"worker": 3}, ("worker", 2), 2),  # no chief
    ({"worker": 3, "ps": 1}, ("ps", 0), 3),
    ({"worker": 3}, (None, None), 0),  # replicated in one graph: no task
])
def test_a_tasks_global_id_is_its_place_in_the_documented_order(cluster, task, expected):
    spec = tf.train.ClusterSpec({job: [f"host:{port}" for port in range(count)]
                                 for job, count in cluster.items()})
    assert layer._global_id(spec, *task) == expected


# One worker of a cluster of workers only (no chief): MultiWorkerMirroredStrategy as TF's docs
# set it up, through train_and_evaluate, which runs it on the distribute coordinator's
# independent-worker road. The first worker is the chief; it saves and evaluates.
WORKER = """
import json, os, sys
import tf_estimator_compat
tf_estimator_compat.install()
import tensorflow as tf

def model_fn(features, labels, mode):
    weight = tf.compat.v1.get_variable("weight", [], initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_mean(tf.square(features["x"] * weight - labels))
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

def input_fn():
    return tf.data.Dataset.from_tensors(({"x": [1.0, 2.0]}, [2.0, 4.0])).repeat()

strategy = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()
config = tf.estimator.RunConfig(model_dir=sys.argv[1], train_distribute=strategy,
                                save_checkpoints_steps=6)
estimator = tf.estimator.Estimator(model_fn, config=config)
tf.estimator.train_and_evaluate(
    estimator, tf.estimator.TrainSpec(input_fn, max_steps=6),
    tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=0, throttle_secs=0))
print("done", json.loads(os.environ["TF_CONFIG"])["task"]["index"])
"""


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_a_cluster_of_workers_only_trains_with_a_multi_worker_strategy(tmp_path):
    import json
    import socket

    ports = []
    for _ in range(2):  # free now; the workers bind them a moment later
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    workers = []
    for index in range(2):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})}
        workers.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path / "model")], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [worker.communicate(timeout=240)[0] for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    for index, (worker, output) in enumerate(zip(workers, outputs)):
        assert worker.returncode == 0 and f"done {index}" in output, output[-3000:]
    assert tf.train.latest_checkpoint(str(tmp_path / "model")).endswith("model.ckpt-6")
