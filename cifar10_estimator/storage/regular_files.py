"""Local files the package reads: a regular file only (``open_regular``).

A FIFO, a socket or a device in a file's place raises ``OSError`` at once, where a plain
``open`` would wait forever for a FIFO's writer or read ``/dev/zero`` without end. Every read of
a local file in the package goes through ``open_regular``: ``open_file``'s, the batches', the
archive's, pictures' and flag files' (``cli``'s ``@FILE``).

Nothing of the package is imported here: a primitive under every read of a local file.
"""

import errno
import os
import stat
from typing import IO


def open_regular(path: str, mode: str = "rb", **kwargs) -> IO:
    """Opens local ``path`` for reading, as ``open(path, mode)`` does, unless it is a pipe
    (FIFO), a socket or a device: those raise ``OSError`` ("not a regular file but a FIFO")
    at once, where ``open`` would wait forever for a FIFO's writer or read a device without
    end (``/dev/zero``). A folder raises ``IsADirectoryError``, as ``open`` does.

    This is ``storage.open_regular``, the package's one way to open a local file it reads.

    The ``stat`` first keeps devices from being opened at all (opening some acts: a tape
    rewinds, a modem line hangs up). It cannot stand alone: the name can be swapped for a
    FIFO between the ``stat`` and the ``open``. So the file is opened with ``O_NONBLOCK``,
    under which opening a FIFO returns at once (POSIX open(2)), and what was really opened is
    checked with ``fstat``; only a regular file is handed back, blocking as usual.
    """
    if mode not in ("r", "rb", "rt"):
        raise ValueError(f"open_regular reads; mode {mode!r} is not a read mode")
    _refuse_unless_regular(os.stat(path).st_mode, path)  # missing, ...: as open() raises
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _refuse_unless_regular(os.fstat(fd).st_mode, path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


_SPECIAL_FILES = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                  (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


def _refuse_unless_regular(mode: int, path: str) -> None:
    """Raises ``OSError`` unless ``mode`` (``st_mode``) is a regular file's."""
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
    kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "special file")
    raise OSError(errno.EINVAL, f"not a regular file but a {kind}", path)
