"""Atomic file and directory writes: readers never see a half-written output.

Everything this package writes for a user (TFRecords, metadata, SavedModels, downloads) goes
through here: the data is written under a temporary name in the destination's own directory
(so the final ``os.replace`` is a same-filesystem rename, which POSIX makes atomic) and renamed
only once complete. On any error the temporary file is removed and no final-named file appears.
"""

import contextlib
import os
import shutil
import tempfile
from typing import Iterator


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


def _temp_name(final_path: str, suffix: str) -> str:
    directory, name = os.path.split(os.path.abspath(final_path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=suffix, dir=directory)
    os.close(fd)
    return tmp


@contextlib.contextmanager
def atomic_path(final_path: str) -> Iterator[str]:
    """Yields a temporary path beside ``final_path``; renames it there if the block succeeds.

    The caller writes the whole file to the yielded path by any means (``open``, a
    ``tf.io.TFRecordWriter``, ...). If the block raises, the temporary file is deleted and
    ``final_path`` is left as it was.
    """
    tmp = _temp_name(final_path, ".tmp")
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
    """Writes ``data`` to ``final_path`` atomically."""
    with atomic_path(final_path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


@contextlib.contextmanager
def atomic_dir(final_path: str) -> Iterator[str]:
    """Yields a fresh temporary directory beside ``final_path``; renames it there on success.

    ``final_path`` must not exist yet. On error the temporary directory is removed.
    """
    parent, name = os.path.split(os.path.abspath(final_path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    try:
        yield tmp
        os.chmod(tmp, DIR_MODE)
        os.rename(tmp, final_path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
