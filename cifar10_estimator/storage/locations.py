"""Where a file lives: a local path or a URL (its scheme), paths joined and split alike for
both, and the ``tf.io.gfile`` file system behind a URL (``gfile``; tensorflow-io's schemes and
the one TensorFlow it works with, ``TFIO_PAIR``).

Errors on a URL come as Python's: ``FileNotFoundError`` for a missing object, ``OSError`` with
the store's own words for any other failure (an unknown bucket, refused credentials, a server
that does not answer), so callers handle local paths and URLs alike (``os_errors``, with
``reason`` for an error's own words).
"""

import contextlib
import errno
import os
import sys
from typing import Iterator, Optional

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
