"""Built-in sample data: a small, learnable stand-in for CIFAR-10 in its exact python layout.

``write_sample_data(DIR)`` writes ``DIR/cifar-10-batches-py/`` with ``data_batch_1`` ..
``data_batch_5``, ``test_batch`` and ``batches.meta``, pickled as CIFAR-10's own Python 2 files
are (``pickles.dumps_py2``), so the generator reads them through the same safe loader as the
real dataset. A marker file (``MARKER_NAME``) records the settings that made the folder.

The 10 classes are shapes and textures drawn with random colours (foreground/background
contrast guaranteed), position, scale and pixel noise. Every class is left-right symmetric
and objects stay at least 4 px inside the frame (textures fill it), so the training
distortions (horizontal flip, 4-px pad-and-crop) never change what an image shows, and no two
classes are mirror images of each other. Colours do not depend on the class, so the mean colour
says little about it. Deterministic for a seed; vectorised numpy (60,000 images in seconds).
"""


import json
import os

import numpy as np

from cifar10_estimator import storage
from cifar10_estimator.data import pickles, schema
from cifar10_estimator.errors import UserError

SAMPLE_CLASS_NAMES = (
    "horizontal_stripes", "vertical_stripes", "checkerboard", "disc", "ring",
    "square", "square_outline", "plus", "cross", "triangle",
)
TEXTURE_CLASSES = (0, 1, 2)  # fill the frame; all the others are objects
DEFAULT_IMAGES_PER_BATCH = 2000
DEFAULT_SEED = 0
MIN_IMAGES_PER_BATCH = 10  # one image of each class per batch at least
MAX_IMAGES_PER_BATCH = 10_000  # the real dataset's batch size
MARKER_NAME = "sample_data.json"
_MARKER_FORMAT = 1
# The marker's "generator": the module's name when the package was flat, kept so that sample
# folders written then are still recognised.
_MARKER_GENERATOR = "cifar10_estimator.sample_data"
# Objects are kept this far inside the 32x32 frame: the training pipeline shifts images by up
# to 4 px (pad to 40x40, random 32x32 crop), so a shifted object is never cut.
BORDER = 4
# Minimum RGB distance between foreground and background (of 441 for black vs white).
MIN_CONTRAST = 120.0

_SIZE = schema.HEIGHT  # square images


def draw_params(rng: np.random.Generator, labels: np.ndarray) -> dict[str, np.ndarray]:
    """Draws the random appearance of one image per label: colours, geometry, noise level."""
    n = len(labels)
    bg = rng.uniform(0, 255, (n, 3))
    fg = rng.uniform(0, 255, (n, 3))
    # Redraw foregrounds too close to their background until all have enough contrast.
    while True:
        weak = np.linalg.norm(fg - bg, axis=1) < MIN_CONTRAST
        if not weak.any():
            break
        fg[weak] = rng.uniform(0, 255, (int(weak.sum()), 3))
    # Object half-size r in [5, 10] px in quarter-pixel steps and a centre on the half-pixel
    # grid (exact in binary floating point, so a mirrored image is exactly a redrawn one)
    # such that every object pixel x satisfies BORDER <= x <= 31 - BORDER.
    radius = rng.integers(20, 41, n) / 4.0
    lo, hi = BORDER + radius, (_SIZE - 1 - BORDER) - radius
    cx = np.floor(rng.uniform(lo, hi) * 2) / 2
    cy = np.floor(rng.uniform(lo, hi) * 2) / 2
    return {
        "bg": bg, "fg": fg, "radius": radius, "cx": cx, "cy": cy,
        "thickness": rng.integers(8, 15, n) / 4.0,  # 2 .. 3.5 px strokes
        "period": rng.integers(2, 6, n).astype(np.float64),  # texture half-period / cell, px
        "phase_x": rng.integers(0, 10, n).astype(np.float64),
        "phase_y": rng.integers(0, 10, n).astype(np.float64),
        "noise": rng.uniform(4.0, 14.0, n),  # pixel noise standard deviation
    }


def _masks(label: int, p: dict[str, np.ndarray]) -> np.ndarray:
    """Foreground masks (n, 32, 32) of one class for the parameter rows in ``p``."""
    grid = np.arange(_SIZE, dtype=np.float32)
    y = grid[None, :, None]
    x = grid[None, None, :]

    def col(key: str) -> np.ndarray:  # a per-image value against the pixel grid
        return p[key].astype(np.float32)[:, None, None]

    n = len(p["cx"])
    if label in TEXTURE_CLASSES:
        w = col("period")
        if label == 0:  # horizontal stripes, 2..5 px wide
            return np.broadcast_to((y + col("phase_y")) // w % 2 == 0, (n, _SIZE, _SIZE))
        if label == 1:  # vertical stripes
            return np.broadcast_to((x + col("phase_x")) // w % 2 == 0, (n, _SIZE, _SIZE))
        c = w + 1  # checkerboard with cells of 3..6 px
        return ((y + col("phase_y")) // c + (x + col("phase_x")) // c) % 2 == 0
    dx, dy = x - col("cx"), y - col("cy")
    r, t = col("radius"), col("thickness")
    if label in (3, 4):
        dist = np.sqrt(dx * dx + dy * dy)
        if label == 3:  # filled disc
            return dist <= r
        return (dist <= r) & (dist > r - t)  # ring
    adx, ady = np.abs(dx), np.abs(dy)
    chebyshev = np.maximum(adx, ady)
    inside = chebyshev <= r
    if label == 5:  # filled square
        return inside
    if label == 6:  # square outline
        return inside & (chebyshev > r - t)
    if label == 7:  # plus sign
        return inside & ((adx <= t / 2) | (ady <= t / 2))
    if label == 8:  # X cross: two diagonal bars of width t
        half = t / np.float32(np.sqrt(2))
        return inside & ((np.abs(dx - dy) <= half) | (np.abs(dx + dy) <= half))
    if label == 9:  # upright triangle, apex at the top
        return (dy >= -r) & (dy <= r) & (2 * adx <= dy + r)
    raise ValueError(f"no sample class {label}")


def render(labels: np.ndarray, params: dict[str, np.ndarray],
           noise_rng: np.random.Generator | None) -> np.ndarray:
    """Draws the images as CIFAR stores them: uint8 (N, 3072), CHW byte order.

    With ``noise_rng=None`` the images are noise-free (used to check the geometry).
    """
    labels = np.asarray(labels)
    n = len(labels)
    mask = np.zeros((n, _SIZE, _SIZE), dtype=np.float32)
    for label in range(schema.NUM_CLASSES):
        rows = np.flatnonzero(labels == label)
        if rows.size:
            mask[rows] = _masks(label, {k: v[rows] for k, v in params.items()})
    bg = params["bg"].astype(np.float32)[:, :, None, None]
    fg = params["fg"].astype(np.float32)[:, :, None, None]
    # (n, 3, 32, 32): channel-major, as CIFAR stores images.
    images = mask[:, None] * (fg - bg)
    images += bg
    if noise_rng is not None:
        noise = noise_rng.standard_normal(images.shape, dtype=np.float32)
        noise *= params["noise"].astype(np.float32)[:, None, None, None]
        images += noise
    np.rint(images, out=images)
    np.clip(images, 0, 255, out=images)
    return images.astype(np.uint8).reshape(n, schema.IMAGE_BYTES)


def make_batch(rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``size`` images with balanced labels (class counts differ by at most one), shuffled."""
    labels = rng.permutation(np.arange(size) % schema.NUM_CLASSES)
    params = draw_params(rng, labels)
    return render(labels, params, rng), labels


def _batch_dict(batch_label: str, data: np.ndarray, labels: np.ndarray,
                first_index: int) -> dict:
    # Key order and value types of the real files: batch_label, labels, data, filenames.
    return {
        "batch_label": batch_label,
        "labels": [int(v) for v in labels],
        "data": data,
        "filenames": [f"{SAMPLE_CLASS_NAMES[v]}_s_{first_index + i:06d}.png"
                      for i, v in enumerate(labels)],
    }


def read_marker(batches_dir: str) -> dict | None:
    """The settings recorded in a sample-data folder, or None if it is not one of ours."""
    try:
        # Not a pipe or device (a plain open() would wait on a FIFO), nor JSON nested too deep.
        marker = storage.read_json(os.path.join(batches_dir, MARKER_NAME))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("generator") != _MARKER_GENERATOR:
        return None
    return marker


def matches(batches_dir: str, images_per_batch: int, seed: int) -> bool:
    """True if ``batches_dir`` is sample data written with exactly these settings."""
    marker = read_marker(batches_dir)
    return (marker is not None and marker.get("format") == _MARKER_FORMAT
            and marker.get("images_per_batch") == images_per_batch
            and marker.get("seed") == seed)


def describe(batches_dir: str) -> str | None:
    """A one-line description of a sample-data folder (for metadata), None if not sample data."""
    marker = read_marker(batches_dir)
    if marker is None:
        return None
    return (f"built-in sample data (seed {marker.get('seed')}, "
            f"{marker.get('images_per_batch')} images per batch)")


def check_size(images_per_batch: int) -> None:
    """Raises ``UserError`` unless the batch size is in the supported range."""
    if not MIN_IMAGES_PER_BATCH <= images_per_batch <= MAX_IMAGES_PER_BATCH:
        raise UserError(f"--sample-size must be between {MIN_IMAGES_PER_BATCH} and "
                        f"{MAX_IMAGES_PER_BATCH} images per batch, got {images_per_batch}")


def write_sample_data(data_dir: str, images_per_batch: int = DEFAULT_IMAGES_PER_BATCH,
                      seed: int = DEFAULT_SEED) -> str:
    """Writes ``data_dir/cifar-10-batches-py/`` (atomically) and returns its path.

    Five training batches and one test batch of ``images_per_batch`` images each, plus
    ``batches.meta`` and the marker file. The folder must not exist yet.
    """
    check_size(images_per_batch)
    final = os.path.join(data_dir, schema.BATCHES_DIRNAME)
    if os.path.lexists(final):
        raise UserError(f"{final} already exists; remove it or choose another --data-dir")
    with storage.atomic_dir(final) as tmp:
        for index, name in enumerate(schema.BATCH_FILES):
            # One independent stream per file: a batch does not depend on the others' sizes.
            rng = np.random.default_rng([seed, index])
            data, labels = make_batch(rng, images_per_batch)
            title = (f"training batch {index + 1} of 5" if name.startswith("data_batch")
                     else "testing batch 1 of 1")
            body = _batch_dict(title, data, labels, index * images_per_batch)
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(pickles.dumps_py2(body))
        meta = {"num_cases_per_batch": images_per_batch,
                "label_names": list(SAMPLE_CLASS_NAMES),
                "num_vis": schema.IMAGE_BYTES}
        with open(os.path.join(tmp, "batches.meta"), "wb") as f:
            f.write(pickles.dumps_py2(meta))
        with open(os.path.join(tmp, MARKER_NAME), "w") as f:
            json.dump({"generator": _MARKER_GENERATOR, "format": _MARKER_FORMAT, "seed": seed,
                       "images_per_batch": images_per_batch}, f, indent=2, sort_keys=True)
            f.write("\n")
    return final
