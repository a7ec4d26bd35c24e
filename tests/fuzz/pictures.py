"""Fuzz kinds for users' pictures: one picture file, as the image-folder generator and
``predict`` read it (``picture``), and whole picture folders, converted to records by the
generator's library entry (``picture-folder``).

The seeds are tiny pictures in every format a user may have (PNG in four modes, JPEG, GIF
still and animated, BMP, and WebP, which Pillow reads but TensorFlow does not), made once
with Pillow; cases damage them (``harness.mutated``), rewrite their headers to promise other
sizes (zero, one, a decompression bomb), give them the wrong extension, or replace them by
empty files, text and noise, or put a pipe, a socket or a link to /dev/zero or /dev/null in
a picture's place (``data_files.special_file``), which must be refused or left out at once,
never waited on. A folder case lays such files out in a tree with odd class
names, links of every sort and missing or misplaced folders, and checks the outcome against
an oracle that reads each file alone: the folder is refused in one line naming it exactly
when its layout is wrong or a split has no readable picture, and otherwise every readable
picture becomes one record (the pixels ``predict`` would see) and every damaged one is left
out and counted (``SKIPPED``).
"""

import functools
import io
import os
import shutil
import struct
import unicodedata
import zlib

import numpy as np
from hypothesis import strategies as st

from fuzz import harness
from fuzz.data_files import SPECIALS, special_file
from fuzz.harness import ACCEPTED, REFUSED, SKIPPED, Violation

EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")  # what the generator takes as pictures


# ---------------------------------------------------------------------------------------------
# Seeds: small valid pictures, and the same pictures with headers that promise other sizes.


@functools.cache
def seeds() -> dict[str, bytes]:
    """Format -> the bytes of a small valid picture (6x5, a few colours), made once."""
    from PIL import Image

    rng = np.random.default_rng(29)
    pixels = rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)
    rgb = Image.fromarray(pixels, "RGB")

    def saved(image, fmt, **options):
        buffer = io.BytesIO()
        image.save(buffer, fmt, **options)
        return buffer.getvalue()

    second = Image.fromarray(255 - pixels, "RGB").convert("P")
    return {
        "png": saved(rgb, "PNG"),
        "png-gray": saved(rgb.convert("L"), "PNG"),
        "png-rgba": saved(rgb.convert("RGBA"), "PNG"),
        "png-palette": saved(rgb.convert("P"), "PNG"),
        "jpeg": saved(rgb, "JPEG", quality=90),
        "gif": saved(rgb.convert("P"), "GIF"),
        "gif-animated": saved(rgb.convert("P"), "GIF", save_all=True, append_images=[second],
                              duration=100, loop=0),
        "bmp": saved(rgb, "BMP"),
        "webp": saved(rgb, "WEBP", lossless=True),
    }


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def resized_header(fmt: str, width: int, height: int) -> bytes:
    """The seed of ``fmt`` whose header promises ``width`` x ``height`` pixels, its checksums
    made right (a PNG's CRC), so that only the size is wrong: with a huge size, the start of a
    decompression bomb; with zero, a picture of nothing."""
    data = bytearray(seeds()[fmt])
    if fmt.startswith("png"):
        # IHDR is the first chunk: length (4), type (4), width, height (4 + 4), ...
        body = struct.pack(">II", width % 2**32, height % 2**32) + bytes(data[24:29])
        return bytes(data[:8] + _png_chunk(b"IHDR", body) + data[33:])
    if fmt == "bmp":
        struct.pack_into("<ii", data, 18, _signed32(width), _signed32(height))
        return bytes(data)
    if fmt.startswith("gif"):
        struct.pack_into("<HH", data, 6, width % 2**16, height % 2**16)  # the logical screen
        at = _gif_image_descriptor(data)
        if at is not None:
            struct.pack_into("<HH", data, at + 5, width % 2**16, height % 2**16)
        return bytes(data)
    if fmt == "jpeg":
        for marker in (b"\xff\xc0", b"\xff\xc2"):
            at = data.find(marker)
            if at >= 0:
                struct.pack_into(">HH", data, at + 5, height % 2**16, width % 2**16)
        return bytes(data)
    raise ValueError(fmt)


def _signed32(value: int) -> int:
    value %= 2**32
    return value - 2**32 if value >= 2**31 else value


def _gif_image_descriptor(data: bytes):
    """Offset of the first image descriptor (0x2C) of a GIF, or None."""
    at = 13
    if data[10] & 0x80:  # a global colour table follows the logical screen descriptor
        at += 3 * 2 ** ((data[10] & 7) + 1)
    while at < len(data) and data[at] == 0x21:  # extension blocks: label, sub-blocks, 0
        at += 2
        while at < len(data) and data[at]:
            at += data[at] + 1
        at += 1
    return at if at < len(data) and data[at] == 0x2C else None


# ---------------------------------------------------------------------------------------------
# What one picture file may hold.

SIZES = st.one_of(st.sampled_from([0, 1, 2, 32, 255, 256, 9_000, 9_500, 65_535, 65_536,
                                   2**31 - 1, 2**31, 2**32 - 1]),
                  st.integers(0, 70_000))
HEADER_FORMATS = ("png", "png-gray", "png-palette", "jpeg", "gif", "gif-animated", "bmp")


@st.composite
def picture_bytes(draw) -> tuple[str, bytes]:
    """(how it was made, bytes) of one file that claims to be a picture."""
    how = draw(st.sampled_from(("seed", "mutated", "mutated", "mutated", "header", "empty",
                                "text", "noise", "spliced")))
    if how == "seed":
        fmt = draw(st.sampled_from(sorted(seeds())))
        return f"seed {fmt}", seeds()[fmt]
    if how == "mutated":
        fmt = draw(st.sampled_from(sorted(seeds())))
        return f"mutated {fmt}", draw(harness.mutated(seeds()[fmt]))
    if how == "header":
        fmt = draw(st.sampled_from(HEADER_FORMATS))
        width, height = draw(SIZES), draw(SIZES)
        data = resized_header(fmt, width, height)
        if draw(st.booleans()):
            data = draw(harness.mutated(data))
        return f"{fmt} promising {width}x{height}", data
    if how == "empty":
        return "empty", b""
    if how == "text":
        return "text", draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    if how == "noise":
        return "noise", draw(st.binary(max_size=300))
    # A picture's header on another picture's body.
    first, second = draw(st.sampled_from(sorted(seeds()))), draw(st.sampled_from(sorted(seeds())))
    cut = draw(st.integers(0, 64))
    return f"{first} head on {second} body", seeds()[first][:cut] + seeds()[second][cut:]


PICTURE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".PNG", ".JpG", ".webp", ".txt",
                      "")


@st.composite
def picture_cases(draw):
    """(how it was made, extension, the bytes, or one of ``SPECIALS`` to stand in the
    file's place)."""
    if draw(st.integers(0, 9)) == 0:
        what = draw(st.sampled_from(SPECIALS))
        return what, draw(st.sampled_from(PICTURE_EXTENSIONS)), what
    how, data = draw(picture_bytes())
    return how, draw(st.sampled_from(PICTURE_EXTENSIONS)), data


def _oracle_pixels(path: str, alone: bool = True):
    """What the generator makes of one file alone: uint8 [32, 32, 3] pixels, or None for a
    damaged picture (refused on its header by ``check_file``, or failing to decode; the
    folder's pipeline drops any TensorFlow error). Read ``alone`` (as ``predict`` reads it), a
    UserError from ``check_file`` must be one line naming the file; in a folder it is only
    counted."""
    import tensorflow as tf

    from cifar10_estimator.data import images
    from cifar10_estimator.errors import UserError

    try:
        images.check_file(path, path)
    except UserError as e:
        if alone:
            harness.one_line(e, path)
        return None
    with open(path, "rb") as f:
        data = f.read()
    try:
        pixels = images.to_cifar_pixels(tf.constant(data)).numpy()
    except tf.errors.OpError:
        return None
    if pixels.shape != (32, 32, 3) or pixels.dtype != np.uint8:
        raise Violation(f"to_cifar_pixels gave {pixels.dtype} {pixels.shape}")
    return pixels


def check_picture(case, scratch: str, context) -> str:
    """The generator's path (``check_file`` then ``to_cifar_pixels``) and ``predict``'s
    (``client.load_image``) on one file: both accept it with the same uint8 [32, 32, 3]
    pixels, or ``predict`` refuses it in one line naming it and the generator counts it
    damaged."""
    from cifar10_estimator.serving import client

    _, extension, data = case
    path = os.path.join(scratch, "picture" + extension)
    if isinstance(data, str):
        special_file(path, data)
    else:
        with open(path, "wb") as f:
            f.write(data)
    generated = _oracle_pixels(path)
    outcome, served = harness.refused(lambda: client.load_image(path), path)
    if outcome == REFUSED:
        if generated is not None:
            raise Violation("predict refuses a picture the generator would train on")
        return REFUSED
    served = served.numpy()
    if served.shape != (32, 32, 3) or served.dtype != np.float32:
        raise Violation(f"load_image gave {served.dtype} {served.shape}, not float32 [32, 32, 3]")
    if generated is None:
        raise Violation("predict accepts a picture the generator would leave out as damaged")
    if not np.array_equal(served, generated.astype(np.float32)):
        raise Violation("predict and the generator see different pixels for the same file")
    return ACCEPTED


# ---------------------------------------------------------------------------------------------
# Picture folders.

CLASS_NAMES = ("cat", "dog", "bird", "with space", "Ünïcødé", "猫", "a" * 200, "é" * 120,
               ".hidden", " lead", "x.png", "new\nline", "tab\there", "bad\udcffbytes",
               "-dash", "日本 語")
FILE_STEMS = ("a", "b c", "ü", "long" * 50, ".dot", "new\nline", "bad\udcff", "#")
CONTENTS = ("good",) * 6 + ("picture", "picture", "empty", "webp-as-png", "bomb", "non-image",
            "link-file", "link-dir", "dangling", "loop", "folder-named-png") + SPECIALS
STRUCTURES = ("no-train", "no-test", "train-is-file", "test-is-file", "root-is-file",
              "class-link-outside", "class-link-dangling", "class-link-loop",
              "file-at-class-level", "unknown-test-class", "empty-class", "validation",
              "hidden-class", "one-class", "fifo-at-class-level", "test-is-fifo")
# The output folder: fresh, an earlier run's, a file, a folder or a pipe where a record file
# goes, a pipe where a split this tree may not have left one (stale-fifo).
OUTPUTS = ("fresh", "fresh", "old-run", "is-file", "record-is-folder", "record-is-fifo",
           "stale-fifo")


@st.composite
def file_specs(draw):
    content = draw(st.sampled_from(CONTENTS))
    extension = draw(st.sampled_from((".png", ".jpg", ".JPEG", ".gif", ".bmp")))
    stem = draw(st.sampled_from(FILE_STEMS))
    spec = {"content": content, "stem": stem, "extension": extension}
    if content == "good":
        spec["format"] = draw(st.sampled_from(sorted(f for f in seeds() if f != "webp")))
    elif content == "picture":
        spec["how"], spec["data"] = draw(picture_bytes())
    return spec


@st.composite
def folder_cases(draw):
    if draw(st.integers(0, 3)) == 3:  # a quarter of the trees: any names, any number
        classes = draw(st.lists(st.sampled_from(CLASS_NAMES), min_size=2, max_size=3,
                                unique=True))
    else:  # names a classifier can use
        classes = draw(st.lists(st.sampled_from(CLASS_NAMES[:8]), min_size=2, max_size=3,
                                unique=True))
    structures = []
    if draw(st.integers(0, 2)) == 2:  # a third of the trees have their layout damaged too
        structures = draw(st.lists(st.sampled_from(STRUCTURES), min_size=1, max_size=2,
                                   unique=True))
    splits = ["train", "test"] + (["validation"] if "validation" in structures else [])
    files = {split: {name: draw(st.lists(file_specs(), min_size=1, max_size=4))
                     for name in classes} for split in splits}
    return {"classes": classes, "structures": structures, "files": files,
            "output": draw(st.sampled_from(OUTPUTS))}


def _write_tree(case, scratch: str) -> str:
    """Lays the case out under ``scratch/pictures``; returns that root."""
    good = seeds()
    outside = os.path.join(scratch, "outside")  # what links point at, outside the tree
    os.makedirs(os.path.join(outside, "folder"))
    with open(os.path.join(outside, "photo.png"), "wb") as f:
        f.write(good["png"])
    with open(os.path.join(outside, "folder", "photo.png"), "wb") as f:
        f.write(good["jpeg"])
    root = os.path.join(scratch, "pictures")
    structures = case["structures"]
    for split, by_class in case["files"].items():
        for name, specs in by_class.items():
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for i, spec in enumerate(specs):
                path = os.path.join(folder, f"{i}{spec['stem']}{spec['extension']}")
                content = spec["content"]
                if content in ("good", "picture", "empty", "webp-as-png", "bomb", "non-image"):
                    data = (good.get(spec.get("format"), b"") if content == "good"
                            else spec.get("data", b"") if content == "picture"
                            else good["webp"] if content == "webp-as-png"
                            else resized_header("png", 60_000, 60_000) if content == "bomb"
                            else b"notes, not a picture\n" if content == "non-image"
                            else b"")
                    if content == "non-image":
                        path = os.path.join(folder, f"{i}{spec['stem']}.txt")
                    with open(path, "wb") as f:
                        f.write(data)
                elif content == "link-file":
                    os.symlink(os.path.join(outside, "photo.png"), path)
                elif content == "link-dir":
                    os.symlink(os.path.join(outside, "folder"), path)
                elif content == "dangling":
                    os.symlink(os.path.join(outside, "missing.png"), path)
                elif content == "loop":
                    os.symlink(os.path.basename(path), path)  # a link to itself
                elif content == "folder-named-png":
                    os.makedirs(path)
                    with open(os.path.join(path, "inner.png"), "wb") as f:
                        f.write(good["png"])
                elif content in SPECIALS:  # a picture's name on no file: left out, counted
                    special_file(path, content)
    train, test = os.path.join(root, "train"), os.path.join(root, "test")
    if "class-link-outside" in structures:
        os.symlink(outside, os.path.join(train, "linked"))
    if "class-link-dangling" in structures:
        os.symlink(os.path.join(outside, "gone"), os.path.join(train, "dangling"))
    if "class-link-loop" in structures:
        os.symlink("looped", os.path.join(train, "looped"))
    if "file-at-class-level" in structures:
        with open(os.path.join(train, "readme.png"), "wb") as f:
            f.write(good["png"])
    if "fifo-at-class-level" in structures:
        special_file(os.path.join(train, "pipe"), "fifo")
    if "unknown-test-class" in structures:
        os.makedirs(os.path.join(test, "zebra"))
        with open(os.path.join(test, "zebra", "z.png"), "wb") as f:
            f.write(good["png"])
    if "one-class" in structures:
        for name in case["classes"][1:]:
            shutil.rmtree(os.path.join(train, name))
    if "empty-class" in structures:
        os.makedirs(os.path.join(train, "empty"))
    if "hidden-class" in structures:
        os.makedirs(os.path.join(train, ".cache"))
        with open(os.path.join(train, ".cache", "x.png"), "wb") as f:
            f.write(b"not a picture")
    for split, path in (("no-train", train), ("no-test", test)):
        if split in structures:
            os.rename(path, path + ".moved")
    for split, path in (("train-is-file", train), ("test-is-file", test)):
        if split in structures:
            if os.path.isdir(path):
                os.rename(path, path + ".was")
            with open(path, "w") as f:
                f.write("a file where a folder should be\n")
    if "test-is-fifo" in structures:  # drawn alone or with no-test or test-is-file
        if os.path.isdir(test):
            os.rename(test, test + ".was")
        elif os.path.lexists(test):
            os.remove(test)
        special_file(test, "fifo")
    if "root-is-file" in structures:
        os.rename(root, root + ".was")
        with open(root, "w") as f:
            f.write("a file\n")
    return root


class _Refuse(Exception):
    """The oracle's verdict: the folder must be refused."""


def _bad_name(name: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") for c in name)


def _oracle_folder(root: str):
    """The documented rules, read from the tree on disk independently of the package:
    (class names, split -> [(path, label, pixels or None)]); ``_Refuse`` for a folder that
    must be refused."""
    def classes_of(split_dir):
        names = []
        for name in sorted(os.listdir(split_dir)):
            path = os.path.join(split_dir, name)
            if name.startswith("."):
                continue
            if os.path.islink(path) and not os.path.exists(path):  # dangling, or a loop
                raise _Refuse()
            if os.path.isdir(path):
                if _bad_name(name):
                    raise _Refuse()
                names.append(name)
        return names

    if not all(os.path.isdir(os.path.join(root, s)) for s in ("train", "test")):
        raise _Refuse()
    names = classes_of(os.path.join(root, "train"))
    if len(names) < 2:
        raise _Refuse()
    splits = {}
    for folder, split in (("train", "train"), ("validation", "validation"), ("test", "eval")):
        split_dir = os.path.join(root, folder)
        if not os.path.isdir(split_dir):
            continue
        entries = []
        for name in classes_of(split_dir):
            if name not in names:
                raise _Refuse()
            class_dir = os.path.join(split_dir, name)
            for file in sorted(os.listdir(class_dir)):
                path = os.path.join(class_dir, file)
                if file.lower().endswith(EXTENSIONS) and not os.path.isdir(path):
                    entries.append((path, names.index(name)))
        if not entries:
            raise _Refuse()
        splits[split] = [(path, label, _oracle_pixels(path, alone=False))
                         for path, label in entries]
    if any(all(pixels is None for _, _, pixels in entries) for entries in splits.values()):
        raise _Refuse()
    return tuple(names), splits


def _old_run(out: str) -> dict[str, bytes]:
    """An earlier run's records and metadata in ``out`` (one record per split); returns its
    files' bytes, to check that a refusal leaves them as they were."""
    import tensorflow as tf

    from cifar10_estimator.data import metadata, schema

    os.makedirs(out)
    facts = {}
    for split in schema.SPLITS:
        path = schema.record_path(out, split)
        with tf.io.TFRecordWriter(path) as writer:
            writer.write(schema.encode_example(bytes(schema.IMAGE_BYTES), 1))
        facts[split] = metadata.file_facts(path, 1)
    metadata.write_metadata(out, facts, "an earlier run", ("old0", "old1"), "image-folder")
    return _snapshot(out)


def _snapshot(folder: str) -> dict[str, bytes]:
    if not os.path.isdir(folder):
        return {}
    snapshot = {}
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                snapshot[name] = f.read()
        else:
            snapshot[name] = b"<folder>"
    return snapshot


def _records(path: str) -> list[tuple[np.ndarray, int]]:
    import tensorflow as tf

    rows = []
    # Parsed with protobuf alone: a tf.data pipeline per file would cost more than the case.
    for raw in tf.compat.v1.io.tf_record_iterator(path):
        feature = tf.train.Example.FromString(raw).features.feature
        chw = np.frombuffer(feature["image"].bytes_list.value[0], np.uint8)
        rows.append((chw.reshape(3, 32, 32).transpose(1, 2, 0),
                     feature["label"].int64_list.value[0]))
    return rows


def _whole(expected: dict) -> callable:
    """Whether an output folder holds exactly what the generator should have written:
    the metadata, each split's file matching it, the expected records, no stale split."""
    def whole(out: str) -> bool:
        from cifar10_estimator.data import metadata, schema
        from cifar10_estimator.errors import UserError

        info = metadata.dataset_info(out)
        if set(info.splits) != set(expected["splits"]):
            return False
        if info.class_names != expected["classes"] or info.dataset != "image-folder":
            return False
        for split in schema.SPLITS:
            if split not in expected["splits"]:
                if os.path.lexists(schema.record_path(out, split)):
                    return False  # an older run's split beside metadata that no longer has it
                continue
            try:
                metadata.verify_split(out, split)
            except UserError:
                return False
            rows = _records(schema.record_path(out, split))
            wanted = expected["splits"][split]
            if len(rows) != len(wanted) or info.splits[split].records != len(wanted):
                return False
            for (image, label), (pixels, want_label) in zip(rows, wanted):
                if label != want_label or not np.array_equal(image, pixels):
                    return False
        return True
    return whole


def _no_temporaries(out: str) -> None:
    if os.path.isdir(out):
        left = [n for n in os.listdir(out) if n.endswith(".tmp")]
        if left:
            raise Violation(f"temporary files left in {out}: {left}")


def check_folder(case, scratch: str, context) -> str:
    """``load_image_folder`` then ``write_tfrecords`` on a tree: refused in one line naming
    the folder exactly when the rules say so, else records of exactly the readable pictures
    (the oracle's pixels and labels), the damaged ones counted and the first named; the output
    folder whole, or as it was."""
    from cifar10_estimator.data import image_folder, writer

    root = _write_tree(case, scratch)
    try:
        names, splits = _oracle_folder(root)
        must_refuse = False
    except _Refuse:
        must_refuse = True
    out = os.path.join(scratch, "records")
    old = {}
    if case["output"] == "old-run":
        old = _old_run(out)
    elif case["output"] == "is-file":
        with open(out, "w") as f:
            f.write("a file where the output folder should be\n")
        old = {None: b"file"}
    elif case["output"] == "record-is-folder":
        os.makedirs(os.path.join(out, "train.tfrecords"))
        old = _snapshot(out)
    elif case["output"] in ("record-is-fifo", "stale-fifo"):
        os.makedirs(out)
        special_file(os.path.join(out, "train.tfrecords" if case["output"] == "record-is-fifo"
                                  else "validation.tfrecords"), "fifo")
        old = _snapshot(out)
    lines = []
    outcome, source = harness.refused(lambda: image_folder.load_image_folder(root, lines.append),
                                      root)
    for line in lines:
        if "\n" in line:
            raise Violation(f"a progress line of several lines: {line!r}")
    if outcome == REFUSED:
        if not must_refuse:
            raise Violation("refused a folder the rules accept")
        _unchanged(out, old)
        return REFUSED
    if must_refuse:
        raise Violation(f"accepted a folder the rules refuse: {source.description}")

    # The pictures kept and left out, as the oracle sees them.
    damaged = [path for entries in splits.values() for path, _, px in entries if px is None]
    description = source.description
    if "\n" in description or not description.isprintable():
        raise Violation(f"the summary is not one printable line: {description!r}")
    if damaged:
        shown = damaged[0] if damaged[0].isprintable() else repr(damaged[0])
        note = f", {len(damaged)} damaged picture(s) left out (first: {shown})"
        if not description.endswith(note + ")"):
            raise Violation(f"the summary {description!r} does not say {note!r}")
    elif "damaged" in description:
        raise Violation(f"the summary counts damaged pictures where there are none: {description}")
    if source.label_names != names:
        raise Violation(f"class names {source.label_names}, expected {names}")
    expected = {"classes": names, "splits": {
        split: [(px, label) for _, label, px in entries if px is not None]
        for split, entries in splits.items()}}
    for split, wanted in expected["splits"].items():
        batch = source.splits[split][0]
        if len(batch.labels) != len(wanted) or batch.data.shape != (len(wanted), 3072):
            raise Violation(f"{split}: {len(batch.labels)} pictures kept, expected {len(wanted)}")

    written, _ = harness.refused(lambda: writer.write_tfrecords(source, out, lines.append), out)
    if written == REFUSED:
        if case["output"] not in ("is-file", "record-is-folder"):
            raise Violation(f"writing the records to a fresh {out} was refused")
        _unchanged(out, old)
        return REFUSED
    harness.assert_absent_or_whole(out, _whole(expected))
    if not os.path.isdir(out):
        raise Violation(f"accepted, but no output in {out}")
    _no_temporaries(out)
    return SKIPPED if damaged else ACCEPTED


def _unchanged(out: str, old: dict) -> None:
    if None in old:  # the output path was a file
        if not os.path.isfile(out):
            raise Violation(f"the file at {out} was replaced")
        return
    if _snapshot(out) != old:
        raise Violation(f"a refused run changed {out}")
    _no_temporaries(out)


def _tree(train, test, classes=("cat", "dog"), structures=(), output="fresh"):
    """A folder case: ``train``/``test`` file specs per class (the same for every class)."""
    return {"classes": list(classes), "structures": list(structures), "output": output,
            "files": {"train": {c: list(train) for c in classes},
                      "test": {c: list(test) for c in classes}}}


_GOOD = {"content": "good", "stem": "a", "extension": ".png", "format": "png"}
_LOOP = {"content": "loop", "stem": "b", "extension": ".png"}
_BROKEN = {"content": "picture", "stem": "b", "extension": ".png", "how": "cut",
           "data": b"\x89PNG\r\n\x1a\nbroken"}
_FIFO = {"content": "fifo", "stem": "x", "extension": ".png"}

# Failures found and fixed (data.image_folder), smallest first.
FOLDER_REGRESSIONS = (
    # A link to itself among the pictures: DirEntry.is_file() raised OSError (ELOOP).
    _tree([_GOOD, _LOOP], [_GOOD]),
    # ... and where a class folder is expected: DirEntry.is_dir() raised OSError (ELOOP).
    _tree([_GOOD], [_GOOD], structures=["class-link-loop"]),
    # A dangling link where a class folder is expected was silently ignored.
    _tree([_GOOD], [_GOOD], structures=["class-link-dangling"]),
    # A class folder with a line break became a class name of two lines (class_names.txt).
    _tree([_GOOD], [_GOOD], classes=("cat", "new\nline")),
    # A file name that is not UTF-8: tf.data could not take the path (UnicodeEncodeError).
    _tree([dict(_GOOD, stem="bad\udcff")], [_GOOD]),
    # One damaged picture refused the whole folder; now left out and counted (SKIPPED).
    _tree([_GOOD, _BROKEN], [_GOOD], output="old-run"),
    # A split with nothing readable is still refused, and the earlier run left as it was.
    _tree([_GOOD], [_BROKEN], output="old-run"),
    # A pipe named x.png: Pillow's open() of it waited forever; now left out and counted.
    _tree([_GOOD, _FIFO], [_GOOD]),
    # A pipe named validation.tfrecords in the output, and no validation/: it stayed beside
    # metadata without that split (the writer removed only regular files).
    _tree([_GOOD], [_GOOD], output="stale-fifo"),
)
# Failures found and fixed (data.images.check_file).
PICTURE_REGRESSIONS = (
    # A pipe named picture.png read alone: Pillow's open() of it waited forever.
    ("fifo", ".png", "fifo"),
)


def warm_up(folder: str) -> None:
    """Loads TensorFlow and its decoding kernels once per run, so that the first case is timed
    like the others."""
    import tensorflow as tf

    from cifar10_estimator.data import images
    from cifar10_estimator.serving import client

    assert client.load_image  # the serving side imported too
    for data in seeds().values():
        try:
            images.to_cifar_pixels(tf.constant(data))
        except tf.errors.OpError:
            pass  # WebP: TensorFlow does not decode it


KINDS = [
    harness.Kind(
        name="picture",
        reader="data.images.check_file + to_cifar_pixels (generator), serving.client.load_image "
               "(predict)",
        tried="PNG (RGB, grey, RGBA, palette), JPEG, GIF (still, animated), BMP and WebP "
              "seeds, mutated; headers rewritten to promise 0 to 2^32-1 pixels a side "
              "(decompression bombs); another format's body under a header; wrong or no "
              "extension; empty files, text, noise; a pipe, a socket, /dev/zero or /dev/null "
              "in the picture's place",
        strategy=picture_cases(),
        check=check_picture,
        start=warm_up,
        regressions=PICTURE_REGRESSIONS,
    ),
    harness.Kind(
        name="picture-folder",
        reader="data.image_folder.load_image_folder + data.writer.write_tfrecords",
        tried="trees of 1-3 classes x 1-4 files per split: good, mutated, empty, WebP named "
              ".png, bomb and non-image files, pipes, sockets and links to /dev/zero or "
              "/dev/null named as pictures; links to a file outside, to a folder, dangling, "
              "to themselves; class folders with unicode, spaces, leading dots, 200 "
              "characters, line breaks, bytes that are not text; missing train/ or test/, "
              "files or a pipe for folders, an unknown test class, an empty class; output "
              "folder fresh, holding an earlier run, a file, or with a folder or a pipe for a "
              "record file",
        strategy=folder_cases(),
        check=check_folder,
        start=warm_up,
        regressions=FOLDER_REGRESSIONS,
        time_limit=30.0,
    ),
]
