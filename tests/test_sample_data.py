"""The built-in sample data: CIFAR-10's exact layout, deterministic, balanced, distortion-safe."""

import os
import pickle

import numpy as np
import pytest

from cifar10_estimator.data import pickles, sample_data, schema
from cifar10_estimator.errors import UserError
from conftest import BATCH_NAMES

OBJECT_CLASSES = [c for c in range(10) if c not in sample_data.TEXTURE_CLASSES]


def files(folder) -> dict[str, bytes]:
    return {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}


def test_layout_matches_cifar10(tmp_path):
    folder = sample_data.write_sample_data(str(tmp_path), images_per_batch=20, seed=1)
    assert folder == str(tmp_path / schema.BATCHES_DIRNAME)
    assert sorted(os.listdir(folder)) == sorted(
        list(BATCH_NAMES) + ["batches.meta", sample_data.MARKER_NAME])
    for index, name in enumerate(BATCH_NAMES):
        raw = pickle.load(open(os.path.join(folder, name), "rb"), encoding="bytes")
        assert list(raw) == [b"batch_label", b"labels", b"data", b"filenames"]
        assert raw[b"batch_label"] == (b"testing batch 1 of 1" if name == "test_batch"
                                       else f"training batch {index + 1} of 5".encode())
        assert len(raw[b"filenames"]) == 20 and raw[b"filenames"][0].endswith(b".png")
        batch = pickles.load_batch(os.path.join(folder, name))  # the generator's own loader
        assert batch.data.shape == (20, 3072) and batch.data.dtype == np.uint8
    meta = pickles.load_pickle(os.path.join(folder, "batches.meta"))
    assert meta == {b"num_cases_per_batch": 20, b"num_vis": 3072,
                    b"label_names": [n.encode() for n in sample_data.SAMPLE_CLASS_NAMES]}
    assert list(meta) == [b"num_cases_per_batch", b"label_names", b"num_vis"]
    assert sample_data.matches(folder, 20, 1)
    assert not sample_data.matches(folder, 20, 2) and not sample_data.matches(folder, 30, 1)
    assert sample_data.describe(folder) == "built-in sample data (seed 1, 20 images per batch)"


def test_deterministic_for_a_seed(tmp_path):
    a = files(sample_data.write_sample_data(str(tmp_path / "a"), 20, seed=7))
    b = files(sample_data.write_sample_data(str(tmp_path / "b"), 20, seed=7))
    c = files(sample_data.write_sample_data(str(tmp_path / "c"), 20, seed=8))
    assert a == b
    assert all(a[name] != c[name] for name in BATCH_NAMES)
    assert len({a[name] for name in BATCH_NAMES}) == len(BATCH_NAMES)  # batches all differ


@pytest.mark.parametrize("size", [20, 25])
def test_labels_are_balanced(size):
    _, labels = sample_data.make_batch(np.random.default_rng(0), size)
    counts = np.bincount(labels, minlength=10)
    assert counts.sum() == size and counts.max() - counts.min() <= 1
    assert len(set(labels[:10].tolist())) > 1  # shuffled, not in class order


def _noise_free(labels, seed=0):
    labels = np.asarray(labels)
    params = sample_data.draw_params(np.random.default_rng(seed), labels)
    images = sample_data.render(labels, params, None).reshape(-1, 3, 32, 32)
    return images.transpose(0, 2, 3, 1), params


def test_objects_stay_inside_the_crop_margin():
    # With the 4-px shifts of pad-and-crop, an object must never touch the 4-px frame.
    labels = np.repeat(OBJECT_CLASSES, 30)
    images, params = _noise_free(labels)
    bg = np.rint(params["bg"]).astype(np.uint8)
    b = sample_data.BORDER
    frame = np.ones((32, 32), bool)
    frame[b:32 - b, b:32 - b] = False
    assert (images[:, frame] == bg[:, None, :]).all()
    # ... and every object is really drawn, in the foreground colour.
    fg = np.rint(params["fg"]).astype(np.uint8)
    assert all((img == colour).all(axis=-1).sum() >= 9 for img, colour in zip(images, fg))


def test_flips_keep_every_class():
    labels = np.repeat(np.arange(10), 20)
    images, params = _noise_free(labels)
    mirrored = dict(params, cx=31 - params["cx"])
    flipped_params = sample_data.render(labels, mirrored, None).reshape(-1, 3, 32, 32)
    flipped_params = flipped_params.transpose(0, 2, 3, 1)
    for label in OBJECT_CLASSES:  # a mirrored object is the same object drawn mirrored
        rows = labels == label
        np.testing.assert_array_equal(images[rows][:, :, ::-1], flipped_params[rows])
    # Stripes stay stripes of the same orientation.
    h, v = images[labels == 0], images[labels == 1]
    assert (h == h[:, :, :1]).all() and (v == v[:, :1, :]).all()
    assert not (h == h[:, :1, :]).all()


def test_contrast_and_colour_independence():
    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(10), 100)
    params = sample_data.draw_params(rng, labels)
    assert (np.linalg.norm(params["fg"] - params["bg"], axis=1) >= sample_data.MIN_CONTRAST).all()
    # Mean colour is a poor cue: nearest class-centroid on mean RGB stays far from solving it.
    images = sample_data.render(labels, params, rng).reshape(-1, 3, 1024).astype(np.float64)
    means = images.mean(axis=2)
    train, test = np.arange(1000) % 2 == 0, np.arange(1000) % 2 == 1
    centroids = np.stack([means[train & (labels == k)].mean(axis=0) for k in range(10)])
    guess = np.argmin(((means[test, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (guess == labels[test]).mean() < 0.35


def test_refuses_bad_size_and_existing_folder(tmp_path):
    for size in (9, 10_001):
        with pytest.raises(UserError, match=f"--sample-size must be between 10 and 10000 "
                                            f"images per batch, got {size}"):
            sample_data.write_sample_data(str(tmp_path), size)
    (tmp_path / schema.BATCHES_DIRNAME).mkdir()
    with pytest.raises(UserError, match="already exists"):
        sample_data.write_sample_data(str(tmp_path), 10)
