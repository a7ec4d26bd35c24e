"""What each task's Ray actor runs on its node for ``cifar10-cluster --ray``
(``ray_actors``): it holds the task's port until the trainer starts, starts the trainer
process with the node's environment plus what the launcher sends, and hands its output, its
exit status and signals across.

The trainer inherits the actor's environment, which is its node's (with what Ray sets for the
actor, such as ``OMP_NUM_THREADS``); ``env`` (POSIX's utility) adds the launcher's variables on
top, so nothing here reads the environment itself (docs/architecture.md).
"""

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Optional

from cifar10_estimator.launch import ports
from cifar10_estimator.platform.parent_death import end_with_parent

# POSIX's env utility, by the path every Linux and macOS has it at, found without the node's
# PATH.
ENV = "/usr/bin/env"


class TaskRunner:
    """One task of the cluster on a Ray node: its port, its trainer process, its output."""

    def __init__(self):
        self._process: Optional[subprocess.Popen] = None
        self._lines: collections.deque = collections.deque()
        self._reader: Optional[threading.Thread] = None
        self._port: Optional[socket.socket] = None

    def reserve(self) -> tuple[str, int, str]:
        """Binds a free port on this node and keeps it: (node address, port, node id)."""
        import ray

        # Held bound until the trainer starts (``ports``: below the ephemeral range).
        # TensorFlow's gRPC server turns SO_REUSEPORT off, so the actor lets go just before
        # the trainer binds.
        sock = ports.bind_free("0.0.0.0")
        self._port = sock
        context = ray.get_runtime_context()
        return ray.util.get_node_ip_address(), sock.getsockname()[1], context.get_node_id()

    def sees(self, path: str, content: Optional[bytes] = None, size: Optional[int] = None
             ) -> bool:
        """Whether this node sees the file ``path`` with ``content`` (or of ``size`` bytes)."""
        try:
            if content is not None:
                with open(path, "rb") as f:
                    return f.read(len(content) + 1) == content
            return os.path.getsize(path) == size
        except OSError:
            return False

    def start(self, args: list[str], env: dict[str, str]) -> int:
        """Starts ``python -m cifar10_estimator args`` with this node's environment and
        ``env``; returns its pid."""
        self._lines.clear()
        self._release()  # the trainer binds it now
        self._process = subprocess.Popen(
            # env(1) sets ``env`` on top of the environment it inherits from this actor, then
            # execs the trainer in its own place: the pid and the signals are the trainer's.
            [ENV, "--", *(f"{name}={value}" for name, value in env.items()),
             sys.executable, "-m", "cifar10_estimator", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            # SIGKILL once this actor's process ends (its node died, or Ray stopped the
            # actor): a trainer outliving its actor would go on training, holding the job
            # dir's lock, beside the job the launcher places again (``ray_actors``).
            start_new_session=True, preexec_fn=end_with_parent(signal.SIGKILL))
        self._reader = threading.Thread(target=self._read, args=(self._process,), daemon=True)
        self._reader.start()
        return self._process.pid

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self._lines.append(line)

    def _release(self) -> None:
        port, self._port = self._port, None
        if port is not None:
            port.close()

    def read(self) -> tuple[list[str], Optional[int]]:
        """The output lines since the last call, and the exit status once the process has
        ended and its output is all read (None before)."""
        lines = []
        while self._lines:
            lines.append(self._lines.popleft())
        code = self._process.poll() if self._process else None
        if code is not None and self._reader is not None and self._reader.is_alive():
            code = None  # lines still coming
        if code is not None and self._lines:
            code = None
        return lines, code

    def poll(self) -> Optional[int]:
        return self._process.poll() if self._process else None

    def send(self, signum: int) -> None:
        """Sends ``signum`` to the trainer's process group."""
        if self._process is not None and self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signum)
            except ProcessLookupError:
                pass
