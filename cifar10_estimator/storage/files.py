"""The file operations, alike for a local path and a URL: whether a file or folder is there,
what a folder holds, its size and age, reading, writing, renaming and deleting, and copying a
local folder to object storage (``upload_tree``).

A local path uses the local file system's own calls; a URL goes through ``tf.io.gfile``, its
errors raised as Python's (``locations``). A local file is read only if it is a regular file
(``open_regular``). A write here is not atomic: ``atomic`` builds on these.
"""

import contextlib
import errno
import json
import os
import shutil
from typing import IO, Optional

from cifar10_estimator.storage.regular_files import open_regular
from cifar10_estimator.storage.locations import gfile, is_url, join, os_errors, parent, scheme


def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    with os_errors(path):
        return gfile(path).exists(path)


def isdir(path: str) -> bool:
    if not is_url(path):
        return os.path.isdir(path)
    with os_errors(path):
        return gfile(path).isdir(path)


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    return exists(path) and not isdir(path)


def listdir(path: str) -> list[str]:
    """Names in a folder (URLs: without the trailing ``/`` object stores give folders)."""
    if not is_url(path):
        return os.listdir(path)
    with os_errors(path):
        return [name.rstrip("/") for name in gfile(path).listdir(path)]


def glob(pattern: str) -> list[str]:
    if not is_url(pattern):
        import glob as local

        return sorted(local.glob(pattern))
    with os_errors(pattern):
        return sorted(gfile(pattern).glob(pattern))


def makedirs(path: str) -> None:
    if not is_url(path):
        os.makedirs(path, exist_ok=True)
        return
    with os_errors(path):
        gfile(path).makedirs(path)


def size(path: str) -> int:
    if not is_url(path):
        return os.path.getsize(path)
    with os_errors(path):
        return gfile(path).stat(path).length


def mtime(path: str) -> float:
    """Seconds since the epoch of the file's last change."""
    if not is_url(path):
        return os.path.getmtime(path)
    with os_errors(path):
        return gfile(path).stat(path).mtime_nsec / 1e9


def remove(path: str) -> None:
    """Deletes a file; a missing one is no error."""
    try:
        if is_url(path):
            with os_errors(path):
                gfile(path).remove(path)
        else:
            os.remove(path)
    except FileNotFoundError:
        pass


def rmtree(path: str) -> None:
    """Deletes a folder and what it holds; errors are ignored (a cleanup)."""
    if is_url(path):
        with contextlib.suppress(Exception):
            gfile(path).rmtree(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def open_file(path: str, mode: str = "r") -> IO:
    """A file object for reading or writing ``path``. On a URL, reading a missing object
    raises ``FileNotFoundError`` here, as ``open`` does. A local file is read only if it is a
    regular file (``open_regular``)."""
    if not is_url(path):
        if "r" in mode:
            return open_regular(path, mode)
        return open(path, mode)
    if "r" in mode and not exists(path):
        raise FileNotFoundError(errno.ENOENT, "no such object", path)
    return _GFileWithOSErrors(path, mode)


class _GFileWithOSErrors:
    """``tf.io.gfile.GFile`` whose reads and writes raise Python's errors."""

    def __init__(self, path: str, mode: str):
        self._path = path
        with os_errors(path):
            self._file = gfile(path).GFile(path, mode)

    def read(self, *args):
        with os_errors(self._path):
            return self._file.read(*args)

    def seek(self, offset: int) -> None:
        with os_errors(self._path):
            self._file.seek(offset)

    def write(self, data):
        with os_errors(self._path):
            return self._file.write(data)

    def close(self):
        with os_errors(self._path):
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` in one go (not atomic: see ``write_bytes_atomic``)."""
    if scheme(path) == "ram":
        remove(path)  # TensorFlow's ram:// opens an existing file for "wb" without emptying it
    with open_file(path, "wb") as f:
        f.write(data)


def read_bytes(path: str) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


def read_json(path: str):
    """The JSON document at ``path``. Raises ``OSError`` if it cannot be read, and
    ``ValueError`` if it is no JSON: not UTF-8, malformed, or nested too deep for the parser
    (whose ``RecursionError`` becomes a ``ValueError`` here, so readers need not know it)."""
    data = read_bytes(path)
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep to read") from None


def read_text(path: str) -> str:
    return read_bytes(path).decode()


def rename(source: str, target: str) -> None:
    """Renames a file or a folder (on object storage: copies, then deletes)."""
    if not is_url(target):
        os.rename(source, target)
        return
    with os_errors(target):
        gfile(target).rename(source, target, overwrite=False)


def upload_tree(local_dir: str, target: str, last: Optional[str] = None) -> None:
    """Copies a local folder's files to ``target`` (a URL), the file named ``last`` (relative
    to the folder) after every other one: its presence says the rest is there."""
    files = sorted(os.path.relpath(os.path.join(root, name), local_dir)
                   for root, _, names in os.walk(local_dir) for name in names)
    files.sort(key=lambda name: name == last)  # stable: ``last`` moves to the end
    for name in files:
        destination = join(target, *name.split(os.sep))
        makedirs(parent(destination))
        with os_errors(destination):
            gfile(target).copy(os.path.join(local_dir, name), destination, overwrite=True)
