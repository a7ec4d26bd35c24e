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

No TensorFlow is imported for a local path: the generator's set-up runs before it loads.

One module per concern, each importing only those before it (and ``errors``):

- ``local``: a local file is read only if it is a regular file (``open_regular``).
- ``locations``: local paths and URLs, joined and split alike; the file system behind a URL
  (``gfile``, ``TFIO_PAIR``) and its errors as Python's (``os_errors``, ``reason``).
- ``files``: the file operations (exists, listdir, glob, read, write, rename, remove, rmtree,
  ``upload_tree``).
- ``atomic``: atomic writes (``atomic_path``, ``write_bytes_atomic``, ``atomic_dir``) and the
  modes they give (``FILE_MODE``, ``DIR_MODE``).
- ``access``: whether a path can be used (``check_reachable``, ``check_writable``), how to
  fix it (``fix_for``), and whether a write found no room (``no_room``).

Callers use the package (``storage.join(...)``): every public name is re-exported here.
"""

from cifar10_estimator.storage.access import (  # noqa: F401
    NO_ROOM_FIX, check_reachable, check_writable, fix_for, no_room, write_failure)
from cifar10_estimator.storage.atomic import (  # noqa: F401
    DIR_MODE, FILE_MODE, atomic_dir, atomic_path, write_bytes_atomic)
from cifar10_estimator.storage.files import (  # noqa: F401
    exists, glob, isdir, isfile, listdir, makedirs, mtime, open_file, read_bytes, read_json,
    read_text, remove, rename, rmtree, size, upload_tree, write_bytes)
from cifar10_estimator.storage.regular_files import open_regular  # noqa: F401
from cifar10_estimator.storage.locations import (  # noqa: F401
    TFIO_PAIR, basename, gfile, is_url, join, os_errors, parent, reason, scheme)
