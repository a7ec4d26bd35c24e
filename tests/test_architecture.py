"""The package's shape (docs/architecture.md): layers along the data's path, imports one way.

Read from the source with ``ast``, so the test sees every import, lazy ones included.
"""

import ast
import os
import tomllib

import pytest

from cifar10_estimator.errors import SCRIPTS_PREFIX

PACKAGE = "cifar10_estimator"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PACKAGE)
# Lower layers never import higher ones: the foundations, then the settings, then the
# subpackages along the data's path up to the training loop, then the rooms that launch
# tasks and run sweeps of them, then the commands (docs/architecture.md).
FOUNDATIONS = ("errors", "cli", "storage", "logs", "engines")
SUBPACKAGES = ("config", "data", "model", "serving", "platform", "jobdir", "task",
               "evaluation", "training", "launch", "sweeps")
LAYERS = {**{name: 0 for name in FOUNDATIONS},
          **{name: i for i, name in enumerate(SUBPACKAGES, start=1)}}
COMMAND_LAYER = len(SUBPACKAGES) + 1  # train, generate, predict, demo, cluster, __main__, ...


def _modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                found[".".join([PACKAGE, *parts])] = path
    return found


def _imports(path: str, modules: dict[str, str]) -> set[str]:
    """The package modules a file imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    seen = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != PACKAGE:
                seen.add(name)
    return seen


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.get(parts[1], COMMAND_LAYER) if len(parts) > 1 else COMMAND_LAYER


MODULES = _modules()
GRAPH = {m: _imports(p, MODULES) - {m} for m, p in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_higher_layer(module):
    upward = sorted(m for m in GRAPH[module] if _layer(m) > _layer(module))
    assert not upward, f"{module} imports {upward} from a higher layer"


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for child in sorted(GRAPH[module]):
            if state.get(child) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path + [module, child]))
            if child not in state:
                visit(child, path + [module])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [])


def test_the_foundations_import_one_way():
    # Any module may import any foundation, so the foundations themselves must import each
    # other in one order, each only ones before it. The module-level cycle test misses a
    # circle that passes through different modules of a foundation: cli imported storage/'s
    # local.py, whose siblings import errors, which imported cli.
    imports: dict[str, dict[str, str]] = {name: {} for name in FOUNDATIONS}
    for module, imported in GRAPH.items():
        here = module.split(".")[1] if "." in module else None
        if here not in imports:
            continue
        for other in sorted(imported):
            there = other.split(".")[1] if "." in other else None
            if there in imports and there != here:
                imports[here].setdefault(there, f"{module} imports {other}")
    order: list[str] = []
    while len(order) < len(imports):
        ready = [name for name in FOUNDATIONS
                 if name not in order and set(imports[name]) <= set(order)]
        assert ready, "the foundations import each other in a circle: " + "; ".join(
            why for name in FOUNDATIONS if name not in order
            for there, why in imports[name].items() if there not in order)
        order.append(ready[0])


# The commands, each a module at the top of the package; every one but __main__ (``python -m
# cifar10_estimator``, the trainer's) is also a console script of pyproject.toml.
COMMANDS = ("train", "generate", "predict", "evaluate", "convert", "demo", "cluster", "sweep",
            "__main__")


def test_the_layers_exist_and_commands_sit_on_top():
    # A foundation may be a package too (storage/): its modules stay in layer 0.
    packages = {m.split(".")[1] for m in MODULES if m.count(".") >= 2} - set(FOUNDATIONS)
    assert packages == set(SUBPACKAGES)
    for command in COMMANDS:
        assert f"{PACKAGE}.{command}" in MODULES


def test_every_top_level_module_is_a_foundation_or_a_listed_command():
    # A new command module that this test does not name would sit on top unchecked.
    top = {m.split(".")[1] for m, path in MODULES.items()
           if m.count(".") == 1 and os.path.basename(path) != "__init__.py"}
    assert top - set(FOUNDATIONS) == set(COMMANDS)


def test_every_command_but_main_is_a_console_script_named_as_the_errors_expect():
    with open(os.path.join(os.path.dirname(ROOT), "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    targets = {}
    for script, target in scripts.items():
        # errors.invoked_as names a console script only by this prefix; another name's
        # errors would read "python -m ...".
        assert script.startswith(SCRIPTS_PREFIX), script
        module, _, attribute = target.partition(":")
        assert module.startswith(f"{PACKAGE}.") and attribute, target
        command = module.split(".", 1)[1]
        assert command in COMMANDS, f"{script} runs {module}, which is no command module"
        assert attribute in _top_level_names(MODULES[module]), f"{script}: {target} is missing"
        targets[command] = script
    assert set(targets) == set(COMMANDS) - {"__main__"}


def _top_level_names(path: str) -> set[str]:
    """The names a module binds at its top level (functions, classes, assignments)."""
    names = set()
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _named_modules(module: str) -> set[str]:
    """The package modules an import in ``module`` names (``from pkg import a, b``: a and b)."""
    named = set()
    for node in ast.walk(ast.parse(open(MODULES[module]).read())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                named.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            named.update(a.name for a in node.names if a.name.startswith(f"{PACKAGE}."))
    return named


def test_the_training_loop_reaches_at_most_eight_modules_outside_training():
    # training/ is the loop and its parts: a task's start (the data checked, the waits, the
    # lock, the plan), the specs, the end of training (result, report, export), the fence and
    # the preemption, each a module of its own beside the driver. What the driver reaches in
    # the other rooms is what couples the loop to them: kept few (docs/architecture.md).
    room = f"{PACKAGE}.training."
    named = {m for m in _named_modules(f"{room}driver") if not m.startswith(room)}
    assert len(named) <= 8, sorted(named)


# What TensorFlow's Estimator calls back: session hooks, checkpoint listeners, exporters, and
# the model_fn's EstimatorSpec. They live in one room, training/estimator/ (docs/architecture.md),
# so that a release that changes Estimator's contracts has one room to open beside the estimator
# layer (tf-estimator-compat/).
CALLBACK_BASES = ("SessionRunHook", "CheckpointSaverHook", "CheckpointSaverListener", "Exporter")


def _estimator_callbacks(path: str) -> list[str]:
    """Classes in ``path`` that subclass one of Estimator's callback bases, and calls that build
    an ``EstimatorSpec``."""
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name in CALLBACK_BASES:
                    found.append(f"class {node.name}({name}) line {node.lineno}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "EstimatorSpec":
                found.append(f"EstimatorSpec(...) line {node.lineno}")
    return found


def test_what_estimator_calls_back_lives_in_the_estimator_room():
    room = f"{PACKAGE}.training.estimator"
    outside = {m: found for m, path in MODULES.items()
               if not (m == room or m.startswith(room + "."))
               for found in [_estimator_callbacks(path)] if found}
    assert not outside, outside
    # And the room is what it says: the model_fn, the input_fns, the hooks, the exporter.
    inside = {m for m, path in MODULES.items() if m.startswith(room + ".")
              and _estimator_callbacks(path)}
    assert {f"{room}.model_fn", f"{room}.exporter", f"{room}.progress", f"{room}.fence",
            f"{room}.precise_bn", f"{room}.preemption_hooks", f"{room}.cluster_hooks",
            f"{room}.sync_replicas"} <= inside
    assert f"{room}.input_fn" in MODULES


LIBRARY = sorted(m for m in MODULES if _layer(m) < COMMAND_LAYER)


@pytest.mark.parametrize("module", LIBRARY)
def test_no_library_module_reads_the_environment(module):
    # The commands read the environment and pass values down (docs/architecture.md).
    for node in ast.walk(ast.parse(open(MODULES[module]).read())):
        read = (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "os" and node.attr in ("environ", "environb", "getenv",
                                                            "putenv", "unsetenv"))
        imported = (isinstance(node, ast.ImportFrom) and node.module == "os"
                    and any(a.name in ("environ", "getenv") for a in node.names))
        assert not (read or imported), f"{module} line {node.lineno} reads the environment"


SECTION_TYPES = {"DataSection", "ModelSection", "ScheduleSection", "DevicesSection",
                 "ClusterSection", "OutputSection", "LoggingSection"}


def _derivations(function) -> list[str]:
    """The expressions in ``function`` that derive a fact from one of its settings sections:
    arithmetic, a comparison or and/or that reads a section's field (or a local name set to
    one) and combines it with at least one other fact (a name that is not a CONSTANT, and no
    call: ``if settings.x and not act()`` is a guarded action, not a fact)."""
    sections = {a.arg for a in function.args.args + function.args.kwonlyargs
                if a.annotation is not None and any(isinstance(n, ast.Name) and n.id in
                                                    SECTION_TYPES for n in ast.walk(a.annotation))}
    if not sections:
        return []

    def field(node) -> bool:
        return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in sections)

    aliases = {node.targets[0].id for node in ast.walk(function)
               if isinstance(node, ast.Assign) and len(node.targets) == 1
               and isinstance(node.targets[0], ast.Name) and field(node.value)}

    def reads(node) -> bool:
        return any(field(n) or (isinstance(n, ast.Name) and n.id in aliases)
                   for n in ast.walk(node))

    def fact(node) -> bool:
        inside = list(ast.walk(node))
        return (not any(isinstance(n, (ast.Call, ast.Lambda)) for n in inside)
                and any(isinstance(n, ast.Name) and not n.id.isupper() for n in inside))

    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.BinOp):
            operands = [node.left, node.right]
        elif isinstance(node, ast.BoolOp):
            operands = node.values
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        else:
            continue
        if (any(reads(o) and fact(o) for o in operands)
                and sum(fact(o) for o in operands) >= 2):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_config_derives_a_fact_from_a_section():
    # Every fact derived from the settings is a field of the plan (config/plan.py), computed
    # once, or a rule there (docs/architecture.md): "is precise batch norm on?" is
    # plan.precise_bn_batches, not a condition rebuilt where it is used.
    found = []
    for module, path in sorted(MODULES.items()):
        if module.split(".")[1:2] == ["config"]:
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [f"{module}.{node.name}, {d}" for d in _derivations(node)]
    assert not found, "\n".join(found)


def test_the_derivation_finder_sees_what_the_plan_took_over():
    # The three facts issue 77 moved into the plan, as training/specs.py computed them.
    source = '''
def specs(plan, model: ModelSection, output: OutputSection, cluster: ClusterSection):
    precise = model.precise_bn_batches and not model.moving_average_decay
    steps = max(1, math.ceil(output.save_checkpoints_epochs * plan.steps_per_epoch))
    delay = cluster.max_worker_delay_secs
    if delay is None and plan.steps_together:
        delay = 0
    if model.model == TUTORIAL_CNN:  # reads, not facts
        check(output.job_dir is not None)
    if output.export_best and not make(output.job_dir):  # a guarded action
        pass
'''
    found = _derivations(ast.parse(source).body[0])
    assert sorted(line.split(":")[0] for line in found) == ["line 3", "line 4", "line 6"], found


def test_no_two_modules_share_a_base_name_and_no_public_class_is_defined_twice():
    # One meaning per name: a reader who meets `settings` or `Cluster` opens one file.
    bases, classes = {}, {}
    for module, path in MODULES.items():
        if not path.endswith("__init__.py"):
            bases.setdefault(os.path.basename(path), []).append(module)
        for node in ast.parse(open(path).read()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                classes.setdefault(node.name, []).append(module)
    assert {b: m for b, m in bases.items() if len(m) > 1} == {}
    assert {c: m for c, m in classes.items() if len(m) > 1} == {}


def test_estimator_itself_is_named_only_in_its_room():
    # RunConfig, the specs, train_and_evaluate, the evaluator's Estimator.evaluate loop, ModeKeys:
    # the next TensorFlow that changes Estimator has training/estimator/ and the estimator
    # layer (tf-estimator-compat/) to open (docs/architecture.md).
    room = f"{PACKAGE}.training.estimator"
    found = []
    for module, path in sorted(MODULES.items()):
        if module.startswith(room):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Attribute) and node.attr == "estimator" and (
                    ast.unparse(node.value) in ("tf", "tf.compat.v1", "tf.compat.v2")):
                found.append(f"{module} line {node.lineno}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "tensorflow_estimator"):
                found.append(f"{module} line {node.lineno}")
    assert found == []


@pytest.mark.parametrize("module, function", [("training.driver", "train_and_evaluate"),
                                              ("training.start", "start")])
def test_the_root_functions_of_a_run_take_the_three_groups_of_settings(module, function):
    # Model Garden's tree: the problem (data, model), the trainer (schedule, output, logging),
    # the runtime (devices, cluster); each callee gets the sections it reads.
    tree = ast.parse(open(MODULES[f"{PACKAGE}.{module}"]).read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    settings = [a.arg for a in node.args.args + node.args.kwonlyargs if a.annotation is not None
                and ast.unparse(a.annotation).endswith(("Section", "Settings"))]
    assert settings == ["problem", "trainer", "runtime"]
