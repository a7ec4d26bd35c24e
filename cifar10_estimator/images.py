"""Image files to CIFAR pixels: the one conversion that training data and serving share.

``to_cifar_pixels`` turns the bytes of a PNG, JPEG, GIF or BMP file of any size and mode into
uint8 [32, 32, 3] RGB: grayscale is replicated to three channels, an alpha channel is dropped,
a palette is expanded (``tf.io.decode_image``), an animation keeps its first frame, and the
picture is area-averaged to 32x32 (``tf.image.resize`` with ``method="area"``) and rounded.
The image-folder generator (``image_folder``) stores exactly these pixels in its records and
``predict`` feeds exactly these pixels to the model, so training and serving see the same.

``header_size`` reads width and height from a file's first bytes, so that a decompression bomb
(a small file that decodes to gigabytes) is refused before it is decoded.
"""

import struct
from typing import Optional

from cifar10_estimator import cifar10

# Refuse images whose header promises more pixels than this: 100 megapixels is larger than
# any camera picture and about 400 MB decoded.
MAX_PIXELS = 100_000_000
# Enough of a file to find its size: PNG, GIF and BMP headers are at the start; a JPEG's
# frame header (SOF) follows its metadata segments (EXIF thumbnails can take ~64 KB).
HEADER_BYTES = 1 << 17
# JPEG start-of-frame markers SOF0..SOF15, but for DHT (C4), JPG (C8) and DAC (CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> Optional[tuple[int, int]]:
    offset = 2
    while offset + 9 <= len(data):
        if data[offset] != 0xFF:
            return None
        marker = data[offset + 1]
        if marker == 0xFF:  # fill byte
            offset += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            offset += 2
            continue
        (length,) = struct.unpack(">H", data[offset + 2:offset + 4])
        if marker in _JPEG_SOF:
            height, width = struct.unpack(">HH", data[offset + 5:offset + 9])
            return width, height
        offset += 2 + length
    return None


def header_size(data: bytes) -> Optional[tuple[int, int]]:
    """(width, height) from the first bytes of a PNG, GIF, BMP or JPEG file; None otherwise."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:2] == b"BM" and len(data) >= 26:
        width, height = struct.unpack("<ii", data[18:26])
        return abs(width), abs(height)  # a negative height means top-down rows
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def too_large(data: bytes) -> Optional[str]:
    """A reason to refuse the file before decoding it (its header promises too many pixels)."""
    size = header_size(data)
    if size is not None and size[0] * size[1] > MAX_PIXELS:
        return (f"is {size[0]}x{size[1]} pixels, more than the {MAX_PIXELS:,} this package "
                f"decodes; shrink it first")
    return None


def to_cifar_pixels(encoded):
    """uint8 [32, 32, 3] RGB pixels of one encoded image (a scalar string tensor)."""
    import tensorflow as tf

    image = tf.io.decode_image(encoded, channels=cifar10.CHANNELS, expand_animations=False)
    image.set_shape([None, None, cifar10.CHANNELS])
    resized = tf.image.resize(tf.cast(image, tf.float32), [cifar10.HEIGHT, cifar10.WIDTH],
                              method="area")
    return tf.cast(tf.round(tf.clip_by_value(resized, 0.0, 255.0)), tf.uint8)
