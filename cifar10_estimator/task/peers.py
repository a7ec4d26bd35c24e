"""Being one task of a TensorFlow cluster: reachability, parameter servers, the end of training.

The cluster and this task's role come from ``tf_config.parse`` (of the ``TF_CONFIG`` value the
command read) as plain values; nothing in this module reads the environment.

What it owns:

- ``device_filters``: which tasks a trainer's sessions may talk to (the parameter servers and
  itself), so one dead or slow worker never blocks another worker's session.
- ``wait_for_tasks`` and ``wait_for_checkpoint``: bounded waits at start-up that end in one clear
  error (naming ``--cluster-timeout-secs``) instead of TensorFlow's silent retries for hours.
  (Once training runs, a parameter server that goes away is TensorFlow's business: the
  sessions fail and ``MonitoredSession`` recreates them when it is back.)
- ``run_parameter_server`` and ``report``: a parameter server serves variables until every
  training task has reported that it finished, then exits 0, so a cluster ends by itself. The
  reports travel through a queue that lives on each parameter server. A parameter server asked
  to stop (a signal) serves on until the chief reports that it saved: the chief's own save on
  a signal reads the variables from it, and a whole job stopped at once (its launcher killed,
  a Kubernetes job deleted) sends every task SIGTERM together.
- ``own_server``: this task's server that cannot start (its port taken), in one line.
- ``answers``: whether a task's server answers, which the parameter-server watchdog
  (``training.estimator.cluster_hooks.ParameterServerWatchdog``) asks of a parameter server
  that went quiet mid-run.
"""

import contextlib
import logging
import socket
import time
from typing import Callable, Iterator, Mapping, Optional, Sequence

import tensorflow as tf

from cifar10_estimator.config.role import TRAINER_JOBS
from cifar10_estimator.errors import UserError

log = logging.getLogger("cifar10_estimator")

_DONE_QUEUE = "cifar10_estimator_done"  # shared_name of the queue on every ps
_POLL_SECS = 0.5
# How long a parameter server keeps serving after the last report. The reply to that report
# and its sender's closing of the session follow the dequeue within milliseconds; a server
# already gone makes the sender's gRPC master client retry UNAVAILABLE until its deadline
# (tensorflow/core/distributed_runtime/rpc/grpc_remote_master.cc): a worker then waited out
# report_done's 30 s and logged that the parameter server never heard, though it had (how
# often: CHANGELOG). A second is far more than those milliseconds, even on a loaded machine.
_LINGER_SECS = 1.0
# How long a parameter server asked to stop serves on for the chief's save: the chief's step
# in flight and its save take seconds; this stays inside Kubernetes' default grace period
# (terminationGracePeriodSeconds, 30 s) with room for the parameter server's own exit.
STOP_SAVE_SECS = 20.0
# What a training task reports to the parameter servers (``report``).
FINISHED, SAVED = "finished", "saved"
# TensorFlow's error when its gRPC server cannot bind the task's port
# (tensorflow/core/distributed_runtime/rpc/grpc_server_lib.cc).
_SERVER_FAILED = "Could not start gRPC server"
PROBE_SECS = 5  # one attempt to reach a task; a live server answers in milliseconds


def device_filters(task_type: str, task_id: int) -> list[str]:
    """Devices a trainer's sessions may use: every ps and this task.

    These are the filters Estimator sets itself when the RunConfig has no session config
    (``RunConfig._get_default_session_config_distributed`` in tensorflow_estimator); this
    package passes its own session config, so it has to repeat them. Without them a session
    asks every task of the cluster for its devices at creation and waits for tasks it never
    uses (a worker that is still starting, or one that died).
    """
    if task_type == "worker":
        return ["/job:ps", f"/job:worker/task:{task_id}"]
    return ["/job:ps", f"/job:{task_type}"]


@contextlib.contextmanager
def own_server(cluster: Mapping[str, Sequence[str]], task_type: str, task_id: int
               ) -> Iterator[None]:
    """Maps TensorFlow's failure to start this task's gRPC server inside the block (raised
    where the server starts: a strategy's collective operations, a parameter server,
    Estimator's server) to one line that names the task's address in ``cluster``. TensorFlow
    binds every interface on that port, so the usual cause is another program holding it."""
    try:
        yield
    except tf.errors.UnknownError as e:
        addresses = cluster.get(task_type, ())
        if _SERVER_FAILED not in e.message or task_id >= len(addresses):
            raise
        address = addresses[task_id]
        raise UserError(
            f"TF_CONFIG: {task_type} {task_id} at {address}: TensorFlow could not start this "
            f"task's server on port {address.rpartition(':')[2]} (it binds every interface: "
            f"another program holds that port, or an earlier run of this task still does); "
            f"end that program, or give this task a free port in TF_CONFIG") from None


def trainer_tasks(cluster: Mapping[str, Sequence[str]]) -> list[str]:
    """Names (``job:index``) of the tasks that train, chief first."""
    return [f"{job}:{i}" for job in TRAINER_JOBS for i in range(len(cluster.get(job, ())))]


def answers(task: str, address: str, timeout_secs: float) -> bool:
    """True if a TensorFlow server for ``task`` (``job:index``) answers at ``address``.

    A TCP connection is not enough: a port that accepts connections but does not speak
    TensorFlow's gRPC would later hang session creation for good (the master's device
    discovery has no deadline). So this runs a trivial op on the task itself, through its own
    master, under ``operation_timeout_in_ms``, which does bound the calls to that master.
    """
    job, index = task.split(":")
    device = f"/job:{job}/task:{index}"
    with tf.Graph().as_default():
        with tf.compat.v1.device(device):
            probe = tf.constant(0, name="probe")
        config = tf.compat.v1.ConfigProto(device_filters=[device],
                                          operation_timeout_in_ms=int(timeout_secs * 1000))
        try:
            with tf.compat.v1.Session(f"grpc://{address}", config=config) as session:
                session.run(probe)
            return True
        except tf.errors.OpError:
            return False


def wait_for_tasks(tasks: Mapping[str, str], timeout_secs: float) -> None:
    """Waits until a TensorFlow server answers for every task.

    Args:
      tasks: task name (``ps:0``) -> ``host:port``.
      timeout_secs: how long to keep trying.

    Raises:
      UserError: some task still did not answer after ``timeout_secs``.
    """
    deadline = time.monotonic() + timeout_secs
    waiting = dict(tasks)
    announced = False
    while True:
        waiting = {name: address for name, address in waiting.items() if not answers(
            name, address, max(_POLL_SECS, min(PROBE_SECS, deadline - time.monotonic())))}
        if not waiting:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(f"{n} at {a}" for n, a in waiting.items())
            raise UserError(f"cannot reach {names} within {timeout_secs:g} s "
                            f"(--cluster-timeout-secs); check the cluster in TF_CONFIG and "
                            f"that those tasks are running")
        if not announced:
            log.info("waiting up to %g s for %s", timeout_secs, ", ".join(waiting))
            announced = True
        time.sleep(_POLL_SECS)


def wait_until_gone(tasks: Mapping[str, str], timeout_secs: float) -> list[str]:
    """Waits until no process listens at the tasks' addresses any more (they exited), at most
    ``timeout_secs``; returns the tasks still there. Only TCP is asked: a task that finished
    may no longer serve TensorFlow, and a connection refused is the answer."""
    deadline = time.monotonic() + timeout_secs
    waiting = dict(tasks)
    while waiting and time.monotonic() < deadline:
        waiting = {name: address for name, address in waiting.items() if _listens(address)}
        if waiting:
            time.sleep(_POLL_SECS)
    return sorted(waiting)


_LISTENS, _REFUSED, _SILENT = "listens", "refused", "silent"


def _answer(address: str) -> str:
    """What a TCP connection to ``address`` meets: a listener, a refusal (nothing listens
    there), or neither in ``_POLL_SECS`` (a name that does not resolve, a silent host)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=_POLL_SECS):
            return _LISTENS
    except ConnectionRefusedError:
        return _REFUSED
    except OSError:
        return _SILENT


def _listens(address: str) -> bool:
    return _answer(address) == _LISTENS


def wait_for_checkpoint(job_dir: str, timeout_secs: float) -> str:
    """Waits until ``job_dir`` holds a checkpoint; returns its path.

    The chief saves one as soon as it has initialised or restored the variables, so a
    non-chief task that sees none for long is almost always looking at a different folder.

    Raises:
      UserError: no checkpoint after ``timeout_secs``.
    """
    checkpoint = tf.train.latest_checkpoint(job_dir)
    if checkpoint:
        return checkpoint
    log.info("waiting up to %g s for the chief's first checkpoint in %s", timeout_secs, job_dir)
    # The first checkpoint the iterator yields; None once it gives up after the timeout.
    checkpoint = next(tf.train.checkpoints_iterator(job_dir, timeout=timeout_secs), None)
    if checkpoint is None:
        raise UserError(
            f"no checkpoint from the chief appeared in --job-dir {job_dir} within "
            f"{timeout_secs:g} s (--cluster-timeout-secs); every task of a cluster must "
            f"use the same --job-dir on shared storage, and the chief must be running")
    return checkpoint


def _done_queue() -> tf.queue.FIFOQueue:
    # Capacity -1 is unbounded (as SyncReplicasOptimizer's token queue): a report never blocks.
    return tf.queue.FIFOQueue(-1, [tf.string], shapes=[()], shared_name=_DONE_QUEUE,
                              name="done_queue")


def run_parameter_server(cluster: Mapping[str, Sequence[str]], task_index: int,
                         straggler_timeout_secs: float,
                         stop_requested: Callable[[], bool] = lambda: False) -> None:
    """Serves this parameter server's share of the variables until training has finished.

    Returns once every training task has reported ``FINISHED``, or ``straggler_timeout_secs``
    after the chief has, whichever comes first (a worker that died never reports; the chief
    finishing means the global step reached its target, so nobody needs the variables long).
    Once ``stop_requested()`` (a signal), it returns as soon as no chief may still be saving:
    the chief reported ``SAVED`` or ``FINISHED``, or its address refuses connections (it is
    gone), or ``STOP_SAVE_SECS`` passed. TensorFlow's own parameter server (``Server.join``)
    never returns.
    """
    # A ps only holds variables: keep it off the GPUs so it does not reserve their memory.
    tf.config.set_visible_devices([], "GPU")
    server = tf.distribute.Server(tf.train.ClusterSpec(dict(cluster)), job_name="ps",
                                  task_index=task_index, start=True)
    expected = trainer_tasks(cluster)
    chief = next((t for t in expected if not t.startswith("worker")), None)
    log.info("parameter server %d serving at %s until %s finish", task_index,
             cluster["ps"][task_index], ", ".join(expected))
    with tf.Graph().as_default():
        with tf.compat.v1.device(f"/job:ps/task:{task_index}"):
            dequeue = _done_queue().dequeue()
        config = tf.compat.v1.ConfigProto(device_filters=[f"/job:ps/task:{task_index}"])
        # A timed-out dequeue is cancelled without taking an element, so polling loses none.
        poll = tf.compat.v1.RunOptions(timeout_in_ms=int(_POLL_SECS * 4000))
        with tf.compat.v1.Session(server.target, config=config) as session:
            done: set[str] = set()
            chief_done_at: Optional[float] = None
            stop_at: Optional[float] = None  # when the stop was asked
            while set(expected) - done:
                if stop_at is None and stop_requested():
                    stop_at = time.monotonic()
                    if chief is None or chief in done or _gone(cluster, chief):
                        return
                    log.info("parameter server %d: asked to stop; serving until %s has saved "
                             "(at most %g s)", task_index, chief, STOP_SAVE_SECS)
                if stop_at is not None:
                    if _gone(cluster, chief):
                        return
                    if time.monotonic() - stop_at > STOP_SAVE_SECS:
                        log.warning("parameter server %d: %s did not report a save within "
                                    "%g s; stopping", task_index, chief, STOP_SAVE_SECS)
                        return
                if (chief_done_at is not None
                        and time.monotonic() - chief_done_at > straggler_timeout_secs):
                    log.warning("parameter server %d: %s never reported within %g s after "
                                "the chief; stopping anyway", task_index,
                                ", ".join(sorted(set(expected) - done)),
                                straggler_timeout_secs)
                    break
                try:
                    message = session.run(dequeue, options=poll).decode()
                except tf.errors.DeadlineExceededError:
                    continue
                name, _, what = message.partition(" ")
                if what == SAVED:
                    log.info("parameter server %d: %s saved", task_index, name)
                    if stop_at is not None and name == chief:
                        time.sleep(_LINGER_SECS)  # the answer still on its way (above)
                        return
                    continue
                done.add(name)
                if name == chief:
                    chief_done_at = time.monotonic()
                    if stop_at is not None:
                        return
                log.info("parameter server %d: %s finished (%d of %d training tasks)",
                         task_index, name, len(done & set(expected)), len(expected))
    time.sleep(_LINGER_SECS)  # the answers still on their way (above)
    log.info("parameter server %d: training finished, exiting", task_index)


def _gone(cluster: Mapping[str, Sequence[str]], task: str) -> bool:
    """Whether ``task``'s address refuses connections: nothing listens there any more. A name
    that does not resolve or a silent host says nothing (a Kubernetes pod that is stopping
    leaves its service's DNS records while its connections still work)."""
    job, _, index = task.partition(":")
    return _answer(cluster[job][int(index)]) == _REFUSED


def report(cluster: Mapping[str, Sequence[str]], task: str, what: str,
           timeout_secs: float) -> None:
    """Tells every parameter server that training task ``task`` (``job:index``) has
    ``FINISHED``, or ``SAVED`` after a signal.

    Best effort: a parameter server that is gone or does not answer within ``timeout_secs``
    is logged and skipped (it no longer needs the report).
    """
    message = task if what == FINISHED else f"{task} {what}"
    for index, address in enumerate(cluster.get("ps", ())):
        with tf.Graph().as_default():
            with tf.compat.v1.device(f"/job:ps/task:{index}"):
                enqueue = _done_queue().enqueue(message)
            config = tf.compat.v1.ConfigProto(
                device_filters=[f"/job:ps/task:{index}"],
                # Bounds session creation and closing against a ps that is gone.
                operation_timeout_in_ms=int(timeout_secs * 1000))
            try:
                with tf.compat.v1.Session(f"grpc://{address}", config=config) as session:
                    session.run(enqueue, options=tf.compat.v1.RunOptions(
                        timeout_in_ms=int(timeout_secs * 1000)))
            except tf.errors.OpError as e:
                # The message's first line is often just "Graph execution error:".
                reason = [line for line in e.message.splitlines() if line.strip()][-1]
                log.warning("could not tell parameter server %d (%s) that %s %s: %s",
                            index, address, task, what, reason)
