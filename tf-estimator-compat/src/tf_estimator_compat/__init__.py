"""``tf.estimator`` on TensorFlow 2.16 and newer: what TensorFlow removed that
``tensorflow-estimator`` 2.15.0, the estimator's last release, still needs.

TensorFlow 2.16 dropped the estimator, and with it four things the estimator's 2.15.0 code
imports or reads (TensorFlow 2.15's sources have each; ``git log`` of tensorflow/tensorflow
shows them removed before the 2.16 branch). Everything else the estimator imports from
TensorFlow's private modules still resolves up to 2.21 (``tests/test_layer.py``
checks every one of those imports, so a release that removes one more fails by name):

1. ``tensorflow.python.distribute.estimator_training``: imported by the estimator's
   ``run_config.py``, ``estimator.py`` and ``training.py``. ``RunConfig`` hands itself to its
   ``init_run_config`` whenever a strategy is set; ``train_and_evaluate`` asks
   ``should_run_distribute_coordinator`` and runs a multi-worker strategy's task through its
   ``train_and_evaluate`` (one task of the cluster, on TensorFlow's distribute coordinator, which
   2.21 still ships). Supplied here with that behaviour, except the coordinator's
   ``STANDALONE_CLIENT`` mode (``DistributeConfig(remote_cluster=...)``, one client driving a
   remote cluster), which refuses in one line: it is the only road to ``estimator_train`` and
   ``estimator_evaluate``, which refuse likewise.
2. ``tensorflow.python.tpu.session_support``, ``tpu_embedding`` and ``tpu_embedding_gradient``:
   imported when the estimator's API loads its ``tpu`` namespace (``tpu_estimator.py``,
   ``_tpu_estimator_embedding.py``). TPUs cannot run without them, so each name imports and
   refuses in one line when used (``TPUUnavailable``).
3. ``tf_export.ESTIMATOR_API_NAME`` and the ``estimator`` entries of ``tf_export.API_ATTRS`` and
   ``API_ATTRS_V1``: ``estimator_export``, the decorator on every public estimator symbol,
   exports under that API name. And the estimator's names in what ``tf_export.get_v1_names``
   and ``get_v2_names`` answer: TensorFlow 2.15's read the estimator's attributes beside
   TensorFlow's and Keras's, 2.16's no longer do (the estimator's own
   ``estimator_export_test.py`` asks them), so the layer's add the estimator's names of a
   symbol to what TensorFlow's answer, where they lack them.
4. The attributes ``tf.estimator``, ``tf.compat.v1.estimator`` and ``tf.compat.v2.estimator``:
   TensorFlow's ``__init__`` attached them lazily (``LazyLoader``), as they are attached here.

``install`` puts one import finder first on ``sys.meta_path``. It supplies the modules of 1 and
2 only when no other finder has them, and it patches 3 and 4 right after ``tensorflow`` itself
has loaded (or at once, if it already has), only where they are missing. It imports nothing
itself, so it may run before TensorFlow loads. Nothing calls it on import: a program does,
once, before or after it imports TensorFlow, since it changes the import system of the whole
process; importing this package leaves ``sys.meta_path`` as it was. For a program one cannot
edit, the distribution installs a start hook, ``AT_START_FILE`` in site-packages, that calls
``install`` as the interpreter starts when the variable ``AT_START_VARIABLE`` is ``1`` (off
otherwise: it then imports nothing).

Its version gate reads ``tf.__version__`` once TensorFlow has loaded (whichever distribution
brought it): on 2.15, which has every piece, the finder takes itself out and patches nothing;
on 2.16 to ``NEWEST_TESTED`` it patches; on a newer release it patches all the same, and logs
one warning naming the release when the estimator first loads through it (not when TensorFlow
loads, which a program may do with its log silenced). It warns rather than refuses: the
distribution caps TensorFlow below the next release, so a newer one is there because its user
lifted the cap to try it, and the pieces are supplied only where missing (the tests name each
private name the layer uses, for that user to read a failure by).
"""

import copy
import functools
import importlib.abc
import logging
import re
import sys
import types
from typing import Any, Optional, Sequence

log = logging.getLogger(__name__)

# The newest TensorFlow (major, minor) the estimator's own suite passed on with the layer (the
# README's table); the cap in pyproject.toml is the release after it (tests/test_layer.py checks
# the two agree).
NEWEST_TESTED = (2, 21)
# The last release that ships every piece (and tf.estimator itself): nothing to supply.
COMPLETE = (2, 15)

ESTIMATOR_API_NAME = "estimator"  # tf_export's name of the estimator's API (TF 2.15)
# tf_export's attributes for that API, as TF 2.15 named them: (names, constants).
_API_ATTRS = ("_estimator_api_names", "_estimator_api_constants")
_API_ATTRS_V1 = ("_estimator_api_names_v1", "_estimator_api_constants_v1")
# Where TF 2.15 pointed tf.estimator and its compat aliases (tensorflow/__init__.py and
# tensorflow/_api/v2/compat/v{1,2}/__init__.py).
_ESTIMATOR_API_V1 = "tensorflow_estimator.python.estimator.api._v1.estimator"
_ESTIMATOR_API_V2 = "tensorflow_estimator.python.estimator.api._v2.estimator"

# The start hook (the module docstring): a .pth file the wheel puts in site-packages, whose one
# line calls install() when this variable is "1" (tests/test_layer.py checks the file says so).
AT_START_FILE = "tf_estimator_compat_at_start.pth"
AT_START_VARIABLE = "TF_ESTIMATOR_COMPAT"

COORDINATOR_MODULE = "tensorflow.python.distribute.estimator_training"
TPU_MODULES = tuple(f"tensorflow.python.tpu.{name}" for name in
                    ("session_support", "tpu_embedding", "tpu_embedding_gradient"))


class TPUUnavailable(NotImplementedError):
    """A TPU piece of the estimator used on a TensorFlow that no longer has it."""


def install() -> None:
    """Makes ``tensorflow-estimator`` 2.15.0 importable on this process's TensorFlow (once;
    for the process's set-up to call, before or after TensorFlow loads)."""
    tf = sys.modules.get("tensorflow")
    loaded = tf is not None and hasattr(tf, "compat")  # not half-way through its __init__
    if loaded and release(tf.__version__) <= COMPLETE:
        return
    if not installed():
        sys.meta_path.insert(0, _Supplier())
    if loaded:
        _tensorflow_loaded(tf)


def installed() -> bool:
    """Whether the layer's finder is on ``sys.meta_path``."""
    return any(isinstance(finder, _Supplier) for finder in sys.meta_path)


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a TensorFlow version string ("2.22.0rc0" -> (2, 22)); one that does
    not start with two numbers counts as newer than any."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (sys.maxsize, 0)


_warned = False


def _tensorflow_loaded(tf: types.ModuleType) -> None:
    """The version gate (module docstring), once ``tensorflow`` has loaded."""
    version = release(tf.__version__)
    if version <= COMPLETE:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Supplier)]
        return
    _patch_tensorflow(tf)


def _warn_if_untested(version: str) -> None:
    """One warning a process, on a TensorFlow newer than ``NEWEST_TESTED``."""
    global _warned
    if release(version) > NEWEST_TESTED and not _warned:
        _warned = True
        log.warning("TensorFlow %s is newer than %d.%d, the newest release tf.estimator was "
                    "tested with tf-estimator-compat: the layer is installed all the same, and "
                    "its README says what was tried", version, *NEWEST_TESTED)


class _Supplier(importlib.abc.MetaPathFinder):
    """Finds the removed modules where TensorFlow has none, and patches ``tensorflow`` once
    its own ``__init__`` has run."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None):
        if fullname != "tensorflow" and fullname != COORDINATOR_MODULE and \
                fullname not in TPU_MODULES:
            return None
        spec = self._find_elsewhere(fullname, path, target)
        if fullname == "tensorflow":
            if spec is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchAfterLoading(spec.loader)
            return spec
        if spec is not None:
            return spec  # this TensorFlow still has it
        return importlib.machinery.ModuleSpec(fullname, _SuppliedModule())

    def _find_elsewhere(self, fullname, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None


class _PatchAfterLoading(importlib.abc.Loader):
    """``tensorflow``'s own loader, then ``_patch_tensorflow``."""

    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # The module keeps its real loader (importlib.resources and friends ask it).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _tensorflow_loaded(sys.modules.get(module.__name__, module))


class _SuppliedModule(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # a plain module

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == COORDINATOR_MODULE:
            # The estimator's own modules import this one first: the estimator is loading.
            _warn_if_untested(getattr(sys.modules.get("tensorflow"), "__version__", "?"))
            module.__doc__ = "Supplied by tf_estimator_compat (removed in TF 2.16)."
            module.init_run_config = _init_run_config
            module.should_run_distribute_coordinator = _should_run_distribute_coordinator
            module.train_and_evaluate = _train_and_evaluate
            module.estimator_train = module.estimator_evaluate = _refuse_standalone_client
        else:
            module.__doc__ = "Refusing stand-ins from tf_estimator_compat."
            module.__getattr__ = _tpu_stand_in(module.__name__)


def _patch_tensorflow(tf: types.ModuleType) -> None:
    """Pieces 3 and 4 of the module docstring, where this TensorFlow lacks them (once: a
    second call finds them there)."""
    from tensorflow.python.util import lazy_loader, tf_export

    if not hasattr(tf_export, "ESTIMATOR_API_NAME"):
        tf_export.ESTIMATOR_API_NAME = ESTIMATOR_API_NAME
    # The same record type as the entries beside it (a NamedTuple of names and constants).
    record = type(tf_export.API_ATTRS[tf_export.TENSORFLOW_API_NAME])
    tf_export.API_ATTRS.setdefault(ESTIMATOR_API_NAME, record(*_API_ATTRS))
    tf_export.API_ATTRS_V1.setdefault(ESTIMATOR_API_NAME, record(*_API_ATTRS_V1))

    for holder, api in ((tf, _ESTIMATOR_API_V2), (tf.compat.v1, _ESTIMATOR_API_V1),
                        (tf.compat.v2, _ESTIMATOR_API_V2)):
        if ESTIMATOR_API_NAME not in vars(holder):
            setattr(holder, ESTIMATOR_API_NAME,
                    lazy_loader.LazyLoader(ESTIMATOR_API_NAME, vars(holder), api))

    for getter, names_attribute in (("get_v1_names", _API_ATTRS_V1[0]),
                                    ("get_v2_names", _API_ATTRS[0])):
        original = getattr(tf_export, getter)
        if original not in _NAME_GETTERS:  # not ours already
            setattr(tf_export, getter, _with_estimator_names(original, names_attribute))


def _with_estimator_names(get_names, names_attribute: str):
    """``tf_export``'s ``get_v1_names`` or ``get_v2_names``, whose answer also holds the
    symbol's estimator names (its attribute ``names_attribute``) where it lacked them."""

    @functools.wraps(get_names)
    def names(symbol: Any) -> list:
        found = list(get_names(symbol))
        own = getattr(symbol, "__dict__", {}).get(names_attribute, ())
        return found + [name for name in own if name not in found]

    _NAME_GETTERS.add(names)
    return names


# The layer's get_v1_names and get_v2_names, so that a second patch wraps nothing twice.
_NAME_GETTERS: set = set()


# Piece 1: the distribute coordinator's road for Estimator, as TF 2.15 had it.

def _init_run_config(config, tf_config: dict) -> None:
    """Sets up a ``RunConfig`` that has a strategy: a cluster's task with a strategy of its own
    runs on the distribute coordinator; anything else is set up from ``TF_CONFIG`` as usual."""
    from tensorflow.python.distribute import distribute_coordinator
    from tensorflow.python.training import server_lib

    experimental = config._experimental_distribute
    if experimental is not None:
        if experimental.remote_cluster:
            _refuse_standalone_client()
        for field in ("train_distribute", "eval_distribute"):
            strategy = getattr(experimental, field)
            if strategy:
                if getattr(config, "_" + field):
                    raise ValueError(f"Either `{field}` or `experimental_distribute.{field}` "
                                     "can be set, not both.")
                setattr(config, "_" + field, strategy)

    cluster = server_lib.ClusterSpec(tf_config.get("cluster", {}))
    config._init_distributed_setting_from_environment_var({})  # a local run's defaults first
    if not tf_config or "master" in cluster.jobs or not config._train_distribute:
        config._distribute_coordinator_mode = None
        config._init_distributed_setting_from_environment_var(tf_config)
        config._maybe_overwrite_session_config_for_distributed_training()
        return
    # The task's own role comes from the coordinator's worker context when it runs.
    config._cluster_spec = cluster
    config._distribute_coordinator_mode = distribute_coordinator.CoordinatorMode.INDEPENDENT_WORKER


def _should_run_distribute_coordinator(config) -> bool:
    from tensorflow.python.distribute import distribute_coordinator

    mode = getattr(config, "_distribute_coordinator_mode", None)
    return (mode == distribute_coordinator.CoordinatorMode.INDEPENDENT_WORKER
            and bool(config.cluster_spec))


def _train_and_evaluate(estimator, train_spec, eval_spec, executor_cls) -> None:
    """One task of a cluster whose strategy runs on every task (``INDEPENDENT_WORKER``): the
    coordinator calls back with the strategy and this task's role."""
    from tensorflow.python.distribute import distribute_coordinator

    config = estimator.config

    def local_copy(strategy, field: str):
        local = copy.deepcopy(estimator)
        setattr(local._config, "_" + field, strategy)
        _take_worker_context(local._config)
        setattr(local, "_train_distribution" if field == "train_distribute"
                else "_eval_distribution", strategy)
        # The copy calls train or evaluate, which must not come back to the coordinator.
        local._config._distribute_coordinator_mode = None
        return local

    def train(strategy) -> None:
        local_copy(strategy, "train_distribute").train(
            input_fn=train_spec.input_fn, max_steps=train_spec.max_steps,
            hooks=list(train_spec.hooks))

    def evaluate(strategy) -> None:
        local = local_copy(strategy, "eval_distribute")
        executor_cls(local, train_spec, eval_spec)._start_continuous_evaluation()

    distribute_coordinator.run_distribute_coordinator(
        train, config.train_distribute, evaluate, config.eval_distribute,
        mode=config._distribute_coordinator_mode, cluster_spec=None,
        session_config=config.session_config)


def _take_worker_context(config) -> None:
    """This task's role in ``config``, from the coordinator's context for the running task."""
    from tensorflow.python.distribute import distribute_coordinator_context
    from tensorflow.python.training import server_lib
    from tensorflow_estimator.python.estimator import run_config

    context = distribute_coordinator_context.get_current_worker_context()
    config._service = None
    config._cluster_spec = context.cluster_spec
    config._task_type = context.task_type
    config._task_id = context.task_id
    config._master = config._evaluation_master = context.master_target
    config._is_chief = context.is_chief
    chief = run_config.TaskType.CHIEF
    if not config._cluster_spec:
        config._global_id_in_cluster, config._num_ps_replicas = 0, 0
        config._num_worker_replicas = 1
    elif config._task_type == run_config.TaskType.EVALUATOR:
        # The evaluator is not part of the training cluster.
        config._cluster_spec = server_lib.ClusterSpec({})
        config._num_ps_replicas = config._num_worker_replicas = 0
        config._global_id_in_cluster = None
    else:
        config._num_ps_replicas = run_config._count_ps(config._cluster_spec)
        config._num_worker_replicas = run_config._count_worker(config._cluster_spec, chief)
        config._global_id_in_cluster = _global_id(config._cluster_spec, config._task_type,
                                                  config._task_id)


def _global_id(cluster_spec, task_type: str, task_id: int) -> int:
    """The task's number in its cluster, in the order ``RunConfig.global_id_in_cluster``
    documents: the chief first, then every other job but the parameter servers by name, then
    those. A cluster may have no chief: MultiWorkerMirroredStrategy's workers alone, as TF's
    docs set them up. (The estimator's ``run_config._get_global_id_in_cluster`` counts a chief
    whatever the cluster; TF 2.15's coordinator module counted one only where there was.) A
    strategy that replicates in one graph across the cluster runs as no task (``task_type``
    None): it is number 0, as in 2.15."""
    from tensorflow_estimator.python.estimator.run_config import TaskType

    if not task_type:
        return 0
    jobs = cluster_spec.jobs
    order = ([TaskType.CHIEF] if TaskType.CHIEF in jobs else []) + sorted(
        job for job in jobs if job not in (TaskType.CHIEF, TaskType.PS)) + (
        [TaskType.PS] if TaskType.PS in jobs else [])
    if task_type not in order:
        raise RuntimeError(f"Internal error: the task type {task_type!r} is not a job of the "
                           f"cluster {cluster_spec.as_dict()}")
    preceding = order[:order.index(task_type)]
    return sum(cluster_spec.num_tasks(job) for job in preceding) + task_id


def _refuse_standalone_client(*args: Any, **kwargs: Any) -> None:
    raise NotImplementedError(
        "tf.estimator's standalone-client mode (DistributeConfig(remote_cluster=...)) needs "
        "TensorFlow 2.15; on newer releases run each task with TF_CONFIG instead")


# Piece 2: the TPU modules' names, each a class that refuses to be called or subclassed.

def _tpu_stand_in(module: str):
    def stand_in(name: str):
        if name.startswith("__"):
            raise AttributeError(name)  # what import machinery and inspect probe for

        def refuse(*args: Any, **kwargs: Any):
            raise TPUUnavailable(
                f"{module}.{name}: TPUEstimator needs TensorFlow 2.15, whose TPU modules "
                "TensorFlow 2.16 removed; this TensorFlow runs tf.estimator without TPUs")
        return type(name, (), {"__new__": refuse, "__init_subclass__": classmethod(refuse)})
    return stand_in
