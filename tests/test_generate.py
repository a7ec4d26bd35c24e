"""The generator end to end: sources, record contents and bytes, atomicity, command line."""

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import storage, generate
from cifar10_estimator.data import (archives, metadata, pickles, sample_data, schema,
                                    sources, writer)
from cifar10_estimator.errors import UserError
from conftest import listing, md5, run_generator_cli

SPLIT_BATCHES = {
    "train": ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4"],
    "validation": ["data_batch_5"],
    "eval": ["test_batch"],
}
OUTPUTS = ["train.tfrecords", "validation.tfrecords", "eval.tfrecords"]


def reference_example(image: bytes, label: int) -> bytes:
    """A tf.train.Example built independently of the package, as the original generator did,
    with its map's entries in key order (the original's order varies by process)."""
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(
        deterministic=True)


def read_records(path) -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path))]


def quiet_generate(data_dir, output_dir=None, **kwargs):
    """The generator's conversion of CIFAR-10's batches in ``data_dir`` (``kwargs``: those of
    ``load_source``): the records per split, and the lines it logged."""
    lines = []
    counts = writer.generate_tfrecords(
        lambda: sources.load_source(data_dir, log=lines.append, progress=io.StringIO(),
                                    **kwargs),
        output_dir or data_dir, log=lines.append)
    return counts, lines


# A record's bytes as another process writes them (its protobuf map hash seed is its own).
ENCODE_ELSEWHERE = ("import hashlib; from cifar10_estimator.data import schema; "
                    "print(hashlib.sha256(schema.encode_example(bytes(range(256)) * 12, 7))"
                    ".hexdigest())")


@pytest.mark.timeout(120)
def test_records_are_the_same_bytes_in_every_process():
    # Without deterministic serialization the two map entries come out in either order, by
    # process: 5 processes agreeing by chance is a 1-in-16 event.
    procs = [subprocess.Popen([sys.executable, "-c", ENCODE_ELSEWHERE], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for _ in range(4)]
    digests = {proc.communicate(timeout=100)[0].strip() for proc in procs}
    digests.add(hashlib.sha256(schema.encode_example(bytes(range(256)) * 12, 7)).hexdigest())
    assert len(digests) == 1, digests


def test_schema_splits_match_the_original():
    assert {k: list(v) for k, v in schema.SPLITS.items()} == SPLIT_BATCHES


def test_round_trip_pickles_to_records(tmp_path, make_cifar_dir):
    contents = make_cifar_dir(str(tmp_path), images_per_batch=20)
    # Mark three pixels of the first training image to pin down the CHW -> HWC placement.
    data = contents["data_batch_1"][0]
    data[0] = 0
    data[0, 0 * 1024 + 0 * 32 + 1] = 200  # red,   row 0,  column 1
    data[0, 1 * 1024 + 2 * 32 + 0] = 100  # green, row 2,  column 0
    data[0, 2 * 1024 + 31 * 32 + 31] = 50  # blue, row 31, column 31
    with open(tmp_path / schema.BATCHES_DIRNAME / "data_batch_1", "wb") as f:
        f.write(pickles.dumps_py2({"batch_label": "training batch 1 of 5",
                                   "labels": contents["data_batch_1"][1], "data": data,
                                   "filenames": []}))

    counts, lines = quiet_generate(str(tmp_path))
    assert counts == {"train": 80, "validation": 20, "eval": 20}

    for split, names in SPLIT_BATCHES.items():
        images = np.concatenate([contents[n][0] for n in names])
        labels = sum((contents[n][1] for n in names), [])
        records = read_records(schema.record_path(str(tmp_path), split))
        assert len(records) == len(labels) == counts[split]
        for record, image, label in zip(records, images, labels):
            # Byte for byte what a tf.train.Example of {image, label} serializes to.
            assert record == reference_example(image.tobytes(), label)
        parsed = [tf.io.parse_single_example(r, schema.FEATURE_SPEC) for r in records]
        decoded = np.stack([schema.decode_images(p["image"]).numpy() for p in parsed])
        assert decoded.shape == (len(labels), 32, 32, 3) and decoded.dtype == np.uint8
        np.testing.assert_array_equal(decoded, images.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        assert [int(p["label"]) for p in parsed] == labels

    first = schema.decode_images(tf.io.parse_single_example(
        read_records(tmp_path / "train.tfrecords")[0], schema.FEATURE_SPEC)["image"]).numpy()
    assert first[0, 1, 0] == 200 and first[2, 0, 1] == 100 and first[31, 31, 2] == 50
    assert np.count_nonzero(first) == 3

    meta = json.loads((tmp_path / metadata.METADATA_FILENAME).read_text())
    assert meta["counts"] == counts
    assert meta["source"] == f"CIFAR-10 python batches in {tmp_path / schema.BATCHES_DIRNAME}"
    assert metadata.split_size(str(tmp_path), "train") == 80
    # Announced per split, then a summary.
    assert "  train: 80 records" in lines and "  eval: 20 records" in lines
    assert lines[-1].startswith("Done: 120 records (train 80, validation 20, eval 20) in ")
    assert [n for n in listing(tmp_path) if n.startswith(".")] == []


def test_output_dir_and_rerun(tmp_path, make_cifar_dir):
    make_cifar_dir(str(tmp_path / "src"), images_per_batch=10)
    out = tmp_path / "out" / "records"
    quiet_generate(str(tmp_path / "src"), str(out))
    assert sorted(os.listdir(out)) == sorted(OUTPUTS + [metadata.METADATA_FILENAME])
    assert not any(name.endswith(".tfrecords") for name in os.listdir(tmp_path / "src"))
    first = (out / "train.tfrecords").read_bytes()
    assert (out / "train.tfrecords").stat().st_mode & 0o777 == storage.FILE_MODE
    quiet_generate(str(tmp_path / "src"), str(out))  # a rerun replaces the files in place
    assert (out / "train.tfrecords").read_bytes() == first
    assert sorted(os.listdir(out)) == sorted(OUTPUTS + [metadata.METADATA_FILENAME])


def test_invalid_later_batch_leaves_no_new_file(tmp_path, make_cifar_dir):
    # train and validation are fine, test_batch has a label out of range: nothing may be
    # written, and outputs of an earlier run stay exactly as they were.
    bad = pickles.dumps_py2({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]})
    make_cifar_dir(str(tmp_path), images_per_batch=10, overrides={"test_batch": bad})
    (tmp_path / "train.tfrecords").write_bytes(b"previous run")
    with pytest.raises(UserError, match="test_batch is not a valid CIFAR batch: label 1 is 10"):
        quiet_generate(str(tmp_path))
    assert (tmp_path / "train.tfrecords").read_bytes() == b"previous run"
    assert not (tmp_path / "validation.tfrecords").exists()
    assert not (tmp_path / "eval.tfrecords").exists()
    assert not (tmp_path / metadata.METADATA_FILENAME).exists()
    assert [n for n in listing(tmp_path) if n.startswith(".")] == []


def test_failing_rename_takes_back_this_runs_files(tmp_path):
    # A real failure during the final renames: the first final path is a non-empty folder,
    # so its rename fails after the later files were renamed into place (renames run last to
    # first). Those must be removed again.
    finals = [str(tmp_path / name) for name in OUTPUTS]
    os.makedirs(os.path.join(finals[0], "keep"))
    with pytest.raises(OSError):
        with writer._all_or_nothing(finals) as temps:
            for tmp in temps:
                with open(tmp, "wb") as f:
                    f.write(b"new")
    assert listing(tmp_path) == ["train.tfrecords", "train.tfrecords/keep"]


def test_output_path_that_is_a_folder(tmp_path, make_cifar_dir):
    make_cifar_dir(str(tmp_path), images_per_batch=10)
    (tmp_path / "eval.tfrecords").mkdir()
    with pytest.raises(UserError, match="eval.tfrecords is a folder"):
        quiet_generate(str(tmp_path))
    assert not (tmp_path / "train.tfrecords").exists()


def test_extracted_folder_wins_over_archive(tmp_path, make_cifar_dir, closed_port_url):
    make_cifar_dir(str(tmp_path), images_per_batch=10)
    (tmp_path / archives.ARCHIVE_NAME).write_bytes(b"not even an archive")
    counts, _ = quiet_generate(str(tmp_path), source_url=closed_port_url)
    assert counts["train"] == 40


def test_local_archive_is_verified_extracted_and_converted(tmp_path, make_cifar_tarball,
                                                           closed_port_url):
    archive, contents = make_cifar_tarball(images_per_batch=12)
    (tmp_path / archives.ARCHIVE_NAME).write_bytes(archive)
    # Unreachable URL: proves the local archive is used without any network.
    counts, lines = quiet_generate(str(tmp_path), source_url=closed_port_url,
                                   source_md5=md5(archive))
    assert counts == {"train": 48, "validation": 12, "eval": 12}
    assert lines[0] == f"Checking {tmp_path / archives.ARCHIVE_NAME}"
    records = read_records(tmp_path / "eval.tfrecords")
    assert records[5] == reference_example(contents["test_batch"][0][5].tobytes(),
                                           contents["test_batch"][1][5])


def test_local_archive_with_wrong_md5(tmp_path, make_cifar_tarball):
    archive, _ = make_cifar_tarball()
    (tmp_path / archives.ARCHIVE_NAME).write_bytes(archive)
    with pytest.raises(UserError, match=f"expected {archives.DEFAULT_MD5}"):
        quiet_generate(str(tmp_path))
    assert listing(tmp_path) == [archives.ARCHIVE_NAME]  # the user's file is kept, as it was


def test_download_then_convert(tmp_path, http_server, make_cifar_tarball):
    archive, _ = make_cifar_tarball(images_per_batch=10)
    http_server.routes["/mirror/cifar-10-python.tar.gz"] = archive
    data_dir = tmp_path / "new"
    counts, _ = quiet_generate(str(data_dir), source_url=http_server.url(
        "/mirror/cifar-10-python.tar.gz"), source_md5=md5(archive))
    assert counts == {"train": 40, "validation": 10, "eval": 10}
    assert (data_dir / archives.ARCHIVE_NAME).read_bytes() == archive  # kept for next time
    meta = json.loads((data_dir / metadata.METADATA_FILENAME).read_text())
    url = http_server.url("/mirror/cifar-10-python.tar.gz")
    assert meta["source"] == f"{url} (MD5 {md5(archive)})"


def test_download_checksum_mismatch_leaves_nothing(tmp_path, http_server, make_cifar_tarball):
    archive, _ = make_cifar_tarball()
    http_server.routes["/a.tgz"] = archive
    with pytest.raises(UserError, match=f"has MD5 {md5(archive)}, expected {'f' * 32}"):
        quiet_generate(str(tmp_path / "new"), source_url=http_server.url("/a.tgz"),
                       source_md5="f" * 32)
    assert not (tmp_path / "new").exists()


def test_hostile_archive_through_the_generator(tmp_path, make_cifar_tarball):
    import tarfile

    def add_symlink(tar):
        info = tarfile.TarInfo(f"{schema.BATCHES_DIRNAME}/evil")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)

    archive, _ = make_cifar_tarball(extra=add_symlink)
    (tmp_path / archives.ARCHIVE_NAME).write_bytes(archive)
    with pytest.raises(UserError, match="refused archive member 'cifar-10-batches-py/evil'"):
        quiet_generate(str(tmp_path), source_md5=md5(archive))
    assert listing(tmp_path) == [archives.ARCHIVE_NAME]


def test_malicious_batch_through_the_generator(tmp_path, make_cifar_dir):
    marker = tmp_path / "pwned"

    class RunsShell:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    payload = pickle.dumps({b"data": RunsShell(), b"labels": [0]}, protocol=2)
    make_cifar_dir(str(tmp_path), images_per_batch=10, overrides={"data_batch_2": payload})
    with pytest.raises(UserError, match="data_batch_2 is not a valid CIFAR batch "
                                        r"\(refused to load posix.system"):
        quiet_generate(str(tmp_path))
    assert not marker.exists()
    assert not any(name.endswith(".tfrecords") for name in os.listdir(tmp_path))


# --- command line -------------------------------------------------------------------------------

def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("generate_tfrecords.py: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.slow
def test_cli_sample_data(tmp_path):
    result = run_generator_cli("--data-dir", str(tmp_path / "d"), "--sample",
                               "--sample-size", "20", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "cuDNN" not in result.stderr
    assert "  train: 80 records" in result.stdout
    assert "Done: 120 records (train 80, validation 20, eval 20)" in result.stdout
    assert "built-in sample data (seed 3, 20 images per batch)" in result.stdout
    assert sorted(n for n in os.listdir(tmp_path / "d") if n.endswith(".tfrecords")) == \
        sorted(OUTPUTS)


def test_cli_corrupt_batch(tmp_path, make_cifar_dir):
    make_cifar_dir(str(tmp_path), images_per_batch=10, overrides={"data_batch_3": b"\x80\x02}q"})
    result = run_generator_cli("--data-dir", str(tmp_path))
    assert_one_line_error(result, "data_batch_3", "truncated")


def test_cli_offline(tmp_path, closed_port_url):
    result = run_generator_cli("--data-dir", str(tmp_path / "d"), "--source-url", closed_port_url)
    assert_one_line_error(result, "offline",
                          f"put it at {tmp_path / 'd' / archives.ARCHIVE_NAME}")
    assert not (tmp_path / "d").exists()


def test_cli_missing_data_dir():
    result = run_generator_cli()
    assert result.returncode == 2 and "--data-dir" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args, fragments", [
    (["--sample", "--sample-size", "3"], ["--sample-size must be between 10 and 10000", "3"]),
    (["--seed", "1"], ["--seed applies only with --sample"]),
    (["--sample", "--source-url", "http://x"], ["--source-url cannot be combined with --sample"]),
    (["--source-md5", "xyz"], ["--source-md5 'xyz' is not an MD5 digest"]),
])
def test_cli_flag_errors(tmp_path, capsys, args, fragments):
    assert generate.main(["--data-dir", str(tmp_path / "d"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(f in err[0] for f in fragments)
    assert not (tmp_path / "d").exists()


def test_cli_sample_refuses_other_data(tmp_path, capsys, make_cifar_dir):
    make_cifar_dir(str(tmp_path), images_per_batch=10)
    assert generate.main(["--data-dir", str(tmp_path), "--sample"]) == 2
    err = capsys.readouterr().err
    assert "already holds real or other CIFAR-10 batches" in err and "--data-dir" in err
    assert not (tmp_path / "train.tfrecords").exists()


def test_cli_sample_reuses_same_settings_refuses_others(tmp_path, capsys):
    args = ["--data-dir", str(tmp_path), "--sample", "--sample-size", "10"]
    assert generate.main(args) == 0
    assert "Wrote sample data" in capsys.readouterr().out
    assert generate.main(args) == 0
    assert "Sample data already in" in capsys.readouterr().out
    assert generate.main(args + ["--seed", "5"]) == 2
    err = capsys.readouterr().err
    assert "holds sample data made with --sample-size 10 --seed 0" in err


def test_sample_class_names_travel_from_batches_meta_to_the_metadata(tmp_path):
    data_dir = str(tmp_path / "data")
    assert generate.main(["--data-dir", data_dir, "--sample", "--sample-size", "10"]) == 0
    assert metadata.dataset_info(data_dir).class_names == tuple(sample_data.SAMPLE_CLASS_NAMES)
    assert metadata.dataset_info(str(tmp_path)).class_names == schema.CLASS_NAMES  # no metadata: CIFAR's
