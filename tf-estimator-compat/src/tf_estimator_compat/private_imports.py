"""Which of a code base's imports of TensorFlow's private modules resolve on this TensorFlow.

Estimator code reaches into ``tensorflow.python`` and ``tensorflow.core`` (the estimator itself
does so some 150 times), and each TensorFlow release may move or remove one of those modules.
``private_imports`` lists them from the source, without running it (``ast``); ``unresolved``
imports each on this TensorFlow and names the ones that fail. The layer's own tests run it on
the estimator; run it on your code before moving it to a newer TensorFlow:

    python -m tf_estimator_compat.private_imports PATH...

It prints one line per import that does not resolve and exits 1 if there is one, else says how
many it checked and exits 0. The layer is installed first, as your program would have it.
"""

import argparse
import ast
import importlib
import os
import sys
from typing import Iterable, Optional, Sequence

# The private trees of TensorFlow's package (its public API is ``tensorflow`` and ``tf.*``).
PRIVATE = ("tensorflow.python", "tensorflow.core")


def _sources(root: str, skip_tests: bool) -> Iterable[str]:
    if os.path.isfile(root):
        yield root
        return
    for folder, _, files in os.walk(root):
        for file in sorted(files):
            if file.endswith(".py") and not (skip_tests and file.endswith("_test.py")):
                yield os.path.join(folder, file)


def private_imports(root: str, skip_tests: bool = False) -> set[tuple[str, str]]:
    """(module, name) of every ``from tensorflow.python... import name`` in the Python files
    under ``root`` (a folder or a file); (module, "") for ``import tensorflow.python...``.
    ``skip_tests``: leave out files named ``*_test.py``."""
    found = set()
    for path in _sources(root, skip_tests):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.startswith(PRIVATE):
                    found.update((node.module, alias.name) for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update((alias.name, "") for alias in node.names
                             if alias.name.startswith(tuple(p + "." for p in PRIVATE)))
    return found


def unresolved(imports: Iterable[tuple[str, str]]) -> list[str]:
    """One line for each of ``imports`` (``private_imports``'s pairs) that this process cannot
    import: the module and name, and the error."""
    missing = []
    for module, name in sorted(imports):
        try:
            loaded = importlib.import_module(module)
            if name and not hasattr(loaded, name):
                importlib.import_module(f"{module}.{name}")  # a submodule not yet loaded
        except ImportError as e:
            missing.append(f"{module}{' ' + name if name else ''}: {e}")
    return missing


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tf_estimator_compat.private_imports",
        description="List the imports of TensorFlow's private modules in PATHs that do not "
                    "resolve on this TensorFlow (with the layer installed).")
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a folder or a .py file")
    parser.add_argument("--skip-tests", action="store_true", help="leave out *_test.py files")
    args = parser.parse_args(argv)
    for path in args.paths:
        if not os.path.exists(path):
            parser.error(f"{path}: no such file or folder")
    import tf_estimator_compat

    # TensorFlow's C++ start-up lines (oneDNN, CUDA) say nothing about the imports.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf_estimator_compat.install()
    imports = set()
    for path in args.paths:
        try:
            imports |= private_imports(path, args.skip_tests)
        except (SyntaxError, UnicodeDecodeError) as e:
            parser.error(f"{path}: cannot be read as Python ({e})")
    missing = unresolved(imports)
    for line in missing:
        print(line)
    import tensorflow as tf

    print(f"{len(imports) - len(missing)} of {len(imports)} private TensorFlow imports resolve "
          f"on TensorFlow {tf.__version__}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
