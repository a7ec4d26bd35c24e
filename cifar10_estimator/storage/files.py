"""Where the package reads and writes: local folders, and object storage through tf.io.gfile.

Every path under ``--job-dir``, ``--data-dir``, ``--output-dir`` and an export goes through
here. A local path keeps the local file system's guarantees: a write is a temporary file in
the same folder, fsynced, then ``os.replace``, which POSIX makes atomic. A URL (``s3://``,
``gs://``, ``hdfs://``, TensorFlow's in-memory ``ram://``) goes through ``tf.io.gfile``:

- ``gs://`` and ``ram://`` are TensorFlow's own. ``s3://`` (and ``hdfs://``) come with the
  ``tensorflow-io`` package (``pip install '.[s3]'``), loaded here on first use of such a path.
- Object stores have no rename: ``tf.io.gfile.rename`` copies, then deletes. A write is still
  "temporary object, then rename", so a reader never sees a half-written object under the final
  name, but the rename is not atomic: a crash in it can leave both names, and a folder's rename
  copies object by object. Where that matters (the export), readers check for the folder's last
  file (``saved_model.pb`` is written last).

Errors on a URL come as Python's: ``FileNotFoundError`` for a missing object, ``OSError`` with
the store's own words for any other failure (an unknown bucket, refused credentials, a server
that does not answer), so callers handle local paths and URLs alike.

A local file is read only if it is a regular file (``open_regular``): a FIFO, a socket or a
device in its place raises ``OSError`` at once, where a plain ``open`` would wait forever for a
FIFO's writer or read ``/dev/zero`` without end.

No TensorFlow is imported for a local path: the generator's set-up runs before it loads.
"""

import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
import uuid
from typing import IO, Iterator, Optional

from cifar10_estimator import cli
from cifar10_estimator.errors import UserError

# Schemes that tensorflow-io registers with TensorFlow when it is imported.
_TFIO_SCHEMES = ("s3", "hdfs", "az", "http", "https")
# The one TensorFlow that tensorflow-io, which brings those schemes, has a working release for
# with this package (pyproject.toml's s3 extra; docs/versions.md): 0.36 is built for TF 2.15,
# and the last release, 0.37.1, for TF 2.16 only, with no Python 3.13 wheels.
TFIO_PAIR = "TensorFlow 2.15 on Python 3.11 (tensorflow-io 0.36)"


def scheme(path: str) -> Optional[str]:
    """``s3`` for ``s3://bucket/key``; None for a local path."""
    head, sep, _ = str(path).partition("://")
    return head.lower() if sep else None


def is_url(path: str) -> bool:
    return scheme(path) is not None


def join(path: str, *names: str) -> str:
    """``os.path.join`` for local paths and URLs alike (URLs always use ``/``)."""
    if not is_url(path):
        return os.path.join(path, *names)
    return "/".join([str(path).rstrip("/"), *names])


def parent(path: str) -> str:
    if not is_url(path):
        return os.path.dirname(os.path.abspath(path))
    return str(path).rstrip("/").rpartition("/")[0]


def basename(path: str) -> str:
    return str(path).rstrip("/").rpartition("/")[2] if is_url(path) else os.path.basename(path)


def gfile(path: str):
    """``tf.io.gfile``, with the file system of ``path`` registered (tensorflow-io's)."""
    import tensorflow as tf

    if scheme(path) in _TFIO_SCHEMES:
        try:
            import tensorflow_io  # noqa: F401  (registers s3://, hdfs://, ...)
        except ImportError:
            raise UserError(f"{path}: {scheme(path)}:// paths need tensorflow-io, which works "
                            f"with {TFIO_PAIR}; this is TensorFlow {tf.__version__} on Python "
                            f"{sys.version_info.major}.{sys.version_info.minor}: install that "
                            f"pair with pip install '.[s3]' on Python 3.11 (docs/storage.md)"
                            ) from None
    return tf.io.gfile


@contextlib.contextmanager
def os_errors(path: str) -> Iterator[None]:
    """TensorFlow's file errors inside the block raised as Python's (see the module's doc)."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.NotFoundError as e:
        raise FileNotFoundError(errno.ENOENT, reason(e), path) from None
    except tf.errors.OpError as e:
        raise OSError(errno.EIO, reason(e), path) from None


def reason(error: BaseException) -> str:
    """An error's own words, for a one-line message: an ``OSError``'s ``strerror``, a
    TensorFlow error's first line (tensorflow-io's S3 messages start with the empty name of the
    call that failed: ``": curlCode: 7, ..."``)."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = (getattr(error, "message", "") or str(error)).strip().lstrip(": ")
    return text.splitlines()[0] if text else type(error).__name__


def fix_for(path: str, flag: str) -> str:
    """How to fix a path that cannot be used, for the end of a one-line error."""
    if not is_url(path):
        return f"choose another {flag}"
    if scheme(path) == "s3":
        return (f"check that the bucket exists and that S3_ENDPOINT, AWS_REGION and the "
                f"AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY credentials reach it "
                f"(docs/storage.md), or choose another {flag}")
    return f"check that the bucket exists and its credentials (docs/storage.md), or choose " \
           f"another {flag}"


def check_reachable(path: str, flag: str) -> None:
    """UserError (one line) unless ``path`` is local or its store answers: a scheme TensorFlow
    has no file system for, tensorflow-io missing for ``s3://``, an unknown bucket, refused
    credentials, a server that does not answer."""
    if not is_url(path):
        return
    import tensorflow as tf

    try:
        gfile(path).exists(path)
        bucket = _bucket(path)
        # A bucket that is missing (or that these credentials cannot see) reads as an empty
        # folder until the first write fails: ask for its root.
        missing = bucket is not None and not gfile(path).exists(bucket)
    except tf.errors.UnimplementedError:
        raise UserError(f"{flag} {path}: TensorFlow has no file system for {scheme(path)}://; "
                        f"use a local path, s3://, gs://, hdfs:// or ram://") from None
    except tf.errors.OpError as e:
        raise UserError(f"{flag} {path} cannot be reached ({reason(e)}); "
                        f"{fix_for(path, flag)}") from None
    if missing:
        raise UserError(f"{flag} {path}: the bucket {bucket} does not exist or these "
                        f"credentials cannot see it; {fix_for(path, flag)}")


def _bucket(path: str) -> Optional[str]:
    """``s3://bucket/`` for an object store's path (s3, gs), else None."""
    if scheme(path) not in ("s3", "gs"):
        return None
    name = str(path).partition("://")[2].partition("/")[0]
    return f"{scheme(path)}://{name}/"


def write_failure(folder: str) -> Optional[str]:
    """Creates ``folder`` if needed and writes (then deletes) a small file in it: why that
    failed, or None. On object storage a write is the one call that reports a missing bucket,
    refused credentials or a server gone, and at once: tensorflow-io's reads and ``makedirs``
    answer "not there" for all three, reads only after about 50 s of retries."""
    try:
        makedirs(folder)
        probe = join(folder, f".write-test-{os.getpid()}")
        write_bytes(probe, b"probe")  # an object store uploads nothing for an empty write
        remove(probe)
    except OSError as e:
        return reason(e)
    return None


def check_writable(folder: str, flag: str) -> None:
    """UserError (one line, naming ``flag``) unless ``folder`` takes a write
    (``write_failure``)."""
    failure = write_failure(folder)
    if failure is not None:
        raise UserError(f"{flag} {folder} is not a writable folder ({failure}); "
                        f"{fix_for(folder, flag)}")


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


# Opens a local file for reading unless it is a pipe, socket or device, which raise OSError at
# once instead of blocking (see its doc). Every read of a local file in the package goes through
# it: open_file's, the batches', the archive's, pictures' and flag files'. Written in cli, which
# reads flag files and cannot import this module (this module imports errors, which imports cli).
open_regular = cli.open_regular


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
