"""The batch loader refuses code and malformed content; the writer pickles as Python 2 did."""

import os
import pickle
import pickletools

import numpy as np
import pytest

from cifar10_estimator.data import pickles
from cifar10_estimator.errors import UserError
from conftest import batch_dict

# What Python 2.7's cPickle.dumps(numpy.array([15, 16, 17], numpy.uint32), 2) produced:
# the classic numpy pickle, memo slots from 1, text as SHORT_BINSTRING.
PY2_UINT32_ARRAY = (
    b"\x80\x02cnumpy.core.multiarray\n_reconstruct\nq\x01cnumpy\nndarray\nq\x02K\x00\x85U\x01b"
    b"\x87Rq\x03(K\x01K\x03\x85cnumpy\ndtype\nq\x04U\x02u4K\x00K\x01\x87Rq\x05(K\x03U\x01<NNNJ"
    b"\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89U\x0c\x0f\x00\x00\x00\x10\x00\x00\x00\x11\x00"
    b"\x00\x00tb."
)
MEMO_OPS = {"BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"}


def opcodes(data: bytes) -> list[tuple[str, object]]:
    return [(op.name, arg) for op, arg, _ in pickletools.genops(data) if op.name not in MEMO_OPS]


def write(path, obj_or_bytes) -> str:
    data = obj_or_bytes if isinstance(obj_or_bytes, bytes) else pickles.dumps_py2(obj_or_bytes)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def good_batch(n: int = 5) -> dict:
    rng = np.random.default_rng(1)
    return batch_dict(rng.integers(0, 256, (n, 3072), dtype=np.uint8), [i % 10 for i in range(n)])


# --- writer -------------------------------------------------------------------------------------

def test_writer_has_python2s_opcodes_for_an_array():
    # The same opcodes as Python 2's cPickle, but for numpy's dtype arguments (False/True where
    # Python 2's numpy wrote 0/1) and the memo (slots from 0, one more memoized object): the
    # loader path is the same, and both load to the same array.
    ours = pickles.dumps_py2(np.array([15, 16, 17], np.uint32))
    ops = opcodes(ours)
    args = ops.index(("SHORT_BINSTRING", "u4")) + 1  # numpy.dtype('u4', align, copy)
    assert ops[args:args + 2] == [("NEWFALSE", None), ("NEWTRUE", None)]
    ops[args:args + 2] = [("BININT1", 0), ("BININT1", 1)]
    assert ops == opcodes(PY2_UINT32_ARRAY)
    for data in (ours, PY2_UINT32_ARRAY):
        np.testing.assert_array_equal(pickle.loads(data, encoding="bytes"), [15, 16, 17])


def test_writer_opcode_shape_is_python2_protocol2():
    data = np.arange(2 * 3072, dtype=np.uint32).astype(np.uint8).reshape(2, 3072)
    pickled = pickles.dumps_py2({"data": data, "labels": [3, 7]})
    expected = [
        ("PROTO", 2), ("EMPTY_DICT", None), ("MARK", None),
        ("SHORT_BINSTRING", "data"),
        ("GLOBAL", "numpy.core.multiarray _reconstruct"), ("GLOBAL", "numpy ndarray"),
        ("BININT1", 0), ("TUPLE1", None), ("SHORT_BINSTRING", "b"), ("TUPLE3", None),
        ("REDUCE", None), ("MARK", None), ("BININT1", 1),
        ("BININT1", 2), ("BININT2", 3072), ("TUPLE2", None),
        ("GLOBAL", "numpy dtype"), ("SHORT_BINSTRING", "u1"), ("NEWFALSE", None),
        ("NEWTRUE", None), ("TUPLE3", None), ("REDUCE", None),
        ("MARK", None), ("BININT1", 3), ("SHORT_BINSTRING", "|"), ("NONE", None),
        ("NONE", None), ("NONE", None), ("BININT", -1), ("BININT", -1), ("BININT1", 0),
        ("TUPLE", None), ("BUILD", None),
        ("NEWFALSE", None), ("BINSTRING", data.tobytes().decode("latin-1")), ("TUPLE", None),
        ("BUILD", None),
        ("SHORT_BINSTRING", "labels"), ("EMPTY_LIST", None), ("MARK", None), ("BININT1", 3),
        ("BININT1", 7), ("APPENDS", None), ("SETITEMS", None), ("STOP", None),
    ]
    assert opcodes(pickled) == expected
    # Text and bytes only as Python 2 byte strings; no Python 3 opcodes or _codecs anywhere.
    assert b"_codecs" not in pickled
    names = {op.name for op, _, _ in pickletools.genops(pickled)}
    assert not names & {"BINUNICODE", "SHORT_BINBYTES", "BINBYTES", "STACK_GLOBAL", "FRAME"}


def test_writer_batches_long_lists_and_uses_long_memo_indices(tmp_path):
    # Python 2 appended list items in runs of 1,000 and switched to LONG_BINPUT past slot 255.
    body = good_batch(1001)
    pickled = pickles.dumps_py2(body)
    ops = [op.name for op, _, _ in pickletools.genops(pickled)]
    assert ops.count("APPENDS") == 2 and ops.count("APPEND") == 2  # labels and filenames
    assert "LONG_BINPUT" in ops
    loaded = pickles.load_pickle(write(tmp_path / "b", pickled))
    assert loaded[b"filenames"][1000] == b"img_s_001000.png"
    assert loaded[b"labels"] == body["labels"]


def test_written_batch_loads_like_the_real_files(tmp_path):
    body = good_batch()
    path = write(tmp_path / "data_batch_1", body)
    plain = pickle.load(open(path, "rb"), encoding="bytes")  # what CIFAR's own docs do
    assert list(plain) == [b"batch_label", b"labels", b"data", b"filenames"]
    assert plain[b"batch_label"] == b"training batch 1 of 5"
    batch = pickles.load_batch(path)
    np.testing.assert_array_equal(batch.data, body["data"])
    assert batch.data.dtype == np.uint8 and batch.data.flags.c_contiguous
    assert batch.labels.tolist() == body["labels"]


# --- restricted unpickler -----------------------------------------------------------------------

class _RunsShell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("nested", [False, True])
def test_malicious_pickle_runs_nothing(tmp_path, protocol, nested):
    marker = tmp_path / "pwned"
    payload = _RunsShell(marker)
    obj = {b"data": payload, b"labels": [1]} if nested else payload
    path = write(tmp_path / "data_batch_1", pickle.dumps(obj, protocol=protocol))
    with pytest.raises(UserError) as e:
        pickles.load_batch(path)
    assert not marker.exists()
    message = str(e.value)
    assert path in message and "refused to load" in message and "system" in message
    assert "\n" not in message
    # Control: the same file really is an attack for plain pickle.
    pickle.load(open(path, "rb"))
    assert marker.exists()


def test_codecs_only_as_latin1(tmp_path):
    # A batch re-saved by Python 3 at protocol 2 stores bytes as _codecs.encode(str, 'latin1').
    body = {b"data": np.full((2, 3072), 7, np.uint8), b"labels": [0, 9]}
    batch = pickles.load_batch(write(tmp_path / "py3p2", pickle.dumps(body, protocol=2)))
    assert batch.data[0, 0] == 7 and batch.labels.tolist() == [0, 9]
    # Any other codec is refused (zlib and friends could decompress a bomb).
    sneaky = (b"\x80\x02c_codecs\nencode\nX\x02\x00\x00\x00eJX\x0a\x00\x00\x00zlib_codec\x86R.")
    with pytest.raises(UserError, match="latin1"):
        pickles.load_pickle(write(tmp_path / "zlib", sneaky))


@pytest.mark.parametrize("protocol", [3, 4, 5])
def test_python3_pickles_with_text_keys_load(tmp_path, protocol):
    body = {"data": np.full((3, 3072), 200, np.uint8), "labels": [1, 2, 3]}
    batch = pickles.load_batch(write(tmp_path / "py3", pickle.dumps(body, protocol=protocol)))
    assert batch.labels.tolist() == [1, 2, 3] and batch.data[2, 3071] == 200


# --- broken files -------------------------------------------------------------------------------

def test_truncated_pickle(tmp_path):
    full = pickles.dumps_py2(good_batch())
    path = write(tmp_path / "data_batch_2", full[: len(full) // 2])
    with pytest.raises(UserError, match="truncated") as e:
        pickles.load_batch(path)
    assert path in str(e.value)


def test_truncated_right_after_header(tmp_path):
    path = write(tmp_path / "data_batch_2", b"\x80\x02}q\x01(U\x04data")
    with pytest.raises(UserError, match=f"{path}.*truncated"):
        pickles.load_batch(path)


def test_empty_file(tmp_path):
    path = write(tmp_path / "test_batch", b"")
    with pytest.raises(UserError, match=f"{path} is empty"):
        pickles.load_batch(path)


def test_directory_instead_of_file(tmp_path):
    (tmp_path / "data_batch_3").mkdir()
    with pytest.raises(UserError, match="data_batch_3 is a directory"):
        pickles.load_batch(str(tmp_path / "data_batch_3"))


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="data_batch_4 not found"):
        pickles.load_batch(str(tmp_path / "data_batch_4"))


def test_garbage_bytes(tmp_path):
    path = write(tmp_path / "data_batch_1", b"<html>404 Not Found</html>\n")
    with pytest.raises(UserError, match="not a valid CIFAR batch"):
        pickles.load_batch(path)


def _with(**changes):
    body = good_batch(4)
    body.update(changes)
    return body


@pytest.mark.parametrize("body, expected", [
    (_with(data=np.zeros((4, 3071), np.uint8)), r"shape \(4, 3071\)"),
    (_with(data=np.zeros((4, 3, 1024), np.uint8)), r"shape \(4, 3, 1024\)"),
    (_with(data=np.zeros((0, 3072), np.uint8), labels=[]), r"shape \(0, 3072\)"),
    (_with(data=np.zeros((4, 3072), np.int32)), "dtype int32, expected uint8"),
    (_with(data=np.zeros((4, 3072), np.float32)), "dtype float32, expected uint8"),
    (_with(data=[[0] * 3072] * 4), "'data' is a list"),
    (_with(labels=[0, 1, 2, 10]), "label 3 is 10, outside 0..9"),
    (_with(labels=[0, -1, 2, 3]), "label 1 is -1, outside 0..9"),
    (_with(labels=[0, 1, 2]), "3 labels for 4 images"),
    (_with(labels=[0, 1, 2, 3, 4]), "5 labels for 4 images"),
    (_with(labels=[0, 1, 2, "3"]), "label 3 is b'3'"),
    (_with(labels=[0, 1, 2, True]), "label 3 is True"),
    (_with(labels=b"0123"), "'labels' is a bytes"),
    ({"data": np.zeros((1, 3072), np.uint8)}, "no 'labels' entry"),
    ([1, 2, 3], "expected a dict, found list"),
])
def test_invalid_content(tmp_path, body, expected):
    path = write(tmp_path / "data_batch_5", body)
    with pytest.raises(UserError, match=expected) as e:
        pickles.load_batch(path)
    assert str(e.value).startswith(f"{path} is not a valid CIFAR batch")
    assert "\n" not in str(e.value)
