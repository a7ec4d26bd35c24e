"""The input pipeline: TFRecords to batches of images and labels with ``tf.data``.

``Cifar10DataSet(data_dir, subset, use_distortion).make_batch(batch_size)`` returns a dataset of
``({'image': float32 [B, 32, 32, 3] in 0..255}, int32 labels [B])`` (24x24 training images with
the ``crop-flip-colour`` augmentation). It emits whole batches of a
static size and knows nothing about towers; ``towers.split_batch`` shards them.

Training: shuffle, repeat, batch, then parse and augment whole batches at once (one
``parse_example`` and a handful of vectorised ops per batch instead of per image, so no Python
and little per-element overhead runs in the hot path), then prefetch. Two augmentations, drawn
independently per image:

- ``pad-crop-flip``, the ResNet tutorial's (He et al. 2015, section 4.2): pad 4 pixels of
  zeros to 40x40, crop a random 32x32 window and flip left-right with probability 1/2.
- ``crop-flip-colour``, the original CIFAR-10 tutorial's (``cifar10_input.distorted_inputs``):
  a random 24x24 window, a flip, a brightness shift drawn from [-63, 63] and a contrast factor
  from [0.2, 1.8] (``tf.image.adjust_contrast``'s formula: about each channel's mean). Its
  images are 24x24 and are not clipped, as the tutorial's were not; the network standardises
  each one (``model.tutorial_cnn``).

Evaluation: one ordered pass over the file in which every record counts exactly once. The last
batch is padded to full size with zero images whose ``weight`` feature is 0, so metrics that use
the weights ignore the padding and towers always get equal shards.
"""

import random
from typing import Optional

import tensorflow as tf

from cifar10_estimator.data import metadata, schema

PAD = 4  # pixels of zero padding before the random crop (He et al. 2015, section 4.2)
# The original tutorial's crop and colour ranges (cifar10_input.py: IMAGE_SIZE,
# random_brightness max_delta, random_contrast lower and upper).
TUTORIAL_CROP = 24
TUTORIAL_BRIGHTNESS = 63.0
TUTORIAL_CONTRAST = (0.2, 1.8)
PAD_CROP_FLIP = "pad-crop-flip"
CROP_FLIP_COLOUR = "crop-flip-colour"
IN_FLIGHT_BATCHES = 2  # batches parsed (and augmented) ahead of the step, training and eval


def without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Switches tf.data's autotuning off for a pipeline whose parallelism is fixed.

    With autotuning on, every iterator starts a model thread (``Model::OptimizeLoop``) that
    sleeps on a timer doubling up to 60 s; in TF 2.15 the iterator's destruction can signal it
    before the cancellation is marked (a lost wake-up), and ``Session.close`` then waits out
    the rest of the period: 10-60 s between the end of training and the export, in some runs,
    growing with training time. These pipelines set no AUTOTUNE value, so the thread has
    nothing to tune; without it the close is immediate (the export phase and autotuning lines of
    benchmarks/fixed_cost.py).
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def parse_batch(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Parses a [B] batch of serialized Examples: uint8 HWC images [B,32,32,3], int32 labels."""
    parsed = tf.io.parse_example(serialized, schema.FEATURE_SPEC)
    return schema.decode_images(parsed["image"]), tf.cast(parsed["label"], tf.int32)


def _crop_and_flip(images: tf.Tensor, seed: tf.Tensor, size: int, pad: int,
                   flips: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Random ``size`` x ``size`` windows of each image padded by ``pad``, flipped
    left-right with probability 1/2 (or where ``flips``, bool [B], says); one gather per axis,
    so no per-image work is scheduled."""
    batch = tf.shape(images)[0]
    padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    offsets = tf.random.stateless_uniform([batch, 2], seed=seed,
                                          maxval=schema.HEIGHT + 2 * pad - size + 1,
                                          dtype=tf.int32)
    if flips is None:
        flips = tf.random.stateless_uniform([batch], seed=seed + [0, 1 << 32]) < 0.5
    steps = tf.range(size)[None, :]
    rows = offsets[:, :1] + steps
    # A flipped image reads its window's columns right to left.
    cols = offsets[:, 1:] + tf.where(flips[:, None], size - 1 - steps, steps)
    cropped = tf.gather(padded, rows, axis=1, batch_dims=1)
    return tf.gather(cropped, cols, axis=2, batch_dims=1)


def distort_batch(images: tf.Tensor, seed: tf.Tensor,
                  flips: Optional[tf.Tensor] = None) -> tf.Tensor:
    """``pad-crop-flip`` on a [B,32,32,C] batch of any dtype.

    Args:
      images: the batch.
      seed: int64 [2], the stateless random seed of this batch; the same seed gives the same
        crops and flips.
      flips: bool [B], which images to flip (``alternating_flips``), instead of at random.
    """
    return _crop_and_flip(images, seed, schema.HEIGHT, PAD, flips)


def tutorial_distort_batch(images: tf.Tensor, seed: tf.Tensor,
                           flips: Optional[tf.Tensor] = None) -> tf.Tensor:
    """``crop-flip-colour`` on a [B,32,32,C] batch: float32 [B,24,24,C], as ``distort_batch``
    seeded."""
    x = tf.cast(_crop_and_flip(images, seed, TUTORIAL_CROP, 0, flips), tf.float32)
    batch = tf.shape(images)[0]
    brightness = tf.random.stateless_uniform(
        [batch, 1, 1, 1], seed=seed + [0, 2 << 32], minval=-TUTORIAL_BRIGHTNESS,
        maxval=TUTORIAL_BRIGHTNESS)
    contrast = tf.random.stateless_uniform(
        [batch, 1, 1, 1], seed=seed + [0, 3 << 32], minval=TUTORIAL_CONTRAST[0],
        maxval=TUTORIAL_CONTRAST[1])
    x = x + brightness
    mean = tf.reduce_mean(x, axis=[1, 2], keepdims=True)
    return (x - mean) * contrast + mean


AUGMENTATIONS = {PAD_CROP_FLIP: distort_batch, CROP_FLIP_COLOUR: tutorial_distort_batch}


def alternating_flips(indices: tf.Tensor, epochs: tf.Tensor, seed: int) -> tf.Tensor:
    """Whether to flip each record (bool [B]) in its epoch under alternating flips (airbench,
    Jordan 2024, arXiv:2404.00498): a fixed random half of the records in even epochs, the
    other half in odd ones, so every two epochs show every picture both ways.

    Args:
      indices: int64 [B], the records' places in the training file.
      epochs: int64 [B], the epoch each record is read in, from 0.
      seed: chooses the half; a record's half is a hash of its index and the seed, so no
        table of the file's size is kept.
    """
    half = tf.strings.to_hash_bucket_fast(
        tf.strings.join([tf.strings.as_string(indices), str(seed)], "/"), 2)
    return tf.equal((half + epochs) % 2, 1)


class Cifar10DataSet:
    """One split of the CIFAR-10 TFRecords."""

    def __init__(self, data_dir: str, subset: str = "train", use_distortion: bool = True,
                 augmentation: str = PAD_CROP_FLIP, alternate_flips: bool = False):
        """
        Args:
          data_dir: folder with ``<subset>.tfrecords``.
          subset: 'train', 'validation' or 'eval'.
          use_distortion: augment; applies to 'train' only.
          augmentation: one of ``AUGMENTATIONS``.
          alternate_flips: the augmentation flips by ``alternating_flips``, not at random.

        Raises:
          UserError: the record file is missing.
        """
        if subset not in schema.SPLITS:
            raise ValueError(f"Invalid data subset {subset!r}; expected one of "
                             f"{sorted(schema.SPLITS)}")
        self.data_dir = data_dir
        self.subset = subset
        if augmentation not in AUGMENTATIONS:
            raise ValueError(f"Invalid augmentation {augmentation!r}; expected one of "
                             f"{sorted(AUGMENTATIONS)}")
        self.use_distortion = use_distortion and subset == "train"
        self.augment = AUGMENTATIONS[augmentation]
        self.alternate_flips = alternate_flips
        self.path = metadata.existing_record_path(data_dir, subset)

    def num_examples(self) -> int:
        """Records in the file (from the generator's metadata, else counted)."""
        return metadata.split_size(self.data_dir, self.subset)

    def make_batch(self, batch_size: int, *, seed: int | None = None,
                   shuffle_buffer: int | None = None,
                   shard: tuple[int, int] = (1, 0)) -> tf.data.Dataset:
        """The dataset of batches for this subset.

        Training subsets repeat forever in shuffled order; other subsets make one ordered pass,
        padded as described in the module docstring (features then include ``weight``).

        Args:
          batch_size: examples per batch (the whole worker's batch, before tower sharding).
          seed: makes shuffling and augmentation repeatable.
          shuffle_buffer: records in the shuffle buffer; default the whole file (or shard), so
            every epoch is a uniform permutation.
          shard: (shards, index): training reads every shards-th record from the index-th on,
            so the workers of a cluster read disjoint records (each with its own seed).
        """
        if self.subset == "train":
            return self._training_batches(self._records(), batch_size, seed, shuffle_buffer,
                                          shard)
        return self.one_pass(batch_size)

    def one_pass(self, batch_size: int) -> tf.data.Dataset:
        """One ordered pass over this subset (the training file too), without augmentation,
        padded as the module docstring says: what an evaluation reads."""
        return self._evaluation_batches(self._records(), batch_size)

    def spread_sample(self, count: int) -> tf.data.Dataset:
        """One batch of up to ``count`` pictures (float32 [N, 32, 32, 3], 0..255, not
        augmented) spread evenly over the file: every (records // count)-th record, so a file
        written in class order still gives every class."""
        stride = max(1, self.num_examples() // count)
        return without_autotuning(self._records().shard(stride, 0).take(count).batch(count).map(
            tf.autograph.experimental.do_not_convert(
                lambda serialized: tf.cast(parse_batch(serialized)[0], tf.float32))))

    def _records(self) -> tf.data.Dataset:
        # Its framing walked first (a few hundredths of a second): TensorFlow's reader would
        # allocate whatever length a record declares, and a hostile one crashes the process.
        metadata.check_framing(self.path)
        # A large read buffer: records are small, so unbuffered reads are latency-bound.
        return tf.data.TFRecordDataset(self.path, buffer_size=8 << 20)

    def _training_batches(self, records, batch_size, seed, shuffle_buffer, shard):
        shards, index = shard
        # Each record with its place in the file, which alternating flips key on.
        records = records.enumerate()
        if shards > 1:
            records = records.shard(shards, index)
            seed = None if seed is None else seed + index  # the same seed: other orders
        # Records of this shard: records index, index + shards, ...
        shard_records = max(len(range(index, self.num_examples(), shards)), 1)
        buffer = shuffle_buffer or shard_records
        # Shuffle before repeat so each epoch sees every record once; reshuffled per epoch.
        records = records.shuffle(buffer, seed=seed, reshuffle_each_iteration=True).repeat()
        # drop_remainder gives a static batch size, which the tower split needs.
        batches = records.batch(batch_size, drop_remainder=True)
        distort = self.augment if self.use_distortion else None
        alternate = distort is not None and self.alternate_flips
        # Each batch's augmentation seed is (base seed, batch index): repeatable for a given
        # seed whatever order the parallel map runs in.
        base_seed = seed if seed is not None else random.SystemRandom().randrange(1 << 62)

        # Not converted by autograph (here and below): the branches are on Python values,
        # and rewriting the source costs time in every input_fn call for nothing.
        @tf.autograph.experimental.do_not_convert
        def parse(batch, places_and_records):
            places, serialized = places_and_records
            images, labels = parse_batch(serialized)
            if distort:
                flips = None
                if alternate:
                    # Every epoch is one pass of the shard (shuffled before the repeat), so
                    # the n-th record read is in epoch n // shard_records.
                    read = batch * batch_size + tf.range(batch_size, dtype=tf.int64)
                    flips = alternating_flips(places, read // shard_records, base_seed)
                images = distort(images, tf.stack([tf.constant(base_seed, tf.int64), batch]),
                                 flips)
            return {"image": tf.cast(images, tf.float32)}, labels

        # Two whole batches in flight keep the step fed with a wide margin: the pipeline alone
        # makes many times the images/s that the fastest training step consumes
        # (docs/performance.md, "Input pipeline").
        return without_autotuning(
            batches.enumerate().map(parse, num_parallel_calls=IN_FLIGHT_BATCHES,
                                    deterministic=seed is not None).prefetch(IN_FLIGHT_BATCHES))

    def _evaluation_batches(self, records, batch_size):
        @tf.autograph.experimental.do_not_convert
        def parse(serialized):
            images, labels = parse_batch(serialized)
            real = tf.shape(labels)[0]
            missing = batch_size - real
            images = tf.pad(images, [[0, missing], [0, 0], [0, 0], [0, 0]])
            labels = tf.pad(labels, [[0, missing]])
            weight = tf.concat([tf.ones([real]), tf.zeros([missing])], axis=0)
            images = tf.ensure_shape(images, [batch_size, schema.HEIGHT, schema.WIDTH,
                                              schema.CHANNELS])
            return ({"image": tf.cast(images, tf.float32),
                     "weight": tf.ensure_shape(weight, [batch_size])},
                    tf.ensure_shape(labels, [batch_size]))

        # Whole batches are parsed by one vectorised map, so two in flight keep the eval step
        # fed as they do the training step (benchmarks/input_pipeline_bench.py --subset eval).
        return without_autotuning(
            records.batch(batch_size).map(parse, num_parallel_calls=IN_FLIGHT_BATCHES)
            .prefetch(IN_FLIGHT_BATCHES))
