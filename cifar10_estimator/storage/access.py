"""Whether a path can be used, checked before a run needs it: a URL's store answers
(``check_reachable``), a folder takes a write (``write_failure``, ``check_writable``); each
refusal is one line that ends with how to fix it (``fix_for``); whether a failed write found
no room (``no_room``).
"""

import errno
import os
from typing import Optional

from cifar10_estimator.errors import UserError
from cifar10_estimator.storage.files import makedirs, remove, write_bytes
from cifar10_estimator.storage.locations import gfile, is_url, join, reason, scheme


# Writes that found no room: a full disk, a quota, a file-size limit (RLIMIT_FSIZE).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
NO_ROOM_FIX = "free space (or raise the quota) and rerun the same command"


def no_room(message: str) -> Optional[str]:
    """The operating system's words for a write that found no room, if ``message`` has them
    (TensorFlow's errors carry them as text)."""
    for code in _NO_ROOM:
        if os.strerror(code) in message:
            return os.strerror(code)
    return None


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
        # A full disk is not the folder's fault: another folder would not help a job that
        # resumes from its checkpoints there (a chaos campaign's full job dir, issue 76).
        fix = NO_ROOM_FIX if no_room(failure) else fix_for(folder, flag)
        raise UserError(f"{flag} {folder} is not a writable folder ({failure}); {fix}")
