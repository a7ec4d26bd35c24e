"""Who can reach a local cluster's tasks: nobody outside their private network namespace.

TensorFlow's gRPC server listens on 0.0.0.0 and has no authentication. The launcher puts its
tasks in a network namespace of their own (``platform.netns``), or says in its first line that
they listen on every interface of this host. These tests look from this process, in the host's
namespace, at real tasks: their ports are not listening here on any address, and a connection
is refused, while the job trains to its end.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from cifar10_estimator.launch import layout
from cifar10_estimator.errors import UserError
from cluster_fixtures import frozen
from trainer_fixtures import REPO, run_module, trainer_args, wait_until

# TCP state LISTEN in /proc/net/tcp and tcp6: include/net/tcp_states.h.
TCP_LISTEN = "0A"


def _listening_ports(net_folder: str) -> set[int]:
    """The TCP ports a network namespace listens on, any address: ``/proc/PID/net``'s view,
    or ``/proc/self/net`` for this process's own namespace."""
    ports = set()
    for name in ("tcp", "tcp6"):
        path = os.path.join(net_folder, name)
        if not os.path.exists(path):
            continue  # no IPv6 here
        with open(path) as f:
            for row in f.readlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                if state == TCP_LISTEN:
                    ports.add(int(local.rpartition(":")[2], 16))
    return ports


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def _task_ports(text: str) -> list[int]:
    spec = json.loads(re.search(r"^\[cluster\] cluster (\{.*\})$", text, re.M).group(1))
    return [int(a.rpartition(":")[2]) for job in spec.values() for a in job]


# The two launches these checks need run in tests/test_distributed.py, whose asynchronous
# cluster (private network, the default) and synchronous one (--network host) they look at: a
# cluster of its own here would cost as much again.

def check_private_network(cluster, listening: list[str]) -> str | None:
    """A local cluster's tasks cannot be reached from this host: the checks on ``cluster``
    (``conftest.launch``'s, training, its chief past its first step), whose tasks ``listening``
    serve TensorFlow (the evaluator serves nothing). Where this system refuses a private
    network namespace (not Linux, or neither root nor user namespaces) it checks nothing and
    returns the launcher's line that says so, for the caller to skip with once its own checks
    have run."""
    pids = cluster.pids()
    if "this system refused a private network namespace" not in cluster.text():
        # A worker's server starts when its Estimator does, which in an asynchronous cluster
        # can be after the chief's first step; the parameter server lives until every
        # trainer has reported, so its namespace is there to look in.
        ports = _task_ports(cluster.text())
        wait_until(lambda: set(ports) <= _listening_ports(f"/proc/{pids['ps0']}/net"),
                   "every task's server listening", timeout=120, interval=0.2)
    # Frozen, the chief cannot finish during the checks.
    with frozen(pids["chief"]):
        text = cluster.text()
        first = text.splitlines()[0]
        if "this system refused a private network namespace" in first:
            return first
        # As root a network namespace; as another user, a user namespace owning one.
        listed = ", ".join(f"127\\.0\\.0\\.1:{2222 + i}" for i in range(len(listening)))
        assert re.match(r"\[cluster\] network: private: the tasks run in a (user and )?"
                        r"network namespace of their own, which other hosts and this "
                        r"host's other processes cannot reach; they listen there on "
                        rf"{listed}$", first), first
        ports = _task_ports(text)
        assert len(ports) == len(listening)
        ours = os.readlink("/proc/self/ns/net")
        (theirs,) = {os.readlink(f"/proc/{pid}/ns/net") for pid in pids.values()}
        assert theirs != ours  # one namespace for every task, not this host's
        # In their namespace the ports listen (so the check below can see them) ...
        assert set(ports) <= _listening_ports(f"/proc/{pids['ps0']}/net")
        # ... and in this host's, on no address at all, nor does anything answer.
        assert not set(ports) & _listening_ports("/proc/self/net")
        assert all(_refused(port) for port in ports)
        # The tasks' process groups are their own, as before the namespace.
        assert all(os.getpgid(pid) == pid for pid in pids.values())
    return None


def check_host_network_first_line(text: str) -> None:
    """A cluster on this host's network (``--network host``) says so first: the output
    ``text`` of its launcher."""
    ports = ", ".join(map(str, sorted(_task_ports(text))))  # the line lists them in order
    assert text.splitlines()[0] == (
        f"[cluster] network: this host's (--network host): the tasks listen on every "
        f"interface of this host (0.0.0.0, ports {ports}), and TensorFlow's gRPC server has "
        f"no authentication; run only on a trusted network")


# --- choosing the network: no TensorFlow, no cluster ------------------------------------------

def test_a_url_the_tasks_must_reach_keeps_this_hosts_network_and_says_why():
    paths = {"--data-dir": "data", "--job-dir": "s3://bucket/job", "--export-dir": None}
    network = layout.choose_network(layout.AUTO, paths, "127.0.0.1", os.geteuid(),
                                    os.getegid())
    assert network.namespace is None
    line = network.line(["127.0.0.1:5000"])
    assert line.startswith("network: this host's (--job-dir s3://bucket/job is reached over "
                           "the network, which a private namespace has none of): the tasks "
                           "listen on every interface of this host (0.0.0.0, ports 5000)")
    with pytest.raises(UserError, match=r"^--network private: the tasks must reach --job-dir "
                                        r"s3://bucket/job over the network"):
        layout.choose_network(layout.PRIVATE, paths, "127.0.0.1", 0, 0)
    # ram:// lives in each process's memory: no network needed.
    assert layout.choose_network(layout.HOST, {"--job-dir": "ram://j"}, "127.0.0.1", 0,
                                 0).why_host == "--network host"


def test_a_private_namespace_has_only_a_loopback_address():
    with pytest.raises(UserError, match=r"^--host 10\.0\.0\.1: a private network namespace "
                                        r"has only a loopback interface"):
        layout.choose_network(layout.PRIVATE, {}, "10.0.0.1", 0, 0)
    network = layout.choose_network(layout.AUTO, {}, "10.0.0.1", 0, 0)
    assert network.namespace is None
    assert network.why_host == "--host 10.0.0.1 is no loopback address"


def test_the_command_refuses_a_private_network_for_a_bucket_in_one_line(tmp_path):
    proc = run_module("cifar10_estimator.cluster", "--network", "private", "--",
                      *trainer_args(tmp_path, "s3://bucket/job"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "cifar10_estimator.cluster: error: --network private: the tasks must reach --job-dir "
        "s3://bucket/job over the network, and a private namespace has none; use --network "
        "host on a trusted network"]


# A process in a fresh namespace listens on 0.0.0.0 as TensorFlow does and reaches itself over
# the loopback (so ``lo`` is up); the process that made the namespace, outside it, is refused.
# A subprocess, forked without exec: it runs as another user where the test asks, and the
# suite's own process (with pytest-xdist's threads) never forks.
_PROBE = """
import json, os, socket, sys
from cifar10_estimator.platform import netns
try:
    ns = netns.create(os.geteuid(), os.getegid())
except netns.Unavailable as e:
    print(json.dumps({"unavailable": str(e)}))
    sys.exit(0)
port_read, port_write = os.pipe()
done_read, done_write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(done_write)
    ns.join()
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    socket.create_connection(("127.0.0.1", s.getsockname()[1]), timeout=5).close()
    os.write(port_write, str(s.getsockname()[1]).encode())
    os.read(done_read, 1)  # until the parent has tried
    os._exit(0)
port = int(os.read(port_read, 16))
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    reached = True
except ConnectionRefusedError:
    reached = False
inside = os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
os.close(done_write)
os.waitpid(pid, 0)
print(json.dumps({"kind": ns.kind, "reached": reached, "inside": inside}))
ns.close()
"""


def _probe(*prefix: str) -> dict:
    proc = subprocess.run([*prefix, sys.executable, "-c", _PROBE], capture_output=True,
                          text=True, timeout=60, cwd="/", env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    if "unavailable" in result:
        pytest.skip(f"this system refuses a network namespace: {result['unavailable']}")
    return result


def test_a_namespace_hides_a_listener_on_every_interface():
    result = _probe()
    assert result["inside"] and not result["reached"], result


def test_an_unprivileged_user_gets_a_user_namespace_that_hides_it_too():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root (to become another user) and util-linux's setpriv")
    with open("/proc/sys/user/max_user_namespaces") as f:
        if int(f.read()) == 0:
            pytest.skip("user namespaces are disabled here (user.max_user_namespaces = 0)")
    nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    # An interpreter that user cannot start (pyenv's builds with a shared libpython under
    # /root, say) says nothing about namespaces.
    start = subprocess.run([*nobody, sys.executable, "-c", "pass"], capture_output=True,
                           text=True, timeout=60)
    if start.returncode != 0:
        pytest.skip(f"user 65534 cannot start {sys.executable}: "
                    f"{start.stderr.strip().splitlines()[-1:]}")
    result = _probe(*nobody)
    assert result == {"kind": "a user and network namespace", "reached": False,
                      "inside": True}, result


@pytest.mark.parametrize("flag", ["--max-failures", "--placement-timeout-secs"])
def test_the_ray_only_flags_are_refused_without_ray_in_one_line(tmp_path, flag):
    proc = run_module("cifar10_estimator.cluster", flag, "2", "--",
                      *trainer_args(tmp_path, tmp_path / "job"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"cifar10_estimator.cluster: error: {flag} applies with --ray only (a local task "
        f"that fails fails the job; rerun the command to resume)"]
    assert not (tmp_path / "job").exists()
