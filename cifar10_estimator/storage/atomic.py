"""Writes that leave no half-written file under its final name: a file (``atomic_path``,
``write_bytes_atomic``) or a folder (``atomic_dir``) is written under a temporary name and put
in place only when whole, locally by one rename, on object storage by copies (the package's doc
says what that leaves). What is renamed into place locally gets the mode a plain
``open``/``mkdir`` would have given it (``FILE_MODE``, ``DIR_MODE``).
"""

import contextlib
import os
import shutil
import tempfile
import uuid
from typing import Iterator

from cifar10_estimator.storage.files import makedirs, open_file, remove, rmtree, upload_tree
from cifar10_estimator.storage.locations import basename, gfile, is_url, join, os_errors, parent


def _current_umask() -> int:
    # The only portable way to read the umask is to set it and put it back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# mkstemp/mkdtemp create 0600 files and 0700 folders (right for temporaries); what we rename
# into place gets the mode a plain open()/mkdir() would have given it.
_UMASK = _current_umask()
FILE_MODE = 0o666 & ~_UMASK
DIR_MODE = 0o777 & ~_UMASK


def _temporary_name(final_path: str, suffix: str) -> str:
    """A name beside ``final_path`` that no one else uses, starting with a dot."""
    return join(parent(final_path), f".{basename(final_path)}.{uuid.uuid4().hex[:12]}{suffix}")


@contextlib.contextmanager
def atomic_path(final_path: str) -> Iterator[str]:
    """Yields a temporary path beside ``final_path``; renames it there if the block succeeds.

    The caller writes the whole file to the yielded path by any means (``open_file``, a
    ``tf.io.TFRecordWriter``, ...). If the block raises, the temporary file is deleted and
    ``final_path`` is left as it was.
    """
    if is_url(final_path):
        tmp = _temporary_name(final_path, ".tmp")
        try:
            yield tmp
            with os_errors(final_path):
                gfile(final_path).rename(tmp, final_path, overwrite=True)
        except BaseException:
            remove(tmp)
            raise
        return
    directory = os.path.dirname(os.path.abspath(final_path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(final_path)}.", suffix=".tmp",
                               dir=directory)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, final_path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_bytes_atomic(final_path: str, data: bytes) -> None:
    """Writes ``data`` to ``final_path`` atomically (see ``atomic_path``)."""
    with atomic_path(final_path) as tmp:
        with open_file(tmp, "wb") as f:
            f.write(data)


@contextlib.contextmanager
def atomic_dir(final_path: str) -> Iterator[str]:
    """Yields a fresh temporary folder; puts it at ``final_path`` when the block succeeds.

    ``final_path`` must not exist yet. Locally the folder is beside ``final_path`` and renamed
    there. For a URL it is a local temporary folder, uploaded file by file at the end (object
    stores rename a folder object by object, and ``ram://`` not at all). On error the temporary
    folder is removed, and on a URL whatever was uploaded.
    """
    if is_url(final_path):
        tmp = tempfile.mkdtemp(prefix=f".{basename(final_path)}.", suffix=".tmp")
        try:
            yield tmp
            upload_tree(tmp, final_path)
        except BaseException:
            rmtree(final_path)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    makedirs(parent(final_path))
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(final_path)}.", suffix=".tmp",
                           dir=parent(final_path))
    try:
        yield tmp
        os.chmod(tmp, DIR_MODE)
        os.rename(tmp, final_path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
