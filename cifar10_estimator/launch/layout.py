"""Where a training cluster's tasks are: its network, its ports, its tasks and their
``TF_CONFIG`` values.

``choose_network`` decides where the tasks' ports are. TensorFlow's gRPC server listens on every
interface (``0.0.0.0:PORT``, whatever the cluster spec says) and has no authentication, so by
default the tasks run in a network namespace of their own (``platform.netns``): one namespace for
the whole cluster, with only its loopback interface, which neither other hosts nor this host's
other processes reach. The launcher itself stays in the host's network and never connects to a
task. The tasks keep this host's network instead when the user asks (``--network host``), when
a path of the job is a URL that they must reach over the network (``s3://``, ``gs://``: a
private namespace reaches nothing outside it), or when the system refuses a namespace. The
launcher's first line (``Network.line``) says which, and why.

``lay_out`` lays out the tasks of a TensorFlow cluster on ports of one address:

- ``num_workers`` training tasks in all: task ``chief`` and ``worker`` 0..N-2;
- ``num_ps`` parameter servers ``ps`` 0..M-1 (none for a collective all-reduce cluster);
- optionally one ``evaluator`` task. It is left out of the cluster spec (it serves nothing);
  Estimator also accepts it listed there, as Kubeflow's operator lists it.

``loop`` runs these tasks, as processes of this host (``local``) or as Ray actors
(``ray_actors``, which lays out the same tasks on the addresses of a Ray cluster's nodes:
``tasks_of``).
"""

import dataclasses
import ipaddress
import json
import signal
import subprocess
import threading
from typing import Mapping, Optional, Sequence

from cifar10_estimator import storage
from cifar10_estimator.errors import UserError
from cifar10_estimator.launch import ports
from cifar10_estimator.platform import netns

# In a private namespace every port is free: the tasks take consecutive ports from 2222,
# TensorFlow's customary one, which Kubeflow's operator gives every replica (k8s/tfjob.yaml).
PRIVATE_FIRST_PORT = 2222

AUTO, PRIVATE, HOST = "auto", "private", "host"
NETWORKS = (AUTO, PRIVATE, HOST)
# Schemes whose paths need no network: TensorFlow's in-memory file system and local files.
_LOCAL_SCHEMES = ("ram", "file")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass
class Network:
    """Where the tasks' ports are: a private network namespace (``namespace``), or this host's
    network (``namespace`` None, for the reason ``why_host``)."""

    namespace: Optional[netns.Namespace] = None
    why_host: str = "no private namespace was asked for"

    def ports(self, count: int, host: str) -> list[int]:
        if self.namespace is not None:
            return list(range(PRIVATE_FIRST_PORT, PRIVATE_FIRST_PORT + count))
        return ports.free_ports(count, host)

    def line(self, addresses: Sequence[str]) -> str:
        """The launcher's first line: where the tasks listen, and who can reach them."""
        addresses = sorted(addresses, key=lambda a: int(a.rpartition(":")[2]))
        if self.namespace is not None:
            return (f"network: private: the tasks run in {self.namespace.kind} of their own, "
                    f"which other hosts and this host's other processes cannot reach; "
                    f"they listen there on {', '.join(addresses)}")
        ports = ", ".join(a.rpartition(":")[2] for a in addresses)
        return (f"network: this host's ({self.why_host}): the tasks listen on every interface "
                f"of this host (0.0.0.0, ports {ports}), and TensorFlow's gRPC server has no "
                f"authentication; run only on a trusted network")

    def join(self) -> None:
        """For ``preexec_fn``: the new task's process enters the namespace, if any."""
        if self.namespace is not None:
            self.namespace.join()

    def close(self) -> None:
        if self.namespace is not None:
            self.namespace.close()


def choose_network(mode: str, paths: dict[str, Optional[str]], host: str, uid: int, gid: int
                   ) -> Network:
    """The network of a cluster: ``mode`` is ``auto``, ``private`` or ``host`` (``--network``);
    ``paths`` the job's paths by flag (``--job-dir``: ...); ``host`` the address in the cluster
    spec; ``uid`` and ``gid`` the launcher's effective ids (for a user namespace). ``auto`` is
    a private namespace where one can work and the system allows it; ``private`` fails with a
    ``UserError`` where ``auto`` would fall back to this host's network."""
    if mode not in NETWORKS:
        raise UserError(f"--network {mode}: choose one of {', '.join(NETWORKS)}")
    if mode == HOST:
        return Network(None, "--network host")
    remote = [f"{flag} {path}" for flag, path in paths.items()
              if path and storage.is_url(path) and storage.scheme(path) not in _LOCAL_SCHEMES]
    if remote:
        if mode == PRIVATE:
            raise UserError(f"--network private: the tasks must reach {remote[0]} over the "
                            f"network, and a private namespace has none; use --network host "
                            f"on a trusted network")
        return Network(None, f"{remote[0]} is reached over the network, which a private "
                             f"namespace has none of")
    if not _is_loopback(host):
        if mode == PRIVATE:
            raise UserError(f"--host {host}: a private network namespace has only a loopback "
                            f"interface; leave --host out, or use --network host")
        return Network(None, f"--host {host} is no loopback address")
    try:
        return Network(netns.create(uid, gid))
    except netns.Unavailable as e:
        if mode == PRIVATE:
            raise UserError(f"--network private: this system refused a network namespace "
                            f"({e}); use --network host on a trusted network") from None
        return Network(None, f"this system refused a private network namespace: {e}")


def make_cluster(num_workers: int, num_ps: int, host: str, ports: Sequence[int]
                 ) -> dict[str, list[str]]:
    """The cluster spec: ``chief`` (1), ``worker`` (num_workers - 1), ``ps`` (num_ps)."""
    if len(ports) != num_workers + num_ps:
        raise ValueError(f"need {num_workers + num_ps} ports, got {len(ports)}")
    return cluster_of(num_workers, num_ps, [f"{host}:{p}" for p in ports])


def cluster_of(num_workers: int, num_ps: int, addresses: Sequence[str]
               ) -> dict[str, list[str]]:
    """The cluster spec of ``addresses``: the chief's, the workers', then the ps'."""
    addresses = list(addresses)
    cluster = {"chief": addresses[:1]}
    if num_ps:
        cluster["ps"] = addresses[num_workers:]
    if num_workers > 1:
        cluster["worker"] = addresses[1:num_workers]
    return cluster


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> str:
    """The ``TF_CONFIG`` value of one task (an evaluator gets the same cluster)."""
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def ended_by_signal(code: Optional[int]) -> bool:
    """Whether a trainer's exit status ``code`` says a signal ended it: 128 or more (its own
    143 after SIGTERM, having saved; 130 after SIGINT; a shell's 128 + N), or negative, killed
    outright (``subprocess``'s -N). Such a trainer is started again, as Kubernetes' ExitCode
    restart policy does (1 to 127 are the trainer's own failures)."""
    return code is not None and (code >= 128 or code < 0)


def how_ended(code: int) -> str:
    """How a trainer that a signal ended ended, in words: its exit status, or the signal."""
    return f"exit status {code}" if code > 0 else f"killed by {signal.Signals(-code).name}"


def task_name(task_type: str, index: int) -> str:
    return task_type if task_type in ("chief", "evaluator") else f"{task_type}{index}"


@dataclasses.dataclass
class LaunchedTask:
    """One task of the cluster as the launcher sees it: its role and ``TF_CONFIG``, and its
    process once the launch loop (``loop``) has started it, here or on a Ray node. (Inside the
    task, the trainer's own state is ``training.start.StartedTask``.)"""

    task_type: str
    index: int
    tf_config: str
    process: Optional[subprocess.Popen] = None
    stopped: bool = False  # terminated by the launcher
    reader: Optional[threading.Thread] = None

    @property
    def name(self) -> str:
        return task_name(self.task_type, self.index)

    def poll(self) -> Optional[int]:
        """Its exit status, None while it runs or before it started. On Ray a call to its
        actor: the launch loop reads it once per tick (``loop.LaunchLoop.run``)."""
        return self.process.poll() if self.process else None

    def signalled(self, code: Optional[int]) -> bool:
        """Whether exit status ``code`` means a signal, not the launcher, stopped the task: 128
        or more (the trainer's own 143 after SIGTERM, 130 after SIGINT), or killed outright."""
        return ended_by_signal(code) and not self.stopped


def lay_out(num_workers: int, num_ps: int, evaluator: bool, host: str = "127.0.0.1",
            network: Optional[Network] = None) -> list[LaunchedTask]:
    """The tasks of a cluster on ports of ``host``, parameter servers first: free ports of this
    host, or ``network``'s (from 2222 in a private namespace)."""
    check_sizes(num_workers, num_ps)
    ports = (network or Network()).ports(num_workers + num_ps, host)
    return tasks_of(make_cluster(num_workers, num_ps, host, ports), evaluator)


def check_sizes(num_workers: int, num_ps: int) -> None:
    if num_workers < 1:
        raise UserError(f"--num-workers must be 1 or more (the chief counts), got {num_workers}")
    if num_ps < 0:
        raise UserError(f"--num-ps must be 0 or more, got {num_ps}")


def tasks_of(cluster: Mapping[str, Sequence[str]], evaluator: bool) -> list[LaunchedTask]:
    """One task per address of ``cluster`` (parameter servers first), and the evaluator."""
    tasks = [LaunchedTask("ps", i, tf_config(cluster, "ps", i))
             for i in range(len(cluster.get("ps", ())))]
    tasks.append(LaunchedTask("chief", 0, tf_config(cluster, "chief", 0)))
    tasks += [LaunchedTask("worker", i, tf_config(cluster, "worker", i))
              for i in range(len(cluster.get("worker", ())))]
    if evaluator:
        tasks.append(LaunchedTask("evaluator", 0, tf_config(cluster, "evaluator", 0)))
    return tasks
