"""What a SavedModel may run: the check of an export before ``predict`` or ``evaluate`` loads it.

A SavedModel is a program. Its graph may hold any of TensorFlow's ops, and some act outside the
model: ``WriteFile`` writes a file when a signature calls it, ``ReadFile`` and ``MatchingFiles``
read and list files, ``SaveV2`` and ``RestoreV2`` write and read checkpoints anywhere, ``PyFunc``
and ``EagerPyFunc`` call Python. Some of it runs at load alone: a TF1 SavedModel's init op
(``main_op``, ``legacy_init_op``, the ``__saved_model_init_op`` signature), which
``tf.saved_model.load`` runs, and a TF2 SavedModel's resources, whose initializer functions it
calls.

``check_export`` reads ``saved_model.pb`` alone (parsing a proto runs no op) and refuses, in one
line naming the file and what it found, any SavedModel that holds more than this package's
exports hold:

- a ``saved_model.pb`` over ``MAX_SAVED_MODEL_BYTES``, before it is parsed;
- an op outside the allow-lists, wherever it is: in the graph, or in ANY function of its library,
  called or not (a While's body, an If's branches, a gradient, a function that only an
  attribute names). An attribute naming a function the library lacks names an op: TensorFlow
  runs the registered op of that name (``FunctionLibraryRuntime`` instantiates a primitive op
  for a name that is no function), so that name is checked as an op;
- the checkpoint ops ``tf.saved_model.save`` puts in its saver (``SAVE_OPS``, ``RESTORE_OPS``)
  outside the saver's own save or restore functions, or in a function something else calls too;
- an init op other than ours: ``tf.saved_model.save`` writes one ``NoOp`` without inputs, named
  by the ``saved_model_main_op`` collection and the ``__saved_model_init_op`` signature;
- any other collection (``legacy_init_op``, TF1 assets and variables), a TF1 asset, and objects
  of the TF2 object graph of kinds our exports lack (a resource, whose initializer runs at load;
  an asset; a variable), or that name Python code registered for loading them.

``SERVING_OPS``, ``SAVE_OPS`` and ``RESTORE_OPS`` are the ops real exports of this package use,
derived from exports of both networks in both precisions, with and without test-time
mirroring, and pinned by ``tests/test_export_trust.py``: a change to the export that uses a new
op fails that test until the op is added here, consciously. An op today's exports dropped
moves to ``EARLIER_SERVING_OPS``, so that earlier exports still load.

TensorFlow's own ``saved_model_cli scan`` is a deny-list (WriteFile, ReadFile and PrintV2 in TF
2.15's ``saved_model_cli._OP_DENYLIST``) over the ops ``meta_graph.ops_used_by_graph_def``
finds, which follows only the functions that nodes call directly or through
``(Stateful)PartitionedCall``'s ``f``: an op in a While's body or an If's branch escapes it. An
allow-list over every function of the library is stricter.

What the check cannot see (docs/serving.md): what the allowed ops compute, and the memory and
time they may take.
"""

import dataclasses
from typing import Iterable, Iterator, Optional

from cifar10_estimator import storage
from cifar10_estimator.errors import UserError

# tf.saved_model.SAVED_MODEL_FILENAME_PB, named without importing TensorFlow (the commands import
# this module before it loads).
SAVED_MODEL_FILE = "saved_model.pb"
# The flag of the commands that load an export (predict, evaluate) that skips the check, named
# in its refusals, and its help.
TRUST_FLAG = "--trust-export"
TRUST_HELP = ("load the SavedModel, or .tflite or .onnx file, without checking that it holds "
              "only what this package's exports hold (no op that reads or writes files or "
              "calls Python, no init op that does work, no custom op, no data outside its "
              "folder): a model is a program, so only if you trust its source "
              "(docs/serving.md)")
# The largest saved_model.pb parsed. An export holds its weights as constants, about 4.2 bytes a
# weight (ResNet-110's 1,736,058 weights and batch-norm statistics: 7,304,744 bytes; the
# tutorial CNN: 4.4 MB), so ResNet-1202, the deepest network of He et al. 2015's CIFAR-10
# experiments (19.4M weights), exports about 82 MB. 256 MiB is three times that, and an eighth
# of protobuf's 2 GiB limit on a message.
MAX_SAVED_MODEL_BYTES = 256 << 20

# The ops of every function an export's signatures reach, and of its graph's own nodes: the
# networks, the picture decoding of serving_bytes, the tf.train.Example parsing of
# serving_examples and classify, and the calls between them (MirrorPad: the shifted views of
# --test-time-shift, edges reflected).
SERVING_OPS = (
    "Abs", "AddV2", "All", "ArgMax", "Assert", "AvgPool", "BiasAdd", "Cast", "ConcatV2", "Const",
    "Conv2D", "DecodeImage", "DecodeRaw", "EnsureShape", "Equal", "ExpandDims",
    "ExtractJpegShape", "FloorMod", "FusedBatchNormV3", "GatherV2", "Greater", "GreaterEqual",
    "Identity", "If", "LRN", "LeftShift", "Less", "LessEqual", "LogicalAnd", "LogicalNot",
    "LogicalOr", "MatMul", "MaxPool", "Maximum", "Mean", "Minimum", "MirrorPad", "Mul", "NoOp",
    "Pack", "Pad",
    "ParseExampleV2", "PartitionedCall", "Placeholder", "Prod", "Range", "RealDiv", "Relu",
    "Reshape", "ResizeArea", "ReverseV2", "Round", "Rsqrt", "SelectV2", "Shape", "Slice",
    "Softmax", "Sqrt", "Square", "Squeeze", "StatefulPartitionedCall", "StatelessIf",
    "StatelessWhile", "StridedSlice", "StringJoin", "StringLength", "Sub", "Substr",
    "TensorListFromTensor", "TensorListGetItem", "TensorListReserve", "TensorListSetItem",
    "TensorListStack", "Tile", "Unpack", "While",
)
# Ops that exports written by earlier versions of the package use and today's no longer do:
# those exports still load. Transpose: the tf.train.Example signatures turned the pictures'
# bytes from CHW to HWC with it (data.schema.decode_images unstacks and stacks the channels
# since, which TensorFlow 2.21's oneDNN pass does not log an error for).
EARLIER_SERVING_OPS = ("Transpose",)
# The further ops of the saver's save function (tf.saved_model.save's _traced_save), which
# saver_def.save_tensor_name reaches: a checkpoint written where its caller says. No loader
# calls it.
SAVE_OPS = ("MergeV2Checkpoints", "SaveV2", "Select", "ShardedFilename", "StaticRegexFullMatch")
# The further ops of the saver's restore function (_traced_restore), which
# saver_def.restore_op_name names: TF Serving's C++ loader runs it on the export's own
# variables/ folder.
RESTORE_OPS = ("RestoreV2",)

# The init op of a TF2 SavedModel, and the collections a TF1 loader reads one from
# (tensorflow/python/saved_model/constants.py; loader_impl.get_init_op tries them in this order).
INIT_OP_SIGNATURE = "__saved_model_init_op"
MAIN_OP_COLLECTION = "saved_model_main_op"
LEGACY_INIT_OP_COLLECTION = "legacy_init_op"
# The only collection our exports have: the main op, the same NoOp as the init signature's.
COLLECTIONS = (MAIN_OP_COLLECTION,)
# The kinds of objects of our exports' TF2 object graph (SavedObject's "kind"): the module,
# its signature map and dicts, and its functions. No resource (its initializer function runs
# at load), asset, variable, constant or captured tensor.
OBJECT_KINDS = ("bare_concrete_function", "function", "user_object")
_OBJECT_RISKS = {"resource": ", whose initializer tf.saved_model.load runs",
                 "asset": ", a file that an initializer reads when it is loaded",
                 "variable": ", restored from a checkpoint when it is loaded"}

GRAPH = "graph"  # where an op is: the graph's own nodes, or a function in one of these roles
SERVING, SAVE, RESTORE = "serving", "save", "restore"
_SERVING = SERVING_OPS + EARLIER_SERVING_OPS
_ALLOWED = {GRAPH: frozenset(_SERVING), SERVING: frozenset(_SERVING),
            SAVE: frozenset(_SERVING + SAVE_OPS), RESTORE: frozenset(_SERVING + RESTORE_OPS)}
_CHECKPOINT_FILE_OPS = ("MergeV2Checkpoints", "RestoreV2", "SaveV2")
# Ops that act outside the model (files, Python, the log): a refusal names one of these before
# any other op the allow-lists lack, so the line says what the SavedModel would do (an If on
# a RandomUniform hiding a WriteFile is refused for the WriteFile).
_OUTSIDE_OPS = frozenset(("WriteFile", "ReadFile", "MatchingFiles", "Save", "SaveSlices",
                          "SaveV2", "Restore", "RestoreSlice", "RestoreV2",
                          "MergeV2Checkpoints", "PyFunc", "PyFuncStateless", "EagerPyFunc",
                          "Print", "PrintV2"))
_SHOWN_CHARS = 80  # a name from the file is shown up to this long, so the refusal stays short


@dataclasses.dataclass(frozen=True)
class OpUse:
    """One op a SavedModel holds: its name, the function it is in (None: the graph's own
    nodes) and that function's role: ``GRAPH``, ``SERVING`` (anything but the saver's own
    functions), ``SAVE`` or ``RESTORE`` (reached from the saver's save tensor or restore op, and
    from nothing else)."""

    op: str
    function: Optional[str]
    role: str


def _names_in_attr(value) -> Iterator[str]:
    """The function names an ``AttrValue`` holds: ``func``, ``list.func``, and those in their
    own attributes (a NameAttrList's attrs may hold functions too)."""
    funcs = [value.func] if value.HasField("func") else []
    if value.HasField("list"):
        funcs.extend(value.list.func)
    for func in funcs:
        yield func.name
        for inner in func.attr.values():
            yield from _names_in_attr(inner)


def _references(nodes, library: dict, attrs=()) -> tuple[list[str], set[str]]:
    """The ops ``nodes`` run and the library functions they call: a node's op that names a
    library function is a call, any other is an op; so is each function name in an attribute
    of a node or in ``attrs`` (a function's own attributes and its attributes' defaults)."""
    names = [name for value in attrs for name in _names_in_attr(value)]
    for node in nodes:
        names.append(node.op)
        names.extend(n for value in node.attr.values() for n in _names_in_attr(value))
    ops = [name for name in names if name not in library]
    return ops, {name for name in names if name in library}


def _reach(start: Iterable[str], calls: dict) -> set[str]:
    """``start`` and every function they call, directly or not."""
    seen, todo = set(), list(start)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(calls.get(name, ()))
    return seen


def _node_name(tensor_or_op: str) -> str:
    """``name`` of ``name:0``, ``^name`` or ``name``."""
    return tensor_or_op.lstrip("^").split(":")[0]


def _object_functions(meta_graph) -> set[str]:
    """The functions the TF2 object graph names."""
    objects = meta_graph.object_graph_def
    names = set(objects.concrete_functions)
    for obj in objects.nodes:
        names.update(obj.function.concrete_functions)
        names.add(obj.bare_concrete_function.concrete_function_name)
        names.add(obj.captured_tensor.concrete_function)
    return names - {""}


def op_uses(meta_graph) -> list[OpUse]:
    """Every op of one meta graph, with where it is (see ``OpUse``), in the file's order."""
    graph = meta_graph.graph_def
    library = {f.signature.name: f for f in graph.library.function}
    ops = {name: [] for name in library}
    calls = {name: set() for name in library}
    for function in graph.library.function:  # each one, should two share a name
        attrs = [*function.attr.values(), *(attr.default_value for attr in
                                            function.signature.attr)]
        function_ops, function_calls = _references(function.node_def, library, attrs)
        ops[function.signature.name].extend(function_ops)
        calls[function.signature.name] |= function_calls
    uses = []
    for gradient in graph.library.gradient:  # a function's gradient is a call of it
        if gradient.gradient_func in library:
            calls.setdefault(gradient.function_name, set()).add(gradient.gradient_func)
        else:
            uses.append(OpUse(gradient.gradient_func, gradient.function_name, SERVING))
    saver_nodes = {SAVE: _node_name(meta_graph.saver_def.save_tensor_name),
                   RESTORE: _node_name(meta_graph.saver_def.restore_op_name)}
    reached = {SAVE: set(), RESTORE: set(), SERVING: set()}
    for node in graph.node:
        node_ops, node_calls = _references([node], library)
        uses.extend(OpUse(op, None, GRAPH) for op in node_ops)
        role = next((r for r, n in saver_nodes.items() if n and node.name == n), SERVING)
        reached[role] |= node_calls
    reached[SAVE] = _reach(reached[SAVE], calls)
    reached[RESTORE] = _reach(reached[RESTORE], calls)
    # The TF2 object graph's functions are what tf.saved_model.load gives Python to call (the
    # signatures among them); any function outside the saver's may be called from elsewhere too,
    # and so may every function it calls: a saver function one of them calls is no longer the
    # saver's alone.
    others = (set(library) - reached[SAVE] - reached[RESTORE]) | _object_functions(meta_graph)
    reached[SERVING] = _reach(reached[SERVING] | others, calls)
    for name in library:
        if name in reached[SERVING] or (name in reached[SAVE] and name in reached[RESTORE]):
            role = SERVING
        else:
            role = SAVE if name in reached[SAVE] else RESTORE
        uses.extend(OpUse(op, name, role) for op in ops[name])
    return uses


def _shown(name: str) -> str:
    """A name from the file as a refusal shows it: printable, on one line, not too long."""
    text = name if name and name.isprintable() and name.strip() == name else repr(name)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _refusal(path: str, what: str) -> UserError:
    return UserError(f"{path} {what}, which this package's exports never do: a SavedModel is a "
                     f"program; add {TRUST_FLAG} to load it anyway if you trust its source")


def _check_ops(path: str, meta_graph) -> None:
    bad = [use for use in op_uses(meta_graph) if use.op not in _ALLOWED[use.role]]
    if not bad:
        return
    # The refusal names the worst: an op that acts outside the model, one none of our exports
    # has before the saver's; else any other op none of our exports has; else a checkpoint op
    # that reads or writes files, else the saver's other ops (a saver function a signature
    # calls holds all three kinds).
    use = min(bad, key=lambda u: (u.op not in _OUTSIDE_OPS,
                                  u.op in SAVE_OPS or u.op in RESTORE_OPS,
                                  u.op not in _CHECKPOINT_FILE_OPS))
    where = "in its graph" if use.function is None else f"in the function {_shown(use.function)}"
    if use.op in SAVE_OPS or use.op in RESTORE_OPS:
        where += " outside the checkpoint saver's own functions"
    raise _refusal(path, f"runs the op {_shown(use.op)} {where}")


def _check_init_op(path: str, nodes: dict, name: str, named_by: str) -> None:
    """Refuses an init op other than our exports': a NoOp without inputs."""
    node = nodes.get(_node_name(name))
    if node is None:
        raise _refusal(path, f"names {_shown(name)}, no node of its graph, as its init op "
                             f"({named_by})")
    if node.op != "NoOp" or len(node.input):
        runs = (f"the op {_shown(node.op)}" if node.op != "NoOp"
                else "its inputs " + ", ".join(_shown(i) for i in node.input[:3])
                + (", ..." if len(node.input) > 3 else ""))
        raise _refusal(path, f"has an init op ({named_by}) that runs {runs} when it is loaded")


def _check_init_and_objects(path: str, meta_graph) -> None:
    nodes = {node.name: node for node in meta_graph.graph_def.node}
    for key, collection in meta_graph.collection_def.items():
        if key not in COLLECTIONS:
            what = ("a legacy init op" if key == LEGACY_INIT_OP_COLLECTION
                    else f"the collection {_shown(key)}")
            raise _refusal(path, f"holds {what} (a TF1 SavedModel's init op, assets or "
                                 f"variables)")
        if collection.WhichOneof("kind") != "node_list":
            raise _refusal(path, f"holds a {key} collection of {collection.WhichOneof('kind')}")
        for name in collection.node_list.value:
            _check_init_op(path, nodes, name, f"the {key} collection")
    if INIT_OP_SIGNATURE in meta_graph.signature_def:
        signature = meta_graph.signature_def[INIT_OP_SIGNATURE]
        if len(signature.inputs):
            raise _refusal(path, f"has an init op (the {INIT_OP_SIGNATURE} signature) that "
                                 f"takes inputs")
        for output in signature.outputs.values():
            _check_init_op(path, nodes, output.name, f"the {INIT_OP_SIGNATURE} signature")
    if len(meta_graph.asset_file_def):
        raise _refusal(path, f"holds the TF1 asset {_shown(meta_graph.asset_file_def[0].filename)}"
                             f", which an init op reads when it is loaded")
    for obj in meta_graph.object_graph_def.nodes:
        kind = obj.WhichOneof("kind")
        if kind not in OBJECT_KINDS:
            raise _refusal(path, f"holds a TF2 {kind} object{_OBJECT_RISKS.get(kind, '')}")
        registered = obj.registered_name or obj.registered_saver or next(
            iter(obj.saveable_objects), "")
        if registered:
            raise _refusal(path, f"holds a TF2 object that Python code registered as "
                                 f"{_shown(registered)} loads or restores")


def read_saved_model(folder: str, max_bytes: int = MAX_SAVED_MODEL_BYTES):
    """The ``SavedModel`` proto of ``folder``'s ``saved_model.pb``, parsed (which runs nothing)
    if it is at most ``max_bytes``; UserError if it is larger, unreadable or no such proto."""
    # TensorFlow's protos, imported here: the commands import this module for TRUST_FLAG
    # before TensorFlow loads (docs/architecture.md).
    from google.protobuf import message
    from tensorflow.core.protobuf import saved_model_pb2

    path = storage.join(folder, SAVED_MODEL_FILE)
    try:
        size = storage.size(path)
        if size <= max_bytes:
            with storage.open_file(path, "rb") as f:
                data = f.read(max_bytes + 1)  # a file that grew meanwhile is not read whole
            size = max(size, len(data))
    except OSError as e:
        raise UserError(f"{path} cannot be read ({storage.reason(e)})") from None
    if size > max_bytes:
        raise UserError(f"{path} is {size:,} bytes, more than the {max_bytes:,} this "
                        f"package's exports need, so it is not read; add {TRUST_FLAG} to "
                        f"load it anyway if you trust its source")
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(data)
    except (message.DecodeError, RecursionError, ValueError):
        raise UserError(f"{path} is no SavedModel (its proto cannot be parsed); export the "
                        f"model again") from None
    return proto


def check_export(folder: str, max_bytes: int = MAX_SAVED_MODEL_BYTES) -> None:
    """Refuses (``UserError``: one line naming ``saved_model.pb`` and what it holds) a
    SavedModel that holds more than this package's exports hold: see the module."""
    path = storage.join(folder, SAVED_MODEL_FILE)
    proto = read_saved_model(folder, max_bytes)
    for meta_graph in proto.meta_graphs:  # the ops first: a refusal then names the worst
        _check_ops(path, meta_graph)
    for meta_graph in proto.meta_graphs:
        _check_init_and_objects(path, meta_graph)
