"""The ports a launched cluster's tasks listen on: chosen where nothing else is handed them.

A port that was free when the launcher chose it must still be free when the task binds it,
seconds later. Ports the kernel picks for ``bind(0)`` come from the range it also gives every
outgoing connection its local port from (Linux's default 32768-60999,
``/proc/sys/net/ipv4/ip_local_port_range``), so on a busy host any client connection can take
one meanwhile, and the task fails to start its server. So the ports are drawn at random below
that range, where the kernel hands none out by itself; only another program that asks for a
port by number can still take one. Standard library only: a Ray node's actor imports it
(``ray_node``).
"""

import contextlib
import random
import socket

# The 12,768 ports just below Linux's default ephemeral range (above); the lower ports, where
# well-known services and TensorFlow's customary 2222 listen, are left alone.
PORT_RANGE = (20000, 32767)
# Random ports tried before giving up: 200 taken in a row means the range is nearly full.
_TRIES = 200


def bind_free(host: str, taken: frozenset = frozenset()) -> socket.socket:
    """A socket bound to a free port of ``host`` in ``PORT_RANGE``, not one of ``taken``.

    Raises:
      OSError: no free port found in ``_TRIES`` attempts.
    """
    candidates = random.sample(range(PORT_RANGE[0], PORT_RANGE[1] + 1), _TRIES)
    for port in candidates:
        if port in taken:
            continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, port))
            return sock
        except OSError:
            sock.close()
    raise OSError(f"no free port in {PORT_RANGE[0]}-{PORT_RANGE[1]} on {host} "
                  f"({_TRIES} tried)")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports of ``host`` that were free a moment ago.

    Every socket stays bound until all ports are chosen, so the ports differ. A program that
    asks for one of them by number could still take it before the task binds it; the task then
    fails with one line (``task.peers.own_server``) and the launcher reports it."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(bind_free(host, frozenset(ports)))
            ports.append(sock.getsockname()[1])
        return ports
