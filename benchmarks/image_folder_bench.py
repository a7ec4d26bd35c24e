"""Images/s of the image-folder conversion against decoding with PIL in one Python loop.

Writes a folder of JPEG and PNG pictures of mixed sizes (64 to 320 px, like photos shrunk for
the web), then alternates, on the same files: ``image_folder.decode_files`` (TensorFlow's
decoders and area resize to 32x32, in parallel through ``tf.data``) and the loop a user would
write with Pillow (open, convert to RGB, ``resize((32, 32), Image.BOX)``, ``numpy.asarray``).
Pillow is needed only here: ``pip install pillow``.

    python benchmarks/image_folder_bench.py --images 2000 --runs 3
"""

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from machine import print_machine_line


def write_pictures(folder: str, count: int) -> list[str]:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        h, w = rng.integers(64, 321, 2)
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        pixels = np.cumsum(pixels, axis=1, dtype=np.uint32).astype(np.uint8)  # some structure
        jpeg = i % 2 == 0
        data = (tf.io.encode_jpeg(pixels, quality=90) if jpeg else tf.io.encode_png(pixels))
        path = os.path.join(folder, f"{i:05d}.{'jpg' if jpeg else 'png'}")
        with open(path, "wb") as f:
            f.write(data.numpy())
        paths.append(path)
    return paths


def with_pil(paths: list[str]) -> np.ndarray:
    from PIL import Image

    rows = []
    for path in paths:
        with Image.open(path) as image:
            small = image.convert("RGB").resize((32, 32), Image.BOX)
        rows.append(np.asarray(small).transpose(2, 0, 1).reshape(-1))
    return np.stack(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print_machine_line()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from cifar10_estimator.data import image_folder

    folder = tempfile.mkdtemp(prefix="c10img.")
    paths = write_pictures(folder, args.images)
    rates: dict[str, list[float]] = {"image_folder (tf.data, parallel)": [],
                                     "PIL loop": []}
    image_folder.decode_files(paths[:64])  # load TensorFlow's kernels once
    for run in range(args.runs):
        for name, fn in (("image_folder (tf.data, parallel)", image_folder.decode_files),
                         ("PIL loop", with_pil)):
            started = time.perf_counter()
            rows = fn(paths)
            rates[name].append(len(paths) / (time.perf_counter() - started))
            assert rows.shape == (len(paths), 3072)
            print(f"run {run + 1}: {name} {rates[name][-1]:,.0f} images/s", flush=True)
    pil = statistics.median(rates["PIL loop"])
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"{name:<34} median {median:8,.0f} images/s ({median / pil:.2f}x PIL)")
    print(f"({args.images} pictures, half JPEG, half PNG, 64-320 px; {args.runs} alternating "
          f"runs)")


if __name__ == "__main__":
    main()
