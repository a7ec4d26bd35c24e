"""CIFAR-10's python batch files: a safe, validating reader and a Python-2-style writer.

The batches (``data_batch_1`` .. ``data_batch_5``, ``test_batch``, ``batches.meta``) are pickles
written by Python 2's ``cPickle`` at protocol 2 (https://www.cs.toronto.edu/~kriz/cifar.html).
A pickle can name any importable callable, so loading an untrusted one with ``pickle.load`` can
run code. ``load_batch`` therefore uses an unpickler whose ``find_class`` admits only the few
names a numpy array needs, and of numpy arrays only those of numbers: an object array is
pointers, and a hostile one crashes the process as numpy builds it. It then checks that the
content is what a CIFAR batch holds.

``dumps_py2`` writes pickles with the opcodes Python 2's ``cPickle`` used, so the built-in sample
data (``sample_data``) travels exactly the loader path real CIFAR-10 files do.
"""


import io
import os
import pickle
import pickletools
import struct
from typing import Any, NamedTuple

import numpy as np

from cifar10_estimator import storage
from cifar10_estimator.data import schema
from cifar10_estimator.errors import UserError

IMAGE_BYTES = schema.IMAGE_BYTES
NUM_CLASSES = schema.NUM_CLASSES
# A real batch file is 31 MB (10,000 images); refuse anything absurd before reading it into
# memory. Reading the whole file first also means a forged length field inside the pickle can
# only ever hit "truncated", never make the reader allocate gigabytes.
MAX_BATCH_FILE_BYTES = 1 << 30


class Batch(NamedTuple):
    """One validated batch: ``data`` uint8 (N, 3072) in CIFAR's CHW byte order, ``labels`` (N,)."""

    data: np.ndarray
    labels: np.ndarray  # int64, values in 0..9


def _latin1_encode(text: Any, encoding: Any = "latin1") -> bytes:
    """The one use of ``_codecs.encode`` a batch can need (see ``_RestrictedUnpickler``)."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode is admitted only as str.encode('latin1')")
    return text.encode("latin-1")


def _sealed(function: Any) -> Any:
    """``function`` as a callable without attributes. A pickle's BUILD opcode sets attributes
    on whatever it is applied to; on a plain function that would change it (its defaults, say)
    for the rest of the process."""
    return type(f"_Sealed_{function.__name__}", (), {"__slots__": (),
                                                     "__call__": staticmethod(function)})()


# What a pickle gets for numpy.ndarray: only a token for ``_empty_array``, not the class, which
# a pickle could otherwise call (REDUCE, NEWOBJ) to allocate any shape without a byte of data.
_NDARRAY = type("_NdarrayToken", (), {"__slots__": ()})()
# The kinds of numpy dtype a batch may hold: bool, signed and unsigned integers, floats
# (numpy's dtype.kind letters). CIFAR's images are uint8; others reach validate_batch, which
# names them. Every other kind is refused before an array is built: objects ("O"), records,
# void and sub-arrays ("V"), strings ("S", "U"), dates ("M", "m"), complex numbers ("c").
# An object array in particular is pointers, not data: its state is a list numpy reads
# without checking its length against the shape, so a batch of a few hundred bytes can make
# it read past the list and crash the process (SIGSEGV).
_NUMERIC_KINDS = "biuf"
# Longer than any name of such a dtype ("float64", "<u8", "bool"): a name is all a batch needs.
_MAX_DTYPE_NAME = 16


def _numeric(dtype: Any) -> np.dtype:
    """``dtype`` as a fresh, plain numeric dtype; refused if it is anything else.

    Rebuilt from its type string: a pickle's BUILD can rewrite a dtype's state after it was
    made (numpy's ``dtype.__setstate__`` takes its flags from the state), and a uint8 dtype
    whose flags say "holds objects" still compares equal to uint8. The string names only the
    kind, byte order and size, so what is rebuilt from it is clean."""
    if not isinstance(dtype, np.dtype):
        raise pickle.UnpicklingError("an array's dtype must be a numpy dtype")
    plain = np.dtype(dtype.str)
    if (plain.kind not in _NUMERIC_KINDS or plain.names is not None
            or plain.subdtype is not None or plain.hasobject):
        raise pickle.UnpicklingError(f"refused dtype {plain.str!r}: a CIFAR batch holds only "
                                     f"arrays of numbers")
    return plain


def _dtype(name: Any, align: Any = False, copy: Any = False) -> np.dtype:
    """``numpy.dtype`` as numpy's pickles call it, ``dtype('u1', False, True)``, for plain
    numeric dtypes named by a short string only (not records, sub-arrays, objects). Always a
    new dtype object: the pickle's BUILD then sets its state on that copy, never on numpy's
    shared uint8 dtype (``copy=False`` would hand it out)."""
    if not isinstance(name, (str, bytes)) or len(name) > _MAX_DTYPE_NAME:
        raise pickle.UnpicklingError("a dtype is admitted only by a short name, such as 'u1'")
    return np.dtype(_numeric(np.dtype(name)), copy=True)


class _CheckedArray(np.ndarray):
    """What ``_empty_array`` builds: an ndarray whose ``__setstate__`` (the pickle's BUILD)
    checks the dtype the state names (``_numeric``) before numpy fills the array from it."""

    def __setstate__(self, state: Any) -> None:
        # numpy's state: ([version,] shape, dtype, is_fortran, raw data).
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise pickle.UnpicklingError("an array's state is admitted only as numpy pickles "
                                         "it: ([version,] shape, dtype, is_fortran, data)")
        *head, dtype, is_fortran, data = state
        super().__setstate__((*head, _numeric(dtype), is_fortran, data))


def _empty_array(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """``numpy.core.multiarray._reconstruct`` as numpy's pickles call it: an empty array that
    ``__setstate__`` then fills from the file's bytes. Any other shape would be memory the file
    does not hold (uninitialised, and up to thousands of times the file's size)."""
    if subtype is not _NDARRAY or not isinstance(shape, tuple) or shape != (0,):
        raise pickle.UnpicklingError("an array is admitted only as numpy pickles one, "
                                     "_reconstruct(ndarray, (0,), dtype) then its state")
    return np.core.multiarray._reconstruct(_CheckedArray, (0,), _dtype(dtype))


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    """``numpy.core.numeric._frombuffer`` (protocol 5) for numeric dtypes only."""
    return np.core.numeric._frombuffer(buffer, _numeric(dtype), shape, order)


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that can rebuild dicts, lists, strings, numbers and numpy arrays of numbers,
    nothing else.

    Containers, strings and numbers need no ``find_class`` at all; a numpy array pickles as
    ``_reconstruct(ndarray, (0,), b'b')`` plus ``__setstate__`` with a ``dtype`` (protocols
    0-4, and every real CIFAR-10 file). Names are mapped to the objects of the numpy installed
    here, so a pickle never causes an import, and to checked stand-ins where numpy's own
    would build more than a batch holds (``_dtype``, ``_empty_array``, ``_frombuffer``).
    """

    _reconstruct = _sealed(_empty_array)
    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        # numpy >= 2 writes its private package under its new name.
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy", "ndarray"): _NDARRAY,
        # Plain numeric dtypes only, each a fresh copy (_dtype).
        ("numpy", "dtype"): _sealed(_dtype),
        # Protocol 5 (pickle.HIGHEST_PROTOCOL) rebuilds an array as _frombuffer(buffer, dtype,
        # shape, order), i.e. np.frombuffer(...).reshape(...): data only, no other effect.
        ("numpy.core.numeric", "_frombuffer"): _sealed(_frombuffer),
        ("numpy._core.numeric", "_frombuffer"): _sealed(_frombuffer),
        # Python 3 at protocol 2 has no opcode for bytes and writes them as
        # _codecs.encode(<latin-1 str>, 'latin1'); the array data of a batch re-saved that way
        # (e.g. by a Python 3 conversion script) needs it. The real files, from Python 2, never
        # do. Only the latin-1 form is admitted: other codecs (zlib, bz2, ...) are not needed
        # and could be used as decompression bombs.
        ("_codecs", "encode"): _sealed(_latin1_encode),
    }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            # The names come from the file (STACK_GLOBAL: any string, newlines included).
            what = f"{module}.{name}"
            what = what if what.isprintable() and len(what) <= 100 else repr(what[:100])
            raise pickle.UnpicklingError(
                f"refused to load {what}: a CIFAR batch holds only numpy arrays, "
                "lists, strings and numbers") from None


def _read_file(path: str) -> bytes:
    try:
        # Not a pipe, socket or device (storage.open_regular): reading one would wait or never end.
        with storage.open_regular(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BATCH_FILE_BYTES:
                raise UserError(f"{path} is {size:,} bytes, far larger than a CIFAR batch "
                                f"(31 MB); it is not a batch file")
            return f.read()
    except FileNotFoundError:
        raise UserError(f"{path} not found: the CIFAR batch folder is incomplete; delete it "
                        "so that it is extracted again from the archive") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a directory, not a CIFAR batch file; replace the folder "
                        "with the genuine extracted batches") from None
    except PermissionError:
        raise UserError(f"{path} cannot be read (permission denied)") from None
    except OSError as e:  # a pipe, socket or device; an I/O error
        raise UserError(f"{path} cannot be read as a CIFAR batch ({storage.reason(e)}); "
                        "delete the CIFAR batch folder so that it is extracted again from "
                        "the archive") from None


# More opcodes than any CIFAR file has (CIFAR-100's train file: ~250,000); each can leave an
# object of ~60 bytes on the unpickler's stack, so this bounds the memory a file can claim.
MAX_OPCODES = 4_000_000


def _check_opcodes(raw: bytes) -> None:
    """Refuses what the unpickler would take at face value: memo indices beyond what the file
    has stored (CPython's unpickler grows its memo table to the largest index a PUT names and
    clears every slot, so a 12-byte pickle with LONG_BINPUT 100,000,000 makes it write 1.6 GB;
    picklers number their memo entries 0, 1, 2, ...) and an absurd count of opcodes. Reads the
    opcodes with ``pickletools`` (~0.1 s for a real batch); errors as the unpickler's."""
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(raw)):
            if count >= MAX_OPCODES:
                raise pickle.UnpicklingError(f"more than {MAX_OPCODES:,} opcodes")
            if op.name in ("PUT", "BINPUT", "LONG_BINPUT") and not 0 <= arg <= count:
                raise pickle.UnpicklingError(f"memo index {arg} at opcode {count}")
    except pickle.UnpicklingError:
        raise
    except Exception as e:  # noqa: BLE001 - pickletools' word for a malformed pickle
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        if any(w in message for w in ("not enough data", "remain", "exhausted", "no newline")):
            raise EOFError from None
        raise pickle.UnpicklingError(f"the pickle is malformed: {message[:200]}") from None


def load_pickle(path: str) -> Any:
    """Unpickles a CIFAR-10 python file safely (restricted unpickler, ``encoding='bytes'``).

    Python 2 ``str`` values, i.e. all keys and names in the real files, come back as ``bytes``.
    Any failure is a one-line ``UserError`` naming the file.
    """
    raw = _read_file(path)
    if not raw:
        raise UserError(f"{path} is empty; the CIFAR batches are damaged, extract them again")
    try:
        _check_opcodes(raw)
        obj = _RestrictedUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except pickle.UnpicklingError as e:
        message = " ".join(str(e).split())  # some of the unpickler's own run over two lines
        if "truncated" in message:
            message = "the file is truncated"
        raise UserError(f"{path} is not a valid CIFAR batch ({message})") from None
    except EOFError:
        raise UserError(f"{path} is not a valid CIFAR batch (the file is truncated)") from None
    except Exception as e:  # noqa: BLE001 - anything a malformed data file provokes is its fault
        detail = str(e).splitlines()[0] if str(e) else ""
        raise UserError(f"{path} is not a valid CIFAR batch (the pickle is malformed: "
                        f"{type(e).__name__}: {detail})") from None
    return obj


def _get(mapping: dict, key: str) -> Any:
    # Python 2 wrote str keys, which encoding='bytes' returns as bytes; accept text keys too
    # (a file re-saved by Python 3).
    if key.encode() in mapping:
        return mapping[key.encode()]
    if key in mapping:
        return mapping[key]
    raise KeyError(key)


def validate_batch(obj: Any, path: str, label_key: str = "labels",
                   num_classes: int = NUM_CLASSES) -> Batch:
    """Checks that ``obj`` (from ``path``) is a CIFAR batch and returns its images and labels.

    ``label_key`` names the labels (CIFAR-100: ``fine_labels`` or ``coarse_labels``), which must
    lie in 0..``num_classes``-1.
    """
    where = f"{path} is not a valid CIFAR batch"
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a dict, found {type(obj).__name__}")
    try:
        data = _get(obj, "data")
        labels = _get(obj, label_key)
    except KeyError as e:
        raise UserError(f"{where}: it has no '{e.args[0]}' entry") from None
    if not isinstance(data, np.ndarray):
        raise UserError(f"{where}: 'data' is a {type(data).__name__}, expected a numpy array")
    if data.dtype != np.uint8:
        raise UserError(f"{where}: 'data' has dtype {data.dtype}, expected uint8")
    if data.ndim != 2 or data.shape[1] != IMAGE_BYTES or data.shape[0] == 0:
        raise UserError(f"{where}: 'data' has shape {data.shape}, expected (N, {IMAGE_BYTES}) "
                        "with N >= 1")
    if not isinstance(labels, (list, tuple)):
        raise UserError(f"{where}: '{label_key}' is a {type(labels).__name__}, expected a list")
    if len(labels) != data.shape[0]:
        raise UserError(f"{where}: {len(labels)} labels for {data.shape[0]} images")
    for i, label in enumerate(labels):
        # bool is an int subclass but never a class id.
        if not isinstance(label, int) or isinstance(label, bool):
            # Shown by value only if that is short and one line (not a nested list or array).
            shown = (repr(label)[:40] if isinstance(label, (bytes, str, float, bool, type(None)))
                     else f"a {type(label).__name__}")
            raise UserError(f"{where}: label {i} is {shown}, expected an int in "
                            f"0..{num_classes - 1}")
        if not 0 <= label < num_classes:
            raise UserError(f"{where}: label {i} is {label}, outside 0..{num_classes - 1}")
    return Batch(np.ascontiguousarray(data), np.asarray(labels, dtype=np.int64))


def load_batch(path: str) -> Batch:
    """Loads and validates one CIFAR-10 python batch file (``data_batch_N`` or ``test_batch``)."""
    return validate_batch(load_pickle(path), path)


# --- Writer: pickles with the opcodes Python 2 wrote --------------------------------------------

class _Py2StylePickler(pickle._Pickler):
    """Protocol 2, with ``str`` and ``bytes`` written as Python 2 ``str`` (a byte string).

    Python 3's pickler already writes protocol 2 with the opcodes Python 2 used, except for
    text (BINUNICODE) and bytes (``_codecs.encode`` at protocol 2); a CIFAR file has only byte
    strings (SHORT_BINSTRING / BINSTRING), which ``encoding='bytes'`` reads back as ``bytes``.
    """

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_byte_string(self, obj: str | bytes) -> None:
        data = obj if isinstance(obj, bytes) else obj.encode("ascii")  # Python 2 str: ASCII
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[str] = dispatch[bytes] = _save_byte_string

    def save_global(self, obj: Any, name: str | None = None) -> None:
        # NumPy 2 renamed numpy.core to numpy._core and pickles arrays by the new name; CIFAR's
        # files, written by NumPy 1, name numpy.core, which NumPy 2 still loads. Writing the
        # old name keeps a batch byte-identical to CIFAR's under either NumPy.
        module = pickle.whichmodule(obj, name or obj.__qualname__)
        if module.startswith(_NUMPY2_CORE + "."):
            module = _NUMPY1_CORE + module[len(_NUMPY2_CORE):]
            self.write(pickle.GLOBAL + f"{module}\n{name or obj.__qualname__}\n".encode("ascii"))
            self.memoize(obj)
            return
        super().save_global(obj, name)


_NUMPY1_CORE, _NUMPY2_CORE = "numpy.core", "numpy._core"


def dumps_py2(obj: Any) -> bytes:
    """Pickles dicts, lists, str/bytes, numbers and numpy arrays with Python 2's opcodes.

    As in the real CIFAR files: protocol 2, text and bytes as byte strings, arrays through
    ``numpy.core.multiarray._reconstruct``, no ``_codecs.encode``. ``str`` must be ASCII.
    """
    buffer = io.BytesIO()
    _Py2StylePickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


def load_label_names(path: str, key: str = "label_names",
                     num_classes: int = NUM_CLASSES) -> tuple[str, ...] | None:
    """The class names of a meta file (``batches.meta``, CIFAR-100's ``meta``), or None.

    The names only label predictions, so a missing or odd meta file is not an error; it is
    unpickled with the same restricted unpickler as the batches all the same.
    """
    if not os.path.exists(path) or os.path.isdir(path):
        return None  # a pipe, socket or device is refused by load_pickle, not waited on
    meta = load_pickle(path)
    names = meta.get(key.encode()) if isinstance(meta, dict) else None
    if (not isinstance(names, list) or len(names) != num_classes
            or not all(isinstance(n, (bytes, str)) for n in names)):
        return None
    return tuple(n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names)

