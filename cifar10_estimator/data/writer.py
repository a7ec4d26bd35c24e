"""Writing a ``Source`` as TFRecords: the split files and their metadata, all or nothing.

Every batch is loaded and validated before anything is written (``sources``); then all split
files are written under temporary names and renamed only once all are complete, so an error or
an interruption leaves the previous outputs (if any) untouched and no new final-named file. If
a rename itself fails part-way, the files already renamed by this run are removed again. The
metadata file (``metadata.write_metadata``) is written last, with each file's size and SHA-256.
``generate_tfrecords`` is the generator command's whole conversion: load, write, summary line.
"""

import contextlib
import os
import time
from typing import Callable, Iterator, Sequence

from cifar10_estimator import storage
from cifar10_estimator.data import metadata, schema
from cifar10_estimator.data.sources import Source
from cifar10_estimator.errors import UserError


@contextlib.contextmanager
def _all_or_nothing(final_paths: Sequence[str]) -> Iterator[list[str]]:
    """Temporary paths for ``final_paths``, all renamed into place only if the block succeeds."""
    renamed: list[str] = []

    def note_renamed(path: str) -> Callable[..., None]:
        def exit_(exc_type: object, exc: object, tb: object) -> None:
            if exc_type is None:
                renamed.append(path)
        return exit_

    try:
        with contextlib.ExitStack() as stack:
            temps = []
            for path in final_paths:
                # Pushed before its atomic_path, so it runs just after that one's rename.
                stack.push(note_renamed(path))
                temps.append(stack.enter_context(storage.atomic_path(path)))
            yield temps
    except BaseException:
        # Non-empty only if a rename failed part-way: take back what this run put in place.
        for path in renamed:
            storage.remove(path)
        raise


def write_tfrecords(source: Source, output_dir: str,
                    log: Callable[[str], None] | None = None) -> dict[str, int]:
    """Writes the splits of ``source`` as TFRecords plus the metadata file, all or nothing."""
    import tensorflow as tf

    log = log or print
    if (not storage.is_url(output_dir) and os.path.lexists(output_dir)
            and not os.path.isdir(output_dir)):
        raise UserError(f"--output-dir {output_dir} exists and is not a folder")
    storage.check_writable(output_dir, "--output-dir")
    splits = list(source.splits)
    finals = [schema.record_path(output_dir, split) for split in splits]
    for path in finals:
        if storage.isdir(path):
            raise UserError(f"{path} is a folder; remove it so that the records can be written")
    facts: dict[str, metadata.SplitFacts] = {}
    try:
        facts = _write_splits(source, splits, finals, log, tf)
    except (OSError, tf.errors.OpError) as e:
        raise UserError(f"cannot write the records in --output-dir {output_dir} "
                        f"({storage.reason(e)}); "
                        f"no record file was replaced; "
                        f"{storage.fix_for(output_dir, '--output-dir')}") from None
    # A split this source does not have (an image folder without validation/) must not leave
    # an older run's file beside metadata that no longer describes it (nor a pipe or device
    # under its name, which a reader would refuse).
    for split in schema.SPLITS:
        stale = schema.record_path(output_dir, split)
        if split not in facts and storage.exists(stale) and not storage.isdir(stale):
            storage.remove(stale)
    metadata.write_metadata(output_dir, facts, source.description, source.label_names,
                           source.dataset)
    return {split: f.records for split, f in facts.items()}


def _write_splits(source: Source, splits: list[str], finals: list[str],
                  log: Callable[[str], None], tf) -> dict[str, metadata.SplitFacts]:
    """Writes every split under a temporary name, then renames them all into place."""
    facts: dict[str, metadata.SplitFacts] = {}
    with _all_or_nothing(finals) as temps:
        for split, final, tmp in zip(splits, finals, temps):
            log(f"Generating {final}")
            count = 0
            with tf.io.TFRecordWriter(tmp) as writer:
                for batch in source.splits[split]:
                    for image, label in zip(batch.data, batch.labels.tolist()):
                        writer.write(schema.encode_example(image.tobytes(), label))
                    count += len(batch.labels)
            # Size and SHA-256 of what was written, for the trainer's check before training.
            facts[split] = metadata.file_facts(tmp, count)
            log(f"  {split}: {count:,} records")
    return facts


def generate_tfrecords(load: Callable[[], Source], output_dir: str,
                       log: Callable[[str], None] | None = None) -> dict[str, int]:
    """The generator's conversion: loads a source with ``load`` (``sources.load_source`` or
    ``image_folder.load_image_folder`` with their arguments), writes it into ``output_dir``
    (``write_tfrecords``), then logs the summary line, with the seconds both took; returns the
    records per split. ``log`` receives the lines (default: ``print``)."""
    log = log or print
    started = time.monotonic()
    source = load()
    counts = write_tfrecords(source, output_dir, log)
    log(summary(counts, output_dir, source.description, time.monotonic() - started))
    return counts


def summary(counts: dict[str, int], output_dir: str, description: str, seconds: float) -> str:
    where = output_dir if storage.is_url(output_dir) else os.path.abspath(output_dir)
    return (f"Done: {sum(counts.values()):,} records ("
            + ", ".join(f"{split} {n:,}" for split, n in counts.items())
            + f") in {where} from {description}, {seconds:.1f} s")
