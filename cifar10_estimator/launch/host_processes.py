"""A cluster's tasks as processes of this host: the launch loop's placement (``loop.LaunchLoop``)
for the ``cluster`` command without ``--ray``.

Each task is a child process in a process group of its own (Ctrl-C reaches the launcher, which
stops the tasks in order), in the cluster's network (``layout.Network``: a private namespace,
joined between fork and exec, or this host's). A local task has nowhere else to be: its place
is never lost, so a task that failed fails the job.
"""

import signal
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from cifar10_estimator.launch.layout import LaunchedTask, Network
from cifar10_estimator.platform.parent_death import end_with_parent

# What a task gets when the launcher dies: SIGHUP, the hang-up of what controls it, not
# SIGTERM: the kernel may repeat it (platform.parent_death), and a second SIGTERM ends a
# trainer at once, in the middle of its save; a trainer takes its parent-death signal once
# (training.preemption).
PARENT_DEATH_SIGNAL = signal.SIGHUP


class HostProcesses:
    """The placement (``loop.Placement``) of tasks that run as processes of this host, in
    ``network``."""

    def __init__(self, network: Optional[Network] = None, python: str = sys.executable):
        self.network = network or Network()
        self.python = python

    def line(self, addresses: Sequence[str]) -> str:
        return self.network.line(addresses)

    def spawn(self, task: LaunchedTask, trainer_args: Sequence[str], env: Mapping[str, str]
              ) -> subprocess.Popen:
        end = end_with_parent(PARENT_DEATH_SIGNAL)

        def preexec() -> None:
            # Into the cluster's namespace between fork and exec, where the child is
            # single-threaded (setns into a user namespace requires it); no wrapper process,
            # so the pid the launcher says is the task's.
            self.network.join()
            # A launcher killed (kill -9, a lost terminal) stops its tasks as a preemption
            # does: each saves and exits, and the same command resumes the job.
            end()
        return subprocess.Popen(
            [self.python, "-m", "cifar10_estimator", *trainer_args],
            env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            # Own process group: Ctrl-C reaches the launcher, which stops tasks in order.
            start_new_session=True, preexec_fn=preexec)

    def where(self, task: LaunchedTask) -> str:
        return ""  # this host, which the network line has named

    def in_doubt(self, task: LaunchedTask) -> bool:
        return False

    def lost(self, task: LaunchedTask) -> Optional[str]:
        return None  # a process of this host ends; its place does not go away

    def place_again(self) -> list[LaunchedTask]:
        raise AssertionError("a local task's place is never lost")  # lost() is always None

    def summary(self) -> str:
        return "the tasks run on this host"

    def close(self) -> None:
        self.network.close()  # the namespace ends once its last task has exited
