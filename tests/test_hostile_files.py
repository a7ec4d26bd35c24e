"""Hostile files, as a user meets them: each through the real command, in its own process.

A reader of untrusted bytes must end in one line naming the file and exit status 2, never in a
native crash (SIGSEGV: -11 from ``subprocess``, 139 from a shell), a hang (each process has a
time limit here) or memory out of all proportion to the file:

- a CIFAR batch that builds an object array whose state lists fewer items than its shape
  (numpy read past the list: SIGSEGV);
- a tar header that tarfile reads whole into memory before any filter sees it;
- a FIFO where a batch, the archive, a flag file, a record file, the records' metadata,
  ``settings.json`` or a picture belongs (a plain ``open`` waits forever for a writer); in an
  image folder, a FIFO named like a picture is left out and counted, as a damaged picture is;
- a record file whose length field (its CRC right) declares 64 GiB (TensorFlow's reader
  allocated it and died: SIGSEGV).

tests/fuzz/ tries thousands of variants of each in-process; these run the commands.
"""

import gzip
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from cifar10_estimator.data import metadata, schema
from cifar10_estimator.errors import UserError
from conftest import REPO, listing, write_cifar_dir
from trainer_fixtures import run_concurrently, run_module, trainer_args, without_cpp_log, \
    work_dir, write_records

GENERATOR = [sys.executable, os.path.join(REPO, "tools", "generate_tfrecords.py")]
# A command that loads no TensorFlow ends in a second or two; one that does, in tens.
QUICK, TENSORFLOW = 60, 300
# The trainer's log lines (logs.py: "%H:%M:%S message") go to stderr too; the error is the
# one line that is not one.
LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d ")


def _refused(proc: subprocess.CompletedProcess, path) -> str:
    """Asserts a refusal: exit status 2, no crash, no traceback, one error line on stderr
    (log lines aside) naming ``path``; returns that line."""
    assert proc.returncode not in (-signal.SIGSEGV, 128 + signal.SIGSEGV), proc.stderr[-2000:]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = [line for line in without_cpp_log(proc.stderr).splitlines()
             if not LOG_LINE.match(line)]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert str(path) in lines[0] and "error: " in lines[0], lines[0]
    return lines[0]


def _object_array_batch() -> bytes:
    """A CIFAR batch (238 bytes) whose 'data' is an object array as numpy pickles it at
    protocol 2, its shape changed from (3,) to (1,000,000,): its state still lists 3 items."""
    raw = pickle.dumps({"data": np.array([1, 2, 3], dtype=object), "labels": [0]}, protocol=2)
    shape = pickle.BININT1 + b"\x03" + pickle.TUPLE1
    assert raw.count(shape) == 1
    return raw.replace(shape, pickle.BININT + struct.pack("<i", 10**6) + pickle.TUPLE1)


def _long_name_archive(path, size: int) -> None:
    """A gzipped tar whose first header is a GNU long name of ``size`` bytes (1 MB of gzip
    for 256 MiB), written as it is compressed."""
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, size
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1,
                                                mtime=0) as out:
        out.write(info.tobuf(tarfile.GNU_FORMAT))
        for _ in range(size >> 20):
            out.write(b"a" * (1 << 20))
        out.write(b"\0" * 1024)


# Runs a command and reports its exit status and peak resident memory. A direct child of the
# test process would report the test process's own size: Linux carries the memory high-water
# mark of a forked copy through exec, so the command is started from this small interpreter.
_MEASURE = """
import json, resource, subprocess, sys
report, timeout, *command = sys.argv[1:]
try:
    done = subprocess.run(command, timeout=float(timeout))
    code = done.returncode
except subprocess.TimeoutExpired:
    code = "timeout"
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
json.dump({"code": code, "peak": peak}, open(report, "w"))
"""


def _run_measured(args: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, int]:
    """Runs ``args`` (killed after ``timeout`` seconds: a hang fails the caller's asserts);
    returns the completed process and its peak resident memory in bytes."""
    report = os.path.join(work_dir(), "measured.json")
    wrapper = subprocess.run([sys.executable, "-c", _MEASURE, report, str(timeout), *args],
                             capture_output=True, text=True, timeout=timeout + 30,
                             cwd=work_dir())
    with open(report) as f:
        measured = json.load(f)
    os.remove(report)
    assert measured["code"] != "timeout", f"{args} still ran after {timeout} s"
    return (subprocess.CompletedProcess(args, measured["code"], wrapper.stdout, wrapper.stderr),
            measured["peak"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["object-array batch", "FIFO batch", "FIFO archive",
                                  "long-name archive", "FIFO flag file"])
def test_hostile_input_to_the_generator_is_refused_in_one_line(case, tmp_path,
                                                               closed_port_url):
    # Each is refused before TensorFlow loads, in a second or two.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    batches = data_dir / schema.BATCHES_DIRNAME
    archive = data_dir / "cifar-10-python.tar.gz"
    command = [*GENERATOR, "--data-dir", str(data_dir), "--source-url", closed_port_url]
    if case in ("object-array batch", "FIFO batch"):
        write_cifar_dir(str(data_dir), images_per_batch=4)
        named = batches / "data_batch_1"
        named.unlink()
        if case == "FIFO batch":
            os.mkfifo(named)
        else:
            named.write_bytes(_object_array_batch())
    elif case == "FIFO archive":  # not taken for a missing archive and downloaded over
        named = archive
        os.mkfifo(named)
    elif case == "FIFO flag file":
        named = tmp_path / "generate.flags"
        os.mkfifo(named)
        command = [*GENERATOR, f"@{named}"]
    else:
        named = archive
        _long_name_archive(named, 256 << 20)
        digest = hashlib.md5(named.read_bytes()).hexdigest()
        command += ["--source-md5", digest]
    before = listing(data_dir)
    proc, peak = _run_measured(command, QUICK)
    line = _refused(proc, named)
    assert listing(data_dir) == before  # nothing written, nothing left half-written
    if case.startswith("FIFO"):
        assert "not a regular file but a FIFO" in line, line
    if case == "long-name archive":
        # tarfile read the whole 256 MiB header before the bound (the generator peaked at
        # about 300 MiB, from a 1.2 MB file); now the header is refused from its size field.
        assert peak < 128 << 20, f"the generator peaked at {peak >> 20} MiB"


def _image_folder(root) -> None:
    """DIR/train and DIR/test with two classes of one small PNG each, and a FIFO named x.png
    among the training cats."""
    from PIL import Image

    for split in ("train", "test"):
        for i, name in enumerate(("cat", "dog")):
            folder = root / split / name
            folder.mkdir(parents=True)
            Image.fromarray(np.full((8, 8, 3), 40 + 100 * i, np.uint8)).save(folder / "a.png")
    os.mkfifo(root / "train" / "cat" / "x.png")


@pytest.mark.slow
@pytest.mark.timeout(TENSORFLOW)
def test_a_fifo_named_like_a_picture_is_left_out_and_counted(tmp_path):
    pictures, out = tmp_path / "pictures", tmp_path / "records"
    _image_folder(pictures)
    fifo = pictures / "train" / "cat" / "x.png"
    proc = subprocess.run([*GENERATOR, "--image-folder", str(pictures), "--output-dir",
                           str(out)], capture_output=True, text=True, timeout=TENSORFLOW,
                          cwd=work_dir())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"1 damaged picture(s) left out (first: {fifo})" in proc.stdout, proc.stdout
    info = metadata.dataset_info(str(out))
    assert {split: facts.records for split, facts in info.splits.items()} == {
        "train": 2, "eval": 2}
    for split in ("train", "eval"):
        metadata.verify_split(str(out), split)
    assert info.class_names == ("cat", "dog")


def _hostile_record() -> bytes:
    """28 bytes: a length field declaring 64 GiB, with its right masked CRC-32C (TensorBoard's
    pure-Python CRC, which its own record writer uses), then 16 bytes."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    length = struct.pack("<Q", 64 << 30)
    return length + struct.pack("<I", masked_crc32c(length)) + bytes(16)


@pytest.mark.slow
@pytest.mark.timeout(4 * TENSORFLOW)
def test_the_trainer_refuses_hostile_records_and_pipes_in_one_line(tmp_path):
    def trainer(data_dir, job_dir):
        """The trainer's command on ``data_dir`` and ``job_dir``, to be run."""
        return lambda: run_module("cifar10_estimator", *trainer_args(data_dir, job_dir,
                                                                     "--train-steps", "2"),
                                  timeout=TENSORFLOW)

    good = tmp_path / "good"
    write_records(str(good), {"train": 16, "eval": 8})
    # Without metadata, count_records handed the file to TensorFlow's reader (SIGSEGV); with
    # metadata forged to match it (a hostile data dir brings its own), so did training.
    hostile = []
    for forged in (False, True):
        data_dir = tmp_path / f"forged-{forged}"
        shutil.copytree(good, data_dir)
        path = schema.record_path(str(data_dir), "train")
        with open(path, "wb") as f:
            f.write(_hostile_record())
        if forged:
            metadata.write_metadata(str(data_dir), {
                "train": metadata.file_facts(path, 1),
                "eval": metadata.file_facts(schema.record_path(str(data_dir), "eval"), 8)},
                "forged")
        hostile.append((data_dir, tmp_path / f"job-{forged}", path))
    # A FIFO for the record file, and in the job dir a FIFO for settings.json.
    fifo_records = tmp_path / "fifo-records"
    shutil.copytree(good, fifo_records)
    fifo_path = schema.record_path(str(fifo_records), "train")
    os.remove(fifo_path)
    os.mkfifo(fifo_path)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    os.mkfifo(job_dir / "settings.json")
    # Each case in a process of its own, all at once (each has its own time limit).
    *forged_runs, fifo_run, settings_run = run_concurrently(
        *(trainer(data_dir, job) for data_dir, job, _ in hostile),
        trainer(fifo_records, tmp_path / "j"), trainer(good, job_dir))
    for (_, job, path), proc in zip(hostile, forged_runs):
        line = _refused(proc, path)
        assert "declares 68,719,476,736 bytes" in line, line
        assert not job.exists()
    assert "not a regular file but a FIFO" in _refused(fifo_run, fifo_path)
    _refused(settings_run, job_dir / "settings.json")


@pytest.mark.slow
@pytest.mark.timeout(TENSORFLOW)
def test_predict_refuses_a_fifo_named_like_a_picture(tiny_export, tmp_path):
    fifo = tmp_path / "x.png"
    os.mkfifo(fifo)
    proc = run_module("cifar10_estimator.predict", "--saved-model", tiny_export, str(fifo),
                      timeout=TENSORFLOW)
    assert "not a regular file but a FIFO" in _refused(proc, fifo)


def test_a_record_file_s_framing_is_walked_without_reading_it(tmp_path):
    # The walk's own figures (docs/data.md has the timing on 50,000 records): it counts, and
    # refuses a length past the end, one at the end of a record that is all there, a cut
    # inside the framing, and a length above what a record holds even when the bytes are there.
    data_dir = str(tmp_path)
    write_records(data_dir, {"train": 5})
    path = schema.record_path(data_dir, "train")
    raw = open(path, "rb").read()
    assert metadata.check_framing(path) == 5 == metadata.count_records(path)
    cases = {"past the end": _hostile_record(), "cut in the framing": raw + bytes(15),
             "over a record's bound": _length_record(metadata.MAX_RECORD_BYTES + 1)}
    for what, data in cases.items():
        with open(path, "wb") as f:
            f.write(data)
        with pytest.raises(UserError) as refused:
            metadata.check_framing(path)
        assert path in str(refused.value) and "\n" not in str(refused.value), what
    # A length that ends exactly at the file's end frames; TensorFlow then checks its CRC.
    with open(path, "wb") as f:
        f.write(_length_record(100))
    assert metadata.check_framing(path) == 1
    with pytest.raises(UserError, match="truncated or corrupt"):
        metadata.count_records(path)


def _length_record(length: int) -> bytes:
    """One record of ``length`` zero bytes, its length CRC right and its data CRC wrong."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    field = struct.pack("<Q", length)
    return field + struct.pack("<I", masked_crc32c(field)) + bytes(length) + b"\xff" * 4
