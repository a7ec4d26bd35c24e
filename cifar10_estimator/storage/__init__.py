"""Where the package reads and writes: local folders, and object storage through tf.io.gfile.

All of it is in ``files`` for now (formerly ``storage.py``). Callers use the package
(``storage.join(...)``): every public name is re-exported here.
"""

from cifar10_estimator.storage.files import (  # noqa: F401
    DIR_MODE, FILE_MODE, TFIO_PAIR, atomic_dir, atomic_path, basename, check_reachable,
    check_writable, exists, fix_for, gfile, glob, is_url, isdir, isfile, join, listdir, makedirs,
    mtime, open_file, open_regular, os_errors, parent, read_bytes, read_json, read_text, reason,
    remove, rename, rmtree, scheme, size, upload_tree, write_bytes, write_bytes_atomic,
    write_failure)
