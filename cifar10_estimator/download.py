"""Getting a CIFAR python archive (CIFAR-10 or -100): download with progress, MD5, safe extraction.

``download`` streams the archive to a temporary file beside its destination, computes the MD5
while streaming and renames the file into place only if the checksum matches, so a failed or
interrupted download never leaves something that looks like a complete archive.

``extract_batches`` does not trust ``tarfile``'s extraction (Python 3.11's ``filter`` argument is
not in every patch release, and it still allows more than we need). It walks the members itself,
admits only regular files directly inside the dataset's folder (``cifar-10-batches-py/`` or
``cifar-100-python/``, and that folder's own entry),
refuses everything else by name, copies member data into a fresh temporary folder beside the
destination and renames the folder into place when everything is there.
"""


import dataclasses
import gzip
import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from typing import TextIO

from cifar10_estimator import cifar10, fsutil
from cifar10_estimator.errors import UserError

# The official archive, https://www.cs.toronto.edu/~kriz/cifar.html ("CIFAR-10 python version",
# 163 MB, md5sum c58f30108f718f92721af3b95e74349a).
DEFAULT_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
DEFAULT_MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE_SIZE = 170_498_071
ARCHIVE_NAME = "cifar-10-python.tar.gz"
# The files a complete extraction must contain: every batch of cifar10.SPLITS.
REQUIRED_BATCHES = tuple(name for names in cifar10.SPLITS.values() for name in names)
# The real archive unpacks to ~178 MB; a larger total is not CIFAR-10 (or is a gzip bomb).
MAX_EXTRACTED_BYTES = 1 << 30
_CHUNK = 1 << 20  # file copies


@dataclasses.dataclass(frozen=True)
class Archive:
    """One of the official python archives: its folder, file name, address, MD5 and files."""

    folder: str
    name: str
    url: str
    md5: str
    required: tuple[str, ...]


CIFAR10 = Archive(cifar10.BATCHES_DIRNAME, ARCHIVE_NAME, DEFAULT_URL, DEFAULT_MD5,
                  REQUIRED_BATCHES)
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
    """The MD5 hex digest of a file."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_md5(path: str, expected: str) -> None:
    """Raises ``UserError`` unless the file's MD5 equals ``expected``."""
    found = md5_file(path)
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
        with fsutil.atomic_path(dest_path) as tmp:
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


def _refuse(archive_path: str, member: tarfile.TarInfo, why: str) -> UserError:
    return UserError(f"{archive_path}: refused archive member {member.name!r} ({why}); "
                     "the archive is not a genuine CIFAR python archive")


def _member_target(archive_path: str, member: tarfile.TarInfo, folder: str) -> str | None:
    """The file name to write for ``member``, None for the folder entry; refuses the rest."""
    name = member.name
    if member.issym() or member.islnk():
        kind = "symbolic link" if member.issym() else "hard link"
        raise _refuse(archive_path, member, f"{kind} to {member.linkname!r}")
    if member.isdev():  # character or block device, or fifo
        raise _refuse(archive_path, member, "device or fifo")
    if name.startswith(("/", "\\")) or os.path.isabs(name) or (len(name) > 1 and name[1] == ":"):
        raise _refuse(archive_path, member, "absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts or any("\\" in p or "\0" in p for p in parts):
        raise _refuse(archive_path, member, "path leaves the extraction folder")
    if not parts or parts[0] != folder:
        raise _refuse(archive_path, member, f"outside {folder}/")
    if member.isdir():
        if len(parts) == 1:
            return None
        raise _refuse(archive_path, member, "unexpected sub-folder")
    if not member.isreg():
        raise _refuse(archive_path, member, "not a regular file")
    if len(parts) != 2:
        raise _refuse(archive_path, member, "unexpected sub-folder")
    return parts[1]


def extract_batches(archive_path: str, dest_dir: str, archive: Archive = CIFAR10) -> str:
    """Safely extracts ``archive.folder`` (``cifar-10-batches-py/``, ...) into ``dest_dir``.

    Returns the path of the extracted folder, which must not exist yet. On any error nothing
    is left in ``dest_dir``.
    """
    final = os.path.join(dest_dir, archive.folder)
    if os.path.lexists(final):
        raise UserError(f"{final} already exists; remove it to extract {archive_path} again")
    written: set[str] = set()
    total = 0
    with fsutil.atomic_dir(final) as tmp:
        try:
            with tarfile.open(archive_path, "r:*") as tar:
                for member in tar:
                    target = _member_target(archive_path, member, archive.folder)
                    if target is None:
                        continue
                    if target in written:
                        raise _refuse(archive_path, member, "appears twice")
                    total += member.size
                    if total > MAX_EXTRACTED_BYTES:
                        raise _refuse(archive_path, member, "archive unpacks to more than "
                                      f"{MAX_EXTRACTED_BYTES >> 20} MiB")
                    source = tar.extractfile(member)
                    assert source is not None  # a regular file always has data
                    # Our own fresh folder (mkdtemp, mode 0700): no link can be planted in it.
                    with source, open(os.path.join(tmp, target), "xb") as out:
                        shutil.copyfileobj(source, out, _CHUNK)
                    written.add(target)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise UserError(f"{archive_path} is not a readable tar.gz archive ({e}); delete it "
                            "and run again to download it") from None
        missing = [name for name in archive.required if name not in written]
        if missing:
            raise UserError(f"{archive_path} has no {archive.folder}/{missing[0]}; it is not "
                            f"the {archive.name} python archive")
    return final
