"""Download (real HTTP server on 127.0.0.1), MD5 checks and safe extraction of the archive."""

import io
import os
import tarfile

import numpy as np
import pytest

from cifar10_estimator.data import archives, pickles, schema
from cifar10_estimator.errors import UserError
from conftest import listing, md5

ARCHIVE = archives.ARCHIVE_NAME
BATCHES = schema.BATCHES_DIRNAME


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_defaults_are_the_official_archive():
    assert archives.DEFAULT_URL == "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert archives.DEFAULT_MD5 == "c58f30108f718f92721af3b95e74349a"
    assert archives.ARCHIVE_SIZE == 170_498_071


def test_download_verify_extract(tmp_path, http_server, make_cifar_tarball):
    archive, contents = make_cifar_tarball(images_per_batch=30)
    http_server.routes["/cifar-10-python.tar.gz"] = archive
    data_dir = tmp_path / "data"
    dest = data_dir / ARCHIVE
    progress = io.StringIO()
    archives.download(http_server.url("/cifar-10-python.tar.gz"), str(dest), md5(archive),
                      progress=progress)
    assert dest.read_bytes() == archive
    assert listing(data_dir) == [ARCHIVE]  # no temporary left over
    text = progress.getvalue()
    # Not a terminal: a header, a line per quarter, a final line; no carriage returns.
    assert text.startswith("Downloading http://127.0.0.1:")
    assert f"({len(archive) / 1e6:.1f} MB)" in text.splitlines()[0]
    assert "\r" not in text and "100.0%" in text.splitlines()[-1]
    assert 2 <= len(text.splitlines()) <= 5

    folder = archives.extract_batches(str(dest), str(data_dir))
    assert folder == str(data_dir / BATCHES)
    assert sorted(os.listdir(folder)) == sorted(
        ["batches.meta", "readme.html", "test_batch"] + [f"data_batch_{i}" for i in range(1, 6)])
    batch = pickles.load_batch(os.path.join(folder, "data_batch_3"))
    np.testing.assert_array_equal(batch.data, contents["data_batch_3"][0])
    assert [n for n in listing(data_dir) if n.startswith(".")] == []


def test_progress_on_a_terminal_is_one_rewritten_line(tmp_path, http_server, make_cifar_tarball):
    archive, _ = make_cifar_tarball()
    http_server.routes["/a.tgz"] = archive
    tty = FakeTty()
    archives.download(http_server.url("/a.tgz"), str(tmp_path / ARCHIVE), md5(archive),
                      progress=tty)
    header, bar = tty.getvalue().split("\n", 1)
    assert header.startswith("Downloading") and bar.startswith("\r") and bar.endswith("\n")
    assert bar.count("\n") == 1 and "100.0% [" + "#" * 30 + "]" in bar


def test_checksum_mismatch_keeps_nothing(tmp_path, http_server, make_cifar_tarball):
    archive, _ = make_cifar_tarball()
    http_server.routes["/a.tgz"] = archive
    wrong = "0" * 32
    data_dir = tmp_path / "data"
    with pytest.raises(UserError) as e:
        archives.download(http_server.url("/a.tgz"), str(data_dir / ARCHIVE), wrong,
                          progress=io.StringIO())
    message = str(e.value)
    assert f"has MD5 {md5(archive)}, expected {wrong}" in message and "\n" not in message
    assert listing(data_dir) == []


def test_http_404_keeps_nothing(tmp_path, http_server):
    data_dir = tmp_path / "data"
    with pytest.raises(UserError, match="HTTP 404") as e:
        archives.download(http_server.url("/missing.tgz"), str(data_dir / ARCHIVE), "0" * 32,
                          progress=io.StringIO())
    assert str(data_dir / ARCHIVE) in str(e.value)  # says where to put the archive by hand
    assert listing(data_dir) == []


def test_connection_dropped_mid_body_keeps_nothing(tmp_path, http_server, make_cifar_tarball):
    archive, _ = make_cifar_tarball()
    http_server.routes["/a.tgz"] = ("drop", archive, len(archive) // 2)
    data_dir = tmp_path / "data"
    with pytest.raises(UserError, match=f"stopped after {len(archive) // 2:,} of "
                                        f"{len(archive):,} bytes"):
        archives.download(http_server.url("/a.tgz"), str(data_dir / ARCHIVE), md5(archive),
                          progress=io.StringIO())
    assert listing(data_dir) == []


def test_offline_says_where_to_put_the_archive(tmp_path, closed_port_url):
    dest = tmp_path / ARCHIVE
    with pytest.raises(UserError) as e:
        archives.download(closed_port_url, str(dest), archives.DEFAULT_MD5,
                          progress=io.StringIO(), timeout=5)
    message = str(e.value)
    assert "offline" in message and f"put it at {dest}" in message and "--sample" in message
    assert listing(tmp_path) == []


def test_local_archive_md5_mismatch(tmp_path, make_cifar_tarball):
    archive, _ = make_cifar_tarball()
    path = tmp_path / ARCHIVE
    path.write_bytes(archive)
    with pytest.raises(UserError, match=f"has MD5 {md5(archive)}, expected "
                                        f"{archives.DEFAULT_MD5}"):
        archives.verify_md5(str(path), archives.DEFAULT_MD5)
    archives.verify_md5(str(path), md5(archive).upper())  # case does not matter


# --- extraction safety --------------------------------------------------------------------------

def _add(tar: tarfile.TarFile, name: str, type_: bytes = tarfile.REGTYPE, data: bytes = b"x",
         linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = type_, linkname, 0o644
    if type_ == tarfile.REGTYPE:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def _evil_members(tmp_path):
    outside = tmp_path / "outside"
    return {
        # tarfile's data filter (PEP 706) refuses these; the message is its own.
        "dotdot": (lambda t: _add(t, f"{BATCHES}/../../outside"), f"{BATCHES}/../../outside",
                   "which is outside the destination"),
        "plain_dotdot": (lambda t: _add(t, "../outside"), "../outside",
                         "which is outside the destination"),
        "symlink": (lambda t: _add(t, f"{BATCHES}/data_batch_6", tarfile.SYMTYPE,
                                   linkname=str(outside)),
                    f"{BATCHES}/data_batch_6", "is a link to an absolute path"),
        "chardev": (lambda t: _add(t, f"{BATCHES}/tty", tarfile.CHRTYPE), f"{BATCHES}/tty",
                    "is a special file"),
        "blockdev": (lambda t: _add(t, f"{BATCHES}/sda", tarfile.BLKTYPE), f"{BATCHES}/sda",
                     "is a special file"),
        "fifo": (lambda t: _add(t, f"{BATCHES}/pipe", tarfile.FIFOTYPE), f"{BATCHES}/pipe",
                 "is a special file"),
        # The data filter makes an absolute name relative; it is then outside the folder.
        "absolute": (lambda t: _add(t, str(outside)), str(outside), f"outside {BATCHES}/"),
        # What the filter allows but a CIFAR archive never holds.
        "hardlink": (lambda t: _add(t, f"{BATCHES}/data_batch_6", tarfile.LNKTYPE,
                                    linkname=f"{BATCHES}/data_batch_1"),
                     f"{BATCHES}/data_batch_6", f"a link to '{BATCHES}/data_batch_1'"),
        "inner_symlink": (lambda t: _add(t, f"{BATCHES}/data_batch_6", tarfile.SYMTYPE,
                                         linkname="data_batch_1"),
                          f"{BATCHES}/data_batch_6", "a link to 'data_batch_1'"),
        "other_folder": (lambda t: _add(t, "somewhere/else"), "somewhere/else",
                         f"outside {BATCHES}/"),
        "subfolder": (lambda t: _add(t, f"{BATCHES}/sub/file"), f"{BATCHES}/sub/file",
                      "sub-folder"),
        "duplicate": (lambda t: _add(t, f"{BATCHES}/data_batch_1"), f"{BATCHES}/data_batch_1",
                      "appears twice"),
    }


@pytest.mark.parametrize("case", ["dotdot", "plain_dotdot", "absolute", "symlink", "hardlink",
                                  "inner_symlink", "chardev", "blockdev", "fifo", "other_folder",
                                  "subfolder", "duplicate"])
def test_hostile_members_are_refused_by_name(tmp_path, make_cifar_tarball, case):
    add, member, reason = _evil_members(tmp_path)[case]
    # The hostile member comes after the genuine ones: a partial extraction must vanish too.
    archive, _ = make_cifar_tarball(extra=add)
    root = tmp_path / "root"
    data_dir = root / "data"
    data_dir.mkdir(parents=True)
    (data_dir / ARCHIVE).write_bytes(archive)
    with pytest.raises(UserError) as e:
        archives.extract_batches(str(data_dir / ARCHIVE), str(data_dir))
    message = str(e.value)
    assert f"refused archive member {member!r}" in message and reason in message
    assert listing(root) == ["data", f"data/{ARCHIVE}"]  # nothing extracted, no temporaries
    assert not (tmp_path / "outside").exists()


def test_archive_without_a_required_batch(tmp_path, make_cifar_tarball):
    archive, _ = make_cifar_tarball(skip=("test_batch",))
    (tmp_path / ARCHIVE).write_bytes(archive)
    with pytest.raises(UserError, match=f"has no {BATCHES}/test_batch"):
        archives.extract_batches(str(tmp_path / ARCHIVE), str(tmp_path))
    assert listing(tmp_path) == [ARCHIVE]


@pytest.mark.parametrize("cut", ["truncated", "not_gzip"])
def test_damaged_archive(tmp_path, make_cifar_tarball, cut):
    archive, _ = make_cifar_tarball()
    body = archive[: len(archive) * 2 // 3] if cut == "truncated" else b"<html>oops</html>" * 50
    (tmp_path / ARCHIVE).write_bytes(body)
    with pytest.raises(UserError, match="not a readable tar.gz archive"):
        archives.extract_batches(str(tmp_path / ARCHIVE), str(tmp_path))
    assert listing(tmp_path) == [ARCHIVE]


def test_extraction_refuses_to_overwrite(tmp_path, make_cifar_tarball):
    archive, _ = make_cifar_tarball()
    (tmp_path / ARCHIVE).write_bytes(archive)
    (tmp_path / BATCHES).mkdir()
    with pytest.raises(UserError, match="already exists"):
        archives.extract_batches(str(tmp_path / ARCHIVE), str(tmp_path))
