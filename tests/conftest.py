"""Shared pytest fixtures and the suite's own checks.

Every process the suite starts, and the suite itself, runs in a temporary work folder
(``work_folder``), never in the checkout; a run that leaves the checkout changed (``git status``
differs from the start: new, changed or deleted files, untracked ones included) fails, naming
the paths.

Data generator: ``make_cifar_dir`` writes tiny CIFAR-10 python batches (real pickle format),
``make_cifar_tarball`` packs them as the official archive is packed, ``http_server`` serves
bytes (or failures) from 127.0.0.1 on an ephemeral port.

Processes: ``endless_trainer`` starts a trainer that trains until the test stops it,
``cluster_tasks`` the tasks of a cluster started by hand (a TF_CONFIG each), ``launch`` the
cluster launcher; whatever they started and is still running when the test ends is stopped.
The helpers behind them are in ``trainer_fixtures`` and ``cluster_fixtures``.
"""


import hashlib
import http.server
import io
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from typing import Callable

import numpy as np
import pytest
import tf_estimator_compat

from cifar10_estimator.data import pickles, schema
from cifar10_estimator.platform import cpu

# The suite's own process runs TensorFlow as the command lines do: oneDNN on unless the user
# chose (cpu.prefer_onednn). Run with TF_ENABLE_ONEDNN_OPTS=0 to test the Eigen kernels that an
# AVX2-only CPU gets by default; tests that need oneDNN check cpu.onednn_enabled().
cpu.prefer_onednn(os.environ)
# And with tf.estimator's compatibility layer, which the command lines' set-up installs
# (platform.process.prepare_process; the rest of that set-up would reach the processes the
# tests start, which run their own). Before anything below imports the estimator.
tf_estimator_compat.install()
# Two logical CPU devices in the suite's own TensorFlow runtime, set before it starts: the
# tests that run a mirrored strategy in this process place their replicas there.
from cifar10_estimator.model import towers  # noqa: E402

towers.ensure_logical_cpus(2)

import cluster_fixtures
import trainer_fixtures
from trainer_fixtures import REPO, tiny_export, tiny_records  # noqa: F401  (fixtures)


# --- the checkout stays clean ---------------------------------------------------------------------

_STATUS_AT_START = pytest.StashKey[list | None]()
_CHECKOUT_CHANGES = pytest.StashKey[list]()
_SUITE_STATUS = pytest.StashKey[int]()


def _git_status() -> list[str] | None:
    """``git status --porcelain`` of the checkout, untracked files listed one by one; None
    where there is no git or no repository to ask."""
    if not shutil.which("git") or not os.path.exists(os.path.join(REPO, ".git")):
        return None
    try:
        proc = subprocess.run(["git", "-C", REPO, "status", "--porcelain",
                               "--untracked-files=all"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.splitlines() if proc.returncode == 0 else None


def pytest_sessionstart(session) -> None:
    session.config.stash[_STATUS_AT_START] = _git_status()


def _changes(before: list[str], after: list[str]) -> list[str]:
    """What a test run did to the checkout, from ``git status --porcelain`` lines (``XY
    path``) before and after: paths that are new in the status (a file written, changed or
    deleted), files deleted meanwhile, and untracked files that are gone. Statuses that only
    moved between index and work tree (someone's ``git add`` or commit meanwhile) are not the
    suite's doing."""
    was = {line[3:]: line[:2] for line in before}
    now = {line[3:]: line[:2] for line in after}
    changes = [f"  new or changed: {status} {path}" for path, status in sorted(now.items())
               if path not in was]
    changes += [f"  deleted: {status} {path}" for path, status in sorted(now.items())
                if path in was and "D" in status and "D" not in was[path]]
    changes += [f"  deleted: {status} {path}" for path, status in sorted(was.items())
                if status == "??" and path not in now
                and not os.path.lexists(os.path.join(REPO, path))]
    return changes


def pytest_sessionfinish(session, exitstatus) -> None:
    session.config.stash[_SUITE_STATUS] = int(exitstatus)
    before = session.config.stash.get(_STATUS_AT_START, None)
    after = _git_status() if before is not None else None
    changes = _changes(before, after) if after is not None else []
    if not changes:
        return
    session.config.stash[_CHECKOUT_CHANGES] = [
        f"the test run changed the checkout {REPO} (git status --porcelain):", *changes]
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        session.config.stash[_SUITE_STATUS] = int(pytest.ExitCode.TESTS_FAILED)


def pytest_terminal_summary(terminalreporter) -> None:
    lines = terminalreporter.config.stash.get(_CHECKOUT_CHANGES, None)
    if lines:
        terminalreporter.section("the checkout changed", sep="=", red=True, bold=True)
        for line in lines:
            terminalreporter.write_line(line, red=True)


# --- the order the tests run in ------------------------------------------------------------------

# About how long each module takes, in seconds of one test process's time (the per-test times
# of a whole run with ``-n 2`` on the 2-core Xeon with AMX, summed by module), for the order
# below; a module not listed is estimated from its tests' markers (``_MARKED_SECS``). Only the
# order depends on these figures, never a result.
MODULE_SECS = {
    "test_cluster_lifecycle": 240, "test_object_storage": 164, "test_allreduce": 137,
    "test_ray": 128, "test_faults": 119, "test_distributed": 117, "test_preemption": 113,
    "test_sweep": 60, "test_train": 51, "test_export_trust": 45, "test_serving": 39,
    "test_progress": 39,
    "test_rerun": 35, "test_levers": 34, "test_batch_norm": 34, "test_job_lock": 33,
    "test_demo": 32, "test_logs": 30, "test_engines": 30, "test_precision": 30, "test_fuzz": 30,
    "test_hostile_files": 21, "test_resnet": 19, "test_job_dir": 18, "test_library_entry": 17,
    "test_own_data": 16, "test_best_export": 14, "test_cpu": 12, "test_tutorial_cnn": 11,
    "test_entry_points": 9, "test_generate": 6, "test_confusion_image": 5, "test_model_fn": 5,
}
_MARKED_SECS = {"cluster": 60.0, "slow": 10.0}
_UNMARKED_SECS = 0.1


def _item_secs(item) -> float:
    for marker, secs in _MARKED_SECS.items():
        if item.get_closest_marker(marker) is not None:
            return secs
    return _UNMARKED_SECS


def _worksteal_shares(count: int, workers: int) -> list[int]:
    """How many of ``count`` tests pytest-xdist's worksteal scheduler first hands to each of
    ``workers`` test processes, in order: consecutive runs of the list, each the remaining
    tests divided by the processes still to serve."""
    shares = []
    for left in range(workers, 0, -1):
        shares.append((count - sum(shares)) // left)
    return shares


def pytest_collection_modifyitems(session, config, items) -> None:
    """Orders the tests for the test processes (``-n N --dist worksteal``, which hands each
    process a consecutive run of this list and lets a process that runs out take the end of
    another's queue): the modules, each kept whole and in its own order (a module's fixtures
    are set up once), are dealt out longest first to the process with the least time so far;
    each process runs its longest modules first and its short tests last, where another
    process can take them over. The longest modules then never start late and end the run on
    one core. Tests beyond a process's share go, shortest last, to the processes short of
    theirs."""
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    if len(items) < 2 or workers < 2:
        return
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def secs(path: str) -> float:
        name = os.path.splitext(os.path.basename(path))[0]
        return MODULE_SECS.get(name) or sum(map(_item_secs, modules[path]))

    groups: list[list] = [[] for _ in range(workers)]
    totals = [0.0] * workers
    for path in sorted(modules, key=lambda p: (-secs(p), p)):  # longest first, to the emptiest
        side = totals.index(min(totals))
        groups[side].extend(modules[path])
        totals[side] += secs(path)
    shares = _worksteal_shares(len(items), workers)
    spare = [item for group, share in zip(groups, shares) for item in group[share:]]
    runs = [group[:share] for group, share in zip(groups, shares)]
    for run, share in zip(runs, shares):
        taken, spare = spare[:share - len(run)], spare[share - len(run):]
        run.extend(taken)
    items[:] = [item for run in runs for item in run]


@pytest.fixture(scope="session", autouse=True)
def work_folder(tmp_path_factory):
    """The session's temporary work folder: the current folder of the suite and of every
    process it starts (``trainer_fixtures.work_dir()``), so nothing runs in the checkout."""
    folder = str(tmp_path_factory.mktemp("work"))
    before = os.getcwd()
    trainer_fixtures.set_work_dir(folder)
    os.chdir(folder)
    yield folder
    os.chdir(before)
    trainer_fixtures.set_work_dir(None)


@pytest.fixture(scope="session", autouse=True)
def precision_cache_home(tmp_path_factory):
    """The suite's own user cache folder (XDG_CACHE_HOME), for this process and the commands it
    starts: the precision probes' cache is shared by the suite's runs and never touches the
    user's ~/.cache."""
    folder = str(tmp_path_factory.mktemp("xdg-cache"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", folder)
        yield folder


@pytest.fixture(scope="session", autouse=True)
def temp_folder(tmp_path_factory):
    """The suite's TMPDIR, for this process and the commands it starts: the temporary files
    TensorFlow leaves behind (AutoGraph's generated modules) land in pytest's own folder,
    which pytest prunes, not in the machine's /tmp. (tensorflow-io's S3 client writes to /tmp
    whatever TMPDIR says.)"""
    import tempfile

    folder = str(tmp_path_factory.mktemp("tmp"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", folder)
        patch.setattr(tempfile, "tempdir", folder)
        yield folder


@pytest.fixture(scope="session")
def suite_environ(work_folder, precision_cache_home, temp_folder) -> dict:
    """The suite's environment, once the session's own variables are set."""
    return dict(os.environ)


@pytest.fixture(autouse=True)
def environ_as_the_suite_has_it(suite_environ):
    """Each test ends with the suite's environment back: a command's ``main`` run in this
    process (the generator's, predict's) sets TensorFlow's variables for its process, as
    a command may, and the next test's processes would inherit them."""
    yield
    if os.environ != suite_environ:
        os.environ.clear()
        os.environ.update(suite_environ)


# --- trainers and clusters the tests start -------------------------------------------------------

@pytest.fixture
def endless_trainer(tmp_path):
    """Factory: ``endless_trainer(data_dir, job_dir, *extra, log="log", until=TRAINING,
    timeout=120, env_extra=None)`` starts ``python -m cifar10_estimator`` training until it is
    stopped (``trainer_fixtures.ENDLESS``: --train-steps 100000, a progress line every second;
    ``extra`` flags come after, and win) with its output in ``tmp_path / log``, and returns the
    ``Trainer`` once ``until`` is in its output (by default a progress line: it is training).
    Every trainer still running when the test ends is killed."""
    started = []

    def start(data_dir, job_dir, *extra: str, log: str = "log",
              until: str = trainer_fixtures.TRAINING, timeout: float = 120,
              env_extra: dict | None = None) -> trainer_fixtures.Trainer:
        trainer = trainer_fixtures.Trainer(
            trainer_fixtures.trainer_args(data_dir, job_dir, *trainer_fixtures.ENDLESS, *extra),
            tmp_path / log, env_extra=env_extra)
        started.append(trainer)
        trainer.wait_for(until, timeout)
        return trainer

    yield start
    for trainer in started:
        trainer.stop()


@pytest.fixture
def cluster_tasks(tmp_path):
    """The tasks of a cluster started by hand (``cluster_fixtures.Tasks``): ``add(name,
    tf_config, args)`` one, ``start()`` them all; each runs in ``tmp_path`` with its log
    ``tmp_path/NAME.log``. Every task still running when the test ends is killed."""
    tasks = cluster_fixtures.Tasks(tmp_path)
    yield tasks
    tasks.stop()


@pytest.fixture
def launch():
    """Factory: ``launch(args, log, env_extra=None)`` starts the launcher (``python -m
    cifar10_estimator.cluster ARGS``) in the background and returns its
    ``cluster_fixtures.Launcher``. Every launcher still running when the test ends is stopped,
    with every task it started."""
    started = []

    def start(args: list[str], log, env_extra: dict | None = None) -> cluster_fixtures.Launcher:
        launcher = cluster_fixtures.Launcher(args, log, env_extra)
        started.append(launcher)
        return launcher

    yield start
    for launcher in started:
        launcher.stop()


BATCH_NAMES = schema.BATCH_FILES
# Member order of the official cifar-10-python.tar.gz.
ARCHIVE_ORDER = ("data_batch_4", "readme.html", "test_batch", "data_batch_3", "batches.meta",
                 "data_batch_2", "data_batch_5", "data_batch_1")


def batch_dict(data: np.ndarray, labels: list[int], title: str = "training batch 1 of 5") -> dict:
    """A batch with the real files' keys, in their order."""
    return {"batch_label": title, "labels": labels, "data": data,
            "filenames": [f"img_s_{i:06d}.png" for i in range(len(labels))]}


def write_cifar_dir(data_dir: str, images_per_batch: int = 24, seed: int = 0,
                    overrides: dict[str, bytes] | None = None) -> dict[str, tuple]:
    """Writes ``data_dir/cifar-10-batches-py`` with random images; returns name -> (data, labels).

    ``overrides`` maps a file name to raw bytes written instead of the generated batch.
    """
    root = os.path.join(data_dir, schema.BATCHES_DIRNAME)
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    contents = {}
    for index, name in enumerate(BATCH_NAMES):
        data = rng.integers(0, 256, (images_per_batch, schema.IMAGE_BYTES), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, images_per_batch)]
        contents[name] = (data, labels)
        title = ("testing batch 1 of 1" if name == "test_batch"
                 else f"training batch {index + 1} of 5")
        body = pickles.dumps_py2(batch_dict(data, labels, title))
        with open(os.path.join(root, name), "wb") as f:
            f.write((overrides or {}).get(name, body))
    meta = {"num_cases_per_batch": images_per_batch, "label_names": list(schema.CLASS_NAMES),
            "num_vis": schema.IMAGE_BYTES}
    with open(os.path.join(root, "batches.meta"), "wb") as f:
        f.write(pickles.dumps_py2(meta))
    with open(os.path.join(root, "readme.html"), "w") as f:
        f.write("<html>test copy</html>\n")
    return contents


def tarball_from_dir(batches_dir: str,
                     extra: Callable[[tarfile.TarFile], None] | None = None) -> bytes:
    """Packs ``batches_dir`` as ``cifar-10-python.tar.gz`` is packed; ``extra`` adds members."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        folder = tarfile.TarInfo(schema.BATCHES_DIRNAME + "/")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for name in ARCHIVE_ORDER:
            path = os.path.join(batches_dir, name)
            if os.path.exists(path):
                tar.add(path, arcname=f"{schema.BATCHES_DIRNAME}/{name}")
        if extra is not None:
            extra(tar)
    return buffer.getvalue()


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def make_cifar_dir():
    """Factory: ``make_cifar_dir(data_dir, images_per_batch=24, seed=0, overrides=None)``."""
    return write_cifar_dir


@pytest.fixture
def make_cifar_tarball(tmp_path_factory):
    """Factory: a CIFAR-format tar.gz (bytes) of fresh tiny batches; ``extra`` adds members."""

    def make(images_per_batch: int = 24, seed: int = 0,
             extra: Callable[[tarfile.TarFile], None] | None = None,
             skip: tuple[str, ...] = ()) -> tuple[bytes, dict]:
        staging = tmp_path_factory.mktemp("staging")  # outside the test's own tmp_path
        contents = write_cifar_dir(str(staging), images_per_batch, seed)
        for name in skip:
            os.remove(staging / schema.BATCHES_DIRNAME / name)
        return tarball_from_dir(str(staging / schema.BATCHES_DIRNAME), extra), contents

    return make


class _Server:
    """Routes: path -> bytes, or ("status", code), or ("drop", body, n_bytes_sent)."""

    def __init__(self) -> None:
        self.routes: dict[str, object] = {}
        routes = self.routes

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                route = routes.get(self.path)
                if route is None or (isinstance(route, tuple) and route[0] == "status"):
                    self.send_error(404 if route is None else route[1])
                    return
                body, sent = (route, len(route)) if isinstance(route, bytes) else route[1:]
                self.send_response(200)
                self.send_header("Content-Type", "application/gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:sent])
                self.wfile.flush()
                if sent < len(body):
                    self.close_connection = True

            def log_message(self, *args) -> None:  # keep test output clean
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture
def http_server():
    """A real HTTP server on 127.0.0.1 (ephemeral port) in a thread; set ``.routes``."""
    server = _Server()
    yield server
    server.close()


@pytest.fixture
def closed_port_url():
    """A URL on 127.0.0.1 where nothing listens: what 'offline' looks like."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/cifar-10-python.tar.gz"


def run_generator_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs ``python REPO/tools/generate_tfrecords.py ARGS`` in the session's work folder."""
    return subprocess.run([sys.executable, os.path.join(REPO, "tools", "generate_tfrecords.py"),
                           *args], cwd=trainer_fixtures.work_dir(), capture_output=True,
                          text=True, timeout=timeout)


def listing(path) -> list[str]:
    """Every file and folder below ``path`` (relative), sorted; [] if it does not exist."""
    out = []
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            out.append(os.path.relpath(os.path.join(root, name), path))
    return sorted(out)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    """A suite process that loaded tensorflow-io (the tests keep s3:// in subprocesses, so
    none should) would abort in its teardown with status 134 (tensorflow/io issue 1912) and
    hide the suite's result: it ends with that result first."""
    if "tensorflow_io" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(config.stash.get(_SUITE_STATUS, 1)))
