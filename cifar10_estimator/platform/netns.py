"""A network namespace of a group of processes' own: made once, joined by each of them.

TensorFlow's gRPC server listens on every interface (``0.0.0.0:PORT``, hard-coded in
grpc_server_lib.cc, whatever the cluster spec says) and has no authentication: whoever reaches
a task's port can run operations in it. Processes in a network namespace of their own have
only that namespace's loopback interface, which nothing outside the namespace reaches, neither
other hosts nor this host's other processes.

- ``create(uid, gid)`` makes the namespace and brings its loopback up (a new namespace's ``lo``
  is down). As root (CAP_SYS_ADMIN) that is ``unshare(CLONE_NEWNET)``. Otherwise, where the
  kernel lets unprivileged users make user namespaces, a user namespace that maps ``uid`` and
  ``gid`` to themselves, owning a network namespace: the processes keep their own ids and
  files, and gain no privilege (their capabilities in it end when they exec).
- ``Namespace.join`` puts the calling process into it; it is meant for ``subprocess.Popen``'s
  ``preexec_fn``, between fork and exec, where the child is single-threaded, as
  ``setns(CLONE_NEWUSER)`` requires.
- ``Unavailable`` says why the system refused (not Linux, no permission, a kernel without
  namespaces).

The namespace is made in a forked helper that exits at once: it lives on while this process
holds its two file descriptors (``Namespace.close`` lets go) or any process is in it. Nothing
here changes the calling process's own namespaces, and no external program (util-linux's
``unshare``, iproute2's ``ip``) is needed: libc's ``unshare`` and ``setns`` through ctypes, and
one ``ioctl`` for the loopback. (``unshare --map-current-user`` followed by ``ip link set lo
up`` would not do as an unprivileged user: the capabilities in the user namespace end at the
exec of ``ip``, so ``lo`` stays down.)
"""

import ctypes
import dataclasses
import errno
import fcntl
import os
import socket
import struct
import sys
from typing import Optional

# Namespace flags of unshare(2) and setns(2): linux/sched.h.
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
# Interface flag ioctls: linux/sockios.h.
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
# The interface is up: linux/if.h.
IFF_UP = 0x1
# struct ifreq (linux/if.h): a name of IFNAMSIZ (16) bytes, then a union whose largest member
# makes it 40 bytes on 64-bit Linux (32 on 32-bit). ifr_flags, an unsigned short as used here,
# starts the union. A longer buffer is harmless: the kernel copies sizeof(struct ifreq).
IFNAMSIZ = 16
IFREQ_SIZE = 40
_IFREQ_FLAGS = struct.Struct(f"{IFNAMSIZ}sH")


class Unavailable(Exception):
    """The system refused a network namespace; the message says why, in a few words."""


def _libc() -> ctypes.CDLL:
    # dlopen(NULL): the interpreter's own symbols, libc's among them; ctypes.util.find_library
    # would run ldconfig (or a compiler) to find the same library.
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _write(path: str, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError as e:
        raise type(e)(e.errno, f"writing {path}: {e.strerror}") from None


def loopback_up() -> None:
    """Sets ``lo`` of the calling thread's network namespace up (SIOCSIFFLAGS, as ``ip link set
    lo up`` does). Needs CAP_NET_ADMIN in the namespace's user namespace."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = _IFREQ_FLAGS.pack(b"lo", 0).ljust(IFREQ_SIZE, b"\0")
        flags = _IFREQ_FLAGS.unpack_from(fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS,
                    _IFREQ_FLAGS.pack(b"lo", flags | IFF_UP).ljust(IFREQ_SIZE, b"\0"))


def _make_here(libc: ctypes.CDLL, uid: int, gid: int) -> str:
    """In the helper: leaves for a new network namespace, with a user namespace if that is
    what the system allows; returns ``net`` or ``user``. Raises OSError."""
    try:
        _check(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        kind = "net"
    except OSError as first:
        if first.errno != errno.EPERM:
            raise
        try:
            _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNET),
                   "unshare(CLONE_NEWUSER | CLONE_NEWNET)")
        except OSError as second:
            raise OSError(second.errno, f"{first.strerror}; {second.strerror}") from None
        # The one mapping an unprivileged process may write for itself: its own ids to
        # themselves (user_namespaces(7)); gid_map needs setgroups denied first (Linux 3.19+).
        _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        try:
            _write("/proc/self/setgroups", "deny")
        except FileNotFoundError:
            pass  # a kernel older than 3.19 has no such file and no such rule
        _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
        kind = "user"
    try:
        loopback_up()
    except OSError as e:
        raise OSError(e.errno, f"bringing lo up: {e.strerror}") from None
    return kind


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


@dataclasses.dataclass
class Namespace:
    """A private network namespace, held open by file descriptors of this process."""

    net: int  # an open /proc/PID/ns/net
    user: Optional[int]  # its owning user namespace's, when one was needed
    libc: ctypes.CDLL = dataclasses.field(repr=False)

    @property
    def kind(self) -> str:
        return "a user and network namespace" if self.user is not None else \
            "a network namespace"

    def join(self) -> None:
        """Moves the calling process into the namespace (the user namespace first, whose
        owner's processes may join it). For ``preexec_fn``: the caller must be
        single-threaded."""
        if self.user is not None:
            _check(self.libc.setns(self.user, CLONE_NEWUSER), "setns(CLONE_NEWUSER)")
        _check(self.libc.setns(self.net, CLONE_NEWNET), "setns(CLONE_NEWNET)")

    def close(self) -> None:
        """Lets the namespace go: it ends once no process is in it either."""
        for fd in (self.net, self.user):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.net, self.user = -1, None


def create(uid: int, gid: int) -> Namespace:
    """A new network namespace with its loopback up. ``uid`` and ``gid`` are the calling
    process's effective ids, which a user namespace maps to themselves where one is needed.
    Raises ``Unavailable``."""
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"network namespaces are Linux's, and this is {sys.platform}")
    if not os.path.exists("/proc/self/ns/net"):
        raise Unavailable("this kernel has no network namespaces (/proc/self/ns/net)")
    libc = _libc()
    ready_read, ready_write = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the helper: only system calls and os functions until os._exit
        try:
            os.close(ready_read)
            os.close(go_write)
            try:
                reply = "ok " + _make_here(libc, uid, gid)
            except OSError as e:
                reply = "error " + _reason(e)
            os.write(ready_write, reply.encode())
            os.close(ready_write)
            os.read(go_read, 1)  # until the parent holds the namespace (or is gone)
        finally:
            os._exit(0)
    os.close(ready_write)
    os.close(go_read)
    fds: list[int] = []
    try:
        reply = b""
        while chunk := os.read(ready_read, 4096):
            reply += chunk
        status, _, detail = reply.decode(errors="replace").partition(" ")
        if status != "ok":
            raise Unavailable(detail or "the helper that makes the namespace failed")
        fds.append(os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        if detail == "user":
            fds.append(os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC))
        return Namespace(fds[0], fds[1] if len(fds) > 1 else None, libc)
    except OSError as e:
        for fd in fds:
            os.close(fd)
        raise Unavailable(f"cannot open the namespace: {_reason(e)}") from None
    finally:
        os.close(ready_read)
        os.close(go_write)  # the helper exits
        os.waitpid(pid, 0)
