"""Warm starts for the tests: ``python -m cifar10_estimator`` (and ``.predict``, ``.evaluate``)
forked from a process that has already loaded TensorFlow, instead of started from nothing.

Loading TensorFlow (with Estimator, Keras and the command's modules) costs a process 3 to 4
CPU-seconds on the 2 cores of the machines the suite runs on, about half of what one of the
tests' tiny runs costs in all, and the suite starts well over a hundred such processes
(docs/performance.md, "The test suite"). A warm start pays that once per test process and set
of commands that load TensorFlow alike (``predict`` and ``evaluate`` share a server).

What a warm-started command is: a real process of its own (its pid, its exit status, real
signals, killed as any process is), forked from a server here, which set itself up as the
command's ``main`` does before TensorFlow loads (``prepare_process`` with the command's
``CPP_LOG_LEVEL``, then ``logs.import_tensorflow_quietly``) and loaded the command's modules (and,
for the trainer, drawn one confusion image, so that matplotlib's fonts are loaded).
The child then becomes the command: its environment, current folder, standard streams
(unbuffered, as with ``PYTHONUNBUFFERED``), ``sys.argv`` and ``sys.path[0]`` as ``python -m``
gives them, default signal handlers, a fresh NumPy seed, and ``runpy`` runs the module as
``__main__``; it ends as the command ends its process (``errors.end_process``), or, where the
command lets the interpreter end (argparse's exits), as the interpreter ends (non-daemon threads
joined, ``atexit`` handlers run). Two things show the fork: its parent is the server, and ``/proc/PID/environ`` (the
environment a process was started with) is the server's; ``os.environ`` and the C library's are
the command's.

What it cannot be, and so is never used for: a process whose TensorFlow would load with other
settings (any ``TF_``, oneDNN, OpenMP, CUDA or ``PYTHON`` variable other than the server's
after ``prepare_process``, ``TF_CONFIG`` aside, which TensorFlow reads later), a trainer that
shows TensorFlow's load-time log (``--verbose``) or whose command line its flag parser refuses
(or ``--help``), any other command. ``Trainer`` and ``run_module`` start those cold; so do the
tests of what happens while TensorFlow loads (tests/test_logs.py), the console scripts
(tests/test_entry_points.py) and every process the package itself starts (the cluster
launcher's tasks, Ray's). ``CIFAR10_TESTS_COLD=1`` in the suite's environment starts every
process cold, as a check that no test depends on the difference.
"""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time

TRAINER = "cifar10_estimator"
# The commands that start warm, each with the modules its server loads ahead (what the command
# loads once its flags are read: the later a module loads, the more of a run it costs).
COMMANDS = {
    TRAINER: ("cifar10_estimator.train", "cifar10_estimator.training.driver",
              "cifar10_estimator.training.summary", "matplotlib.figure",
              "matplotlib.backends.backend_agg"),  # (the evaluations' confusion images)
    "cifar10_estimator.predict": ("cifar10_estimator.serving.client",),
    "cifar10_estimator.evaluate": ("cifar10_estimator.evaluation.offline",
                                   "cifar10_estimator.evaluation.report"),
}
# Environment variables read when TensorFlow or the interpreter loads (TF_CONFIG is read
# later, by the package and Estimator): a process that differs in one of them starts cold.
_LOAD_TIME_PREFIXES = ("TF_", "ONEDNN_", "DNNL_", "MKL", "KMP_", "OMP_", "CUDA", "XLA_",
                       "PYTHON")
_RUN_TIME = {"TF_CONFIG", "PYTHONUNBUFFERED"}
# The servers' environment: the suite's as it starts, before any test changes its own.
_SERVER_ENV = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
               "PYTHONUNBUFFERED": "1"}


def _load_time(env) -> dict:
    return {k: v for k, v in env.items()
            if k.startswith(_LOAD_TIME_PREFIXES) and k not in _RUN_TIME}


def _cpp_log_level(module: str):
    """The C++ log level ``module``'s command loads TensorFlow with (its ``CPP_LOG_LEVEL``),
    or None for ``prepare_process``'s default."""
    import importlib

    command = importlib.import_module("cifar10_estimator.train" if module == TRAINER else module)
    return getattr(command, "CPP_LOG_LEVEL", None)


def _prepare(module: str, env) -> None:
    """What ``module``'s command sets in ``env`` before TensorFlow loads (``prepare_process``,
    with the command's ``CPP_LOG_LEVEL`` where it has its own)."""
    from cifar10_estimator.platform.process import prepare_process

    level = _cpp_log_level(module)
    prepare_process(env, **({"cpp_log_level": level} if level else {}))


def _served_with(module: str) -> tuple:
    """The commands one server forks ``module`` with: those that prepare their process alike
    (``_prepare``), so that TensorFlow loads in each as in the command started cold."""
    return tuple(m for m in COMMANDS if _cpp_log_level(m) == _cpp_log_level(module))


# --- the server ---------------------------------------------------------------------------------

def _serve(modules: list) -> None:
    """Loads what the commands ``modules`` load (they prepare their process alike), then forks
    one per request line on stdin (JSON: id, module, argv, env, cwd, stdout, stderr, append)
    and answers on stdout: {"id", "pid"} once started, {"pid", "status"}
    (``Popen.returncode``'s convention) once ended. Ends when stdin does."""
    import importlib

    from cifar10_estimator import logs

    _prepare(modules[0], os.environ)
    logs.import_tensorflow_quietly()
    import tensorflow as tf

    tf.estimator.Estimator  # noqa: B018  (Estimator loads lazily)
    for name in (n for module in modules for n in COMMANDS[module]):
        importlib.import_module(name)
    if TRAINER in modules:
        _render_a_confusion_image()

    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _answer(answers, {"ready": _load_time(os.environ)})
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    buffered = b""
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                _reap(answers)
                continue
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                return
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    _become(request["module"], request, wake_r, wake_w)  # never returns
                _answer(answers, {"id": request["id"], "pid": pid})
        _reap(answers)


def _render_a_confusion_image() -> None:
    """Draws one confusion image as a trainer's evaluations do (``model.confusion_image``), in
    Python only (no TensorFlow runtime starts before a fork): matplotlib loads its fonts and
    fills its caches once here, not in each fork's first evaluation (docs/performance.md, "The
    test suite")."""
    import numpy as np

    from cifar10_estimator.data import schema
    from cifar10_estimator.model import confusion_image

    confusion_image.render_png(np.eye(len(schema.CLASS_NAMES)), schema.CLASS_NAMES)


def _answer(stream, message: dict) -> None:
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


def _reap(answers) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _answer(answers, {"pid": pid, "status": os.waitstatus_to_exitcode(status)})


def _become(module: str, request: dict, *server_fds: int) -> None:
    """In the forked child: becomes ``python -m MODULE ARGV`` and ends with its status."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT
                          else signal.SIG_DFL)
        for fd in server_fds:
            os.close(fd)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT
                      | (os.O_APPEND if request["append"] else os.O_TRUNC), 0o644)
        err = out if request["stderr"] is None else os.open(
            request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        for fd in {null, out, err}:
            os.close(fd)
        sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
        for name, fd in (("stdout", 1), ("stderr", 2)):
            stream = io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False),
                                      write_through=True,
                                      errors="backslashreplace" if fd == 2 else "strict")
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import numpy as np

        np.random.seed()  # a fresh process's NumPy draws differ from its siblings'
        import importlib.util
        import runpy

        spec = importlib.util.find_spec(module)
        if spec.submodule_search_locations is None:
            # The server read the command's settings from it; ``-m`` runs it afresh, never
            # imported under its own name.
            sys.modules.pop(module, None)
        sys.argv = [spec.origin if spec.submodule_search_locations is None else os.path.join(
            os.path.dirname(spec.origin), "__main__.py"), *request["argv"]]
        sys.path[0] = os.getcwd()
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        threading._shutdown()  # as the interpreter's end: non-daemon threads first
        import atexit

        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


# --- the tests' side ------------------------------------------------------------------------------

class WarmProcess:
    """A warm-started trainer, with the part of ``subprocess.Popen`` the tests use: ``pid``,
    ``returncode``, ``poll``, ``wait``, ``send_signal``, ``kill``."""

    def __init__(self, server: "_Server", pid: int, args: list):
        self._server, self.pid, self.args = server, pid, args
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self._server.status(self.pid)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._server.wait_change(0.05 if deadline is None
                                     else max(0.0, min(0.05, deadline - time.monotonic())))
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Server:
    """This test process's fork server for ``modules`` (started on first use, ended with the
    process)."""

    def __init__(self, modules: tuple, cwd: str):
        self._log = open(os.path.join(cwd, f"warm-start-{modules[0]}-{os.getpid()}.log"), "w")
        self._process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *modules], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, cwd=cwd, env=_SERVER_ENV)
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._pids: dict[int, int] = {}  # request id -> pid
        self._statuses: dict[int, int] = {}
        self._next = 0
        ready = json.loads(self._process.stdout.readline() or b"null")
        assert ready, f"the warm-start server did not start: see {self._log.name}"
        self.load_time = ready["ready"]
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._process.stdout:
            message = json.loads(line)
            with self._changed:
                if "status" in message:
                    self._statuses[message["pid"]] = message["status"]
                else:
                    self._pids[message["id"]] = message["pid"]
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def alive(self) -> bool:
        return self._process.poll() is None

    def start(self, module: str, argv: list, env: dict, cwd, stdout, stderr=None, append=False
              ) -> WarmProcess:
        with self._lock:
            self._next += 1
            ident = self._next
            self._process.stdin.write(json.dumps({
                "id": ident, "module": module, "argv": [str(a) for a in argv], "env": env,
                "cwd": str(cwd), "stdout": str(stdout),
                "stderr": None if stderr is None else str(stderr), "append": append,
            }).encode() + b"\n")
            self._process.stdin.flush()
        with self._changed:
            assert self._changed.wait_for(lambda: ident in self._pids or not self.alive(), 60)
            return WarmProcess(self, self._pids.pop(ident), argv)

    def status(self, pid: int):
        with self._changed:
            return self._statuses.get(pid)

    def wait_change(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)


_SERVERS: dict = {}  # the commands a server forks (``_served_with``) -> the server
_SERVERS_LOCK = threading.Lock()  # tests start processes from several threads at once


def _server(module: str, cwd: str) -> "_Server":
    modules = _served_with(module)
    with _SERVERS_LOCK:
        if modules not in _SERVERS or not _SERVERS[modules].alive():
            _SERVERS[modules] = _Server(modules, cwd)
        return _SERVERS[modules]


def can_start_warm(module: str, argv: list, env: dict, cwd: str) -> bool:
    """Whether ``python -m module argv`` with ``env`` may be warm-started (the module's
    docstring says when not); ``cwd``: where its server runs, if one starts now."""
    if module not in COMMANDS or os.environ.get("CIFAR10_TESTS_COLD"):
        return False
    if module == TRAINER:
        from cifar10_estimator.config import flags

        try:
            with contextlib.redirect_stderr(io.StringIO()), \
                    contextlib.redirect_stdout(io.StringIO()):
                _, verbose = flags.parse([str(a) for a in argv], {})
        except BaseException:  # refused (argparse exits), --help, --version: started cold
            return False
        if verbose:
            return False
    prepared = dict(env)
    _prepare(module, prepared)
    return _load_time(prepared) == _server(module, cwd).load_time


def start(module: str, argv: list, env: dict, cwd, stdout, stderr=None, append: bool = False
          ) -> WarmProcess:
    """Warm-starts ``python -m module argv`` (check ``can_start_warm`` first) in ``cwd``: its
    stdout into the file ``stdout``, its stderr into ``stderr`` (None: the same file)."""
    return _server(module, str(cwd)).start(module, argv, env, cwd, stdout, stderr, append)


if __name__ == "__main__":
    _serve(sys.argv[1:])
