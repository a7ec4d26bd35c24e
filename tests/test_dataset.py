"""The input pipeline: parsing, augmentation, one exact evaluation pass, clear errors."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.data import pipeline
from cifar10_estimator.errors import UserError


def _hwc(rows):
    return rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


def test_training_batches_without_distortion_are_the_records(tiny_records):
    data_dir, rows = tiny_records
    images, labels = rows["train"]
    ds = pipeline.Cifar10DataSet(data_dir, "train", use_distortion=False).make_batch(32, seed=1)
    features, batch_labels = next(iter(ds))
    assert features["image"].dtype == tf.float32 and features["image"].shape == (32, 32, 32, 3)
    assert batch_labels.dtype == tf.int32 and batch_labels.shape == (32,)
    expected = {(int(l), _hwc(img[None])[0].tobytes()) for img, l in zip(images, labels)}
    got = {(int(l), img.astype(np.uint8).tobytes())
           for img, l in zip(features["image"].numpy(), batch_labels.numpy())}
    assert got <= expected  # shuffled, but every example is a record with its own label


def test_an_epoch_visits_every_training_record_once(tiny_records):
    data_dir, rows = tiny_records
    ds = pipeline.Cifar10DataSet(data_dir, "train", use_distortion=False).make_batch(8, seed=2)
    seen = np.concatenate([labels.numpy() for _, labels in ds.take(96 // 8)])
    assert sorted(seen.tolist()) == sorted(rows["train"][1].tolist())


def test_distortion_is_a_padded_crop_possibly_flipped():
    image = np.random.default_rng(0).integers(1, 256, (1, 32, 32, 3)).astype(np.uint8)
    padded = np.pad(image[0], [(4, 4), (4, 4), (0, 0)])
    candidates = [w for y in range(9) for x in range(9)
                  for w in (padded[y:y + 32, x:x + 32], padded[y:y + 32, x:x + 32][:, ::-1])]
    outcomes = set()
    for i in range(40):
        out = pipeline.distort_batch(tf.constant(image), tf.constant([7, i], tf.int64))[0].numpy()
        match = [k for k, c in enumerate(candidates) if np.array_equal(c, out)]
        assert match, "output is not a crop of the padded image"
        outcomes.add(match[0])
    flipped = {k % 2 for k in outcomes}
    assert flipped == {0, 1} and len(outcomes) > 10  # both flips, many offsets


def test_augmentation_is_repeatable_for_a_seed(tiny_records):
    data_dir, _ = tiny_records
    make = lambda seed: next(iter(pipeline.Cifar10DataSet(data_dir, "train").make_batch(  # noqa
        16, seed=seed)))[0]["image"].numpy()
    assert np.array_equal(make(5), make(5))
    assert not np.array_equal(make(5), make(6))


def test_evaluation_is_one_ordered_pass_counting_every_record_once(tiny_records):
    data_dir, rows = tiny_records
    images, labels = rows["eval"]  # 37 records, batch 8: the last batch has 5
    batches = list(pipeline.Cifar10DataSet(data_dir, "eval").make_batch(8))
    assert len(batches) == 5
    weights = np.concatenate([f["weight"].numpy() for f, _ in batches])
    got_labels = np.concatenate([l.numpy() for _, l in batches])
    got_images = np.concatenate([f["image"].numpy() for f, _ in batches])
    assert all(f["image"].shape == (8, 32, 32, 3) for f, _ in batches)
    assert weights.sum() == 37 and weights[:37].all() and not weights[37:].any()
    assert np.array_equal(got_labels[:37], labels)
    assert np.array_equal(got_images[:37].astype(np.uint8), _hwc(images))


def test_record_count_comes_from_the_file_when_there_is_no_metadata(tiny_records):
    data_dir, _ = tiny_records
    assert pipeline.Cifar10DataSet(data_dir, "train").num_examples() == 96


def test_missing_records_name_the_file_and_the_generator(tmp_path):
    with pytest.raises(UserError) as e:
        pipeline.Cifar10DataSet(str(tmp_path), "train")
    assert "train.tfrecords" in str(e.value) and "generate_tfrecords.py" in str(e.value)


def test_unknown_subset_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="subset"):
        pipeline.Cifar10DataSet(str(tmp_path), "test")
