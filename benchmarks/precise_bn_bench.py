"""Short runs on real pictures: evaluation accuracy with precise batch norm, without it, and with
the best fixed batch-norm decay.

Real pictures: Zalando's Fashion-MNIST from Debian's ``dataset-fashion-mnist`` package
(``apt-get install dataset-fashion-mnist``; 28x28 grey clothes, 10 classes), of which
``--per-class`` training and ``--test-per-class`` test pictures per class are written as an
image folder of PNG files and converted by the package's own generator. Each configuration then
trains a ResNet-8 for ``--steps`` steps at batch 64 with the trainer's default flags but the one
under test, and the final evaluation's accuracy is printed, per seed and as a median.

    python benchmarks/precise_bn_bench.py --seeds 1,2
"""

import argparse
import gzip
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from machine import print_machine_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = "/usr/share/datasets/fashion-mnist"
NAMES = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
         "ankle-boot")
CONFIGS = {
    "default flags (precise batch norm, 50 batches)": [],
    "--precise-bn-batches 0": ["--precise-bn-batches", "0"],
    "--precise-bn-batches 0 --batch-norm-decay 0.9": ["--precise-bn-batches", "0",
                                                       "--batch-norm-decay", "0.9"],
}
ACCURACY = re.compile(r"final evaluation at step \d+: accuracy = ([0-9.]+)")
PRECISE = re.compile(r"precise batch norm: .* \(([0-9.]+) s\)")


def _idx(name: str) -> np.ndarray:
    """An IDX file (LeCun's MNIST format): a magic number, the dimensions, then the bytes."""
    with gzip.open(os.path.join(SOURCE, name)) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def check_source() -> None:
    """Exits with one line if Debian's Fashion-MNIST is not installed."""
    if not os.path.isdir(SOURCE):
        raise SystemExit(f"{SOURCE} not found: apt-get install dataset-fashion-mnist")


# Training pictures per class in Fashion-MNIST (Xiao et al. 2017, arXiv:1708.07747); a
# validation split holds out the last held_out(per_class) of each class, a holdout split as many
# after the first per_class (so it needs per_class + 2 x held_out <= TRAIN_PER_CLASS). HELD_OUT
# where the unused pictures allow it, down to MIN_HELD_OUT so that 50,000 training pictures
# still leave two disjoint sets (issue 69: three splits at 40,000 and 50,000 pictures).
TRAIN_PER_CLASS = 6_000
HELD_OUT = 1_000
MIN_HELD_OUT = 500
MAX_HOLDOUT_PER_CLASS = TRAIN_PER_CLASS - 2 * MIN_HELD_OUT
# What the eval folder holds: the test pictures, the last training pictures of each class (for
# choosing), or training pictures neither of those runs trains or chooses on (for reading once).
EVAL_SPLITS = ("test", "validation", "holdout")


def held_out(per_class: int | None) -> int:
    """The pictures of each class that the validation split, and the holdout split, hold out
    when ``per_class`` train (None: as many as the validation split leaves)."""
    if per_class is None or per_class > MAX_HOLDOUT_PER_CLASS:
        return HELD_OUT  # no room for a holdout split: the validation split as it always was
    return min(HELD_OUT, (TRAIN_PER_CLASS - per_class) // 2)


def eval_indices(labels: np.ndarray, label: int, per_class: int | None, split: str) -> np.ndarray:
    """The training-file indices of ``label``'s pictures in the eval folder of ``split``
    (validation or holdout)."""
    indices = np.flatnonzero(labels == label)
    count = held_out(per_class)
    if split == "validation":
        return indices[-count:]
    assert per_class is not None and per_class <= MAX_HOLDOUT_PER_CLASS, per_class
    return indices[per_class:per_class + count]


def write_image_folder(root: str, per_class: int | None, test_per_class: int | None,
                       split: str = "test") -> None:
    """Writes ``root/train/<class>/*.png`` and ``root/test/<class>/*.png``: the first
    ``per_class`` training and ``test_per_class`` test pictures of each class (None: all).
    With ``split`` validation the test folder gets the last ``held_out(per_class)`` training
    pictures of each class instead, and the training folder at most the ones before them; with
    holdout, as many training pictures after the first ``per_class``."""
    from PIL import Image

    train_count = per_class
    if split == "validation":
        train_count = min(per_class or TRAIN_PER_CLASS, TRAIN_PER_CLASS - held_out(per_class))
    images = {prefix: (_idx(f"{prefix}-images-idx3-ubyte.gz"),
                       _idx(f"{prefix}-labels-idx1-ubyte.gz")) for prefix in ("train", "t10k")}
    for folder_split in ("train", "test"):
        for label, name in enumerate(NAMES):
            if folder_split == "train":
                pixels, labels = images["train"]
                indices = np.flatnonzero(labels == label)[:train_count]
            elif split != "test":
                pixels, labels = images["train"]
                indices = eval_indices(labels, label, per_class, split)
            else:
                pixels, labels = images["t10k"]
                indices = np.flatnonzero(labels == label)[:test_per_class]
            folder = os.path.join(root, folder_split, name)
            os.makedirs(folder)
            for i, index in enumerate(indices):
                Image.fromarray(pixels[index]).save(os.path.join(folder, f"{i:04d}.png"))


def make_records(data_dir: str, per_class: int | None, test_per_class: int | None,
                 split: str = "test") -> None:
    """Fashion-MNIST as the package's TFRecords in ``data_dir``: an image folder of PNG files
    (``write_image_folder``, in a temporary folder beside ``data_dir``, removed afterwards)
    converted by ``tools/generate_tfrecords.py``; train = the training pictures, eval = the
    test pictures (with ``split`` validation or holdout, held-out training pictures:
    ``write_image_folder``)."""
    parent = os.path.dirname(os.path.abspath(data_dir))
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".pictures-") as pictures:
        write_image_folder(pictures, per_class, test_per_class, split)
        generator = os.path.join(REPO, "tools", "generate_tfrecords.py")
        proc = subprocess.run([sys.executable, generator, "--data-dir", data_dir,
                               "--image-folder", pictures], check=False, capture_output=True,
                              text=True)
    if proc.returncode:
        raise SystemExit(f"generate_tfrecords.py failed:\n{(proc.stdout + proc.stderr)[-3000:]}")


def train(data_dir: str, job_dir: str, steps: int, seed: int, extra: list[str]) -> tuple:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    proc = subprocess.run(
        [sys.executable, "-m", "cifar10_estimator", "--data-dir", data_dir, "--job-dir", job_dir,
         "--num-layers", "8", "--train-batch-size", "64", "--train-steps", str(steps),
         "--seed", str(seed), *extra], capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    precise = PRECISE.search(proc.stderr)
    accuracy = float(ACCURACY.search(proc.stderr).group(1))
    return accuracy, float(precise.group(1)) if precise else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--test-per-class", type=int, default=100)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", default="1,2")
    args = parser.parse_args()
    check_source()
    print_machine_line()
    seeds = [int(s) for s in args.seeds.split(",")]
    with tempfile.TemporaryDirectory() as work:
        data_dir = os.path.join(work, "data")
        make_records(data_dir, args.per_class, args.test_per_class)
        print(f"Fashion-MNIST: {10 * args.per_class} training and {10 * args.test_per_class} test "
              f"pictures; ResNet-8, {args.steps} steps at batch 64; seeds {seeds}", flush=True)
        for name, extra in CONFIGS.items():
            results = [train(data_dir, os.path.join(work, f"job-{len(extra)}-{seed}"),
                             args.steps, seed, extra) for seed in seeds]
            accuracies = [a for a, _ in results]
            cost = [s for _, s in results if s is not None]
            shown = ", ".join(f"{100 * a:.1f}%" for a in accuracies)
            extra_cost = (f"; precise batch norm took {statistics.median(cost):.1f} s" if cost
                          else "")
            print(f"{name}: {shown} (median {100 * statistics.median(accuracies):.1f}%)"
                  f"{extra_cost}", flush=True)


if __name__ == "__main__":
    main()
