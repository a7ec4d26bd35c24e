"""One trainer per job dir: a lock file that a living trainer keeps fresh, and a dead one does not.

Two trainers on one job dir overwrite each other's checkpoints and summaries. A local run or a
cluster's chief therefore holds ``JOB/trainer.lock`` while it runs (workers and the evaluator
do not: they write no checkpoints). A second one is refused at once with one line naming the
holder (host, pid, since when) and what to do.

Why not ``fcntl``/``flock`` advisory locks: on the shared file systems a cluster uses they are
unreliable or missing (NFS needs a working lock manager, FUSE-mounted buckets have none), and
a lock held by a lost node is never released. Instead:

- On a file system the lock is created with ``O_CREAT | O_EXCL``, atomic on local file systems
  and on NFS v3+. Object storage (``s3://``, ``gs://``) has no create-if-absent through
  ``tf.io.gfile``, so there the lock is a lease: a trainer that finds none writes its own, waits
  ``SETTLE_SECS`` and holds the lock only if the lease it reads back is still its own. Of two
  trainers that both found none, the later write wins and the earlier trainer reads it back;
  this holds while finding-then-writing takes less than ``SETTLE_SECS`` (one request's round
  trip, milliseconds) and the store reads back what was written at once (S3 since December
  2020, GCS always: both document strong read-after-write consistency).
- It records the holder: host name, the kernel's boot id, pid and the process's start time.
- The holder rewrites it every ``HEARTBEAT_SECS``; each rewrite bumps a counter.
- A lock is stale when its holder is known dead: on the same machine (same host name and boot
  id), when no process with that pid and start time runs (a ``kill -9``, a container that
  restarted, even one that got the same pid); on another machine, when its counter does not move
  for ``STALE_SECS`` (a power loss, a lost node). A stale lock is taken over (on a file system
  renamed away, so that of two trainers racing for it only one wins; on object storage deleted,
  and the lease written anew as above) and the run goes on; a dead holder never blocks a rerun,
  at worst it delays one on another machine by ``STALE_SECS``.
- The holder deletes the lock when it ends, however it ends short of SIGKILL.

What it does not do: fence a holder that stopped beating but still runs (a machine frozen for
over ``STALE_SECS``, then thawed). Such a holder finds the lock taken over at its next beat and
says so; the two then share the job dir until one ends.
"""

import dataclasses
import datetime
import json
import logging
import os
import socket
import threading
import time
from typing import Callable, Optional

from cifar10_estimator import storage
from cifar10_estimator.errors import UserError

log = logging.getLogger("cifar10_estimator")

LOCK_FILE = "trainer.lock"
HEARTBEAT_SECS = 10.0
# Six missed heartbeats: a living holder on a busy machine still writes well within it.
STALE_SECS = 60.0
# A lease's wait before reading itself back, on object storage (see above). Two seconds is
# hundreds of request round trips, and short beside a trainer's start.
SETTLE_SECS = 2.0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) is in parentheses and may hold spaces.
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lock."""

    host: str
    boot_id: str
    pid: int
    start_ticks: Optional[int]
    since: str  # ISO 8601, for people
    beat: int = 0  # heartbeat counter

    @classmethod
    def this_process(cls) -> "Holder":
        return cls(socket.gethostname(), _boot_id(), os.getpid(), _start_ticks(os.getpid()),
                   datetime.datetime.now().astimezone().isoformat(timespec="seconds"))

    def same_machine(self) -> bool:
        return self.host == socket.gethostname() and self.boot_id == _boot_id()

    def alive_here(self) -> bool:
        """On this machine: whether the holding process still runs (the same pid and start
        time; without /proc, whether the pid exists)."""
        now = _start_ticks(self.pid)
        if now is not None and self.start_ticks is not None:
            return now == self.start_ticks
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, since {self.since}"


def _read(path: str) -> Optional[Holder]:
    try:
        return Holder(**json.loads(storage.read_bytes(path)))
    except FileNotFoundError:
        raise
    except (OSError, ValueError, TypeError):
        return None  # half-written by a holder that died mid-write: no holder to ask


class JobLock:
    """``with JobLock(job_dir):`` holds the job dir's lock for the block."""

    def __init__(self, job_dir: str, heartbeat_secs: float = HEARTBEAT_SECS,
                 stale_secs: float = STALE_SECS, settle_secs: float = SETTLE_SECS,
                 sleep: Callable[[float], None] = time.sleep):
        self.path = storage.join(job_dir, LOCK_FILE)
        self.job_dir = job_dir
        self.heartbeat_secs = heartbeat_secs
        self.stale_secs = stale_secs
        self.settle_secs = settle_secs
        self._sleep = sleep
        self._me: Optional[Holder] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "JobLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        """Takes the lock, taking over a stale one; UserError if a living trainer holds it."""
        me = Holder.this_process()
        try:
            while not self._create(me):
                self._take_over_if_stale()
        except OSError as e:
            raise UserError(f"cannot write the lock {self.path} ({e.strerror}); "
                            f"{storage.fix_for(self.job_dir, '--job-dir')}") from None
        self._me = me
        self._thread = threading.Thread(target=self._beat, name="job_lock_heartbeat",
                                        daemon=True)
        self._thread.start()

    def _create(self, me: Holder) -> bool:
        """Writes ``me`` as the holder if there is none; whether this process now holds it."""
        body = json.dumps(dataclasses.asdict(me)).encode()
        if not storage.is_url(self.path):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, storage.FILE_MODE)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            return True
        if storage.exists(self.path):
            return False
        storage.write_bytes_atomic(self.path, body)
        self._sleep(self.settle_secs)  # a trainer that also found none writes meanwhile
        try:
            return _read(self.path) == me
        except FileNotFoundError:
            return False

    def _take_over_if_stale(self) -> None:
        try:
            holder = _read(self.path)
            if holder is None:  # being written by a trainer that just created it, or by one
                self._sleep(1.0)  # that died mid-write: look once more
                holder = _read(self.path)
        except FileNotFoundError:
            return  # released meanwhile: try again
        if holder is not None and holder.same_machine():
            if holder.alive_here():
                raise self._refusal(holder)
        elif holder is not None and self._beats_on(holder):
            raise self._refusal(holder)
        if storage.is_url(self.path):
            storage.remove(self.path)  # the next lease decides between trainers taking over
        else:
            stale = f"{self.path}.stale-{os.getpid()}"
            try:
                os.rename(self.path, stale)  # of two trainers taking over, one wins
            except FileNotFoundError:
                return
            os.remove(stale)
        log.info("took over %s: its holder (%s) is gone", self.path,
                 holder.describe() if holder else "unknown")

    def _beats_on(self, holder: Holder) -> bool:
        """Watches a holder on another machine: True as soon as its heartbeat moves."""
        log.info("%s is held by %s on another machine; waiting up to %.0f s for a sign of life",
                 self.path, holder.describe(), self.stale_secs)
        waited = 0.0
        while waited < self.stale_secs:
            self._sleep(1.0)
            waited += 1.0
            try:
                now = _read(self.path)
            except FileNotFoundError:
                return False
            if now is None or now.pid != holder.pid or now.host != holder.host:
                return False  # replaced meanwhile: look again
            if now.beat != holder.beat:
                return True
        return False

    def _refusal(self, holder: Holder) -> UserError:
        return UserError(
            f"--job-dir {self.job_dir} is in use by another trainer "
            f"({holder.describe()}); wait for it to end, stop it, or use another --job-dir")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_secs):
            try:
                if _read(self.path) != self._me:
                    log.warning("%s was taken over by another trainer", self.path)
                    return
                beat = dataclasses.replace(self._me, beat=self._me.beat + 1)
                storage.write_bytes_atomic(self.path,
                                           json.dumps(dataclasses.asdict(beat)).encode())
                self._me = beat
            except OSError:
                continue  # a full disk or a hiccup of the shared file system: beat again later

    def release(self) -> None:
        """Stops the heartbeat and deletes the lock if it is still this process's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if self._me is not None and _read(self.path) == self._me:
                storage.remove(self.path)
        except (FileNotFoundError, OSError):
            pass
        self._me = None
