"""The fast trainers' levers (issue 44) and the paper recipe's schedule for a given length:
He et al.'s proportions, the frozen whitening layer, batch-norm learning rates, Lookahead,
alternating flips and multi-crop test-time views; each in the graph it runs in, and all of
them together in one real run that trains, resumes, evaluates and exports."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.config import flags, overlays, plan
from cifar10_estimator.config.settings import ModelSection, ScheduleSection
from cifar10_estimator.data import pipeline, schema
from cifar10_estimator.errors import UserError
from cifar10_estimator.model import graph as model_graph
from cifar10_estimator.training.estimator import model_fn
from cifar10_estimator.model import lookahead, networks, schedules, whitening
from trainer_fixtures import run_module, trainer_args, write_records

pytestmark = pytest.mark.timeout(240)
PATHS = ["--data-dir", "d", "--job-dir", "j"]


# ---------------------------------------------------------------------------------------------
# He et al.'s proportions


@pytest.mark.parametrize("argv, schedule", [
    (["--train-epochs", "15"], "he"),
    (["--train-steps", "3000"], "piecewise"),  # the tutorial's own flag keeps its schedule
    ([], "piecewise"),  # the tutorial's own 80,000 steps keep its drops
    (["--train-epochs", "15", "--lr-boundary-epochs", "8,12", "--lr-decay-factors",
      "1,0.1,0.01"], "piecewise"),
    (["--train-epochs", "15", "--lr-schedule", "cosine"], "cosine"),
    (["--train-epochs", "15", "--recipe", "fast"], "one-cycle"),
    (["--train-epochs", "15", "--model", "tutorial-cnn"], "piecewise"),
])
def test_the_paper_recipe_given_a_length_in_epochs_follows_he_et_al(argv, schedule):
    config, _ = flags.parse(argv + PATHS)
    assert config.schedule.lr_schedule == schedule
    # The recipe line marks a schedule as given only when a flag gave it.
    line = overlays.describe(config)
    assert (f"--lr-schedule {schedule} (given)" in line) == ("--lr-schedule" in argv)


def test_he_schedule_drops_at_half_and_three_quarters_of_the_run():
    params = ScheduleSection(lr_schedule="he", learning_rate=0.1)
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        rate = schedules.learning_rate(step, plan.schedule_of(
            params, steps_per_epoch=7, total_steps=200, global_batch=128))
        with tf.compat.v1.Session() as session:
            # As the piecewise schedule: a phase's rate from the step after its boundary.
            got = [session.run(rate, {step: s}) for s in (0, 100, 101, 150, 151, 199)]
    np.testing.assert_allclose(got, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)


def test_the_plan_line_names_the_steps_he_drops_after():
    from cifar10_estimator.config.plan import resolve
    from cifar10_estimator.config.role import Role
    from cifar10_estimator.training import start

    config, _ = flags.parse(["--train-epochs", "10", "--train-batch-size", "100"] + PATHS)
    resolved = resolve(Role(), config.model, config.schedule, config.devices, config.cluster,
                       dataset="cifar10", class_names=[str(i) for i in range(10)],
                       train_records=1000, precision="fp32")
    assert start._plan_line(resolved, config.model, config.schedule.recipe).endswith(
        "he learning rate peaking at 0.1, x0.1 after step 50 and x0.01 after step 75 (He et "
        "al.'s proportions of the run)")


# ---------------------------------------------------------------------------------------------
# The whitening layer


def test_whitening_filters_decorrelate_patches_to_unit_variance():
    rng = np.random.default_rng(0)
    noise = rng.normal(size=(300, 34, 34, 3)).astype(np.float32)
    # Neighbouring pixels and channels correlated, as in pictures.
    images = (noise[:, 1:33, 1:33] + noise[:, :32, :32] + noise[:, 1:33, 1:33, ::-1]) / 3
    for patch in (2, 3):
        filters, bias = whitening.filters_from(tf.constant(images), patch)
        assert filters.shape == (patch, patch, 3, whitening.channels(patch))
        out = tf.nn.conv2d(images, filters, 1, "VALID") + bias
        flat = tf.reshape(out, [-1, whitening.channels(patch)]).numpy().astype(np.float64)
        np.testing.assert_allclose(flat.mean(axis=0), 0, atol=1e-3)
        np.testing.assert_allclose(np.cov(flat.T), np.eye(whitening.channels(patch)),
                                   atol=5e-3)


def test_a_layer_without_a_sample_starts_at_zero_to_be_restored():
    with tf.Graph().as_default():
        y = whitening.whiten(tf.ones([1, 8, 8, 3]), 2, nchw=False, compute_dtype=tf.float32)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert not session.run(y).any()
        assert not tf.compat.v1.trainable_variables()


def test_whitening_needs_the_resnet_and_a_patch_it_knows():
    with pytest.raises(UserError, match="--whitening-patch applies to --model resnet"):
        flags.parse(["--model", "tutorial-cnn", "--whitening-patch", "2"] + PATHS)
    with pytest.raises(SystemExit):
        flags.parse(["--whitening-patch", "4"] + PATHS)


# ---------------------------------------------------------------------------------------------
# Batch-norm learning rates and Lookahead


def _one_step_changes(multiplier: float) -> dict:
    """How far one training step moves each variable of a tiny ResNet, by name."""
    schedule = ScheduleSection(batch_norm_lr_multiplier=multiplier, momentum=0.0)
    settings = model_fn.ModelSettings(
        ModelSection(num_layers=8), plan.optimizer_of(schedule), schedule=plan.schedule_of(
            schedule, steps_per_epoch=10, total_steps=10, global_batch=128))
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(1)
        images = tf.constant(np.random.default_rng(0).uniform(0, 255, (8, 32, 32, 3)),
                             tf.float32)
        spec = model_fn.make_model_fn(settings)({"image": images}, tf.range(8) % 10,
                                                tf.estimator.ModeKeys.TRAIN)
        weights = tf.compat.v1.trainable_variables()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = session.run(weights)
            session.run(spec.train_op)
            after = session.run(weights)
    return {v.op.name: a - b for v, a, b in zip(weights, after, before)}


def test_the_batch_norm_multiplier_scales_their_steps_alone():
    plain, faster = _one_step_changes(1.0), _one_step_changes(4.0)
    for name, change in plain.items():
        expected = 4 * change if name.endswith(("/gamma", "/beta")) else change
        # after - before of float32 weights near 1: rounding of about 1e-7.
        np.testing.assert_allclose(faster[name], expected, rtol=1e-4, atol=1e-6)
    assert any(np.abs(c).max() > 0 for n, c in plain.items() if n.endswith("/beta"))


def test_lookahead_moves_slow_weights_every_k_steps_and_resets_the_fast_ones():
    # Plain gradient descent on w with gradient 1 and rate 1: each step subtracts 1.
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(0.0))
        step = tf.compat.v1.train.get_or_create_global_step()
        apply = tf.compat.v1.train.GradientDescentOptimizer(1.0).apply_gradients(
            [(tf.constant(1.0), w)], global_step=step)
        train = lookahead.step(apply, [w], step, k=2, alpha=0.5)
        slow = [v for v in tf.compat.v1.global_variables()
                if v.op.name == f"w/{lookahead.SLOW_SUFFIX}"][0]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            seen = []
            for _ in range(4):
                session.run(train)
                seen.append(session.run([w, slow]))
    # Step 2: fast -2, slow 0 + 0.5 (-2 - 0) = -1, fast reset to -1; step 4: fast -3, slow
    # -1 + 0.5 (-3 + 1) = -2.
    assert seen == [[-1.0, 0.0], [-1.0, -1.0], [-2.0, -1.0], [-2.0, -2.0]]


def test_lookahead_is_refused_where_replicas_apply_updates_apart():
    for extra in (["--sync"], ["--distribution-strategy", "mirrored"]):
        config, _ = flags.parse(["--lookahead-steps", "5", *extra] + PATHS)
        from cifar10_estimator.config import checks
        with pytest.raises(UserError, match="--lookahead-steps: not available with"):
            checks.validate(config)


# ---------------------------------------------------------------------------------------------
# Alternating flips


def test_alternating_flips_flip_each_record_in_every_other_epoch():
    indices = tf.range(1000, dtype=tf.int64)
    even = pipeline.alternating_flips(indices, tf.zeros_like(indices), seed=7).numpy()
    odd = pipeline.alternating_flips(indices, tf.ones_like(indices), seed=7).numpy()
    assert (even != odd).all()
    assert 400 < even.sum() < 600
    other = pipeline.alternating_flips(indices, tf.zeros_like(indices), seed=8).numpy()
    assert (other != even).any()


def test_the_training_pipeline_shows_every_picture_both_ways_over_two_epochs(tmp_path):
    # Ten records, one per label, each picture bright on its left half and dark on its right:
    # after any crop the brighter side says whether it was flipped. A batch of ten is an epoch.
    data_dir = str(tmp_path)
    write_records(data_dir, {"train": 10})
    from cifar10_estimator.data import schema
    with tf.io.TFRecordWriter(schema.record_path(data_dir, "train")) as writer:
        image = np.zeros([32, 32, 3], np.uint8)
        image[:, :16] = 255
        for label in range(10):
            writer.write(schema.encode_example(image.transpose(2, 0, 1).tobytes(), label))
    data = pipeline.Cifar10DataSet(data_dir, "train", alternate_flips=True)
    flipped = []
    for features, labels in data.make_batch(10, seed=3).take(4):
        pictures = features["image"].numpy()
        right_brighter = pictures[:, :, 16:].mean(axis=(1, 2, 3)) > pictures[:, :, :16].mean(
            axis=(1, 2, 3))
        flipped.append(dict(zip(labels.numpy().tolist(), right_brighter.tolist())))
    for label in range(10):
        assert flipped[0][label] != flipped[1][label] and flipped[0][label] == flipped[2][label]
        assert flipped[1][label] == flipped[3][label]


# ---------------------------------------------------------------------------------------------
# Multi-crop test-time views


def test_the_views_weigh_the_picture_half_and_each_shift_a_quarter():
    images = tf.reshape(tf.range(2 * 32 * 32 * 3, dtype=tf.float32), [2, 32, 32, 3])
    views = networks.test_time_views(images, ModelSection(test_time_shift=1,
                                                          test_time_mirror=True))
    assert len(views) == 6 and sum(w for _, w in views) == pytest.approx(1.0)
    centre, up_left, down_right = (views[0][0], views[2][0], views[4][0])
    np.testing.assert_array_equal(centre, images)
    # Shifted one pixel: the interior moves by one row and one column each way.
    np.testing.assert_array_equal(up_left[:, 1:, 1:], images[:, :-1, :-1])
    np.testing.assert_array_equal(down_right[:, :-1, :-1], images[:, 1:, 1:])
    np.testing.assert_array_equal(views[1][0], images[:, :, ::-1])
    assert networks.test_time_views(images, ModelSection()) == [(images, 1.0)]


def test_logits_average_the_views_as_weighed():
    params = ModelSection(num_layers=8, test_time_shift=2)
    pictures = np.random.default_rng(1).uniform(0, 255, (3, 32, 32, 3)).astype(np.float32)
    with tf.Graph().as_default():
        images = tf.constant(pictures)
        with tf.compat.v1.variable_scope("resnet"):
            averaged = networks.logits(images, params, is_training=False, num_classes=10)
        with tf.compat.v1.variable_scope("resnet", reuse=True):
            each = [(networks.logits(view, ModelSection(num_layers=8), is_training=False,
                                     num_classes=10), weight)
                    for view, weight in networks.test_time_views(images, params)]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            got, views = session.run([averaged, [logits for logits, _ in each]])
    expected = sum(v * w for v, (_, w) in zip(views, each))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_shift_beyond_the_training_crops_is_refused():
    with pytest.raises(UserError, match="--test-time-shift must be 0 to 4 pixels"):
        from cifar10_estimator.config import checks
        checks.validate(flags.parse(["--test-time-shift", "5"] + PATHS)[0])


# ---------------------------------------------------------------------------------------------
# All of them in one real run


def test_a_run_with_every_lever_trains_resumes_evaluates_and_exports(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    # The tutorial's piecewise schedule: a resumed run may train longer (not so under he).
    # Progressive resizing: the first run's first 4 steps at 16 pixels (0.7 of its 6), its
    # last 2 and the resumed run's at full size.
    levers = ["--lr-schedule", "piecewise", "--whitening-patch", "2",
              "--low-res-fraction", "0.7", "--low-res-size", "16",
              "--batch-norm-lr-multiplier", "4",
              "--lookahead-steps", "3", "--alternating-flips", "true", "--test-time-shift", "1",
              "--test-time-mirror", "true", "--eval-throttle-secs", "100000"]
    first = run_module("cifar10_estimator", *trainer_args(data_dir, job_dir, "--train-steps",
                                                          "6", *levers))
    assert first.returncode == 0, first.stderr[-3000:]
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(job_dir))
    filters = reader.get_tensor("resnet/whitening/filters")
    # The filters are those of the training file's pictures, computed once.
    sample = pipeline.Cifar10DataSet(data_dir, "train").spread_sample(whitening.SAMPLE_PICTURES)
    expected, _ = whitening.filters_from(next(iter(sample)) / 128.0 - 1.0, 2)
    np.testing.assert_allclose(filters, expected, rtol=1e-3, atol=1e-3)
    assert reader.has_tensor(f"resnet/stem/kernel/{lookahead.SLOW_SUFFIX}")
    assert reader.get_variable_to_shape_map()["resnet/stem/kernel"] == [3, 3, 12, 16]

    # Resumed, the frozen filters stay as they were: restored, neither trained nor recomputed.
    second = run_module("cifar10_estimator", *trainer_args(data_dir, job_dir, "--train-steps",
                                                           "9", *levers))
    assert second.returncode == 0, second.stderr[-3000:]
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(job_dir))
    assert reader.get_tensor("global_step") == 9
    np.testing.assert_array_equal(reader.get_tensor("resnet/whitening/filters"), filters)
    final = re.search(r"final evaluation at step 9: accuracy = ([0-9.]+)", second.stderr)
    assert final, second.stderr[-2000:]

    # The export computes the same six views: its accuracy on the eval split is the trainer's.
    export = re.search(r"SavedModel: (\S+)", second.stdout + second.stderr).group(1)
    assert os.path.isdir(export)
    evaluated = run_module("cifar10_estimator.evaluate", export, "--data-dir", data_dir)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    accuracy = re.search(r"accuracy[ =:]+([0-9.]+)\s*%?", evaluated.stdout)
    assert accuracy, evaluated.stdout
    shown = float(accuracy.group(1))
    assert shown == pytest.approx(float(final.group(1)) * (100 if shown > 1 else 1), abs=0.02)


# ---------------------------------------------------------------------------------------------
# Progressive resizing


def test_training_pictures_are_scaled_down_until_the_low_res_steps_end():
    settings = model_fn.ModelSettings(model=ModelSection(), low_res_steps=3, low_res_size=20)
    pictures = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        sized = model_graph._sized_for_step(tf.constant(pictures), settings)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            early = session.run(sized)
            session.run(step.assign(2))
            last_low = session.run(sized)
            session.run(step.assign(3))
            full = session.run(sized)
    assert early.shape == last_low.shape == (2, 20, 20, 3)
    # A scale-down keeps the picture: its mean brightness, not a crop of it.
    np.testing.assert_allclose(early.mean(axis=(1, 2)), pictures.mean(axis=(1, 2)), rtol=0.02)
    np.testing.assert_array_equal(full, pictures)


def test_the_low_res_steps_are_the_fraction_of_the_plans_steps():
    from cifar10_estimator.config.plan import resolve
    from cifar10_estimator.config.role import Role
    config, _ = flags.parse(["--low-res-fraction", "0.375", "--train-epochs", "4",
                             "--train-batch-size", "8"] + PATHS)
    settings = model_fn.ModelSettings.of(resolve(
        Role(), config.model, config.schedule, config.devices, config.cluster,
        dataset="cifar10", class_names=schema.CLASS_NAMES, train_records=96,
        precision="fp32"), config.model, config.data.data_dir)
    assert settings.low_res_size == config.schedule.low_res_size == 24
    assert settings.low_res_steps == 18  # 0.375 of 4 epochs of 96 / 8 = 12 steps


def test_the_fast_recipes_share_of_small_pictures_follows_the_training_files_size(
        tmp_path, monkeypatch):
    from cifar10_estimator.config import overlays
    from cifar10_estimator.config.role import Role
    from cifar10_estimator.jobdir import settings_record
    from cifar10_estimator.training import start

    def with_settings(records, *argv):
        config, _ = flags.parse(["--recipe", "fast", *argv] + PATHS)
        return config, plan.resolve(Role(), config.model, config.schedule, config.devices,
                                    config.cluster, dataset="cifar10",
                                    class_names=schema.CLASS_NAMES, train_records=records,
                                    precision="fp32")

    def planned(records, *argv):
        return with_settings(records, *argv)[1]

    def recorded(records, *argv):
        config, resolved = with_settings(records, *argv)
        return settings_record.of_plan(resolved, config.flat())

    config = with_settings(40_000)[0]
    # Today's recipe: 6 epochs of 625 steps at 40,000 records, all at full size.
    today = planned(40_000)
    assert (today.train_steps, today.low_res_fraction, today.low_res_steps) == (3750, 0.0, 0)
    assert "pixels" not in start._plan_line(today, config.model, "fast")

    # A share per size, as the sixth round's table had it (0.545 from 40,000 records).
    monkeypatch.setitem(overlays.LOW_RES_SHARES, "fast", ((10_000, 0.0), (40_000, 0.545)))
    small, between, large = planned(10_000), planned(20_000), planned(40_000)
    assert (small.low_res_fraction, small.low_res_steps) == (0.0, 0)
    assert 0 < between.low_res_fraction < large.low_res_fraction == 0.545
    # 6 epochs of 625 steps: the first 0.545 of the 3,750 steps at 24 pixels.
    assert (large.train_steps, large.low_res_steps) == (3750, 2043)
    assert model_fn.ModelSettings.of(large, config.model, None).low_res_steps == 2043
    assert "the first 2043 steps (0.545 of the run, the fast recipe's share for 40,000 " \
           "records) at 24 pixels" in start._plan_line(large, config.model, "fast")
    assert "pixels" not in start._plan_line(small, config.model, "fast")
    given = planned(10_000, "--low-res-fraction", "0.25")
    assert given.low_res_steps == int(0.25 * given.train_steps)
    assert "(0.25 of the run, --low-res-fraction)" in start._plan_line(given, config.model,
                                                                       "fast")
    assert "--low-res-fraction by the training set's size" in overlays.describe(config)

    # The job dir keeps the share the run resolved: the same file size agrees, another is
    # refused like a changed flag, naming both values.
    job_dir = str(tmp_path)
    settings_record.check(job_dir, settings_record.of_plan(large, config.flat()),
                          is_chief=True)
    assert settings_record.read(job_dir)["low_res_fraction"] == 0.545
    settings_record.check(job_dir, recorded(40_000), is_chief=True)
    with pytest.raises(UserError, match=r"--low-res-fraction 0\.545 \(now 0\)"):
        settings_record.check(job_dir, recorded(10_000), is_chief=True)
    settings_record.check(job_dir, recorded(  # the recorded share and length
        10_000, "--low-res-fraction", "0.545", "--train-steps", "3750"), is_chief=True)


def test_a_low_res_fraction_of_the_whole_run_is_refused():
    from cifar10_estimator.config import checks
    with pytest.raises(UserError, match="--low-res-fraction must be in \\[0, 1\\)"):
        checks.validate(flags.parse(["--low-res-fraction", "1"] + PATHS)[0])


def test_dirac_init_makes_the_first_filters_of_every_convolution_after_the_stem_the_identity():
    with tf.Graph().as_default():
        networks.logits(tf.zeros([2, 32, 32, 3]), ModelSection(num_layers=8, dirac_init=True),
                        is_training=True, num_classes=10, data_format="channels_last",
                        compute_dtype=tf.float32)
        kernels = {v.op.name: v for v in tf.compat.v1.global_variables()
                   if v.op.name.endswith("/kernel") and v.shape.rank == 4}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = session.run(kernels)
    stem = [name for name in values if name.split("/")[-2] == "stem"]
    assert stem and not np.array_equal(values[stem[0]][1, 1, :3, :3], np.eye(3))  # as it was
    checked = 0
    for name, kernel in values.items():
        if name in stem:
            continue
        _, _, channels_in, channels_out = kernel.shape
        n = min(channels_in, channels_out)
        expected = np.zeros((3, 3, channels_in, n), np.float32)
        expected[1, 1, range(n), range(n)] = 1.0
        np.testing.assert_array_equal(kernel[..., :n], expected, err_msg=name)
        assert n == channels_out or np.std(kernel[..., n:]) > 0  # the rest: He et al.'s
        checked += 1
    assert checked == 6  # ResNet-8: three blocks of two convolutions
