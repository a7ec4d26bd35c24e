"""Fuzzing kinds for the dataset files the generator and the trainer read.

- ``cifar-pickle``: CIFAR's python batch and meta files (``data.pickles``), with pickles that
  would run code if unpickled freely (each would create a canary file; it must not appear),
  arrays of every dtype numpy pickles (objects, records, strings; dtype states rewritten by
  BUILD), and pipes, sockets and devices in the files' place;
- ``cifar-batches``: the extracted batch folder as the generator loads it
  (``data.sources.load_source``), with pipes, sockets, devices, folders, dangling links,
  missing and empty files in place of its files, of the folder itself or of the archive;
- ``cifar-archive``: the downloaded tar archive (``data.archives.extract_batches``), with path
  tricks, links, special files and bombs (nothing may land outside the destination, no link
  may be made, and a refusal leaves the destination empty);
- ``tfrecords``: the generator's record files and its metadata file as the trainer checks
  them (``data.metadata``): accepted means the file really reads to its end. Lengths are
  rewritten with valid CRCs too (huge, just past the end, exactly at the end), metadata is
  forged to match hostile records, and pipes, sockets and devices stand in for either file.

``special_file`` makes the pipes, sockets and device links the picture and settings kinds use
too: each must be refused at once, never waited on (a case past its time limit fails).

Seed inputs are built once (``functools.cache``) in memory and mutated per case; a case only
writes under its own ``scratch`` folder.
"""

import functools
import gzip
import bz2
import hashlib
import importlib
import io
import json
import lzma
import os
import pickle
import resource
import stat
import struct
import tarfile
import tracemalloc

import numpy as np
from hypothesis import strategies as st

from fuzz import harness
from fuzz.harness import ACCEPTED, REFUSED, Violation

from cifar10_estimator.data import archives, metadata, pickles, sample_data, schema, sources
from cifar10_estimator.errors import UserError

IMAGE_BYTES = schema.IMAGE_BYTES


# ---------------------------------------------------------------------------------------------
# What is not a file: every kind that reads a local file puts these in its place.

SPECIALS = ("fifo", "socket", "dev-zero", "dev-null")


def special_file(path: str, what: str) -> None:
    """Puts at ``path`` what a reader must refuse without waiting: a FIFO that no one writes
    to (a plain open() waits forever), a socket (made by mknod, bound by no one), or a link to
    a character device (/dev/zero reads zeros without end, /dev/null nothing). Harmless to
    leave behind: removing the case's folder unlinks them, and links only point."""
    if what == "fifo":
        os.mkfifo(path)
    elif what == "socket":
        os.mknod(path, 0o600 | stat.S_IFSOCK)
    elif what in ("dev-zero", "dev-null"):
        os.symlink(f"/dev/{what[4:]}", path)
    else:
        raise ValueError(what)


# ---------------------------------------------------------------------------------------------
# cifar-pickle

def _images(n: int, width: int = IMAGE_BYTES) -> np.ndarray:
    # A pattern, not random bytes: the seeds stay small once compressed (archives).
    return (np.arange(n * width, dtype=np.int64) % 251).astype(np.uint8).reshape(n, width)


def _batch(n: int = 2) -> dict:
    return {"batch_label": "training batch 1 of 5", "labels": [i % 10 for i in range(n)],
            "data": _images(n), "filenames": [f"img_{i:06d}.png" for i in range(n)]}


@functools.cache
def _pickle_seeds() -> tuple[bytes, ...]:
    """A valid two-image batch as Python 2 wrote it, and as Python 3 re-saves it (protocols
    0 to 5: text opcodes, ``_codecs.encode`` for bytes, ``_frombuffer``)."""
    batch = _batch()
    return (pickles.dumps_py2(batch),) + tuple(pickle.dumps(batch, protocol=p) for p in range(6))


@functools.cache
def _meta_seed() -> bytes:
    return pickles.dumps_py2({"num_cases_per_batch": 2, "label_names": list(schema.CLASS_NAMES),
                              "num_vis": IMAGE_BYTES})


def _text(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogatepass")
    return pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw


def _asm(x) -> bytes:
    """Pickle opcodes that push ``x`` (str, bytes, int, None, list, tuple) with no memo."""
    if x is None:
        return pickle.NONE
    if isinstance(x, bool):
        return pickle.NEWTRUE if x else pickle.NEWFALSE
    if isinstance(x, int):
        if 0 <= x < 256:
            return pickle.BININT1 + bytes([x])
        if -2**31 <= x < 2**31:
            return pickle.BININT + struct.pack("<i", x)
        raw = x.to_bytes((x.bit_length() + 8) // 8, "little", signed=True)
        return pickle.LONG1 + bytes([len(raw)]) + raw
    if isinstance(x, str):
        return _text(x)
    if isinstance(x, bytes):
        return pickle.SHORT_BINBYTES + bytes([len(x)]) + x if len(x) < 256 else (
            pickle.BINBYTES + struct.pack("<I", len(x)) + x)
    if isinstance(x, list):
        return pickle.EMPTY_LIST + pickle.MARK + b"".join(map(_asm, x)) + pickle.APPENDS
    if isinstance(x, tuple):
        return pickle.MARK + b"".join(map(_asm, x)) + pickle.TUPLE
    raise TypeError(type(x))


# Callables a free unpickler would import; each, given its arguments, would create the canary.
_CODE = [
    ("os", "system", "shell"), ("posix", "system", "shell"), ("builtins", "eval", "python"),
    ("builtins", "exec", "python"), ("__builtin__", "eval", "python"),
    ("subprocess", "call", "argv"), ("subprocess", "check_output", "argv"),
    ("subprocess", "Popen", "argv"), ("builtins", "open", "open"), ("io", "open", "open"),
    ("pathlib", "Path.touch", "path"), ("numpy", "save", "open"),
    # Admitted names put to uses numpy's pickles never make.
    ("numpy.core.multiarray", "_reconstruct", "ndarray"), ("numpy", "ndarray", "shape"),
    ("numpy.core.numeric", "_frombuffer", "frombuffer"), ("_codecs", "encode", "codec"),
    ("numpy", "dtype", "dtype"),
]
_INVOKE = ("GLOBAL+REDUCE", "STACK_GLOBAL+REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX",
           "BUILD", "EXT1", "EXT2", "EXT4", "REDUCE-in-batch")


def _arguments(style: str, canary: str, big: int) -> tuple:
    return {
        "shell": (f"touch {canary}",),
        "python": (f"open({canary!r}, 'w').close()",),
        "argv": (["touch", canary],),
        "open": (canary, "w"),
        "path": (canary,),
        "ndarray": (None, (big, IMAGE_BYTES), b"B"),  # the ndarray token is pushed separately
        "shape": ((big, IMAGE_BYTES), "u1"),
        "frombuffer": (b"\0" * 8, "u1", (big, IMAGE_BYTES), "C"),
        "codec": ("x" * 64, "zlib"),
        "dtype": (("u1", (big, big)), False, True),
    }[style]


def _global(module: str, name: str, stack: bool) -> bytes:
    if stack:
        return _text(module) + _text(name) + pickle.STACK_GLOBAL
    return pickle.GLOBAL + module.encode() + b"\n" + name.encode() + b"\n"


def _hostile(recipe: tuple, canary: str) -> bytes:
    """Assembles a pickle that would run ``recipe``'s callable if unpickled freely."""
    (module, name, style), invoke, big, wrap = recipe
    args = _arguments(style, canary, big)
    if style == "ndarray":
        args_ops = pickle.MARK + _global("numpy", "ndarray", False) + b"".join(
            map(_asm, args[1:])) + pickle.TUPLE
    else:
        args_ops = _asm(args)
    stack = invoke.startswith("STACK")
    if invoke in ("GLOBAL+REDUCE", "STACK_GLOBAL+REDUCE", "REDUCE-in-batch"):
        body = _global(module, name, stack) + args_ops + pickle.REDUCE
    elif invoke == "INST":
        body = (pickle.MARK + b"".join(map(_asm, args)) + pickle.INST + module.encode() + b"\n"
                + name.encode() + b"\n")
    elif invoke == "OBJ":
        body = pickle.MARK + _global(module, name, False) + b"".join(map(_asm, args)) + pickle.OBJ
    elif invoke == "NEWOBJ":
        body = _global(module, name, False) + args_ops + pickle.NEWOBJ
    elif invoke == "NEWOBJ_EX":
        body = _global(module, name, True) + args_ops + pickle.EMPTY_DICT + pickle.NEWOBJ_EX
    elif invoke == "BUILD":
        # BUILD sets attributes on what it builds: here on the admitted callable itself.
        state = (pickle.NONE + pickle.EMPTY_DICT + _text("__defaults__") + _asm(("x", "zlib"))
                 + pickle.SETITEM + pickle.TUPLE2)
        body = _global(module, name, False) + state + pickle.BUILD
    else:  # EXTn: the extension registry (empty here) names a callable by a number
        code = {"EXT1": pickle.EXT1 + b"\x01", "EXT2": pickle.EXT2 + b"\x01\x02",
                "EXT4": pickle.EXT4 + b"\x01\x02\x03\x04"}[invoke]
        body = code + args_ops + pickle.REDUCE
    if wrap or invoke == "REDUCE-in-batch":
        # Inside an otherwise sound batch, as the value of 'data' or of a label.
        body = (pickle.EMPTY_DICT + pickle.MARK + _text("data") + body + _text("labels")
                + _asm([0]) + pickle.SETITEMS)
    return pickle.PROTO + b"\x02" + body + pickle.STOP


def _deep(shape: str, depth: int) -> bytes:
    """Nested or self-referencing structures, alone or as a batch's labels."""
    if shape == "lists":
        inner = pickle.EMPTY_LIST * depth + pickle.APPEND * (depth - 1)
    elif shape == "dicts":
        inner = pickle.EMPTY_DICT + (_text("k") + pickle.EMPTY_DICT) * (depth - 1) + (
            pickle.SETITEM * (depth - 1))
    elif shape == "tuples":
        inner = pickle.MARK * depth + pickle.TUPLE * depth
    elif shape == "marks":  # marks never closed
        inner = pickle.MARK * depth + pickle.NONE
    elif shape == "self-list":  # a list that holds itself, `depth` times
        inner = pickle.EMPTY_LIST + pickle.BINPUT + b"\x00" + pickle.MARK + (
            pickle.BINGET + b"\x00") * min(depth, 10_000) + pickle.APPENDS
    elif shape == "self-dict":
        inner = pickle.EMPTY_DICT + pickle.BINPUT + b"\x00" + _text("labels") + (
            pickle.BINGET + b"\x00") + pickle.SETITEM
    else:  # "memo": memo indices far beyond what the file stores
        inner = pickle.NONE + pickle.LONG_BINPUT + struct.pack("<I", min(depth * 4096, 2**32 - 1))
    batch = (pickle.EMPTY_DICT + pickle.MARK + _text("data") + pickles.dumps_py2(_images(1))[2:-1]
             + _text("labels") + pickle.EMPTY_LIST + inner + pickle.APPEND + pickle.SETITEMS)
    return pickle.PROTO + b"\x02" + (batch if depth % 2 else inner) + pickle.STOP


def _array(draw) -> object:
    n = draw(st.integers(0, 3))
    width = draw(st.sampled_from((IMAGE_BYTES, IMAGE_BYTES - 1, IMAGE_BYTES + 1, 0, 1024)))
    how = draw(st.sampled_from(("uint8", "int64", "float32", "bool", "object", "1d", "3d",
                                "fortran", "bytes", "list", "none", "structured",
                                "object-field", "string", "complex")))
    base = _images(n, width)
    if how in ("int64", "float32", "bool"):
        return base.astype(how)
    if how == "object":
        return base.astype(object)
    if how == "1d":
        return base.reshape(-1)
    if how == "3d":
        return base.reshape(n, 1, width)
    if how == "fortran":
        return np.asfortranarray(base)
    if how == "bytes":
        return base.tobytes()
    if how == "list":
        return base.tolist()
    if how == "none":
        return None
    if how == "structured":
        return np.zeros((n, width), dtype=[("r", "u1")])
    if how == "object-field":
        return np.zeros((n, width), dtype=[("r", "O")])
    if how == "string":
        return base.astype("S1")
    if how == "complex":
        return base.astype(np.complex64)
    return base


_LABEL = st.one_of(st.integers(-2, 12), st.integers(-2**70, 2**70), st.booleans(),
                   st.floats(allow_nan=True), st.binary(max_size=4), st.text(max_size=4),
                   st.none(), st.lists(st.integers(0, 9), max_size=3))


@st.composite
def _generated_batch(draw) -> bytes:
    """A batch-like object with the wrong types, shapes and counts, pickled several ways."""
    data = _array(draw)
    rows = len(data) if hasattr(data, "__len__") and not isinstance(data, bytes) else 1
    count = max(0, rows + draw(st.sampled_from((0, 0, 0, -1, 1, 1000))))
    labels = (draw(st.lists(_LABEL, max_size=5)) + [0] * count)[:count]
    container = draw(st.sampled_from(("list", "list", "tuple", "array", "dict")))
    if container == "tuple":
        labels = tuple(labels)
    elif container == "array":
        labels = np.array(labels, dtype=object)
    elif container == "dict":
        labels = dict(enumerate(labels))
    keys = draw(st.sampled_from(("bytes", "text", "missing-data", "missing-labels", "extra",
                                 "fine_labels")))
    obj = {"data": data, "labels": labels, "batch_label": "x"}
    if keys == "missing-data":
        del obj["data"]
    elif keys == "missing-labels":
        del obj["labels"]
    elif keys == "extra":
        obj["extra"] = draw(st.lists(_LABEL, max_size=3))
    elif keys == "fine_labels":
        obj["fine_labels"] = obj.pop("labels")
    top = draw(st.sampled_from(("dict", "dict", "list", "array", "none")))
    if top == "list":
        obj = [obj]
    elif top == "array":
        obj = _images(1)
    elif top == "none":
        obj = None
    protocol = draw(st.sampled_from(("py2", 0, 2, 4, 5)))
    if keys == "text" or protocol != "py2":
        try:
            return pickle.dumps(obj, protocol=2 if protocol == "py2" else protocol)
        except Exception:  # noqa: BLE001 - what pickle cannot write is not a case
            return b""
    try:
        return pickles.dumps_py2(obj)
    except Exception:  # noqa: BLE001 - non-ASCII text: Python 2 could not have written it
        return pickle.dumps(obj, protocol=2)


# dtypes by name, as numpy's pickles give them to numpy.dtype: the plain numeric ones a batch may
# hold, and every other kind (objects, records, void, sub-arrays, strings, dates, complex),
# misspelt and over-long names.
_DTYPE_NAMES = ("u1", "|u1", "f8", "b1", "i8", ">u2", "float64", "O", "O8", "V8", "S3", "U2",
                "M8", "m8[s]", "c8", "u1,u1", "(2,)u1", "(3072,)u1", "x", "u" * 40)
# A dtype's BUILD state, flags last: None (no BUILD), numpy's own for a plain dtype (0), and
# the flags of an object dtype (63: NPY_OBJECT_DTYPE_FLAGS), which numpy's dtype.__setstate__
# takes as they are.
_DTYPE_FLAGS = (None, 0, 63, 1, 8)
_SHAPES = ((1, IMAGE_BYTES), (2, IMAGE_BYTES), (3,), (10**6,), (10**6, IMAGE_BYTES), (0,), ())
_ARRAY_DATA = ("exact", "short", "list-exact", "list-short", "none")


def _dtype_ops(name, copy: bool, flags) -> bytes:
    """Opcodes that push numpy.dtype(name, False, copy), then BUILD its state with ``flags``."""
    ops = _global("numpy", "dtype", False) + _asm((name, False, copy)) + pickle.REDUCE
    if flags is not None:
        ops += _asm((3, "|", None, None, None, -1, -1, flags)) + pickle.BUILD
    return ops


def _array_pickle(name, copy: bool, flags, shape: tuple, data: str, how: str) -> bytes:
    """A batch whose 'data' is an array assembled as numpy pickles one, its parts chosen: the
    dtype, its state, the shape, and the data (bytes or a list of items, as many as the shape
    holds or fewer). ``how``: protocol 2's _reconstruct + BUILD, or protocol 5's _frombuffer."""
    size = 1
    for n in shape:
        size *= n
    count = size if size <= 2 * IMAGE_BYTES else 3  # never more than a small file holds
    items = {"exact": bytes(count), "short": bytes(min(count, 3) // 2),
             "list-exact": [7] * count, "list-short": [7] * min(count, 3), "none": None}[data]
    if how == "frombuffer":
        array = (_global("numpy.core.numeric", "_frombuffer", False) + pickle.MARK
                 + _asm(items if isinstance(items, bytes) else b"") + _dtype_ops(name, copy, flags)
                 + _asm(shape) + _asm("C") + pickle.TUPLE + pickle.REDUCE)
    else:
        array = (_global("numpy.core.multiarray", "_reconstruct", False) + pickle.MARK
                 + _global("numpy", "ndarray", False) + _asm((0,)) + _asm(b"b") + pickle.TUPLE
                 + pickle.REDUCE + pickle.MARK + _asm(1) + _asm(shape)
                 + _dtype_ops(name, copy, flags) + pickle.NEWFALSE + _asm(items) + pickle.TUPLE
                 + pickle.BUILD)
    labels = [0] * (shape[0] if len(shape) == 2 and shape[0] <= 2 else 1)
    return (pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + pickle.MARK + _text("data") + array
            + _text("labels") + _asm(labels) + pickle.SETITEMS + pickle.STOP)


_ARRAY_CASES = st.builds(_array_pickle, st.sampled_from(_DTYPE_NAMES), st.booleans(),
                         st.sampled_from(_DTYPE_FLAGS), st.sampled_from(_SHAPES),
                         st.sampled_from(_ARRAY_DATA), st.sampled_from(("reconstruct",
                                                                        "frombuffer")))


_RAW_PICKLES = (
    b"", b".", b"N", b"\x80", b"\x80\x02", b"\x80\x02}", b"\x80\x06N.", b"(((((((.",
    b"S'\\xff\\xfe'\n.", b"V\\udcff\n.", b"X\x02\x00\x00\x00\xff\xfe.", b"I99999999999999999999\n.",
    b"cnumpy\nndarray\n.", b"\x80\x02cnumpy.core.multiarray\n_reconstruct\n.",
    b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7fN.", b"\x80\x02B\xff\xff\xff\x7fxx.",
    b"\x80\x02T\xff\xff\xff\x7fxx.", b"\x80\x05\x97.", b"P0\n.", b"\x80\x02g0\n.",
    b"\xef\xbb\xbf\x80\x02N.", "ü".encode("utf-16"),
)


def _pickle_cases() -> st.SearchStrategy:
    seeds = _pickle_seeds()
    batch_bytes = st.one_of(
        st.sampled_from(seeds).flatmap(harness.mutated),
        st.sampled_from(seeds),
        _generated_batch(),
        _generated_batch().flatmap(harness.mutated),
        st.tuples(st.sampled_from(("lists", "dicts", "tuples", "marks", "self-list", "self-dict",
                                   "memo")), st.integers(1, 20_000)).map(lambda a: _deep(*a)),
        st.sampled_from(_RAW_PICKLES),
        st.binary(max_size=256),
        _ARRAY_CASES,
    )
    hostile = st.tuples(st.sampled_from(_CODE), st.sampled_from(_INVOKE),
                        st.sampled_from((0, 1, 2, 10**5, 10**9, 2**40)), st.booleans())
    return st.one_of(
        st.tuples(st.just("batch"), batch_bytes),
        st.tuples(st.just("meta"), st.one_of(st.just(_meta_seed()),
                                             harness.mutated(_meta_seed()), batch_bytes)),
        st.tuples(st.sampled_from(("batch-hostile", "meta-hostile")), hostile),
        st.tuples(st.sampled_from(("batch-special", "meta-special")), st.sampled_from(SPECIALS)),
    )


# numpy's own _frombuffer, as it was before any case ran: NumPy 2 moved it to numpy._core
# (NumPy 1.26 has a numpy._core too, without it) and gave it a default argument (None, for
# ``like``); NumPy 1's has none.
_FROMBUFFER = importlib.import_module(
    "numpy._core.numeric" if int(np.__version__.split(".")[0]) >= 2 else "numpy.core.numeric"
)._frombuffer
_FROMBUFFER_DEFAULTS = _FROMBUFFER.__defaults__


def _admitted_unchanged() -> None:
    """The callables a pickle may name keep their attributes (BUILD sets attributes)."""
    if pickles._latin1_encode.__defaults__ != ("latin1",):
        raise Violation("a pickle changed pickles._latin1_encode.__defaults__")
    if _FROMBUFFER.__dict__ or _FROMBUFFER.__defaults__ != _FROMBUFFER_DEFAULTS:
        raise Violation("a pickle changed numpy's _frombuffer")
    shared = np.dtype(np.uint8)  # numpy's one uint8 dtype: BUILD on it would change them all
    if shared.hasobject or shared.flags != 0 or shared.itemsize != 1:
        raise Violation("a pickle changed numpy's uint8 dtype for the whole process")


def check_pickle(case, scratch: str, context) -> str:
    target, payload = case
    canary = os.path.join(scratch, "canary")
    meta = target.startswith("meta")
    path = os.path.join(scratch, "batches.meta" if meta else "data_batch_1")
    if target.endswith("special"):
        # A pipe, socket or device where the file should be: refused at once, meta included
        # (an odd but readable meta file is ignored; one that cannot be read is refused).
        special_file(path, payload)
        reader = pickles.load_label_names if meta else pickles.load_batch
        outcome, _ = harness.refused(lambda: reader(path), path)
        if outcome != REFUSED:
            raise Violation(f"{payload} in place of {path} was read")
        return outcome
    raw = _hostile(payload, canary) if target.endswith("hostile") else payload
    with open(path, "wb") as f:
        f.write(raw)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if meta:
        outcome, names = harness.refused(lambda: pickles.load_label_names(path), path)
        if outcome == ACCEPTED and names is not None and not (
                isinstance(names, tuple) and len(names) == schema.NUM_CLASSES
                and all(isinstance(n, str) for n in names)):
            raise Violation(f"load_label_names returned {names!r}")
    else:
        outcome, batch = harness.refused(lambda: pickles.load_batch(path), path)
        if outcome == ACCEPTED:
            data, labels = batch
            if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
                    and data.shape[1] == IMAGE_BYTES and data.shape[0] >= 1
                    and data.flags.c_contiguous):
                raise Violation(f"accepted data of {getattr(data, 'dtype', type(data))} "
                                f"{getattr(data, 'shape', '')}")
            if not (isinstance(labels, np.ndarray) and labels.dtype == np.int64
                    and labels.shape == (data.shape[0],)
                    and ((labels >= 0) & (labels < schema.NUM_CLASSES)).all()):
                raise Violation(f"accepted labels {labels!r}")
            if data.nbytes > len(raw):  # images the file does not hold: memory made up
                raise Violation(f"accepted {data.nbytes} image bytes from a {len(raw)}-byte file")
    if os.path.lexists(canary):
        raise Violation(f"unpickling {path} ran code (the canary file exists)")
    _admitted_unchanged()
    growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) >> 10
    if growth_mib > 256:
        raise Violation(f"reading a {len(raw)}-byte {path} took {growth_mib} MiB")
    return outcome


# ---------------------------------------------------------------------------------------------
# cifar-batches

_BATCH_FOLDER_FILES = schema.BATCH_FILES + ("batches.meta", sample_data.MARKER_NAME)
_IN_PLACE = SPECIALS + ("folder", "dangling", "missing", "empty")
# What stands where the folder itself, or the archive beside it, belongs (nothing that would
# make the generator download the archive: a case never touches the network).
_FOLDER_PLACES = {"<folder>": SPECIALS + ("dangling", "empty"), "<archive>": SPECIALS + ("empty",)}


def _batches_folder_cases() -> st.SearchStrategy:
    files = st.tuples(st.sampled_from(_BATCH_FOLDER_FILES), st.sampled_from(_IN_PLACE))
    folders = st.sampled_from(sorted(_FOLDER_PLACES)).flatmap(
        lambda where: st.tuples(st.just(where), st.sampled_from(_FOLDER_PLACES[where])))
    return st.one_of(st.lists(files, max_size=3, unique_by=lambda r: r[0]),
                     st.lists(folders, min_size=1, max_size=1)).map(tuple)


def _marker() -> bytes:
    """A sample-data marker as sample_data.write_sample_data writes it."""
    return json.dumps({"generator": sample_data._MARKER_GENERATOR,
                       "format": sample_data._MARKER_FORMAT, "seed": 0,
                       "images_per_batch": 1}).encode()


def check_batches_folder(case, scratch: str, context) -> str:
    """``load_source`` on a batch folder with some files (or the folder, or the archive)
    replaced: refused in one line naming one of them exactly when a batch cannot be read or
    batches.meta is no file it can read; never waited on."""
    data_dir = os.path.join(scratch, "data")
    folder = os.path.join(data_dir, FOLDER)
    os.makedirs(folder)
    bodies = dict(_file_bodies(), **{sample_data.MARKER_NAME: _marker()})
    for name in _BATCH_FOLDER_FILES:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(bodies[name])
    must_refuse, named = False, []
    for where, what in case:
        path = {"<folder>": folder,
                "<archive>": os.path.join(data_dir, archives.ARCHIVE_NAME)}.get(
                    where, os.path.join(folder, where))
        if where == "<archive>":
            for name in os.listdir(folder):
                os.remove(os.path.join(folder, name))
            os.rmdir(folder)
        elif os.path.isdir(path):
            for name in os.listdir(path):
                os.remove(os.path.join(path, name))
            os.rmdir(path)
        else:
            os.remove(path)
        if what in SPECIALS:
            special_file(path, what)
        elif what == "folder":
            os.mkdir(path)
        elif what == "dangling":
            os.symlink(os.path.join(scratch, "gone"), path)
        elif what == "empty":
            open(path, "wb").close()
        # The batches and the folder must be there and readable; batches.meta may be missing
        # (or a folder, or a link to nothing), but not unreadable; the marker only describes.
        if where in schema.BATCH_FILES or where in _FOLDER_PLACES or (
                where == "batches.meta" and what in SPECIALS + ("empty",)):
            must_refuse = True
            named.append(path)
    try:
        source = sources.load_source(data_dir, source_url="http://127.0.0.1:9/unreachable",
                                     log=lambda _: None, timeout=1)
    except UserError as e:
        harness.one_line(e)
        if not must_refuse:
            raise Violation(f"refused a batch folder the rules accept: {e}") from None
        if not any(path in str(e) for path in named):
            raise Violation(f"the refusal {str(e)!r} names none of {named}") from None
        return REFUSED
    if must_refuse:
        raise Violation(f"read a batch folder with {case}")
    sizes = {split: [len(batch.labels) for batch in batches]
             for split, batches in source.splits.items()}
    if sizes != {split: [1] * len(names) for split, names in schema.SPLITS.items()}:
        raise Violation(f"read batches of {sizes} images")
    return ACCEPTED


# ---------------------------------------------------------------------------------------------
# cifar-archive

FOLDER = schema.BATCHES_DIRNAME
_SCRATCH = "{SCRATCH}"  # replaced by the case's folder when the archive is built
_MEMBER_FILES = schema.BATCH_FILES + ("batches.meta", "readme.html")


@functools.cache
def _file_bodies() -> dict:
    bodies = {name: pickles.dumps_py2({"data": _images(1), "labels": [3]})
              for name in schema.BATCH_FILES}
    bodies["batches.meta"] = _meta_seed()
    bodies["readme.html"] = b"<html>fuzz copy</html>\n"
    return bodies


def _header(name: str, kind: bytes, size: int, linkname: str = "", fmt=tarfile.PAX_FORMAT,
            pax: tuple = (), mtime: int = 0, mode: int = 0o644) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname, info.mtime, info.mode = kind, size, linkname, mtime, mode
    info.pax_headers = dict(pax)
    return info.tobuf(fmt, "utf-8", "surrogateescape")


def _padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % tarfile.BLOCKSIZE)


@functools.cache
def _valid_tar() -> bytes:
    """The real archive's layout: the folder, then its files, in a tar without compression."""
    out = [_header(FOLDER + "/", tarfile.DIRTYPE, 0, mode=0o755)]
    for name, body in _file_bodies().items():
        out.append(_header(f"{FOLDER}/{name}", tarfile.REGTYPE, len(body)) + _padded(body))
    return b"".join(out) + b"\0" * (2 * tarfile.BLOCKSIZE)


def _compress(tar: bytes, how: str) -> bytes:
    if how == "gz":
        return gzip.compress(tar, compresslevel=1, mtime=0)
    if how == "bz2":
        return bz2.compress(tar, 1)
    if how == "xz":
        return lzma.compress(tar, preset=0)
    return tar


@functools.cache
def _valid_archive(how: str = "gz") -> bytes:
    return _compress(_valid_tar(), how)


@functools.cache
def _bomb(size: int) -> bytes:
    """A valid layout whose data_batch_1 is ``size`` zero bytes: a small gz, large on disk."""
    out = [_header(FOLDER + "/", tarfile.DIRTYPE, 0)]
    out.append(_header(f"{FOLDER}/data_batch_1", tarfile.REGTYPE, size))
    out.append(_padded(b"\0" * size))
    return _compress(b"".join(out) + b"\0" * 1024, "gz")


_NAMES = (
    f"{FOLDER}/data_batch_1", f"{FOLDER}/data_batch_2", f"{FOLDER}/test_batch", f"{FOLDER}/",
    FOLDER, f"./{FOLDER}/data_batch_3", f"{FOLDER}//data_batch_4", f"/{FOLDER}/data_batch_5",
    "../escaped", "../../escaped-above", f"{FOLDER}/../escaped", f"{FOLDER}/../../escaped-above",
    f"{_SCRATCH}/escaped", f"{FOLDER}/sub/data_batch_1", f"{FOLDER}/sub", "other/data_batch_1",
    "", ".", "..", "/", f"{FOLDER}/a\nb", f"{FOLDER}/a\x00b", f"{FOLDER}/\udcff\udcfe",
    f"{FOLDER}/" + "a" * 300, f"{FOLDER}/" + "é" * 40, f"{FOLDER}/.", f"{FOLDER}/..",
    f"{FOLDER}\\..\\escaped", "data_batch_1",
)
_LINKS = ("../escaped", "/etc/passwd", f"{_SCRATCH}/escaped", "data_batch_1",
          f"{FOLDER}/data_batch_1", f"{FOLDER}/data_batch_2", "", ".", "..", FOLDER,
          f"{FOLDER}/../../escaped-above", "/")
_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
          tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE, tarfile.CONTTYPE, b"Z", b"7")
_PAX = st.lists(st.tuples(
    st.sampled_from(("path", "linkpath", "size", "mtime", "uid", "gid", "uname", "mode",
                     "GNU.sparse.size", "hdrcharset")),
    st.sampled_from(("nan", "inf", "-inf", "-1e30", "1e400", "99999999999999999999", "-1",
                     "abc", "", "0", f"{FOLDER}/data_batch_1", "../escaped", "BINARY"))),
    max_size=2)


@st.composite
def _member(draw) -> tuple:
    kind = draw(st.sampled_from(_TYPES))
    name = draw(st.sampled_from(_NAMES + tuple(f"{FOLDER}/{n}" for n in _MEMBER_FILES)))
    body = draw(st.sampled_from((b"", b"x", _file_bodies()["data_batch_1"])))
    declared = draw(st.sampled_from(("actual", "actual", "more", "less", "huge", "over-limit")))
    size = {"actual": len(body), "more": len(body) + 700, "less": max(0, len(body) - 100),
            "huge": 8**11 - 1, "over-limit": archives.MAX_EXTRACTED_BYTES + 1}[declared]
    return (kind, name, draw(st.sampled_from(_LINKS)), body, size,
            draw(st.sampled_from((tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT))),
            tuple(draw(_PAX)), draw(st.sampled_from((0, -1, 8**11 - 1, 2**40))),
            draw(st.sampled_from((0o644, 0o777, 0o4755, 0, 0o7777))))


def _build(members: tuple, valid_first: bool, scratch: str) -> bytes:
    out = [_valid_tar()[:-2 * tarfile.BLOCKSIZE]] if valid_first else []
    for kind, name, link, body, size, fmt, pax, mtime, mode in members:
        name, link = name.replace(_SCRATCH, scratch), link.replace(_SCRATCH, scratch)
        try:
            head = _header(name, kind, size, link, fmt, pax, mtime, mode)
        except (ValueError, UnicodeError):  # a field the format cannot hold: not a case
            continue
        data = body if kind in tarfile.REGULAR_TYPES + (b"Z", b"7") else b""
        out.append(head + _padded(data[:size]))
    return b"".join(out) + b"\0" * (2 * tarfile.BLOCKSIZE)


# Headers tarfile reads whole into memory before any filter sees their member: GNU long names
# and links, pax extended and global headers (and Solaris'), and GNU sparse maps.
_BIG_HEADERS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
# Declared (and held) sizes: a real name, the bounds and one byte over, and 64 MiB (a 64 KiB
# gzip: tarfile held all 64 MiB before the bound).
_HEADER_SIZES = (100, archives.MAX_LONG_NAME_BYTES, archives.MAX_LONG_NAME_BYTES + 1,
                 archives.MAX_PAX_HEADER_BYTES, archives.MAX_PAX_HEADER_BYTES + 1, 64 << 20)


def _write_extended(out, kind: bytes, size: int) -> None:
    """Writes one extended header of ``kind`` holding ``size`` bytes to ``out``, its body in
    pieces of 1 MiB: a long name of that length (NUL-terminated), or one pax record
    ``"LEN comment=aaa...\n"`` of that length."""
    long_name = kind in _BIG_HEADERS[:2]
    head = f"{FOLDER}/".encode() if long_name else f"{size} comment=".encode()
    tail = b"\0" if long_name else b"\n"
    info = tarfile.TarInfo("././@LongLink" if long_name else "pax")
    info.type, info.size = kind, size
    out.write(info.tobuf(tarfile.GNU_FORMAT if long_name else tarfile.USTAR_FORMAT))
    out.write(head[:size - 1])
    fill = max(0, size - len(head) - 1)
    for start in range(0, fill, 1 << 20):
        out.write(b"a" * min(1 << 20, fill - start))
    out.write(tail + b"\0" * (-size % tarfile.BLOCKSIZE))


@functools.cache
def _header_archive(kind: bytes, size: int, repeat: int) -> bytes:
    """``repeat`` extended headers of ``kind`` and ``size`` in a row, then a batch; gzipped
    as it is written (a 64 MiB header never sits in this process's memory)."""
    batch = _file_bodies()["data_batch_1"]
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=1, mtime=0) as out:
        out.write(_header(FOLDER + "/", tarfile.DIRTYPE, 0, fmt=tarfile.USTAR_FORMAT))
        for _ in range(repeat):
            _write_extended(out, kind, size)
        out.write(_header(f"{FOLDER}/data_batch_1", tarfile.REGTYPE, len(batch),
                          fmt=tarfile.USTAR_FORMAT) + _padded(batch) + b"\0" * 1024)
    return buffer.getvalue()


@functools.cache
def _sparse_archive(style: str) -> bytes:
    """A sparse member: GNU's old format (type S), or pax's GNU.sparse 1.0, whose map (read
    whole by tarfile) declares a billion regions."""
    if style == "old":
        info = tarfile.TarInfo(f"{FOLDER}/data_batch_1")
        info.type, info.size = tarfile.GNUTYPE_SPARSE, 0
        tar = info.tobuf(tarfile.GNU_FORMAT)
    else:
        pax = _header(f"{FOLDER}/data_batch_1", tarfile.REGTYPE, 1 << 20,
                      pax=(("GNU.sparse.major", "1"), ("GNU.sparse.minor", "0"),
                           ("GNU.sparse.name", f"{FOLDER}/data_batch_1")))
        tar = pax + _padded(b"1000000000\n" + b"1\n" * ((1 << 20) // 2 - 6))
    return _compress(tar + b"\0" * 1024, "gz")


@functools.cache
def _repeated_folders(count: int) -> bytes:
    """The folder's entry ``count`` times (each skipped by the member filter), then nothing;
    gzipped as it is written."""
    head = _header(FOLDER + "/", tarfile.DIRTYPE, 0, fmt=tarfile.USTAR_FORMAT)
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=1, mtime=0) as out:
        for start in range(0, count, 1000):
            out.write(head * min(1000, count - start))
        out.write(b"\0" * 1024)
    return buffer.getvalue()


def _header_cases() -> st.SearchStrategy:
    """("headers", kind, size, repeat), ("sparse", style), ("folders", count): built when
    checked (``_built``), so a case's report stays short."""
    return st.one_of(
        st.tuples(st.sampled_from(_BIG_HEADERS), st.sampled_from(_HEADER_SIZES)).flatmap(
            # Chains of headers: long ones only of small headers (2,000 of 256 KiB would take
            # seconds to build, and test the same bound as 5).
            lambda a: st.tuples(st.just("headers"), st.just(a[0]), st.just(a[1]),
                                st.sampled_from((1,) if a[1] > 1 << 20 else (
                                    1, 2, archives.MAX_EXTENDED_HEADERS + 1) + (
                                        (2000,) if a[1] <= 1 << 13 else ())))),
        st.tuples(st.just("sparse"), st.sampled_from(("old", "pax-1.0"))),
        st.tuples(st.just("folders"), st.sampled_from((2, archives.MAX_MEMBERS + 1, 200_000))),
    )


def _built(case) -> bytes:
    return {"headers": _header_archive, "sparse": _sparse_archive,
            "folders": _repeated_folders}[case[0]](*case[1:])


def _archive_cases() -> st.SearchStrategy:
    compressions = st.sampled_from(("gz", "gz", "gz", "bz2", "xz", "none"))
    return st.one_of(
        _header_cases(),
        st.tuples(st.just("bytes"), compressions.map(_valid_archive).flatmap(harness.mutated),
                  st.booleans()),
        st.tuples(st.just("bytes"), st.sampled_from((_valid_archive("gz"), b"", b"\x1f\x8b",
                                                     _valid_tar()[:700])), st.booleans()),
        st.tuples(st.just("tar"), st.lists(_member(), min_size=1, max_size=4).map(tuple),
                  st.booleans(), compressions, st.booleans()),
        st.tuples(st.just("bomb"), st.sampled_from((1 << 20, 4 << 20, 8 << 20))),
    )


def _tree(root: str) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        found += [os.path.join(folder, n) for n in dirs + files]
    return found


# What extraction may hold in memory at once: tarfile's copy buffer and a few headers, and the
# decompressor's window (measured: under 1 MiB for the real layout and the 8 MiB bombs).
_MAX_HELD = 16 << 20


def check_archive(case, scratch: str, context) -> str:
    archive = os.path.join(scratch, "cifar-10-python.tar.gz")
    dest = os.path.join(scratch, "dest")
    os.mkdir(dest)
    existing = False
    if case[0] == "bytes":
        raw, existing = case[1], case[2]
    elif case[0] in ("headers", "sparse", "folders"):
        raw = _built(case)
    elif case[0] == "tar":
        _, members, valid_first, how, existing = case
        raw = _compress(_build(members, valid_first, scratch), how)
    else:
        raw = _bomb(case[1])
    with open(archive, "wb") as f:
        f.write(raw)
    final = os.path.join(dest, FOLDER)
    if existing:  # a folder from an earlier extraction: refused, and left as it is
        os.mkdir(final)
        with open(os.path.join(final, "mine"), "wb") as f:
            f.write(b"keep")
    # Python's own allocations, to the byte: tarfile reads headers into bytes objects.
    tracemalloc.start()
    try:
        outcome, result = harness.refused(lambda: archives.extract_batches(archive, dest),
                                          archive)
        held = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if held > _MAX_HELD:
        raise Violation(f"extracting a {len(raw):,}-byte {archive} held {held >> 20} MiB")
    above = os.path.dirname(scratch)
    if any(n.startswith("escaped") for n in os.listdir(above)):
        raise Violation(f"extracting {archive} wrote beside {scratch}")
    allowed = {archive, dest, final}
    for path in _tree(scratch):
        if os.path.islink(path):
            raise Violation(f"extracting {archive} made a link: {path}")
        if path not in allowed and os.path.dirname(path) != final:
            raise Violation(f"extracting {archive} wrote {path}")
    if existing:
        if outcome != REFUSED or os.listdir(dest) != [FOLDER] or os.listdir(final) != ["mine"]:
            raise Violation(f"extracting over an existing {final} changed it")
        return outcome
    if outcome == REFUSED:
        if os.listdir(dest):
            raise Violation(f"a refused {archive} left {os.listdir(dest)} in {dest}")
        return outcome
    if result != final or os.listdir(dest) != [FOLDER]:
        raise Violation(f"extracting {archive} gave {result!r}, {os.listdir(dest)}")
    names = os.listdir(final)
    for name in names:
        st_ = os.lstat(os.path.join(final, name))
        if not stat.S_ISREG(st_.st_mode) or st_.st_nlink != 1 or st_.st_mode & 0o7022:
            raise Violation(f"extracted {name!r} is not a plain private regular file")
    missing = set(schema.BATCH_FILES) - set(names)
    if missing:
        raise Violation(f"accepted {archive} without {sorted(missing)}")
    return outcome


# ---------------------------------------------------------------------------------------------
# tfrecords

_SIZES = {"train": 3, "validation": 1, "eval": 2}


@functools.cache
def _record_seeds() -> dict:
    """Each split's record file (tiny images), written by TensorFlow's own writer in memory
    (``ram://``), and the generator's metadata file for them: {name: bytes}."""
    import tensorflow as tf

    folder = "ram://fuzz-data-files-seed"
    tf.io.gfile.makedirs(folder)
    facts = {}
    for split, n in _SIZES.items():
        path = f"{folder}/{split}.tfrecords"
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(n):
                writer.write(schema.encode_example(bytes([i]) * IMAGE_BYTES, i % 10))
        facts[split] = metadata.file_facts(path, n)
    metadata.write_metadata(folder, facts, source="fuzz")
    files = {}
    for name in [f"{s}.tfrecords" for s in _SIZES] + [metadata.METADATA_FILENAME]:
        with tf.io.gfile.GFile(f"{folder}/{name}", "rb") as f:
            files[name] = f.read()
    return files


def _length_header(length: int) -> bytes:
    """A record's length field and its masked CRC-32C, as TensorFlow's writer makes them
    (TensorBoard's pure-Python CRC-32C, which its own record writer uses)."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    field = struct.pack("<Q", length)
    return field + struct.pack("<I", masked_crc32c(field))


def _record_offsets(raw: bytes) -> list[int]:
    offsets, at = [], 0
    while at + 12 <= len(raw):
        offsets.append(at)
        at += 12 + struct.unpack("<Q", raw[at:at + 8])[0] + 4
    return offsets


@st.composite
def _damaged_records(draw, raw: bytes) -> bytes:
    """Damage aimed at the framing: cuts inside a header or between records, flips in a
    length, a CRC or the payload, garbage after the end."""
    starts = _record_offsets(raw)
    at = draw(st.sampled_from(starts))
    length = struct.unpack("<Q", raw[at:at + 8])[0]
    where = draw(st.sampled_from(("cut-header", "cut-boundary", "cut-payload", "length",
                                  "length-crc", "payload", "data-crc", "append", "empty",
                                  "huge-length", "checked-length", "checked-length",
                                  "checked-length")))
    data = bytearray(raw)
    if where == "checked-length":
        # A length whose own CRC is right, so TensorFlow's reader believes it: huge (it used
        # to allocate it and die), one byte past the end, exactly to the end, above what a
        # record holds (with the bytes there), or zero.
        left = len(raw) - at - 16
        length = draw(st.sampled_from((2**64 - 1, 2**63 - 1, 64 << 30, 2**32, left + 1, left,
                                       metadata.MAX_RECORD_BYTES + 1, 0)))
        tail = raw[at + 12:]
        if length == metadata.MAX_RECORD_BYTES + 1:
            tail = bytes(length + 4)  # the whole record is there: only its length is too much
        return raw[:at] + _length_header(length) + tail
    if where == "cut-header":
        return raw[:at + draw(st.integers(1, 11))]
    if where == "cut-boundary":
        return raw[:at]
    if where == "cut-payload":
        return raw[:at + 12 + draw(st.integers(0, length + 3))]
    if where == "append":
        return raw + draw(st.sampled_from((b"\0", b"\0" * 12, raw[at:at + 16], b"garbage" * 3)))
    if where == "empty":
        return b""
    if where == "huge-length":
        data[at:at + 8] = struct.pack("<Q", draw(st.sampled_from((2**63 - 1, 2**32, length + 1))))
        return bytes(data)
    offset = {"length": at + draw(st.integers(0, 7)),
              "length-crc": at + 8 + draw(st.integers(0, 3)),
              "payload": at + 12 + draw(st.integers(0, length - 1)),
              "data-crc": at + 12 + length + draw(st.integers(0, 3))}[where]
    data[offset] ^= 1 << draw(st.integers(0, 7))
    return bytes(data)


_NASTY = st.sampled_from((
    None, True, -1, 0, 2**63, 10**400, 1.5, float("nan"), float("inf"), "", "x" * 1000, "\n",
    [], {}, [[[[]]]], {"a": {"b": {}}}, ["a"], ["a", "a"], list(range(200)),
))


@st.composite
def _damaged_metadata(draw, raw: bytes) -> bytes:
    """The metadata JSON changed where it matters: keys dropped or given the wrong type,
    huge numbers, NaN, deep nesting, another encoding, or not JSON at all."""
    how = draw(st.sampled_from(("field", "field", "drop", "deep", "encoding", "raw", "type")))
    body = json.loads(raw)
    if how in ("field", "drop"):
        split = draw(st.sampled_from(sorted(_SIZES)))
        where = draw(st.sampled_from((
            (), ("splits",), ("splits", split), ("splits", split, "records"),
            ("splits", split, "bytes"), ("splits", split, "sha256"), ("counts",),
            ("counts", split), ("class_names",), ("label_names",), ("dataset",), ("format",),
            ("num_classes",))))
        parent = body
        for key in where[:-1]:
            parent = parent[key]
        if not where:
            return json.dumps(draw(_NASTY)).encode()
        if how == "drop":
            parent.pop(where[-1], None)
        else:
            parent[where[-1]] = draw(_NASTY)
        return json.dumps(body).encode()
    if how == "deep":
        depth = draw(st.sampled_from((100, 900, 1000, 5000, 100_000)))
        key = draw(st.sampled_from(("dataset", "class_names", "splits", None)))
        nested = "[" * depth + "]" * depth
        if key is None:
            return nested.encode()
        return raw.replace(b"{", f'{{"{key}": {nested}, '.encode(), 1) if key != "splits" else \
            json.dumps({**body, "splits": {"train": json.loads("[" * 50 + "]" * 50)}}).encode()
    if how == "encoding":
        codec = draw(st.sampled_from(("utf-16", "utf-32", "latin-1-bad", "bom")))
        text = raw.decode()
        if codec == "latin-1-bad":
            return raw.replace(b'"fuzz"', b'"\xff\xfe"')
        if codec == "bom":
            return b"\xef\xbb\xbf" + raw
        return text.encode(codec)
    if how == "type":
        return draw(st.sampled_from((b"[]", b"null", b"1", b'"x"', b"NaN", b"Infinity",
                                     b"1e999999", b"9" * 5000)))
    return draw(st.sampled_from((b"", b"{", b"\0" * 10, b"{}", b'{"splits": {}}')))


def _tfrecord_cases() -> st.SearchStrategy:
    seeds = _record_seeds()
    split = st.sampled_from(sorted(_SIZES))

    def per_split(name):
        raw = seeds[f"{name}.tfrecords"]
        meta = seeds[metadata.METADATA_FILENAME]
        records = st.one_of(st.just(raw), harness.mutated(raw), _damaged_records(raw),
                            st.sampled_from(("missing", "folder") + SPECIALS))
        # "forged": metadata that matches the records, whatever they hold (a hostile data
        # dir brings its own).
        metas = st.one_of(st.just(meta), harness.mutated(meta), _damaged_metadata(meta),
                          st.sampled_from(("missing", "forged", "forged") + SPECIALS))
        return st.tuples(st.just(name), records, metas)

    return split.flatmap(per_split)


@functools.lru_cache(maxsize=512)
def _read_fully(raw: bytes) -> int:
    """The records tf.data reads from ``raw`` (cached: the same bytes read the same)."""
    import tensorflow as tf

    path = f"ram://fuzz-data-files-read/{hash(raw)}.tfrecords"
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(raw)
    try:
        return sum(1 for _ in tf.data.TFRecordDataset(path))
    finally:
        tf.io.gfile.remove(path)


def check_tfrecords(case, scratch: str, context) -> str:
    split, records, meta = case
    seeds = _record_seeds()
    # "seed": the generator's own file (lets a regression name it without building it).
    records = seeds[f"{split}.tfrecords"] if records == "seed" else records
    meta = seeds[metadata.METADATA_FILENAME] if meta == "seed" else meta
    data_dir = os.path.join(scratch, "data")
    os.mkdir(data_dir)
    for name, raw in seeds.items():
        if name != metadata.METADATA_FILENAME and name != f"{split}.tfrecords":
            with open(os.path.join(data_dir, name), "wb") as f:
                f.write(raw)
    path = schema.record_path(data_dir, split)
    meta_path = os.path.join(data_dir, metadata.METADATA_FILENAME)
    forged = meta == "forged"
    if forged:
        if not isinstance(records, bytes):
            meta = seeds[metadata.METADATA_FILENAME]
        else:
            body = json.loads(seeds[metadata.METADATA_FILENAME])
            body["splits"][split] = {"records": _SIZES[split], "bytes": len(records),
                                     "sha256": hashlib.sha256(records).hexdigest()}
            meta = json.dumps(body).encode()
    for target, content in ((path, records), (meta_path, meta)):
        if content == "folder":
            os.mkdir(target)
        elif content in SPECIALS:
            special_file(target, content)
        elif content != "missing":
            with open(target, "wb") as f:
                f.write(content)
    meta_intact = meta == seeds[metadata.METADATA_FILENAME]

    def named(error: UserError) -> str:
        harness.one_line(error)
        message = str(error)
        if path not in message and meta_path not in message:
            raise Violation(f"the refusal {message!r} names neither {path} nor {meta_path}")
        if meta_intact and path not in message:
            raise Violation(f"the refusal {message!r} does not name {path}")
        return REFUSED

    try:
        info = metadata.dataset_info(data_dir)
    except UserError as e:
        info = named(e)
    if info != REFUSED and not (
            isinstance(info.class_names, tuple) and len(info.class_names) >= 2
            and all(isinstance(n, str) and n for n in info.class_names)
            and isinstance(info.dataset, str)
            and all(isinstance(f.records, int) and isinstance(f.size, int)
                    and isinstance(f.sha256, str) for f in info.splits.values())):
        raise Violation(f"dataset_info gave {info!r}")
    try:
        metadata.verify_split(data_dir, split)
    except UserError as e:
        return named(e)
    if info == REFUSED:
        raise Violation("verify_split accepted what dataset_info refused")
    facts = info.splits.get(split)
    if facts is None:
        # No facts to check against (no metadata, or format 1): the trainer finds damage
        # while reading (count_records, the guard's find_corrupt_record_file).
        try:
            counted = metadata.count_records(path)
        except UserError as e:
            if metadata.find_corrupt_record_file(data_dir) != path:
                raise Violation(f"find_corrupt_record_file missed {path}") from None
            return named(e)
        if counted != _read_fully(records):
            raise Violation(f"count_records counted {counted} records in {path}")
        return ACCEPTED
    if forged:
        # Facts made to match: verify_split vouches only for the framing, and TensorFlow's
        # reader (which checks the CRCs) then reads the file or refuses it, one line.
        try:
            counted = metadata.count_records(path)
        except UserError as e:
            return named(e)
        if counted != _read_fully(records):
            raise Violation(f"count_records counted {counted} records in {path}")
        return ACCEPTED
    # Accepted against the facts: the file is the generator's and reads to its end.
    counted = _read_fully(records)
    if records != seeds[f"{split}.tfrecords"]:
        raise Violation(f"verify_split accepted a changed {path}")
    if meta_intact and counted != facts.records:
        raise Violation(f"{path} holds {counted} records, the metadata says {facts.records}")
    return ACCEPTED


# Minimal cases of the failures this campaign found (fixed in the package).
_PICKLE_REGRESSIONS = (
    # A label nested 5,000 deep: the refusal's repr() of it raised RecursionError.
    ("batch", _deep("lists", 5001)),
    # An array as a label: a refusal of several lines (numpy's repr).
    ("batch", pickles.dumps_py2({"data": _images(1), "labels": [np.zeros((3, 3))]})),
    # STACK_GLOBAL names any string: a newline in it made the refusal two lines.
    ("batch", pickle.PROTO + b"\x04" + _text("os\nsystem") + _text("x") + pickle.STACK_GLOBAL
     + pickle.STOP),
    # _reconstruct(ndarray, (1, 3072), 'B'): an uninitialised image accepted from no bytes.
    ("batch-hostile", (("numpy.core.multiarray", "_reconstruct", "ndarray"), "REDUCE-in-batch",
                       1, False)),
    # BUILD on the admitted _codecs.encode changed its defaults for the whole process.
    ("batch-hostile", (("_codecs", "encode", "codec"), "BUILD", 0, False)),
    # PERSID: the unpickler's own refusal ran over two lines.
    ("meta", b"P0\n."),
    # LONG_BINPUT 100,000,000: CPython's unpickler cleared a 1.6 GB memo table.
    ("batch", pickle.PROTO + b"\x02" + pickle.NONE + pickle.LONG_BINPUT
     + struct.pack("<I", 10**8) + pickle.STOP),
    # An object array (numpy.dtype admitted any dtype) whose state lists 3 items for a shape
    # of 1,000,000: numpy read past the list, SIGSEGV (a 250-byte batch).
    ("batch", _array_pickle("O8", True, 63, (10**6,), "list-short", "reconstruct")),
    # The same with a uint8 dtype whose BUILD state gave it an object dtype's flags: still
    # equal to uint8, and SIGSEGV.
    ("batch", _array_pickle("u1", True, 63, (10**6,), "list-short", "reconstruct")),
    # A pipe in place of the batch: open() waited forever.
    ("batch-special", "fifo"),
)
def _damaged_xz() -> bytes:
    """An xz tar whose stream breaks after its first member (64 KiB that do not compress)."""
    noise = np.random.default_rng(0).bytes(1 << 16)
    tar = _header(f"{FOLDER}/data_batch_1", tarfile.REGTYPE, len(noise)) + _padded(noise)
    raw = _compress(tar + b"\0" * 1024, "xz")
    middle = len(raw) // 2
    return raw[:middle] + b"\0" * 64 + raw[middle + 64:]


_GOOD = (tarfile.REGTYPE, f"{FOLDER}/data_batch_1", "", b"x", 1, tarfile.PAX_FORMAT, (), 0, 0o644)
_ARCHIVE_REGRESSIONS = (
    # A name longer than the file system takes: OSError (ENAMETOOLONG) escaped.
    ("tar", ((tarfile.REGTYPE, f"{FOLDER}/" + "a" * 300) + _GOOD[2:],), True, "gz", False),
    # pax mtime=nan / inf: ValueError / OverflowError from os.utime escaped.
    ("tar", (_GOOD[:6] + ((("mtime", "nan"),),) + _GOOD[7:],), False, "gz", False),
    ("tar", (_GOOD[:6] + ((("mtime", "inf"),),) + _GOOD[7:],), False, "gz", False),
    # An xz archive ("r:*" opens those too) damaged mid-stream: lzma.LZMAError escaped.
    ("bytes", _damaged_xz(), False),
    # Not an archive: tarfile's "r:*" refusal listed each method on a line of its own.
    ("bytes", b"not an archive", False),
    # A GNU long name of 64 MiB in a 64 KiB gzip: tarfile held all of it before any filter.
    ("headers", tarfile.GNUTYPE_LONGNAME, 64 << 20, 1),
    # A 100-byte pax header 2,000 times in a row: tarfile nests a call per header, and
    # RecursionError escaped.
    ("headers", tarfile.XHDTYPE, 100, 2000),
    # The folder's entry 200,000 times (each skipped by the filter): tarfile kept a TarInfo
    # for each, 87 MiB from a 0.3 MB gzip.
    ("folders", 200_000),
)
# TensorFlow believes a length once its CRC matches: 28 bytes declaring a 64 GiB record.
_HOSTILE_RECORD = _length_header(64 << 30) + b"\0" * 16
_TFRECORD_REGRESSIONS = (
    # Metadata nested 100,000 deep: RecursionError from json.loads escaped.
    ("train", "seed", b"[" * 100_000 + b"]" * 100_000),
    # That record without metadata: count_records died in TensorFlow's reader (SIGSEGV).
    ("train", _HOSTILE_RECORD, "missing"),
    # ... and with metadata forged to match it: verify_split vouched for it.
    ("train", _HOSTILE_RECORD, "forged"),
)
_BATCHES_REGRESSIONS = (
    # A pipe in place of a batch, or of the sample-data marker: open() waited forever.
    (("data_batch_1", "fifo"),),
    ((sample_data.MARKER_NAME, "fifo"),),
    # A pipe in place of the archive: taken for no archive, and replaced by a download.
    (("<archive>", "fifo"),),
)


KINDS = [
    harness.Kind(
        "cifar-pickle", "data.pickles.load_batch, data.pickles.load_label_names",
        "valid Python 2/3 batches (protocols 0-5) mutated; wrong types, shapes and label "
        "counts; nested and self-referencing structures 20,000 deep; memo bombs; pickles "
        "calling os.system, eval, subprocess, open (GLOBAL, STACK_GLOBAL, INST, OBJ, NEWOBJ, "
        "BUILD, EXT) and admitted numpy names misused; arrays of every dtype (objects, "
        "records, strings, dates, complex; dtypes whose BUILD state claims objects) with "
        "states holding fewer items than their shapes, through _reconstruct and _frombuffer; "
        "a pipe, socket, /dev/zero or /dev/null in the file's place",
        st.deferred(_pickle_cases), check_pickle, time_limit=10.0,
        regressions=_PICKLE_REGRESSIONS),
    harness.Kind(
        "cifar-batches", "data.sources.load_source (a batch folder)",
        "the extracted folder with up to 3 of its batches, batches.meta or sample_data.json "
        "replaced by a pipe, a socket, /dev/zero, /dev/null, a folder, a dangling link, "
        "nothing or an empty file; the folder itself, or the archive in its absence, "
        "replaced by a pipe, socket or device",
        st.deferred(_batches_folder_cases), check_batches_folder, time_limit=10.0,
        regressions=_BATCHES_REGRESSIONS),
    harness.Kind(
        "cifar-archive", "data.archives.extract_batches",
        "the real layout (gz, bz2, xz, plain) mutated; members with ../, absolute and "
        "over-long names, NUL, newline, non-UTF-8, symlinks, hardlinks, devices, fifos, "
        "duplicates, huge declared sizes, hostile pax fields (mtime NaN); gzip bombs to 8 MiB; "
        "GNU long names and links, pax extended, global and Solaris headers from 100 bytes "
        "to 64 MiB, alone and 2,000 in a row; GNU sparse members (old and pax 1.0); the "
        "folder's entry 200,000 times; memory held measured with tracemalloc",
        st.deferred(_archive_cases), check_archive, time_limit=10.0,
        regressions=_ARCHIVE_REGRESSIONS),
    harness.Kind(
        "tfrecords", "data.metadata.verify_split, dataset_info, count_records",
        "tiny record files cut inside headers, at boundaries and in payloads, flipped "
        "lengths/CRCs/payload, garbage appended; lengths rewritten with a valid CRC (2^64-1, "
        "64 GiB, 2^32, one byte past the end, exactly to the end, over 1 MiB, 0); a pipe, "
        "socket, /dev/zero or /dev/null as the record or metadata file; metadata JSON with "
        "dropped or mistyped keys, huge numbers, NaN, deep nesting, other encodings, not "
        "JSON, or forged to match the records",
        st.deferred(_tfrecord_cases), check_tfrecords, time_limit=10.0,
        # TensorFlow's import and the seed files, once and outside the cases' time limit.
        start=lambda folder: _record_seeds(),
        regressions=_TFRECORD_REGRESSIONS),
]
