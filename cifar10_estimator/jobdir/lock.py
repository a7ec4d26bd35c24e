"""One trainer per job dir: a lock file that a living trainer keeps fresh, and a dead one does not;
a trainer that loses it stops before it saves again.

Two trainers on one job dir overwrite each other's checkpoints and summaries. A local run or a
cluster's chief therefore holds ``JOB/trainer.lock`` while it runs (workers and the evaluator
do not: they write no checkpoints). A second one is refused at once with one line naming the
holder (host, pid, since when) and what to do.

Taking the lock:

- On a file system the lock is created with ``O_CREAT | O_EXCL``, atomic on local file systems
  and on NFS v3+. Object storage (``s3://``, ``gs://``) has no create-if-absent through
  ``tf.io.gfile`` (tensorflow-io 0.36's S3 client sends plain PutObject and CopyObject requests,
  without the ``If-None-Match`` precondition S3 now offers; TensorFlow's GCS client sends no
  ``ifGenerationMatch``), so there the lock is a lease: a trainer that finds none writes its
  own, waits, and holds the lock only if the lease it reads back is still its own. Of two
  trainers that both found none, the later write wins and the earlier trainer reads it back,
  provided the later one's find-then-write lands within the earlier one's wait. The wait is
  therefore measured, not fixed: ``SETTLE_SECS``, or ``SETTLE_FACTOR`` times the slowest
  find-then-write (or read-back) this trainer saw, whichever is longer; a store whose requests
  take seconds (the SDK's retries) gets a wait of several times that. Both stores read back what
  was written at once (S3 since December 2020, GCS always: both document strong
  read-after-write consistency).
- The lock file records the holder: host name, the kernel's boot id, pid, the process's start
  time, its PID namespace, and which kernel lock it holds (below).
- On a file system the holder also keeps an exclusive ``flock(2)`` on the job dir itself for
  its whole life, where the file system grants one (not on the lock file, which every
  heartbeat replaces by a rename). The kernel drops it when the process ends, however it ends
  and whatever PID namespace it ran in.
- The holder rewrites the lock file every ``HEARTBEAT_SECS``; each rewrite bumps a counter.

Judging a holder that is there:

- On the same kernel (same boot id) and the same job dir (same device and inode), when the
  holder recorded a kernel lock: a trainer that cannot take the ``flock`` knows a process holds
  it and is refused; one that can knows the holder has ended, and takes the lock over at once.
- Else, on the same machine (same host name and boot id) and in the same PID namespace: the
  holder lives while a process with its pid and start time runs (a ``kill -9``, a container
  that restarted, even one that got the same pid, are recognised as dead). Pids of another PID
  namespace say nothing here (a container with the same host name, ``/proc`` of its own), so
  they are never compared across namespaces.
- Else (another machine, or another PID namespace without a shared kernel lock): the holder
  lives while its counter moves; it is stale once the counter has not moved for
  ``STALE_SECS``, counted by the taker from after its first read returned to the start of its
  last one, so a slow read only lengthens the wait.

A stale lock is taken over (on a file system renamed away, so that of two trainers racing for
it only one wins, and put back if what was renamed turns out to be another taker's fresh lock;
on object storage deleted, and the lease written anew as above) and the run
goes on: a dead holder never blocks a rerun, at worst it delays one by ``STALE_SECS``. The
holder deletes the lock when it ends, however it ends short of SIGKILL.

Why not rely on ``flock`` alone: on the shared file systems a cluster uses it is unreliable or
missing. NFS locks go through a lock manager that NFSv3 needs running and that keeps a lost
node's locks until that node comes back, or stay within one client; a FUSE-mounted bucket's
locks reach at most the processes of its own mount. So a kernel lock is trusted only where the
kernel itself decides it: a holder under this very kernel (the same boot id) that locked this
very job dir (the same device and inode). A holder on another machine or another mount, and one
whose file system refused the ``flock`` (it then records none), is judged by the pid and
heartbeat rules above, as before there was a kernel lock.

Losing the lock (``check``, ``LockLost``): a holder has lost it once the lock file names another
holder, is gone or is unreadable, or once its lease is too old for others to still see it alive:
its last successful heartbeat started over ``renew_within`` seconds ago (``STALE_SECS`` less a
margin of two heartbeats, 40 s by default). The margin covers what happens between a holder's
last check and the end of what that check allowed (a checkpoint's save, seconds) and the
difference between two machines' clock rates (parts per million). Time is counted on
``CLOCK_BOOTTIME``, which goes on while a machine is suspended. A heartbeat that lands later
than that renews nothing: a taker may have watched the counter stand still meanwhile. Losing is
for good. The heartbeat thread notices a takeover within one heartbeat; the training session
(``training.driver``) checks the verdict before every step, re-reads the lock file before every
checkpoint save, and stops with one line, saving nothing more.

What it does not do (docs/storage.md, "What remains, without a compare-and-swap"): compare-and-swap. Without one in the
store, a lease is safe only while another trainer's find-then-write lands within this trainer's
measured wait; if it lands later, both read back their own lease, and the one overwritten finds
the other's lease at its next heartbeat or checkpoint save, whichever comes first, and stops
without saving. Nor does it stop a save already under way: a checkpoint whose check passed
before the loss completes. A holder's heartbeat in flight when its lease ran out can land on a
taker's fresh lease: then both stop, and a rerun resumes. On a file system without a kernel lock
a trainer in another PID namespace of the same machine watches the heartbeat for up to
``STALE_SECS`` rather than be told at once.
"""

import dataclasses
import datetime
import errno
import fcntl
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
# The words of the refusal that a sweep's trial waits on (sweeps.trainable).
IN_USE = "is in use by another trainer"
HEARTBEAT_SECS = 10.0
# Six missed heartbeats: a living holder on a busy machine still writes well within it.
STALE_SECS = 60.0
# A lease's least wait before reading itself back, on object storage (see above). Two seconds is
# hundreds of request round trips, and short beside a trainer's start.
SETTLE_SECS = 2.0
# A lease's wait, in multiples of the slowest find-then-write (or read-back) this trainer saw.
# Another trainer's find-then-write is the same requests to the same store; what makes one much
# slower than another is retries, and aws-sdk-cpp's default retry strategy doubles its back-off
# with each retry (25 ms x 2^n): 4 leaves room for a peer that needed two retries more.
SETTLE_FACTOR = 4.0
# How a holder's lease runs out: STALE_SECS less this many heartbeats (see the module's doc).
RENEWAL_MARGIN_BEATS = 2
# A PID namespace that cannot be named (no /proc, or a /proc of another namespace): pids of it
# are never compared.
UNKNOWN_NAMESPACE = "unknown"


def _clock() -> float:
    """Seconds on a clock that goes on while the machine is suspended (``CLOCK_BOOTTIME``,
    clock_gettime(2)); ``time.monotonic``'s ``CLOCK_MONOTONIC`` stops then, and a suspended
    holder is exactly one whose lease runs out."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_ticks(pid) -> Optional[int]:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22;
    ``pid`` may be ``"self"``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) is in parentheses and may hold spaces.
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _pid_namespace() -> str:
    """This process's PID namespace (``pid:[inode]``), or ``UNKNOWN_NAMESPACE`` where /proc
    does not show it: missing, or mounted for another namespace (then /proc/<pid> names other
    processes than this process's pids do)."""
    try:
        if int(os.readlink("/proc/self")) != os.getpid():
            return UNKNOWN_NAMESPACE
        return os.readlink("/proc/self/ns/pid")
    except (OSError, ValueError):
        return UNKNOWN_NAMESPACE


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lock."""

    host: str
    boot_id: str
    pid: int
    start_ticks: Optional[int]
    since: str  # ISO 8601, for people
    beat: int = 0  # heartbeat counter
    # The holder's PID namespace; "" in locks written before it was recorded (judged as then).
    pid_ns: str = ""
    # "device:inode" of the job dir whose flock the holder keeps; "" if it keeps none.
    kernel_lock: str = ""

    @classmethod
    def this_process(cls, kernel_lock: str = "") -> "Holder":
        # /proc/self, not /proc/<getpid()>: the two differ under a /proc of another namespace.
        return cls(socket.gethostname(), _boot_id(), os.getpid(), _start_ticks("self"),
                   datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                   pid_ns=_pid_namespace(), kernel_lock=kernel_lock)

    @property
    def key(self) -> tuple:
        """Who it is, whatever its heartbeat counter says."""
        return dataclasses.astuple(dataclasses.replace(self, beat=0))

    def same_machine(self) -> bool:
        return self.host == socket.gethostname() and self.boot_id == _boot_id()

    def pids_comparable(self) -> bool:
        """Whether its pid means the same process here: the same PID namespace (or a lock
        written before namespaces were recorded, judged as then)."""
        return not self.pid_ns or (self.pid_ns == _pid_namespace()
                                   and self.pid_ns != UNKNOWN_NAMESPACE)

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


_FIELDS = {f.name for f in dataclasses.fields(Holder)}


def _read(path: str) -> Optional[Holder]:
    try:
        data = json.loads(storage.read_bytes(path))
        # Fields a later version may add are left out rather than make the lock unreadable.
        return Holder(**{k: v for k, v in data.items() if k in _FIELDS})
    except FileNotFoundError:
        raise
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # half-written by a holder that died mid-write: no holder to ask


class LockLost(UserError):
    """This trainer no longer holds its job dir's lock: it must stop without saving."""


class _KernelLock:
    """An exclusive ``flock`` on a local job dir, held from ``take`` to ``release``."""

    def __init__(self, job_dir: str):
        self.job_dir = job_dir
        self.identity = ""  # the job dir's "device:inode", where flock works on it
        self.held = False
        self.busy = False  # another open file description holds it
        self._fd: Optional[int] = None

    def take(self) -> None:
        """Tries once, without waiting."""
        if self.held or storage.is_url(self.job_dir):
            return
        if self._fd is None:
            try:
                # Python opens it close-on-exec: no program this process starts keeps it.
                self._fd = os.open(self.job_dir, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                return
            status = os.fstat(self._fd)
            self.identity = f"{status.st_dev}:{status.st_ino}"
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.held, self.busy = True, False
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                self.busy = True
            else:  # NFS (EBADF on a directory), ENOLCK, EOPNOTSUPP: no kernel lock here
                self.release()

    def speaks_for(self, holder: Holder) -> bool:
        """Whether this flock says whether ``holder`` lives: it keeps the flock of this very
        job dir (same device and inode) under this very kernel (same boot id)."""
        return bool(self.identity and holder.kernel_lock == self.identity
                    and holder.boot_id and holder.boot_id == _boot_id())

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the kernel drops the flock with its last descriptor
        self._fd, self.held, self.busy, self.identity = None, False, False, ""


_ALIVE, _DEAD, _CHANGED = "alive", "dead", "changed"


class JobLock:
    """``with JobLock(job_dir):`` holds the job dir's lock for the block.

    ``heartbeat_secs``, ``stale_secs`` and ``settle_secs`` are the module's constants unless a
    test gives its own; ``sleep`` and ``clock`` likewise (a test's fake time)."""

    def __init__(self, job_dir: str, heartbeat_secs: float = HEARTBEAT_SECS,
                 stale_secs: float = STALE_SECS, settle_secs: float = SETTLE_SECS,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = _clock):
        self.path = storage.join(job_dir, LOCK_FILE)
        self.job_dir = job_dir
        self.heartbeat_secs = heartbeat_secs
        self.stale_secs = stale_secs
        self.settle_secs = settle_secs
        # A test's lock that never beats (an hour) still gets half of stale_secs.
        self.renew_within = stale_secs - min(RENEWAL_MARGIN_BEATS * heartbeat_secs,
                                             stale_secs / 2)
        self._sleep = sleep
        self._clock = clock
        self._me: Optional[Holder] = None
        self._renewed_at = 0.0  # when the last write others may still see began
        self._slowest = 0.0  # the slowest find-then-write or read-back of the lease
        self._last_error = ""  # the last failed heartbeat's
        self._lost: Optional[str] = None  # why, once lost
        self._state = threading.Lock()
        self._kernel = _KernelLock(job_dir)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> "JobLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # --- taking it -------------------------------------------------------------------------------

    def acquire(self) -> None:
        """Takes the lock, taking over a stale one; UserError if a living trainer holds it."""
        try:
            me = self._take()
        except OSError as e:
            self._kernel.release()
            raise UserError(f"cannot write the lock {self.path} ({e.strerror}); "
                            f"{storage.fix_for(self.job_dir, '--job-dir')}") from None
        except BaseException:
            self._kernel.release()
            raise
        self._me = me
        self._thread = threading.Thread(target=self._beat, name="job_lock_heartbeat",
                                        daemon=True)
        self._thread.start()

    def _take(self) -> Holder:
        self._kernel.take()
        # A trainer that holds the flock writes its lock file within milliseconds: give one
        # that is starting the time to, rather than race it for the file without the flock.
        wait_for_file_until = self._clock() + self.settle_secs
        while True:
            if self._kernel.busy:
                self._kernel.take()
            if (self._kernel.busy and self._clock() < wait_for_file_until
                    and not storage.exists(self.path)):
                time.sleep(0.05)
                continue
            me = Holder.this_process(self._kernel.identity if self._kernel.held else "")
            if self._create(me):
                return me
            self._take_over_if_stale()

    def _create(self, me: Holder) -> bool:
        """Writes ``me`` as the holder if there is none; whether this process now holds it."""
        body = json.dumps(dataclasses.asdict(me)).encode()
        started = self._clock()
        if not storage.is_url(self.path):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, storage.FILE_MODE)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            self._renewed_at = started
            return True
        if storage.exists(self.path):
            return False
        storage.write_bytes_atomic(self.path, body)
        self._slowest = max(self._slowest, self._clock() - started)
        # A trainer that also found none writes meanwhile; its write takes about as long.
        self._sleep(max(self.settle_secs, SETTLE_FACTOR * self._slowest))
        read_started = self._clock()
        try:
            mine = _read(self.path) == me
        except FileNotFoundError:
            mine = False
        self._slowest = max(self._slowest, self._clock() - read_started)
        if mine:
            self._renewed_at = started
        return mine

    def _take_over_if_stale(self) -> None:
        try:
            holder = _read(self.path)
            if holder is None:  # being written by a trainer that just created it, or by one
                self._sleep(1.0)  # that died mid-write: look once more
                holder = _read(self.path)
        except FileNotFoundError:
            return  # released meanwhile: try again
        verdict = self._judge(holder)
        if verdict == _ALIVE:
            raise self._refusal(holder)
        if verdict == _CHANGED:
            return  # another holder meanwhile: look again
        if storage.is_url(self.path):
            storage.remove(self.path)  # the next lease decides between trainers taking over
        else:
            stale = f"{self.path}.stale-{os.getpid()}"
            try:
                os.rename(self.path, stale)  # of two trainers taking over, one wins
            except FileNotFoundError:
                return
            moved = _read_or_none(stale)
            if moved is not None and (holder is None or moved.key != holder.key):
                # Another trainer took it over between the last look and the rename: its
                # lock goes back (a link fails if yet another one is there already).
                try:
                    os.link(stale, self.path)
                except OSError:
                    pass
                os.remove(stale)
                return
            os.remove(stale)
        log.info("took over %s: its holder (%s) is gone", self.path,
                 holder.describe() if holder else "unknown")

    def _judge(self, holder: Optional[Holder]) -> str:
        """Whether ``holder`` lives (``_ALIVE``), has ended (``_DEAD``) or gave way to another
        holder while it was watched (``_CHANGED``)."""
        if holder is None:
            return _DEAD  # unreadable twice over: it died mid-write
        if self._kernel.speaks_for(holder):
            if self._kernel.held:
                return _DEAD  # the kernel let go of its flock: the process has ended
            if self._kernel.busy:
                return _ALIVE
        if holder.same_machine() and holder.pids_comparable():
            return _ALIVE if holder.alive_here() else _DEAD
        return self._watch(holder)

    def _watch(self, holder: Holder) -> str:
        """Watches a holder whose process cannot be asked (another machine, another PID
        namespace): alive as soon as its heartbeat moves, dead after ``stale_secs`` without.

        The time counted is the sleeps between reads: the first read has returned before the
        first sleep, and the last read starts after ``stale_secs`` of them, however slow the
        reads are. The holder's lease (``renew_within``) runs out sooner, counted from before
        the write this watch first read."""
        log.info("%s is held by %s, whose process cannot be asked from here; waiting up to "
                 "%.0f s for a sign of life", self.path, holder.describe(), self.stale_secs)
        waited = 0.0
        while waited < self.stale_secs:
            self._sleep(1.0)
            waited += 1.0
            try:
                now = _read(self.path)
            except FileNotFoundError:
                return _CHANGED
            if now is None or now.key != holder.key:
                return _CHANGED
            if now.beat != holder.beat:
                return _ALIVE
        return _DEAD

    def _refusal(self, holder: Holder) -> UserError:
        return UserError(
            f"--job-dir {self.job_dir} {IN_USE} "
            f"({holder.describe()}); wait for it to end, stop it, or use another --job-dir")

    # --- keeping it ------------------------------------------------------------------------------

    def _beat(self) -> None:
        failed = False
        while True:
            # The next beat is due a heartbeat after the last renewal began (at once after a
            # lease's long wait); after a failure, a heartbeat after the failure.
            wait = self.heartbeat_secs if failed else max(
                0.0, self._renewed_at + self.heartbeat_secs - self._clock())
            if self._stop.wait(wait) or self.lost_error() is not None:
                return
            failed = not self._beat_once()
            if self._lost is not None:
                return

    def _beat_once(self) -> bool:
        """One heartbeat: the lock file read, then rewritten with the counter bumped; whether
        it renewed the lease."""
        try:
            holder = _read(self.path)
        except FileNotFoundError:
            self._lose(f"{self.path} was deleted")
            return False
        except OSError as e:  # a hiccup of the shared file system or the store: beat again
            self._last_error = storage.reason(e)
            return False
        if holder is None or holder.key != self._me.key:
            self._lose_to(holder)
            return False
        beat = dataclasses.replace(self._me, beat=self._me.beat + 1)
        started = self._clock()
        try:
            storage.write_bytes_atomic(self.path, json.dumps(dataclasses.asdict(beat)).encode())
        except OSError as e:  # a full disk, a store that does not answer: beat again later
            self._last_error = storage.reason(e)
            return False
        with self._state:
            if self._lost is not None:
                return False
            if self._clock() - self._renewed_at > self.renew_within:
                # Landed after the lease ran out: a taker may have watched it stand still.
                self._lost = self._not_renewed(f"a heartbeat took {self._clock() - started:.1f} s")
                return False
            self._me, self._renewed_at, self._last_error = beat, started, ""
        return True

    # --- losing it -------------------------------------------------------------------------------

    def check(self, read: bool = True) -> None:
        """Raises ``LockLost`` (one line) once this process has lost the lock.

        ``read``: read the lock file now, as before a checkpoint is saved; without, only the
        heartbeat's verdict and the lease's age (no I/O: before every training step)."""
        error = self.lost_error(read)
        if error is not None:
            raise error

    def lost_error(self, read: bool = False) -> Optional[LockLost]:
        """The ``LockLost`` to raise if this process has lost the lock, else None."""
        if self._lost is None and self._me is not None:
            if self._clock() - self._renewed_at > self.renew_within:
                self._lose(self._not_renewed(self._last_error and
                                             f"the last write failed: {self._last_error}"))
            elif read:
                try:
                    holder = _read(self.path)
                except FileNotFoundError:
                    self._lose(f"{self.path} was deleted")
                except OSError:
                    pass  # cannot tell now; the lease's age decides
                else:
                    if holder is None or holder.key != self._me.key:
                        self._lose_to(holder)
        return None if self._lost is None else LockLost(self._advice(self._lost))

    def _not_renewed(self, why: str) -> str:
        return (f"its heartbeat was not renewed for over {self.renew_within:g} s"
                f"{f' ({why})' if why else ''}, and another trainer may take a lock over "
                f"after {self.stale_secs:g} s without one")

    def _lose(self, why: str) -> None:
        with self._state:
            if self._lost is None:  # the first reason stays
                self._lost = why

    def _lose_to(self, holder: Optional[Holder]) -> None:
        self._lose(f"to pid {holder.pid} on {holder.host} (since {holder.since})" if holder
                   else f"{self.path} was overwritten with something that is not a lock")

    def _advice(self, why: str) -> str:
        head = f"lost the lock of --job-dir {self.job_dir}"
        head += f" {why}" if why.startswith("to pid") else f": {why}"
        return (f"{head}; stopped without saving: the checkpoints saved before are kept; "
                f"rerun the same command to resume once no other trainer uses --job-dir, or "
                f"use another --job-dir")

    def release(self) -> None:
        """Stops the heartbeat and deletes the lock if it is still this process's; then lets
        go of the kernel lock."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            holder = _read(self.path) if self._me is not None else None
            if holder is not None and holder.key == self._me.key:
                storage.remove(self.path)
        except OSError:  # FileNotFoundError included
            pass
        self._me = None
        self._kernel.release()


def _read_or_none(path: str) -> Optional[Holder]:
    try:
        return _read(path)
    except FileNotFoundError:
        return None
