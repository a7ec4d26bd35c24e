"""Getting a CIFAR python archive (CIFAR-10 or -100): download with progress, MD5, safe extraction.

``download`` streams the archive to a temporary file beside its destination, computes the MD5
while streaming and renames the file into place only if the checksum matches, so a failed or
interrupted download never leaves something that looks like a complete archive.

``extract_batches`` extracts with ``tarfile``'s data filter (PEP 706, Python 3.11.4+), which
refuses members that would land outside the destination, plus a filter of our own that admits
only regular files directly inside the dataset's folder (``cifar-10-batches-py/`` or
``cifar-100-python/``) and refuses everything else by name. Headers that tarfile would read
into memory before any filter sees them (GNU long names, pax headers, sparse maps) are bounded
as they are read (``_bounded_tarinfo``). Files go to a fresh temporary folder beside the
destination, renamed into place when everything is there.
"""


import dataclasses
import gzip
import hashlib
import http.client
import lzma
import os
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from typing import TextIO

from cifar10_estimator import storage
from cifar10_estimator.data import schema
from cifar10_estimator.errors import UserError

# The official archive, https://www.cs.toronto.edu/~kriz/cifar.html ("CIFAR-10 python version",
# 163 MB, md5sum c58f30108f718f92721af3b95e74349a).
DEFAULT_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
DEFAULT_MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE_SIZE = 170_498_071
ARCHIVE_NAME = "cifar-10-python.tar.gz"
# The real archive unpacks to ~178 MB; a larger total is not CIFAR-10 (or is a gzip bomb).
MAX_EXTRACTED_BYTES = 1 << 30
# Members an archive may have: the real ones have 9 (CIFAR-10: its folder, 6 batches,
# batches.meta, readme.html) and 5 (CIFAR-100). tarfile keeps a TarInfo per member read, so
# without a bound a small archive of repeated folder entries (which the filter skips) fills
# memory.
MAX_MEMBERS = 100
# tarfile reads a GNU long name or long link, and a pax header, whole into memory before any
# filter sees the member it describes: a 1 MB gzip of one header declaring 1 GiB made it hold
# 1 GiB. Bounds, far above what a genuine archive holds:
# - a long name or link is a path: at most PATH_MAX bytes, its NUL included (4,096:
#   linux/limits.h); nothing longer can be opened or created on Linux anyway.
MAX_LONG_NAME_BYTES = 4096
# - a pax header holds a path and a link path (each at most PATH_MAX), times, ids and names,
#   and the extended attributes tar records (each value at most XATTR_SIZE_MAX, 65,536 bytes:
#   linux/limits.h): 256 KiB leaves room for several. Global headers, which add up from one
#   member to the next, share the same bound.
MAX_PAX_HEADER_BYTES = 256 << 10
# - headers before one member: a GNU long name and long link, or a pax global and extended
#   header, so 2; each nests a call in tarfile, so a chain of thousands would end in a
#   RecursionError holding every header read.
MAX_EXTENDED_HEADERS = 4


@dataclasses.dataclass(frozen=True)
class Archive:
    """One of the official python archives: its folder, file name, address, MD5 and files."""

    folder: str
    name: str
    url: str
    md5: str
    required: tuple[str, ...]


CIFAR10 = Archive(schema.BATCHES_DIRNAME, ARCHIVE_NAME, DEFAULT_URL, DEFAULT_MD5,
                  schema.BATCH_FILES)
# https://www.cs.toronto.edu/~kriz/cifar.html ("CIFAR-100 python version", 161 MB, md5sum
# eb9058c3a382ffc7106e4002c42a8d85): one training file of 50,000 images, one test file of
# 10,000, and a meta file with the fine and coarse class names.
CIFAR100 = Archive("cifar-100-python", "cifar-100-python.tar.gz",
                   "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                   "eb9058c3a382ffc7106e4002c42a8d85", ("train", "test", "meta"))
ARCHIVES = {"cifar10": CIFAR10, "cifar100": CIFAR100}
_NET_CHUNK = 1 << 16  # network reads: small enough for a lively progress display


def is_md5(text: str) -> bool:
    """True if ``text`` looks like an MD5 hex digest (32 hexadecimal digits)."""
    return len(text) == 32 and all(c in "0123456789abcdefABCDEF" for c in text)


def md5_file(path: str) -> str:
    """The MD5 hex digest of a file (a regular one: ``storage.open_regular``)."""
    with storage.open_regular(path, "rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.md5(usedforsecurity=False)).hexdigest()


def verify_md5(path: str, expected: str) -> None:
    """Raises ``UserError`` unless the file's MD5 equals ``expected``."""
    try:
        found = md5_file(path)
    except OSError as e:  # a pipe, socket or device in its place; unreadable
        raise UserError(f"{path} cannot be read as the archive ({storage.reason(e)}); delete "
                        f"it and run again to download it") from None
    if found != expected.lower():
        raise UserError(f"{path} has MD5 {found}, expected {expected.lower()}: the archive is "
                        "damaged or not the CIFAR-10 python archive; delete it and run again "
                        "to download it")


class _Progress:
    """Download progress on a stream: one carriage-return bar on a terminal, a few lines else."""

    def __init__(self, stream: TextIO, total: int | None) -> None:
        self.stream = stream
        self.total = total if total and total > 0 else None
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self.last_draw = 0.0
        self.quarters = 0  # non-tty: a line at 25 %, 50 % and 75 %, then finish()

    def _line(self, done: int) -> str:
        mb = done / 1e6
        rate = mb / max(time.monotonic() - self.start, 1e-6)
        if self.total:
            fraction = min(done / self.total, 1.0)
            bar = "#" * int(fraction * 30)
            return (f"{fraction:6.1%} [{bar:<30}] {mb:7.1f}/{self.total / 1e6:.1f} MB "
                    f"{rate:6.1f} MB/s")
        return f"{mb:7.1f} MB {rate:6.1f} MB/s"

    def update(self, done: int) -> None:
        if self.tty:
            now = time.monotonic()
            if now - self.last_draw >= 0.1:
                self.last_draw = now
                self.stream.write("\r" + self._line(done))
                self.stream.flush()
        elif self.total:
            quarters = min(done * 4 // self.total, 3)
            if quarters > self.quarters:
                self.quarters = quarters
                self.stream.write("  " + self._line(done) + "\n")
                self.stream.flush()

    def finish(self, done: int) -> None:
        if self.tty:
            self.stream.write("\r" + self._line(done) + "\n")
        else:
            self.stream.write("  " + self._line(done) + "\n")
        self.stream.flush()


def download(url: str, dest_path: str, expected_md5: str, *, timeout: float = 60.0,
             progress: TextIO | None = None) -> None:
    """Downloads ``url`` to ``dest_path`` and checks its MD5; nothing is left there on failure.

    ``timeout`` bounds each network wait in seconds. Progress goes to ``progress`` (default
    ``sys.stderr``). Errors are one-line ``UserError``s that say where to put the archive by hand.
    """
    stream = sys.stderr if progress is None else progress
    by_hand = (f"download it yourself (from {url} or a mirror) and put it at {dest_path}, or "
               "use --sample for the built-in sample data")
    os.makedirs(os.path.dirname(os.path.abspath(dest_path)), exist_ok=True)
    try:
        with storage.atomic_path(dest_path) as tmp:
            try:
                response = urllib.request.urlopen(url, timeout=timeout)
            except ValueError as e:  # not a URL at all
                raise UserError(f"cannot download {url!r}: {e}") from None
            with response, open(tmp, "wb") as out:
                length = response.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                stream.write(f"Downloading {url}"
                             + (f" ({total / 1e6:.1f} MB)" if total else "")
                             + f" to {dest_path}\n")
                bar = _Progress(stream, total)
                digest = hashlib.md5(usedforsecurity=False)
                done = 0
                for chunk in iter(lambda: response.read(_NET_CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    bar.update(done)
                bar.finish(done)
                if total is not None and done != total:
                    raise UserError(f"download of {url} stopped after {done:,} of {total:,} "
                                    f"bytes; run again, or {by_hand}")
            found = digest.hexdigest()
            if found != expected_md5.lower():
                raise UserError(f"downloaded {url} has MD5 {found}, expected "
                                f"{expected_md5.lower()}; nothing was kept. Check the URL and "
                                f"MD5, or {by_hand}")
    except urllib.error.HTTPError as e:
        raise UserError(f"cannot download {url}: HTTP {e.code} {e.reason}; {by_hand}") from None
    except urllib.error.URLError as e:
        raise UserError(f"cannot download {url} ({e.reason}); if this machine is offline, "
                        f"{by_hand}") from None
    except (http.client.HTTPException, OSError) as e:  # dropped connection, timeout, disk full
        detail = str(e) or type(e).__name__
        raise UserError(f"download of {url} failed ({detail}); run again, or {by_hand}") from None


def _refuse(archive_path: str, name: str, why: str) -> UserError:
    return UserError(f"{archive_path}: refused archive member {name!r} ({why}); "
                     "the archive is not a genuine CIFAR python archive")


_LONG_NAMES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_PAX_HEADERS = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


def _bounded_tarinfo(archive_path: str) -> type:
    """A ``tarfile.TarInfo`` class (``tarfile.open(tarinfo=...)``) that refuses, before reading
    it, a header larger than a genuine archive's (``MAX_LONG_NAME_BYTES``,
    ``MAX_PAX_HEADER_BYTES``), more than ``MAX_EXTENDED_HEADERS`` of them before one member,
    and sparse files, whose maps tarfile also reads into memory without a bound (a CIFAR
    archive has none)."""
    chain = [0]  # extended headers being read, one inside the other

    def refuse(why: str) -> UserError:
        return UserError(f"{archive_path}: refused {why}; the archive is not a genuine CIFAR "
                         "python archive")

    class BoundedTarInfo(tarfile.TarInfo):
        def _proc_member(self, tar):
            if self.type == tarfile.GNUTYPE_SPARSE:
                raise refuse("a sparse member")
            if self.type not in _LONG_NAMES + _PAX_HEADERS:
                return super()._proc_member(tar)
            if self.type in _LONG_NAMES and self.size > MAX_LONG_NAME_BYTES:
                what = "name" if self.type == tarfile.GNUTYPE_LONGNAME else "link"
                raise refuse(f"a GNU long {what} of {self.size:,} bytes (a path has at most "
                             f"{MAX_LONG_NAME_BYTES:,})")
            held = sum(len(k) + len(v) for k, v in tar.pax_headers.items()) \
                if self.type == tarfile.XGLTYPE else 0
            if self.type in _PAX_HEADERS and held + self.size > MAX_PAX_HEADER_BYTES:
                raise refuse(f"a pax header of {held + self.size:,} bytes (at most "
                             f"{MAX_PAX_HEADER_BYTES:,})")
            if chain[0] >= MAX_EXTENDED_HEADERS:
                raise refuse(f"more than {MAX_EXTENDED_HEADERS} extended headers before a "
                             "member")
            chain[0] += 1
            try:
                return super()._proc_member(tar)
            finally:
                chain[0] -= 1

        def _proc_gnusparse_00(self, *args):
            raise refuse("a sparse member")

        _proc_gnusparse_01 = _proc_gnusparse_10 = _proc_gnusparse_00

    return BoundedTarInfo


class _MemberFilter:
    """A ``tarfile`` extraction filter: the data filter, then only the dataset's own files.

    ``tarfile.data_filter`` (Python 3.11.4+, PEP 706) refuses what could write outside the
    destination: ``..``, links that leave it, devices and fifos; it turns absolute names into
    relative ones. On top of it, a CIFAR archive holds only regular files directly inside its
    folder, so anything else (a link, a sub-folder, another folder, a second copy of a file, or
    more data than the real archive has) is refused by name. Names lose the folder prefix: the
    files land straight in the temporary folder that becomes ``archive.folder``.
    """

    def __init__(self, archive_path: str, folder: str):
        self.archive_path = archive_path
        self.folder = folder
        self.written: set[str] = set()
        self.total = 0
        self.seen = 0

    def __call__(self, member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        name = member.name
        self.seen += 1
        if self.seen > MAX_MEMBERS:
            raise _refuse(self.archive_path, name, f"more than {MAX_MEMBERS} members")
        try:
            member = tarfile.data_filter(member, dest)
        except tarfile.FilterError as e:
            raise _refuse(self.archive_path, name, str(e)) from None
        parts = [p for p in member.name.split("/") if p not in ("", ".")]
        if not parts or parts[0] != self.folder:
            raise _refuse(self.archive_path, name, f"outside {self.folder}/")
        if member.isdir() and len(parts) == 1:
            return None  # the folder itself: the temporary folder stands for it
        if member.issym() or member.islnk():
            raise _refuse(self.archive_path, name, f"a link to {member.linkname!r}")
        if not member.isreg() or len(parts) != 2:
            raise _refuse(self.archive_path, name, "unexpected sub-folder or special file")
        if parts[1] in self.written:
            raise _refuse(self.archive_path, name, "appears twice")
        self.total += member.size
        if self.total > MAX_EXTRACTED_BYTES:
            raise _refuse(self.archive_path, name, "archive unpacks to more than "
                          f"{MAX_EXTRACTED_BYTES >> 20} MiB")
        self.written.add(parts[1])
        return member.replace(name=parts[1], deep=False)


def extract_batches(archive_path: str, dest_dir: str, archive: Archive = CIFAR10) -> str:
    """Safely extracts ``archive.folder`` (``cifar-10-batches-py/``, ...) into ``dest_dir``.

    Returns the path of the extracted folder, which must not exist yet. On any error nothing
    is left in ``dest_dir``.
    """
    final = os.path.join(dest_dir, archive.folder)
    if os.path.lexists(final):
        raise UserError(f"{final} already exists; remove it to extract {archive_path} again")
    members = _MemberFilter(archive_path, archive.folder)
    with storage.atomic_dir(final) as tmp:
        try:
            # Opened once, as a regular file (storage.open_regular): a pipe would block.
            with storage.open_regular(archive_path, "rb") as raw, tarfile.open(
                    fileobj=raw, mode="r:*", tarinfo=_bounded_tarinfo(archive_path)) as tar:
                tar.extractall(tmp, filter=members)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
            # tarfile's "r:*" lists each method it tried on a line of its own.
            raise UserError(f"{archive_path} is not a readable tar.gz archive "
                            f"({' '.join(str(e).split())}); delete it and run again to "
                            "download it") from None
        except (OSError, lzma.LZMAError, ValueError, OverflowError) as e:
            # What a damaged or hostile archive provokes beyond tarfile's own errors: a
            # corrupt bz2 or xz stream ("r:*" opens those too), a name too long for the file
            # system, a timestamp out of range.
            raise UserError(f"{archive_path} cannot be extracted into {dest_dir} "
                            f"({storage.reason(e)}); delete it and run again to download "
                            "it") from None
        missing = [name for name in archive.required if name not in members.written]
        if missing:
            raise UserError(f"{archive_path} has no {archive.folder}/{missing[0]}; it is not "
                            f"the {archive.name} python archive")
    return final
