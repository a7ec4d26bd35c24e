"""Job dirs and data on object storage: ``ram://`` in this process, ``s3://`` against a real
S3-protocol server (moto's, on 127.0.0.1) with the package's commands as real processes.

The s3:// runs are subprocesses: tensorflow-io, which brings s3://, aborts the interpreter's
teardown (tensorflow/io issue 1912), so it is never imported into the suite's own process.
A small TCP relay stands between the trainer and the server where a test takes the server away
and brings it back with its objects.
"""

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Callable

import pytest
import tensorflow as tf

from cifar10_estimator import storage, train
from cifar10_estimator.task import allreduce
from cifar10_estimator.errors import UserError
from cifar10_estimator.jobdir import lock as job_lock
from cluster_fixtures import RAN, RATE, free_ports, run_cluster, task_lines
from trainer_fixtures import (HAS_S3, NEEDS_S3, Trainer, one_line_error, run_concurrently,
                              run_module, trainer_args, trainer_env, work_dir)


# Where tensorflow-io's S3 client keeps a local copy of each file open for writing: /tmp,
# whatever TMPDIR says (tensorflow/io pull request 1526).
S3_CLIENT_BUFFERS = "/tmp/_s3_filesystem_*"
# An event file's first record (length, checksums, an Event with its wall time and version).
EVENT_HEAD = 40


# --- ram://: one process -------------------------------------------------------------------------

def test_storage_reads_writes_and_renames_on_ram_as_on_a_disk():
    root = f"ram://storage-{uuid.uuid4().hex[:8]}"
    storage.makedirs(storage.join(root, "job"))
    path = storage.join(root, "job", "a.json")
    storage.write_bytes_atomic(path, b"{}")
    assert storage.read_bytes(path) == b"{}" and storage.size(path) == 2
    assert storage.listdir(storage.join(root, "job")) == ["a.json"]  # no temporary left
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(storage.join(root, "job", "missing"))
    storage.remove(storage.join(root, "job", "missing"))  # no error
    with storage.atomic_dir(storage.join(root, "export", "1")) as tmp:
        storage.write_bytes(os.path.join(tmp, "saved_model.pb"), b"x")
    assert storage.listdir(storage.join(root, "export", "1")) == ["saved_model.pb"]
    with pytest.raises(RuntimeError):
        with storage.atomic_path(storage.join(root, "job", "b.json")) as tmp:
            storage.write_bytes(tmp, b"half")
            raise RuntimeError("the writer failed")
    assert storage.listdir(storage.join(root, "job")) == ["a.json"]  # neither b nor its tmp


def test_the_lease_on_object_storage_admits_one_trainer():
    job_dir = f"ram://lease-{uuid.uuid4().hex[:8]}/job"
    storage.makedirs(job_dir)
    first = job_lock.JobLock(job_dir, heartbeat_secs=3600, settle_secs=0.05)
    first.acquire()
    try:
        lease = json.loads(storage.read_bytes(storage.join(job_dir, job_lock.LOCK_FILE)))
        assert lease["pid"] == os.getpid()
        with pytest.raises(UserError, match=rf"--job-dir {job_dir} is in use by another "
                                                  rf"trainer \(pid {os.getpid()} on "):
            job_lock.JobLock(job_dir, heartbeat_secs=3600, settle_secs=0.05).acquire()
    finally:
        first.release()
    assert not storage.exists(storage.join(job_dir, job_lock.LOCK_FILE))
    # A lease overwritten during the settling time belongs to the later writer: the earlier
    # trainer reads the other one back and does not hold the lock.
    racer = job_lock.JobLock(job_dir, heartbeat_secs=3600, settle_secs=0.05)
    other = dict(lease, host="other-host", boot_id="other", pid=1)

    def overwrite(_seconds):
        storage.write_bytes(storage.join(job_dir, job_lock.LOCK_FILE),
                            json.dumps(other).encode())

    racer._sleep = overwrite
    assert racer._create(job_lock.Holder.this_process()) is False
    assert json.loads(storage.read_bytes(storage.join(job_dir, job_lock.LOCK_FILE))) == other


@pytest.mark.slow
def test_a_job_dir_on_ram_trains_resumes_exports_and_reruns_as_on_a_disk(tiny_records, capsys):
    data_dir, _ = tiny_records
    job_dir = f"ram://job-{uuid.uuid4().hex[:8]}/job"
    first = train.run(trainer_args(data_dir, job_dir, "--train-steps", "2",
                                   "--eval-throttle-secs", "100000"))
    assert first.export_path.startswith(f"{job_dir}/export/")
    assert storage.isfile(storage.join(first.export_path, "saved_model.pb"))
    assert tf.train.latest_checkpoint(job_dir).endswith("model.ckpt-2")
    longer = train.run(trainer_args(data_dir, job_dir, "--train-steps", "4",
                                    "--eval-throttle-secs", "100000"))
    assert longer.steps_trained == 2 and "resuming from" in capsys.readouterr().err
    names = storage.listdir(job_dir)
    assert {"settings.json", "eval_report.json", "checkpoint", "export"} <= set(names)
    assert job_lock.LOCK_FILE not in names  # released


# --- s3:// against a real S3-protocol server ------------------------------------------------------

def _wait_until_answers(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing answers at {url}"
            time.sleep(0.2)


def _start_moto(tmp_path_factory, env_extra: dict | None = None):
    """moto's S3 server on 127.0.0.1, answering: its process and endpoint URL."""
    pytest.importorskip("moto", reason="the test extra installs moto")
    port = free_ports(1)[0]
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                   "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                  cwd=work_dir(), env={**os.environ, **(env_extra or {})})
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_until_answers(f"{endpoint}/moto-api/")
    except BaseException:
        server.kill()
        raise
    return server, endpoint


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """moto's S3 server on 127.0.0.1: its endpoint URL."""
    server, endpoint = _start_moto(tmp_path_factory)
    try:
        yield endpoint
    finally:
        server.terminate()
        server.wait(30)


def _s3_env(endpoint: str) -> dict:
    """What a user sets for an S3-compatible server (docs/storage.md)."""
    return {"S3_ENDPOINT": endpoint, "S3_USE_HTTPS": "0", "S3_VERIFY_SSL": "0",
            "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing"}


# The AWS SDK's retries cut to one, as docs/storage.md shows for a test: by default a request
# to a server that does not answer backs off for about 50 s before it fails.
_FAIL_FAST = {"AWS_RETRY_MODE": "standard", "AWS_MAX_ATTEMPTS": "2"}


def _client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def bucket(s3_server) -> str:
    """A new bucket of its own for the test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    _client(s3_server).create_bucket(Bucket=name)
    return name


def _keys(endpoint: str, bucket: str, prefix: str = "") -> list[str]:
    pages = _client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                        Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", ()))


@dataclass
class Store:
    """Where a cluster's tasks share their files: ``root`` (a bucket's URL or a folder), the
    environment that reaches it, and its objects' keys and bytes, relative to the root."""
    root: str
    env: dict
    keys: Callable[[str], list]
    read: Callable[[str], bytes]
    upload: Callable[[str, str], None]  # (a local folder's files, to a prefix)


@pytest.fixture
def shared_store(request, tmp_path) -> Store:
    """A bucket of the local S3 server where s3:// works; elsewhere a folder, which every task
    on this machine, and every node of a local Ray cluster, shares (the user's choice there)."""
    if HAS_S3:
        endpoint, name = request.getfixturevalue("s3_server"), request.getfixturevalue("bucket")
        client = _client(endpoint)

        def upload(folder: str, prefix: str) -> None:
            for file in os.listdir(folder):
                client.upload_file(os.path.join(folder, file), name, f"{prefix}/{file}")

        return Store(f"s3://{name}", _s3_env(endpoint), lambda prefix: _keys(endpoint, name,
                                                                             prefix),
                     lambda key: client.get_object(Bucket=name, Key=key)["Body"].read(), upload)
    root = tmp_path / "store"
    root.mkdir()

    def keys(prefix: str) -> list:
        return sorted(os.path.relpath(os.path.join(folder, file), root)
                      for folder, _, files in os.walk(root) for file in files
                      if os.path.relpath(os.path.join(folder, file), root).startswith(prefix))

    return Store(str(root), {}, keys, lambda key: (root / key).read_bytes(),
                 lambda folder, prefix: shutil.copytree(folder, root / prefix) and None)


S3_RUN = ["--eval-throttle-secs", "100000", "--precise-bn-batches", "0"]


@pytest.mark.slow
@pytest.mark.skipif(HAS_S3, reason="this TensorFlow has s3:// (tensorflow-io)")
def test_without_tensorflow_io_an_s3_path_is_refused_in_one_line_naming_the_pair(tiny_records):
    data_dir, _ = tiny_records
    done = run_module("cifar10_estimator", *trainer_args(data_dir, "s3://bucket/job",
                                                         "--train-steps", "2"))
    line = one_line_error(done, "s3://bucket/job: s3:// paths need tensorflow-io, which works "
                                 f"with {storage.TFIO_PAIR}; this is TensorFlow {tf.__version__}"
                                 f" on Python {sys.version_info.major}.{sys.version_info.minor}")
    assert line.endswith("install that pair with pip install '.[s3]' on Python 3.11 "
                         "(docs/storage.md)")


@NEEDS_S3
@pytest.mark.slow
def test_records_training_sigterm_resume_export_evaluate_and_predict_all_in_a_bucket(
        s3_server, bucket, make_cifar_dir, tmp_path):
    env = _s3_env(s3_server)
    leftovers_before = set(glob.glob(S3_CLIENT_BUFFERS))
    make_cifar_dir(str(tmp_path / "cifar"), images_per_batch=12)
    data_dir, job_dir = f"s3://{bucket}/data", f"s3://{bucket}/job"
    made = run_module("cifar10_estimator.generate", "--data-dir", str(tmp_path / "cifar"),
                      "--output-dir", data_dir, env_extra=env)
    assert made.returncode == 0, made.stderr[-3000:]
    assert {"data/train.tfrecords", "data/eval.tfrecords"} <= set(_keys(s3_server, bucket))

    # The default checkpoint cadence (600 s): the checkpoint the signal makes is the first
    # after step 0, and no evaluation comes at a checkpoint before it.
    trainer = Trainer(trainer_args(data_dir, job_dir, *S3_RUN, "--train-steps", "100000",
                                   "--progress-secs", "0.5"),
                      tmp_path / "first.log", env_extra=env)
    try:
        trainer.wait_for(r"step \d+/100000", timeout=180)
        assert "job/trainer.lock" in _keys(s3_server, bucket, "job/")
        # A second trainer on the same job dir is refused by the lease, and writes nothing.
        second = run_module("cifar10_estimator", *trainer_args(data_dir, job_dir, *S3_RUN,
                                                               "--train-steps", "3"),
                            env_extra=env)
        one_line_error(second, f"--job-dir {job_dir} is in use by another trainer "
                                f"(pid {trainer.process.pid} on ")
        trainer.process.send_signal(signal.SIGTERM)
        assert trainer.finish(120) == 143, trainer.text()[-3000:]
    finally:
        if trainer.process.poll() is None:
            trainer.process.kill()
    saved = int(re.findall(r"received SIGTERM at step (\d+): saved ", trainer.text())[-1])
    assert "job/trainer.lock" not in _keys(s3_server, bucket, "job/")  # released

    final = saved + 2
    rerun = run_module("cifar10_estimator", *trainer_args(data_dir, job_dir, *S3_RUN,
                                                          "--train-steps", str(final)),
                       env_extra=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming from {job_dir}/model.ckpt-{saved}" in rerun.stderr
    export = re.search(r"exported SavedModel to (s3://\S+)", rerun.stderr).group(1)
    version = export.rsplit("/", 1)[1]
    keys = _keys(s3_server, bucket, "job/")
    assert f"job/export/{version}/saved_model.pb" in keys
    assert "job/settings.json" in keys and "job/eval_report.json" in keys
    assert any(k.startswith("job/events.out.tfevents.") for k in keys)
    assert not any(".tmp" in k or "write-test" in k for k in keys)  # nothing half-written
    # Both runs closed their event files before ending their process: tensorflow-io's local
    # copies of them are gone. An event file's first record holds its creation time, so its
    # first bytes tell this job's copies from those of the suite's other S3 runs.
    starts = {_client(s3_server).get_object(Bucket=bucket, Key=k)["Body"].read()[:EVENT_HEAD]
              for k in keys if "events.out.tfevents" in k}
    left = [p for p in set(glob.glob(S3_CLIENT_BUFFERS)) - leftovers_before
            if open(p, "rb").read()[:EVENT_HEAD] in starts]
    assert len(starts) >= 2 and not left, left

    # The export is evaluated and predicts, and TensorBoard (as the run summary prints it)
    # reads the job's events from the bucket: three readers of the finished job, at once.
    picture = tmp_path / "picture.png"
    picture.write_bytes(tf.io.encode_png(tf.zeros([32, 32, 3], tf.uint8)).numpy())
    tensorboard = re.search(r"TensorBoard: (\S+) --logdir (\S+)", rerun.stderr).groups()
    assert tensorboard[1] == job_dir

    def tensorboard_tags() -> dict:
        port = free_ports(1)[0]
        server = subprocess.Popen([tensorboard[0], "--logdir", job_dir, "--port", str(port),
                                   "--host", "127.0.0.1", "--load_fast", "false"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  cwd=tmp_path, env=trainer_env(extra=env))
        try:
            deadline = time.monotonic() + 120
            tags = {}
            while time.monotonic() < deadline and not ("." in tags and "eval" in tags):
                try:
                    with urllib.request.urlopen(
                            f"http://127.0.0.1:{port}/data/plugin/scalars/tags",
                            timeout=10) as response:
                        tags = json.load(response)
                except OSError:
                    pass
                time.sleep(0.5)
        finally:
            server.kill()
            server.wait()
        return tags

    evaluated, predicted, tags = run_concurrently(
        lambda: run_module("cifar10_estimator.evaluate", export, "--data-dir", data_dir,
                           env_extra=env),
        lambda: run_module("cifar10_estimator.predict", "--saved-model", f"{job_dir}/export",
                           str(picture), env_extra=env),
        tensorboard_tags)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert f"job/export/eval_report_eval_{version}.json" in _keys(s3_server, bucket, "job/")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert predicted.stdout.startswith(f"{picture}:")
    assert {"loss", "learning_rate"} <= set(tags.get(".", {})), tags
    assert "accuracy" in tags["eval"], tags


@pytest.fixture(scope="module")
def s3_server_with_keys(tmp_path_factory):
    """moto's S3 server checking credentials: its endpoint and the one key pair it accepts
    (moto lets the first INITIAL_NO_AUTH_ACTION_COUNT requests through unchecked: they make
    an IAM user with S3 rights, its key and a bucket)."""
    import boto3

    server, endpoint = _start_moto(tmp_path_factory, {"INITIAL_NO_AUTH_ACTION_COUNT": "4"})
    try:
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="trainer")
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        iam.put_user_policy(UserName="trainer", PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id=key["AccessKeyId"],
                     aws_secret_access_key=key["SecretAccessKey"]).create_bucket(Bucket="keyed")
        yield endpoint, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        server.terminate()
        server.wait(30)


@NEEDS_S3
@pytest.mark.slow
def test_wrong_credentials_are_one_line_and_the_right_ones_write(s3_server_with_keys,
                                                                  make_cifar_dir, tmp_path):
    endpoint, key_id, secret = s3_server_with_keys
    make_cifar_dir(str(tmp_path / "cifar"), images_per_batch=4)
    env = {**_s3_env(endpoint), "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": "wrong"}
    refused = run_module("cifar10_estimator.generate", "--data-dir", str(tmp_path / "cifar"),
                         "--output-dir", "s3://keyed/data", env_extra=env)
    one_line_error(refused, "--output-dir s3://keyed/data is not a writable folder (")
    assert "SignatureDoesNotMatch" in refused.stderr.strip().splitlines()[-1]
    env["AWS_SECRET_ACCESS_KEY"] = secret
    made = run_module("cifar10_estimator.generate", "--data-dir", str(tmp_path / "cifar"),
                      "--output-dir", "s3://keyed/data", env_extra=env)
    assert made.returncode == 0, made.stderr[-3000:]


@NEEDS_S3
@pytest.mark.slow
def test_a_missing_bucket_or_a_server_that_does_not_answer_is_one_line(
        s3_server, tiny_records, tmp_path):
    data_dir, _ = tiny_records
    missing = f"s3://no-such-{uuid.uuid4().hex[:8]}/job"
    closed = f"http://127.0.0.1:{free_ports(1)[0]}"
    # Each trainer in a process of its own, at once.
    no_bucket, no_server = run_concurrently(
        lambda: run_module("cifar10_estimator", *trainer_args(data_dir, missing,
                                                              "--train-steps", "2"),
                           env_extra=_s3_env(s3_server)),
        lambda: run_module("cifar10_estimator", *trainer_args(data_dir, "s3://any/job",
                                                              "--train-steps", "2"),
                           env_extra={**_s3_env(closed), **_FAIL_FAST}))
    one_line_error(no_bucket, f"--job-dir {missing}: the bucket s3://{missing[5:].split('/')[0]}/ "
                               f"does not exist or these credentials cannot see it; check that")
    one_line_error(no_server, "(curlCode: 7, Couldn't connect to server); check that the bucket "
                               "exists and that S3_ENDPOINT")
    assert not os.path.exists(os.path.join(work_dir(), "s3:"))  # never a local folder


class _Relay:
    """A TCP relay from a port of its own to the S3 server: ``stop`` takes the server away
    (connections cut, new ones refused), ``start`` brings it back with its objects. With
    ``put_delay``, it holds every PUT request that long before passing it on, as a write through
    the SDK's retries or a congested link would be."""

    def __init__(self, target_port: int, put_delay: float = 0.0):
        self.target_port = target_port
        self.put_delay = put_delay
        self.port = free_ports(1)[0]
        self._listener = None
        self._connections: list[socket.socket] = []
        # stop() and a connection accepted while it runs: without the lock, one accepted just
        # before the listener closed would be added after the cut and keep the server reachable.
        self._lock = threading.Lock()

    def start(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            self._listener.close()
            for c in self._connections:
                self._cut(c)
            self._connections.clear()

    @staticmethod
    def _cut(connection: socket.socket) -> None:
        try:
            connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        connection.close()

    def _accept(self, listener) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                if listener is not self._listener or listener.fileno() == -1:  # stopped
                    self._cut(client)
                    self._cut(server)
                    return
                self._connections += [client, server]
            for a, b, requests in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, requests), daemon=True).start()

    def _pipe(self, source, sink, requests: bool) -> None:
        try:
            while data := source.recv(65536):
                if requests and self.put_delay and data.startswith(b"PUT "):
                    time.sleep(self.put_delay)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@NEEDS_S3
@pytest.mark.slow
def test_a_server_gone_mid_run_is_one_line_and_the_run_resumes_once_it_is_back(
        s3_server, bucket, tiny_records, tmp_path):
    data_dir, _ = tiny_records
    relay = _Relay(int(s3_server.rsplit(":", 1)[1]))
    relay.start()
    env = {**_s3_env(f"http://127.0.0.1:{relay.port}"), **_FAIL_FAST}  # once the server is gone
    job_dir = f"s3://{bucket}/job"
    flags = trainer_args(data_dir, job_dir, *S3_RUN, "--save-checkpoints-steps", "3",
                         "--progress-secs", "0.5")
    trainer = Trainer([*flags, "--train-steps", "100000"], tmp_path / "first.log",
                      env_extra=env)
    try:
        trainer.wait_for(r"Saving checkpoints for [1-9]\d* ", timeout=180)
        relay.stop()
        code = trainer.finish(300)
    finally:
        if trainer.process.poll() is None:
            trainer.process.kill()
    text = trainer.text()
    assert code == 2 and "Traceback" not in text, text[-3000:]
    assert text.strip().splitlines()[-1].startswith(
        f"cifar10_estimator: error: --job-dir {job_dir} stopped answering ("), text[-2000:]
    relay.start()
    index = _client(s3_server).get_object(Bucket=bucket, Key="job/checkpoint")["Body"].read()
    latest = int(re.search(rb'model_checkpoint_path: "model.ckpt-(\d+)"', index).group(1))
    # The checkpoint the index names is whole: the rerun resumes from it.
    resumed = run_module("cifar10_estimator", *flags, "--train-steps", str(latest + 2),
                         env_extra=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {job_dir}/model.ckpt-{latest}" in resumed.stderr
    relay.stop()


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_an_all_reduce_cluster_in_a_shared_store_trains_evaluates_exports_and_ends_on_its_own(
        shared_store, tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = f"{shared_store.root}/job"
    code, output = run_cluster(
        ["--num-workers", "2", "--evaluator",
         # 5 epochs of 96 records at 2 x 8 a global step: 30 steps, for the evaluator too
         # (it counts the workers; Estimator's RunConfig gives an evaluator none).
         "--", *trainer_args(data_dir, job_dir, "--distribution-strategy",
                             "multi-worker-mirrored", "--train-epochs", "5",
                             "--save-checkpoints-steps", "10", "--eval-throttle-secs", "1",
                             "--precise-bn-batches", "0", "--progress-secs", "1",
                             "--precision", "auto")],
        tmp_path / "cluster.log", timeout=280, env_extra=shared_store.env)
    assert code == 0, output[-4000:]
    assert "Traceback" not in output and " E " not in output, output[-4000:]
    for task in ("chief", "worker0", "evaluator"):
        assert f"[cluster] {task}: exit status 0" in output, output[-4000:]
    assert "ps0" not in output  # no parameter servers
    chief, worker = task_lines(output, "chief"), task_lines(output, "worker0")
    assert any("collective all-reduce updates" in line for line in chief)
    # Synchronous: the job ends at the step asked for, and both workers ran every step.
    for lines in (chief, worker):
        ran = [RAN.search(line) for line in lines]
        assert [int(m.group(1)) for m in ran if m] == [30]
        own, total = map(float, [m for m in map(RATE.search, lines) if m][-1].groups())
        assert total == pytest.approx(2 * own, rel=0.05)  # a global step: both batches
    # One precision for the job: the chief's, recorded in the bucket; the worker waited for
    # it there, checked itself against the chief's settings and follows it.
    assert any(re.match(r"[\d:]+ precision auto: (fp32|bf16)", line) for line in chief)
    assert any("precision auto: " in line and "the job's recorded precision" in line
               for line in worker)
    # The evaluator read the chief's checkpoints from the store, the last one at once.
    evaluator = task_lines(output, "evaluator")
    assert any("final evaluation at step 30" in line for line in evaluator), output[-4000:]
    keys = shared_store.keys("job/")
    saved = [int(m.group(1)) for m in (re.fullmatch(r"job/model\.ckpt-(\d+)\.index", k)
                                       for k in keys) if m]
    assert max(saved) == 30 and "job/settings.json" in keys
    (export,) = [k for k in keys if re.fullmatch(r"job/export/\d+/saved_model\.pb", k)]
    info = json.loads(shared_store.read(export.replace("saved_model.pb",
                                                       "assets.extra/export.json")))
    assert info["global_step"] == 30
    assert "job/trainer.lock" not in keys and f"job/{allreduce.STOP_FILE}" not in keys
