"""What a records folder holds: the generator's metadata file, and record files checked against it.

Beside the record files the generator writes ``cifar10_records.json`` (``write_metadata``): the
dataset, its class names and, per split, the record count, the file size and a SHA-256. The
trainer reads the class count and the epoch size from it (``dataset_info``, ``split_size``) and
checks every record file it uses against it before training (``verify_split``): TensorFlow's
record reader takes a partial record header at the end of a file for the end of the file, so a
file cut inside a header (or exactly between records) reads as a shorter, valid one.

Files made by the original tutorial's generator have no metadata file: they are CIFAR-10, their
records are counted by reading them (``count_records``, the one whole-file reader), and damage
can only be found while reading.

No record file reaches TensorFlow's reader before its framing is walked (``check_framing``):
TensorFlow believes a record's length field, once that field's own CRC matches, and allocates
it whole, so a 28-byte file declaring a 64 GiB record kills the process (SIGSEGV). The walk
reads only the length fields, seeking from one to the next, and refuses a length larger than
what is left of the file. ``verify_split``, ``count_records`` and the input pipeline
(``pipeline.Cifar10DataSet``) walk each file before handing it to TensorFlow.
"""

import dataclasses
import hashlib
import json
import os
import struct
from typing import Any, Mapping, Optional, Sequence

from cifar10_estimator import storage
from cifar10_estimator.data import schema
from cifar10_estimator.errors import UserError

METADATA_FILENAME = "cifar10_records.json"
_FORMAT = 2
# TFRecord framing (tensorflow/core/lib/io/record_writer.cc, and TensorFlow's "TFRecord and
# tf.train.Example" guide): per record, a uint64 little-endian length, a uint32 masked CRC-32C
# of the length, the data, a uint32 masked CRC-32C of the data.
_LENGTH = struct.Struct("<Q")
_FRAMING_BYTES = 8 + 4 + 4
# A record is one 32x32 image: 3,072 bytes of pixels, a label and the tf.train.Example around
# them (schema.encode_example: 3,110 bytes). A length field above 1 MiB is no record of ours;
# TensorFlow would allocate it before checking the data's CRC.
MAX_RECORD_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class SplitFacts:
    """What the generator knows of one written record file: records, bytes and SHA-256."""

    records: int
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """The dataset a data dir holds, from the generator's metadata (CIFAR-10 without it)."""

    dataset: str
    class_names: tuple[str, ...]
    splits: Mapping[str, SplitFacts]  # empty without metadata (or with format 1's)
    counts: Mapping[str, int]  # record counts, also from format 1 metadata

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def file_facts(path: str, records: int) -> SplitFacts:
    """Size and SHA-256 of a written record file (~0.25 s for CIFAR-10's 123 MB train file)."""
    digest = hashlib.sha256()
    with storage.open_file(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return SplitFacts(records, storage.size(path), digest.hexdigest())


def write_metadata(data_dir: str, splits: Mapping[str, SplitFacts], source: str,
                   class_names: Optional[Sequence[str]] = None, dataset: str = "cifar10") -> None:
    """Writes what the records hold beside them (atomically): the metadata file.

    Format 2: dataset, class names and, per split, records, bytes and SHA-256. The format 1
    keys (``counts``, ``label_names``) are kept, so older readers still find the counts.
    """
    names = list(class_names or schema.CLASS_NAMES)
    body = {"format": _FORMAT, "dataset": dataset, "num_classes": len(names),
            "class_names": names, "source": source,
            "splits": {k: {"records": v.records, "bytes": v.size, "sha256": v.sha256}
                       for k, v in splits.items()},
            "counts": {k: v.records for k, v in splits.items()}, "label_names": names}
    storage.write_bytes_atomic(storage.join(data_dir, METADATA_FILENAME),
                              (json.dumps(body, indent=2, sort_keys=True) + "\n").encode())


def _read_metadata(data_dir: str) -> dict:
    """The metadata file's JSON object; {} without one. A file that is there but unreadable
    is refused: read as "no metadata" it would hide damage to the records (``verify_split``)
    and make any dataset look like CIFAR-10's 10 classes."""
    path = storage.join(data_dir, METADATA_FILENAME)
    try:
        body = storage.read_json(path)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise UserError(f"{path} cannot be read ({storage.reason(e)}); regenerate the records "
                        f"with {schema.GENERATOR_COMMAND}") from None
    except ValueError as e:  # not UTF-8, not JSON, nested too deep
        detail = str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        raise UserError(f"{path} is damaged, not the generator's JSON ({detail}); regenerate "
                        f"the records with {schema.GENERATOR_COMMAND}") from None
    if not isinstance(body, dict):
        raise UserError(f"{path} is damaged: a JSON {type(body).__name__}, not the generator's "
                        f"object; regenerate the records with {schema.GENERATOR_COMMAND}")
    return body


def _split_facts(raw: Any) -> dict[str, SplitFacts]:
    facts = {}
    if not isinstance(raw, dict):
        return facts
    for split, v in raw.items():
        if (isinstance(v, dict) and isinstance(v.get("records"), int)
                and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)):
            facts[split] = SplitFacts(v["records"], v["bytes"], v["sha256"])
    return facts


def dataset_info(data_dir: str) -> DatasetInfo:
    """What ``data_dir`` holds, from its metadata; CIFAR-10 for records without metadata."""
    body = _read_metadata(data_dir)
    names = body.get("class_names", body.get("label_names"))
    if not (isinstance(names, list) and len(names) >= 2
            and all(isinstance(n, str) and n for n in names)):
        names = list(schema.CLASS_NAMES)
    counts = body.get("counts")
    counts = {k: v for k, v in counts.items() if isinstance(v, int)} if isinstance(
        counts, dict) else {}
    return DatasetInfo(str(body.get("dataset", "cifar10")), tuple(names),
                       _split_facts(body.get("splits")), counts)


def existing_record_path(data_dir: str, split: str) -> str:
    """The record file of ``split``; UserError that says how to make it if it is missing or
    is not a regular file (a pipe, socket or device, which TensorFlow would wait on)."""
    path = schema.record_path(data_dir, split)
    try:
        found = storage.isfile(path)
        special = not found and storage.exists(path) and not storage.isdir(path)
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror}); check --data-dir") from None
    if special:  # local: a URL is a file or a folder
        try:
            storage.open_regular(path).close()
        except OSError as e:
            raise UserError(f"{path} cannot be read ({storage.reason(e)}); replace it with "
                            f"the generator's records: {schema.GENERATOR_COMMAND}") from None
    if not found:
        raise UserError(f"{path} not found; generate the records with "
                        f"{schema.GENERATOR_COMMAND}")
    return path


def check_framing(path: str) -> int:
    """Walks the record headers of one TFRecord file; returns its record count.

    Reads the 8-byte length of each record and seeks past the record (no payload is read: about
    0.06 s for 50,000 records, see docs/data.md), checking each length against the bytes left.
    CRCs are not checked here: the lengths alone decide what TensorFlow's reader allocates, and
    it checks the CRCs itself (``count_records``).

    Raises:
      UserError: the file is not a regular file, cannot be read, ends inside a record's
        framing, or declares a record longer than what is left of it or than a record holds.
    """
    regenerate = f"regenerate it with {schema.GENERATOR_COMMAND}"
    try:
        with storage.open_file(path, "rb") as f:  # a regular file only (open_regular)
            if storage.is_url(path):
                size = storage.size(path)

                def length_field(at: int) -> bytes:
                    f.seek(at)
                    return f.read(_LENGTH.size)
            else:
                size = os.fstat(f.fileno()).st_size

                def length_field(at: int) -> bytes:
                    return os.pread(f.fileno(), _LENGTH.size, at)  # one call, no read-ahead

            count = at = 0
            while at < size:
                left = size - at - _FRAMING_BYTES
                raw = length_field(at) if left >= 0 else b""
                if len(raw) != _LENGTH.size:
                    raise UserError(f"{path} is truncated or corrupt (it ends inside the "
                                    f"framing of record {count + 1}, at byte {size:,}); "
                                    f"{regenerate}")
                length = _LENGTH.unpack(raw)[0]
                if length > min(left, MAX_RECORD_BYTES):
                    limit = (f"the {left:,} bytes left" if left < MAX_RECORD_BYTES else
                             f"a record holds ({MAX_RECORD_BYTES:,})")
                    raise UserError(f"{path} is truncated or corrupt (record {count + 1}, at "
                                    f"byte {at:,}, declares {length:,} bytes, more than "
                                    f"{limit}); {regenerate}")
                at += _FRAMING_BYTES + length
                count += 1
            return count
    except OSError as e:
        raise UserError(f"{path} cannot be read ({storage.reason(e)}); {regenerate}") from None


def verify_split(data_dir: str, split: str) -> None:
    """Checks a record file against the generator's metadata before it is used, and its
    framing in any case (``check_framing``).

    The size catches every cut; the SHA-256 catches changed bytes.

    Raises:
      UserError: the file is missing, differs from what the generator wrote, or its framing
        declares more than it holds.
    """
    path = existing_record_path(data_dir, split)
    expected = dataset_info(data_dir).splits.get(split)
    if expected is not None:  # none: the original tutorial's files, or format 1
        regenerate = f"regenerate it with {schema.GENERATOR_COMMAND}"
        size = storage.size(path)
        if size != expected.size:
            raise UserError(f"{path} is {size:,} bytes but the generator wrote "
                            f"{expected.size:,} ({METADATA_FILENAME}): it is truncated or was "
                            f"replaced; {regenerate}")
        if file_facts(path, expected.records).sha256 != expected.sha256:
            raise UserError(f"{path} has the size the generator wrote but other bytes (SHA-256 "
                            f"differs from {METADATA_FILENAME}): it is corrupt or was "
                            f"replaced; {regenerate}")
    # Even then: metadata in a data dir is no more trusted than the records beside it.
    check_framing(path)


def count_records(path: str) -> int:
    """Counts the records of one TFRecord file by reading it to its end, its framing walked
    first (``check_framing``), so that TensorFlow's reader, which checks the CRCs, allocates
    no more than a record holds.

    Raises:
      UserError: the file is truncated or corrupt (named).
    """
    import tensorflow as tf

    check_framing(path)
    try:
        return sum(1 for _ in tf.compat.v1.io.tf_record_iterator(path))
    except tf.errors.DataLossError as e:
        raise UserError(f"{path} is truncated or corrupt ({e.message.splitlines()[0]}); "
                        f"regenerate it with {schema.GENERATOR_COMMAND}") from None


def find_corrupt_record_file(data_dir: str) -> Optional[str]:
    """The first record file of ``data_dir`` that fails to read to its end, if any."""
    for split in schema.SPLITS:
        path = schema.record_path(data_dir, split)
        if storage.exists(path):
            try:
                count_records(path)
            except UserError:
                return path
    return None


def split_size(data_dir: str, split: str) -> int:
    """The number of records in ``split``: from the metadata file if present, else by counting."""
    path = existing_record_path(data_dir, split)
    info = dataset_info(data_dir)
    facts = info.splits.get(split)
    if facts is not None and storage.size(path) == facts.size:
        return facts.records  # verify_split checks the bytes before training
    meta_path = storage.join(data_dir, METADATA_FILENAME)
    # Format 1 metadata has only counts: trust them if at least as new as the records.
    if (facts is None and split in info.counts
            and storage.mtime(meta_path) >= storage.mtime(path)):
        return info.counts[split]
    return count_records(path)
