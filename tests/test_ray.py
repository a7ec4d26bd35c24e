"""Ray as an engine (docs/distributed.md, "Ray"): a real Ray cluster of two nodes on this host
(``ray start --head``, ``ray start --address``), ``cifar10-cluster --ray`` on it with the
records and the job dir in a bucket of the local S3 server, a task killed mid-run, a
parameter-server job, and Ray Train's ``TensorflowTrainer`` calling ``train.run``.

Each node is a ``ray start --block`` in a process group of its own, which the fixture ends;
``ray stop`` would end every Ray process on the machine."""

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from test_object_storage import bucket, s3_server, shared_store  # noqa: F401
from cluster_fixtures import free_ports
from trainer_fixtures import trainer_args, trainer_env, work_dir

ray = pytest.importorskip("ray")

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
pytestmark = [pytest.mark.cluster]


# Waits in one process (one connection to the cluster) until ARGV[2] nodes are alive, or
# ARGV[3] seconds have passed; prints how many are.
_WAIT_FOR_NODES = """
import sys, time
import ray
ray.init(address=sys.argv[1], logging_level="ERROR")
deadline = time.monotonic() + float(sys.argv[3])
while True:
    alive = sum(n["Alive"] for n in ray.nodes())
    if alive >= int(sys.argv[2]) or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(alive)
"""


def _wait_for_port(port: int, timeout: float) -> None:
    """Until something listens on 127.0.0.1:PORT (the head's GCS)."""
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(0.1)


def _stop_node(node: subprocess.Popen, grace: float) -> None:
    """Ends one node's ``ray start --block`` and what it started (its process group):
    SIGTERM, then SIGKILL for what is left after ``grace`` seconds. (A head whose other nodes
    are gone drains for 30 s after SIGTERM, with nothing left to drain.)"""
    try:
        os.killpg(node.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        node.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(node.pid, signal.SIGKILL)  # whatever of the group is left
    except ProcessLookupError:
        pass
    node.wait(10)


@contextlib.contextmanager
def ray_nodes(count: int = 2, cpus: int = 3, extra: dict | None = None):
    """``count`` Ray nodes on this host with ``cpus`` CPUs each, ``extra`` in their
    environment: (the head's address, the nodes' ``ray start`` processes, the head first)."""
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    # A short folder of its own: Ray's socket paths must fit in 107 bytes.
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    common = ["--num-cpus", str(cpus), "--disable-usage-stats", "--block"]
    env = trainer_env(extra={"RAY_memory_monitor_refresh_ms": "0", **(extra or {})})
    nodes = [subprocess.Popen([RAY, "start", "--head", f"--port={port}", "--temp-dir", temp,
                               "--include-dashboard=false", *common],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, cwd=work_dir(), env=env)]
    try:
        _wait_for_port(port, 90)  # the head's GCS answers: the other nodes can join
        for _ in range(count - 1):
            nodes.append(subprocess.Popen([RAY, "start", f"--address={address}", *common],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True, cwd=work_dir(), env=env))
        probe = subprocess.run([sys.executable, "-c", _WAIT_FOR_NODES, address, str(count),
                                "90"], capture_output=True, text=True, timeout=150,
                               cwd=work_dir(), env=trainer_env(extra=extra))
        alive = probe.stdout.strip().splitlines()[-1:] if probe.returncode == 0 else []
        assert alive == [str(count)], f"the Ray nodes did not come up: {probe.stderr[-2000:]}"
        yield address, nodes
    finally:
        for node in reversed(nodes):  # these nodes only (their process groups), one by one
            _stop_node(node, 10 if node is not nodes[0] else 2)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_cluster():
    """Two Ray nodes on this host, three CPUs each (room for two jobs at once): the head's
    address."""
    with ray_nodes() as (address, _):
        yield address


def _cluster(address: str, launcher_flags: list[str], trainer: list[str], env: dict,
             log) -> subprocess.Popen:
    out = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "cifar10_estimator.cluster", "--ray", address,
                             *launcher_flags, "--", *trainer],
                            stdout=out, stderr=subprocess.STDOUT, cwd=work_dir(), env=env,
                            start_new_session=True)


@contextlib.contextmanager
def _ended(launcher: subprocess.Popen):
    """Stops ``launcher`` (SIGTERM to its process group: it stops its tasks) if it still runs
    when the block ends."""
    try:
        yield launcher
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(60)


def _exit_status(process: subprocess.Popen, timeout: float) -> int | None:
    """``process``'s exit status, or None if it still runs after ``timeout`` seconds (for an
    assertion that shows its log, where ``wait`` would raise)."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _wait_for(log, pattern: str, process: subprocess.Popen, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while True:
        found = re.search(pattern, log.read_text())
        if found:
            return found
        assert process.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, f"no {pattern!r} in:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


RAY_TRAIN = textwrap.dedent("""
    import json, os, sys
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    address, argv, storage, pids = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    ray.init(address=address, logging_level="ERROR")

    def train_loop_per_worker(config):
        import ray.train
        from cifar10_estimator import train
        # Where the test finds each worker's process, to kill one.
        with open(os.path.join(config["pids"], f"rank-{ray.train.get_context().get_world_rank()}"),
                  "a") as f:
            f.write(f"{os.getpid()}\\n")
        train.run(config["argv"])

    result = TensorflowTrainer(
        train_loop_per_worker, train_loop_config={"argv": argv, "pids": pids},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=storage, name="cifar10",
                             failure_config=FailureConfig(max_failures=2))).fit()
    print(json.dumps({"metrics": result.metrics, "error": repr(result.error),
                      "checkpoint": result.checkpoint and result.checkpoint.path}))
""")


@pytest.mark.timeout(480)
def test_an_all_reduce_job_on_ray_loses_a_task_and_ray_train_recovers_a_killed_worker(
        ray_cluster, shared_store, tiny_records, tmp_path):
    # Two jobs on the cluster at once (five of its six CPUs): Ray Train's TensorflowTrainer
    # calling train.run, whose worker 1 is killed after the first checkpoint (FailureConfig
    # restarts the worker group, train.run resumes from the job dir), and the launcher's
    # all-reduce job in a bucket (a shared folder where this TensorFlow has no s3://), which
    # loses a task.
    local_data, _ = tiny_records
    ray_train_job, pids = tmp_path / "job", tmp_path / "pids"
    pids.mkdir()
    # Steps enough after the first checkpoint that the kill lands mid-run: a worker killed
    # after the last step finds the job trained to its end when restarted.
    argv = trainer_args(local_data, ray_train_job, "--distribution-strategy",
                        "multi-worker-mirrored", "--train-steps", "64",
                        "--save-checkpoints-steps", "16", "--precise-bn-batches", "0")
    with open(tmp_path / "ray-train.out", "w") as out, \
            open(tmp_path / "ray-train.err", "w") as err:
        ray_train = subprocess.Popen([sys.executable, "-c", RAY_TRAIN, ray_cluster,
                                      json.dumps([str(a) for a in argv]),
                                      str(tmp_path / "ray-results"), str(pids)],
                                     stdout=out, stderr=err, cwd=work_dir(), env=trainer_env(),
                                     start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list(ray_train_job.glob("model.ckpt-[1-9]*.index")):
            assert ray_train.poll() is None and time.monotonic() < deadline, (
                (tmp_path / "ray-train.err").read_text()[-4000:])
            time.sleep(0.2)
        killed = int((pids / "rank-1").read_text().split()[0])
        os.kill(killed, signal.SIGKILL)  # Ray Train's worker 1, mid-run
        _all_reduce_job_loses_a_task(ray_cluster, shared_store, local_data, tmp_path)
        _exit_status(ray_train, 280)  # its status and output are asserted below
    finally:
        if ray_train.poll() is None:
            os.killpg(ray_train.pid, signal.SIGKILL)
            ray_train.wait(60)
    # Ray Train's run.
    stdout, stderr = ((tmp_path / f"ray-train.{n}").read_text() for n in ("out", "err"))
    assert ray_train.returncode == 0, (stdout + stderr)[-5000:]
    # (Ray's own lines about the killed worker may come after the script's.)
    out = json.loads(next(line for line in reversed(stdout.splitlines())
                          if line.startswith("{")))
    assert out["error"] == "None", out
    # The worker group was started again (new processes) and resumed from the job dir.
    assert len((pids / "rank-1").read_text().split()) >= 2, stderr[-4000:]
    assert re.search(rf"resuming from {re.escape(str(ray_train_job))}/model\.ckpt-(16|32|48)",
                     stderr), stderr[-4000:]
    # Worker 0 of Ray Train's workers-only TF_CONFIG was the chief: it evaluated at the end,
    # exported and reported; its figures reached Ray Train.
    assert out["metrics"]["exported"] == 1 and 0 <= out["metrics"]["accuracy"] <= 1
    assert json.loads((ray_train_job / "eval_report.json").read_text())["global_step"] == 64
    assert len(os.listdir(ray_train_job / "export")) == 1
    # The export is the run's checkpoint in Ray Train's storage.
    assert os.path.isfile(os.path.join(out["checkpoint"], "saved_model.pb"))


def _all_reduce_job_loses_a_task(ray_cluster, store, local_data, tmp_path):
    # chief + worker (all-reduce) + evaluator as Ray actors, records and job dir in the store.
    store.upload(local_data, "data")
    data_dir, job_dir = f"{store.root}/data", f"{store.root}/job"
    log = tmp_path / "cluster.log"
    launcher = _cluster(
        ray_cluster, ["--num-workers", "2", "--evaluator"],
        trainer_args(data_dir, job_dir, "--distribution-strategy", "multi-worker-mirrored",
                     "--train-steps", "160", "--save-checkpoints-steps", "40",
                     "--eval-throttle-secs", "1", "--precise-bn-batches", "0",
                     "--progress-secs", "1"),
        trainer_env(extra=store.env), log)
    with _ended(launcher):
        placed = _wait_for(log, r"placed 3 tasks on (\d) Ray node\(s\)", launcher, 120)
        assert placed.group(1) == "2"  # spread over both nodes
        worker = int(_wait_for(log, r"started worker0 \(pid (\d+) on ", launcher, 60).group(1))
        # 120 steps after this checkpoint: the kill lands mid-run.
        _wait_for(log, r"\[chief\] .*Saving checkpoints for 40 ", launcher, 240)
        os.kill(worker, signal.SIGKILL)  # a lost task: its node's process, gone
        assert _exit_status(launcher, 300) == 0, log.read_text()[-5000:]
    output = log.read_text()
    assert "worker0 stopped by a signal (killed by SIGKILL): starting it again" in output
    for task in ("chief", "worker0", "evaluator"):
        assert f"[cluster] {task}: exit status 0" in output, output[-4000:]
    # Nothing lost but the steps since the last checkpoint: the job resumed from one.
    assert re.search(rf"\[chief\] .*resuming from {re.escape(job_dir)}/model\.ckpt-(40|80|120)",
                     output)
    assert re.search(r"\[evaluator\] .*final evaluation at step 160", output), output[-4000:]
    keys = store.keys("job/")
    assert "job/eval_report.json" in keys and "job/model.ckpt-160.index" in keys
    assert any(re.fullmatch(r"job/export/\d+/saved_model\.pb", k) for k in keys)
    assert "network: the Ray cluster's nodes" in output


@pytest.mark.timeout(300)
def test_a_parameter_server_job_on_ray(ray_cluster, tiny_records, tmp_path):
    # The nodes share this host's disk: local folders pass the check of shared paths.
    data_dir, _ = tiny_records
    log = tmp_path / "cluster.log"
    launcher = _cluster(ray_cluster, ["--num-workers", "2", "--num-ps", "1"],
                        trainer_args(data_dir, tmp_path / "job", "--train-steps", "10",
                                     "--save-checkpoints-steps", "5"),
                        trainer_env(), log)
    assert _exit_status(launcher, 240) == 0, log.read_text()[-5000:]
    output = log.read_text()
    for task in ("chief", "worker0", "ps0"):
        assert f"[cluster] {task}: exit status 0" in output, output[-4000:]
    assert "asynchronous updates" in output
    (version,) = os.listdir(tmp_path / "job" / "export")
    info = json.loads((tmp_path / "job" / "export" / version / "assets.extra" / "export.json"
                       ).read_text())
    assert info["global_step"] >= 10


@pytest.mark.timeout(200)
def test_a_job_dir_the_nodes_do_not_share_is_refused_in_one_line(ray_cluster, tiny_records,
                                                                 tmp_path):
    # /proc/self/cwd is the folder each process runs in: the launcher's job dir is one folder
    # (in tmp_path), and each Ray actor, running where its node runs, looks into another, as a
    # node without the mount would.
    data_dir, _ = tiny_records
    done = subprocess.run(
        [sys.executable, "-m", "cifar10_estimator.cluster", "--ray", ray_cluster,
         "--num-workers", "2", "--", *trainer_args(data_dir, "/proc/self/cwd/unshared-job",
                                                   "--train-steps", "2")],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env=trainer_env())
    assert done.returncode == 2, (done.stdout + done.stderr)[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("cifar10_estimator.cluster: error: --job-dir "
                           "/proc/self/cwd/unshared-job is not shared by the Ray cluster's "
                           "nodes (chief's node, "), line
    assert "use a bucket (s3://, gs://) or a folder every node mounts" in line
    assert "[chief]" not in done.stdout  # nothing started
    assert not os.path.exists(os.path.join(work_dir(), "unshared-job"))


def _node_of(pid: int, nodes: list) -> int:
    """Which of ``nodes`` (their ``ray start`` processes) runs the trainer ``pid``: its parent
    is its task's actor, whose parent is the node's raylet, in the node's process group."""
    def parent(p: int) -> int:
        with open(f"/proc/{p}/status") as f:
            return int(next(line for line in f if line.startswith("PPid:")).split()[1])

    raylet_group = os.getpgid(parent(parent(pid)))
    return next(i for i, node in enumerate(nodes) if node.pid == raylet_group)


@pytest.mark.timeout(420)
def test_a_job_on_ray_that_loses_a_node_is_placed_again_on_the_survivor_and_exports(
        shared_store, tiny_records, tmp_path):
    # Its own two nodes: the one without the head is killed (its `ray start` process group,
    # SIGKILL, as a machine that goes away), with one of the job's two trainers on it.
    local_data, _ = tiny_records
    shared_store.upload(local_data, "data")
    data_dir, job_dir = f"{shared_store.root}/data", f"{shared_store.root}/job"
    log = tmp_path / "cluster.log"
    with ray_nodes(2, 3) as (address, nodes):
        launcher = _cluster(
            address, ["--num-workers", "2", "--max-failures", "1"],
            trainer_args(data_dir, job_dir, "--distribution-strategy", "multi-worker-mirrored",
                         # Long enough to still train once Ray has declared the node
                         # dead (its heartbeats missed: 10-20 s here).
                         "--train-steps", "600", "--save-checkpoints-steps", "40",
                         "--precise-bn-batches", "0", "--progress-secs", "1"),
            trainer_env(extra=shared_store.env), log)
        with _ended(launcher):
            _wait_for(log, r"placed 2 tasks on 2 Ray node\(s\)", launcher, 120)
            pids = {name: int(_wait_for(log, rf"started {name} \(pid (\d+) on ", launcher,
                                        60).group(1)) for name in ("chief", "worker0")}
            on_node = {name: _node_of(pid, nodes) for name, pid in pids.items()}
            (lost,) = [name for name, node in on_node.items() if node == 1]
            _wait_for(log, r"\[chief\] .*Saving checkpoints for 40 ", launcher, 240)
            os.killpg(nodes[1].pid, signal.SIGKILL)
            assert _exit_status(launcher, 300) == 0, log.read_text()[-6000:]
    output = log.read_text()
    said = re.search(rf"\[cluster\] {lost}'s node \S+ \(node \w+\) was lost \((.+)\): "
                     rf"placing the job again on the nodes that are alive, restart 1 of 1 "
                     rf"\(--max-failures\)", output)
    assert said, output[-6000:]
    assert "placed 2 tasks on 1 Ray node(s)" in output
    # The trainer on the lost node died with its actor: nothing of the old placement trains on.
    with pytest.raises(ProcessLookupError):
        os.kill(pids[lost], 0)
    # Nothing lost but the steps since the last checkpoint: the job resumed from one, then
    # trained again.
    resumed = re.search(rf"\[chief\] .*resuming from {re.escape(job_dir)}/model\.ckpt-(\d+)",
                        output)
    assert resumed and 40 <= int(resumed.group(1)) < 600, output[-6000:]
    assert re.search(r"\[chief\] .*step \d+/600 ", output[resumed.end():]), output[-6000:]
    for task in ("chief", "worker0"):
        assert f"[cluster] {task}: exit status 0" in output, output[-4000:]
    keys = shared_store.keys("job/")
    assert "job/model.ckpt-600.index" in keys  # (no evaluator: no report)
    assert any(re.fullmatch(r"job/export/\d+/saved_model\.pb", k) for k in keys)
    # The job's settings did not change with the placement.
    assert "was trained with other settings" not in output


@pytest.mark.timeout(200)
def test_a_ray_cluster_that_asks_for_its_token_is_refused_in_one_line(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    token = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    with ray_nodes(1, 1, extra=token) as (address, _):
        done = subprocess.run(  # no token here (the suite's environment: mode disabled)
            [sys.executable, "-m", "cifar10_estimator.cluster", "--ray", address, "--",
             *trainer_args(data_dir, tmp_path / "job", "--train-steps", "2")],
            capture_output=True, text=True, timeout=150, cwd=work_dir(), env=trainer_env())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    # (Ray's own client logs each refused try first, from C++.)
    assert done.stderr.strip().splitlines()[-1] == (
        f"cifar10_estimator.cluster: error: --ray {address}: the Ray cluster asks for its "
        f"authentication token; set RAY_AUTH_MODE=token and put the cluster's token in "
        f"~/.ray/auth_token (or RAY_AUTH_TOKEN) on this host")
    assert not (tmp_path / "job").exists()
