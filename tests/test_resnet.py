"""The ResNet builder: the paper's parameter counts, shapes, versions and data formats."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.model import resnet


def _count_trainable(num_layers, version=1):
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3])
        resnet.resnet_cifar(images, is_training=True, num_layers=num_layers, version=version)
        return sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())


@pytest.mark.parametrize("num_layers,expected", [
    (20, 269_722), (32, 464_154), (44, 658_586), (56, 853_018)])
def test_trainable_parameters_match_the_paper(num_layers, expected):
    # He et al. 2015, Table 6: 0.27M, 0.46M, 0.66M, 0.85M with option-A shortcuts.
    assert _count_trainable(num_layers) == expected


def test_pre_activation_version_builds_with_its_final_batch_norm():
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3])
        resnet.resnet_cifar(images, is_training=True, num_layers=8, version=2)
        names = [v.name for v in tf.compat.v1.trainable_variables()]
    assert "final_bn/gamma:0" in names and "stem_bn/gamma:0" not in names


@pytest.mark.parametrize("bad", [7, 9, 21, 2])
def test_depth_must_be_6n_plus_2(bad):
    with tf.Graph().as_default(), pytest.raises(ValueError, match="6n\\+2"):
        resnet.resnet_cifar(tf.zeros([1, 32, 32, 3]), is_training=False, num_layers=bad)


_LOGITS_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf
from cifar10_estimator.model import resnet

data_format, out_path = sys.argv[1], sys.argv[2]
images = np.random.default_rng(0).uniform(0, 255, (3, 32, 32, 3)).astype(np.float32)
results = {}
for version in (1, 2):
    with tf.Graph().as_default():
        logits = resnet.resnet_cifar(tf.constant(images), is_training=False, num_layers=8,
                                     version=version, data_format=data_format)
        queued = len(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
        with tf.compat.v1.Session() as sess:
            # Same values for both layouts: seeded by variable name, not graph position.
            for v in tf.compat.v1.global_variables():
                rng = np.random.default_rng(sum(map(ord, v.op.name)))
                value = rng.normal(0, 0.2, v.shape.as_list()).astype(np.float32)
                sess.run(v.assign(np.abs(value) + 0.5 if "variance" in v.name else value))
            results[f"v{version}"] = sess.run(logits)
            results[f"queued{version}"] = np.array(queued)
np.savez(out_path, **results)
"""


@pytest.mark.slow
def test_channels_first_computes_the_same_logits_as_channels_last(tmp_path):
    # NCHW runs on this CPU through oneDNN, so the GPU layout is checked for real here. Each
    # layout runs in its own process: on TF 2.15 with oneDNN, an NCHW graph run after an
    # NHWC graph of the same shapes in one process gave wrong logits (seen while writing
    # this test); one layout per process, as in training, is exact.
    # NCHW pooling exists only in oneDNN's CPU kernels, which the command lines turn on; the
    # test turns them on in its own processes whatever the suite runs with.
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1"}
    out = {}
    for fmt in ("channels_last", "channels_first"):
        path = tmp_path / f"{fmt}.npz"
        subprocess.run([sys.executable, "-c", _LOGITS_SCRIPT, fmt, str(path)], check=True,
                       capture_output=True, cwd=tmp_path, env=env, timeout=300)
        out[fmt] = np.load(path)
    for version in (1, 2):
        nhwc, nchw = out["channels_last"][f"v{version}"], out["channels_first"][f"v{version}"]
        assert nhwc.shape == (3, 10)  # odd batch: nothing divides by accident
        assert out["channels_last"][f"queued{version}"] == 0  # inference queues no updates
        np.testing.assert_allclose(nchw, nhwc, rtol=1e-4, atol=1e-4)


def test_training_mode_queues_one_update_pair_per_batch_norm():
    with tf.Graph().as_default():
        resnet.resnet_cifar(tf.zeros([2, 32, 32, 3]), is_training=True, num_layers=8)
        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        moving = [v for v in tf.compat.v1.global_variables() if "moving_" in v.name]
    # ResNet-8: stem + 3 blocks x 2 batch norms = 7, each with a mean and a variance.
    assert len(updates) == len(moving) == 14


@pytest.mark.parametrize("version", [1, 2])
def test_folding_batch_norm_into_convolutions_computes_the_same_logits(version):
    """The export's folded network equals the plain one, with batch-norm statistics far from
    their initial values (so a wrong scale or shift would show)."""
    images = np.random.default_rng(0).uniform(0, 255, (3, 32, 32, 3)).astype(np.float32)
    logits = {}
    for fold in (False, True):
        with tf.Graph().as_default():
            out = resnet.resnet_cifar(tf.constant(images), is_training=False, num_layers=8,
                                      version=version, fold_batch_norm=fold)
            with tf.compat.v1.Session() as sess:
                for v in tf.compat.v1.global_variables():
                    rng = np.random.default_rng(sum(map(ord, v.op.name)))
                    value = rng.normal(0, 0.3, v.shape.as_list()).astype(np.float32)
                    sess.run(v.assign(np.abs(value) + 0.5 if "variance" in v.name else value))
                logits[fold] = sess.run(out)
                names = sorted(v.op.name for v in tf.compat.v1.global_variables())
        logits[f"names{fold}"] = names
    assert logits["namesFalse"] == logits["namesTrue"]  # the same checkpoint fits both
    np.testing.assert_allclose(logits[True], logits[False], rtol=1e-4, atol=1e-4)
    assert np.abs(logits[False]).max() > 0.1  # not a trivially zero output


def test_batch_norm_is_folded_only_for_inference():
    with tf.Graph().as_default(), pytest.raises(ValueError, match="only for inference"):
        resnet.resnet_cifar(tf.zeros([1, 32, 32, 3]), is_training=True, num_layers=8,
                            fold_batch_norm=True)


@pytest.mark.parametrize("model", ["resnet", "tutorial-cnn"])
def test_test_time_mirror_gives_a_picture_and_its_mirror_the_same_logits(model):
    # Averaging the logits of x and flip(x) makes the network blind to the flip; without it a
    # random network tells them apart. Training builds the plain network.
    from cifar10_estimator.config.settings import ModelSection
    from cifar10_estimator.model import networks

    rng = np.random.default_rng(0)
    pictures = rng.uniform(0, 255, (3, 32, 32, 3)).astype(np.float32)
    both = np.concatenate([pictures, pictures[:, :, ::-1]])
    results = {}
    for mirror in (False, True):
        params = ModelSection(model=model, num_layers=8, test_time_mirror=mirror)
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(1)
            images = tf.constant(both)
            with tf.compat.v1.variable_scope(networks.SCOPES[model]):
                served = networks.logits(images, params, is_training=False, num_classes=10)
            with tf.compat.v1.variable_scope(networks.SCOPES[model], reuse=True):
                trained = networks.logits(images, params, is_training=True, num_classes=10)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                results[mirror] = sess.run([served, trained])
    (plain, plain_training), (mirrored, mirrored_training) = results[False], results[True]
    assert not np.allclose(plain[:3], plain[3:], atol=1e-4)
    np.testing.assert_allclose(mirrored[:3], mirrored[3:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mirrored[:3], (plain[:3] + plain[3:]) / 2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mirrored_training, plain_training, rtol=1e-5, atol=1e-5)


def test_zero_init_residual_zeroes_the_scale_of_each_blocks_last_batch_norm():
    """Each v1 block's last batch-norm scale starts at 0 (its residual branch adds nothing to
    the shortcut at first), every other scale at 1."""
    from cifar10_estimator.config.settings import ModelSection
    from cifar10_estimator.model import networks

    pictures = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype(np.float32)
    for zero in (False, True):
        params = ModelSection(num_layers=8, zero_init_residual=zero)
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(1)
            with tf.compat.v1.variable_scope(networks.SCOPES["resnet"]):
                networks.logits(tf.constant(pictures), params, is_training=True, num_classes=10)
            gammas = {v.op.name: v for v in tf.compat.v1.trainable_variables()
                      if v.op.name.endswith("/gamma")}
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                values = sess.run(gammas)
        last = {n: g for n, g in values.items() if n.endswith("bn2/gamma")}
        rest = {n: g for n, g in values.items() if n not in last}
        assert len(last) == 3 and len(rest) == 4  # ResNet-8: 3 blocks, stem + 3 first norms
        assert all((g == (0.0 if zero else 1.0)).all() for g in last.values())
        assert all((g == 1.0).all() for g in rest.values())


def test_zero_init_residual_is_refused_for_pre_activation_blocks():
    with tf.Graph().as_default(), pytest.raises(ValueError, match="version 1"):
        resnet.resnet_cifar(tf.zeros([1, 32, 32, 3]), is_training=True, num_layers=8,
                            version=2, zero_init_residual=True)


def test_no_bias_decay_leaves_batch_norm_and_the_dense_bias_out_of_the_weight_decay():
    from cifar10_estimator.config.settings import ModelSection
    from cifar10_estimator.model import networks

    decayed = {}
    for no_bias in (False, True):
        params = ModelSection(num_layers=8, no_bias_decay=no_bias)
        with tf.Graph().as_default():
            with tf.compat.v1.variable_scope(networks.SCOPES["resnet"]):
                networks.logits(tf.zeros([1, 32, 32, 3]), params, is_training=True,
                                num_classes=10)
            trainable = tf.compat.v1.trainable_variables()
            decayed[no_bias] = {v.op.name for v in networks.decayed_weights(params, trainable)}
            every = {v.op.name for v in trainable}
    assert decayed[False] == every
    # ResNet-8: the stem, 3 blocks x 2 convolutions, and the dense layer's kernel.
    assert len(decayed[True]) == 8 and all(n.endswith("/kernel") for n in decayed[True])
    assert not any(n.endswith(("gamma", "beta", "bias")) for n in decayed[True])
