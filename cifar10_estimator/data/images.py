"""Image files to CIFAR pixels: the one conversion that training data and serving share.

``to_cifar_pixels`` turns the bytes of a PNG, JPEG, GIF or BMP file of any size and mode into
uint8 [32, 32, 3] RGB: grayscale is replicated to three channels, an alpha channel is dropped,
a palette is expanded (``tf.io.decode_image``), an animation keeps its first frame, and the
picture is area-averaged to 32x32 (``tf.image.resize`` with ``method="area"``) and rounded.
The image-folder generator (``image_folder``) stores exactly these pixels in its records and
``predict`` feeds exactly these pixels to the model, so training and serving see the same.

``check_file`` reads only a file's header, with Pillow, before anything decodes it: a file that
is no picture is refused by name, and so is a decompression bomb (a small file that decodes to
gigabytes), by Pillow's own limit (``PIL.Image.MAX_IMAGE_PIXELS``, 89,478,485 pixels: about
0.25 GB as RGB, far beyond any camera picture).
"""

import os
import warnings
from typing import BinaryIO, Union

from cifar10_estimator import storage
from cifar10_estimator.data import schema
from cifar10_estimator.errors import UserError

KINDS = "PNG, JPEG, GIF or BMP"
# Pillow's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS), which check_file applies
# through Pillow; the export's serving_bytes signature applies the same bound in its graph.
MAX_PIXELS = 89_478_485


def check_file(file: Union[str, os.PathLike, BinaryIO], name: str) -> None:
    """Refuses ``file`` (a local path or an open binary file) unless its header is a picture of
    a size Pillow would decode. Only the header is read; a path is opened only if it is a
    regular file (``storage.open_regular``: Pillow's own ``open`` would wait forever on a FIFO
    named ``x.png``).

    Raises:
      UserError: naming ``name``: not a regular file, not a picture Pillow recognises, or a
        decompression bomb.
    """
    if isinstance(file, (str, os.PathLike)):
        try:
            with storage.open_regular(file, "rb") as opened:
                check_file(opened, name)
        except FileNotFoundError:
            raise UserError(f"cannot read image {name}: no such file") from None
        except PermissionError:
            raise UserError(f"cannot read image {name}: permission denied") from None
        except OSError as e:  # a pipe, socket, device or folder in its place
            raise UserError(f"cannot read image {name}: {storage.reason(e)}") from None
        return
    from PIL import Image  # only commands that read picture files need Pillow

    try:
        with warnings.catch_warnings():
            # Pillow warns above MAX_IMAGE_PIXELS and raises only above twice that; refuse both.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(file):
                pass
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise UserError(f"{name} is too large to decode safely ({e.args[0].split(',')[0]}); "
                        f"shrink it first") from None
    except (OSError, SyntaxError, ValueError):  # UnidentifiedImageError is an OSError
        raise UserError(f"{name} is not a readable {KINDS} image; remove or replace it") from None


def to_cifar_pixels(encoded):
    """uint8 [32, 32, 3] RGB pixels of one encoded image (a scalar string tensor)."""
    import tensorflow as tf

    image = tf.io.decode_image(encoded, channels=schema.CHANNELS, expand_animations=False)
    image.set_shape([None, None, schema.CHANNELS])
    resized = tf.image.resize(tf.cast(image, tf.float32), [schema.HEIGHT, schema.WIDTH],
                              method="area")
    return tf.cast(tf.round(tf.clip_by_value(resized, 0.0, 255.0)), tf.uint8)
