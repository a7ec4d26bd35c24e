"""The model's graph in training and evaluation: towers, loss, one update, metrics.

TensorFlow graph code that knows nothing of Estimator: the Estimator-facing model_fn
(``training.estimator.model_fn``) calls it and wraps what it builds into ``EstimatorSpec``s;
the precision probe times its update through that model_fn. ``build_towers`` places one tower
per device on its shard of the batch (or this replica's under a tf.distribute strategy), each
with its logits and, with labels, its loss and gradients; ``outputs`` joins the towers'
predictions, ``loss`` their mean loss, ``eval_metrics`` the evaluation's metrics, and ``train``
averages the towers' gradients into one momentum update (through ``SyncReplicasOptimizer`` with
``sync_replicas``), all on the consolidation device (``consolidation_device``).

The loss and the learning rate get fixed names (``LOSS_TENSOR``, ``LEARNING_RATE_TENSOR``) so
that hooks outside the model (the trainer's progress lines) can fetch them; precise batch
norm finds its feed and updates in two graph collections (``PRECISE_BN_COUNT``,
``PRECISE_BN_UPDATES``).
"""

import dataclasses
import logging
from typing import Optional

import tensorflow as tf

from cifar10_estimator.data import pipeline
from cifar10_estimator.model import (lookahead, metrics, networks, resnet, schedules, towers,
                                     whitening)
from cifar10_estimator.model.model_settings import NAN_LOSS_MESSAGE, ModelSettings

log = logging.getLogger("cifar10_estimator")

# Tensors are named *_value so that the summaries (and Estimator's own "loss") get the plain
# tags: an op named "loss" would turn the summary's tag into "loss_1".
LOSS_TENSOR = "loss_value:0"
LEARNING_RATE_TENSOR = "learning_rate_value:0"
# Precise batch norm (training.estimator.precise_bn) finds what it runs in these graph
# collections: the batch count it feeds, and tower 0's moving-statistics updates.
PRECISE_BN_COUNT = "precise_batch_norm_count"
PRECISE_BN_UPDATES = "precise_batch_norm_updates"


@dataclasses.dataclass
class Towers:
    """What the towers built: logits always; with labels, losses and gradients."""

    logits: list = dataclasses.field(default_factory=list)
    cross_entropy: list = dataclasses.field(default_factory=list)
    weight_decay: list = dataclasses.field(default_factory=list)
    losses: list = dataclasses.field(default_factory=list)
    grads: list = dataclasses.field(default_factory=list)
    update_ops: list = dataclasses.field(default_factory=list)


def _whitening_sample(s: ModelSettings):
    """In training with ``--whitening-patch``, what gives the pictures the whitening filters
    are computed from (``whitening.SAMPLE_PICTURES``, spread over the training file)."""
    if not s.model.whitening_patch or s.data_dir is None:
        return None

    # Built when called: by the layer's initialiser, once per graph, not once per tower.
    def sample():
        return pipeline.Cifar10DataSet(s.data_dir, "train").spread_sample(
            whitening.SAMPLE_PICTURES).get_single_element()

    return sample


def _sized_for_step(images, s: ModelSettings):
    """Training's pictures at the size of the current step: scaled down to ``low_res_size``
    for the first ``low_res_steps`` global steps (progressive resizing), full size after.

    The size follows the global step, as the learning rate does, so a resumed run picks up
    where it stopped. The network is convolutional up to its global average pool, so one set
    of weights serves both sizes; the last steps, precise batch norm and evaluation all see
    full-size pictures.
    """
    if not s.low_res_steps:
        return images
    size = s.low_res_size
    step = tf.compat.v1.train.get_or_create_global_step()
    # Antialiased: a plain bilinear scale-down by 3/4 skips pixels and aliases thin edges.
    return tf.cond(step < s.low_res_steps,
                   lambda: tf.image.resize(images, [size, size], antialias=True),
                   lambda: images)


def _tower(images, labels, is_training, s: ModelSettings, bn_decay):
    """One tower: logits, and in training/eval the loss (cross-entropy + weight decay)."""
    p = s.model
    # Evaluation and prediction fold each batch norm into its convolution, as the export does
    # (serving.signatures): they compute what is served, and faster in bf16 (docs/performance.md,
    # "End of training").
    logits = networks.logits(images, p, is_training=is_training, num_classes=s.num_classes,
                             data_format=s.data_format, compute_dtype=tf.as_dtype(s.compute_dtype),
                             batch_norm_decay=bn_decay, fold_batch_norm=not is_training,
                             whitening_sample=_whitening_sample(s) if is_training else None)
    if labels is None:
        return logits, None, None
    if is_training and p.label_smoothing > 0:
        # Evaluation reports the plain cross-entropy: smoothing regularises training only.
        xent = tf.compat.v1.losses.softmax_cross_entropy(
            tf.one_hot(labels, s.num_classes), logits, label_smoothing=p.label_smoothing,
            reduction=tf.compat.v1.losses.Reduction.NONE)
    else:
        xent = tf.compat.v1.losses.sparse_softmax_cross_entropy(
            labels, logits, reduction=tf.compat.v1.losses.Reduction.NONE)
    # l2_loss is half the squared norm, as in both tutorials.
    l2 = p.weight_decay * tf.math.add_n(
        [tf.nn.l2_loss(v) for v in networks.decayed_weights(
            p, tf.compat.v1.trainable_variables())])
    return logits, xent, l2


def _replica_count() -> int:
    """Replicas of a tf.distribute strategy whose replica this graph is built for (Estimator
    calls the model_fn once per replica under ``train_distribute``); 0 outside a strategy."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return 0
    return tf.distribute.get_replica_context().num_replicas_in_sync


def build_towers(images, labels, s: ModelSettings, *, training: bool, predicting: bool
                 ) -> Towers:
    """One tower per device on its shard of the batch, sharing variables; under a
    tf.distribute strategy, this replica's one tower on its own batch (the strategy places it,
    and all-reduces the gradients)."""
    if training:
        images = _sized_for_step(images, s)
    replicas = _replica_count()
    # Serving and prediction use one tower on the first device: requests have any size.
    devices = list(s.devices) if not predicting and not replicas else [s.devices[0]]
    setters = ([lambda op: op.device or ""] if replicas else
               towers.make_device_setters(devices, s.variable_strategy))
    image_shards = towers.split_batch(images, len(devices))
    label_shards = (towers.split_batch(labels, len(devices)) if labels is not None
                    else [None] * len(devices))
    bn_decay = s.model.batch_norm_decay
    if training:
        with tf.compat.v1.device("" if replicas else towers.consolidation_device(
                s.variable_strategy, devices)):
            scheduled = schedules.batch_norm_decay_schedule(
                tf.compat.v1.train.get_or_create_global_step(), s.model.batch_norm_decay)
            # Fed the batch count k by precise batch norm, the decay is k / (k + 1): the moving
            # statistics become the plain mean of the batches' statistics.
            count = tf.compat.v1.placeholder_with_default(-1.0, [], name=PRECISE_BN_COUNT)
            tf.compat.v1.add_to_collection(PRECISE_BN_COUNT, count)
            bn_decay = tf.where(count >= 0, count / (count + 1.0), scheduled)
    built = Towers()
    for i, (setter, x, y) in enumerate(zip(setters, image_shards, label_shards)):
        with tf.compat.v1.variable_scope(networks.SCOPES[s.model.model],
                                         reuse=True if i > 0 else None), \
                tf.name_scope(f"tower_{i}") as scope, tf.compat.v1.device(setter):
            logits, xent, l2 = _tower(x, y, training, s, bn_decay)
            built.logits.append(logits)
            if xent is None:
                continue
            loss = tf.reduce_mean(xent) + l2
            built.cross_entropy.append(xent)
            built.weight_decay.append(l2)
            built.losses.append(loss)
            if training:
                params = tf.compat.v1.trainable_variables()
                # A strategy SUMs the replicas' gradients (the optimizer's all-reduce): each
                # replica's share of the mean loss is its loss over the replica count.
                scaled = loss / replicas if replicas else loss
                built.grads.append(list(zip(tf.gradients(scaled, params), params)))
            if i == 0:
                # Only tower 0 updates the batch-norm moving statistics: every tower sees a
                # random shard of the same distribution, so one tower's statistics converge
                # to the same values, and the update stays cheap.
                built.update_ops = tf.compat.v1.get_collection(
                    tf.compat.v1.GraphKeys.UPDATE_OPS, scope)
                for op in built.update_ops:
                    tf.compat.v1.add_to_collection(PRECISE_BN_UPDATES, op)
    return built


def moving_average(s: ModelSettings, global_step=None
                   ) -> Optional[tf.compat.v1.train.ExponentialMovingAverage]:
    """The weights' exponential moving average, None when ``moving_average_decay`` is 0.

    Its shadows are ``<variable>/ExponentialMovingAverage`` in the checkpoints; with
    ``num_updates`` (the global step) the decay starts low and grows to the one asked for.
    """
    if not s.model.moving_average_decay:
        return None
    return tf.compat.v1.train.ExponentialMovingAverage(s.model.moving_average_decay,
                                                       num_updates=global_step)


def _train_op(built: Towers, loss_value, learning_rate, global_step, s: ModelSettings):
    """One optimizer update from the towers' averaged gradients (then the weights' moving
    average, if on); and the ``SyncReplicasOptimizer`` whose hook the session needs (None
    without ``sync_replicas``)."""
    optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate, s.optimizer.momentum,
                                                     use_nesterov=s.optimizer.nesterov)
    synced = None
    average = moving_average(s, global_step)
    weights = tf.compat.v1.trainable_variables()
    if s.sync_replicas:
        # The chief applies the average after each aggregated update, once per global step.
        optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
            optimizer, replicas_to_aggregate=s.num_workers, total_num_replicas=s.num_workers,
            variable_averages=average, variables_to_average=weights if average else None)
        log.info("synchronous updates: SyncReplicasOptimizer with replicas_to_aggregate=%d",
                 s.num_workers)
        synced = optimizer
    gradvars = _batch_norm_rates(towers.average_gradients(built.grads), s)
    # A NaN or infinite loss fails the step before the update is applied, so the variables
    # (and every checkpoint saved later) keep their last finite values. Estimator's own
    # NanTensorHook checks only after the step, when the chief's checkpoint hook (which runs
    # first) may already have saved the NaN weights.
    with tf.control_dependencies([tf.debugging.check_numerics(loss_value, NAN_LOSS_MESSAGE)]):
        apply_op = optimizer.apply_gradients(gradvars, global_step=global_step)
    if s.optimizer.lookahead_steps:
        apply_op = lookahead.step(apply_op, weights, global_step, s.optimizer.lookahead_steps,
                                  s.optimizer.lookahead_alpha)
    if average is not None and not s.sync_replicas:
        with tf.control_dependencies([apply_op]):  # the average of the updated weights
            apply_op = average.apply(weights)
    return tf.group(apply_op, *built.update_ops), synced


def _batch_norm_rates(gradvars, s: ModelSettings):
    """The gradients of the batch-norm scales and shifts times ``batch_norm_lr_multiplier``:
    with momentum SGD, a gradient k times larger is a learning rate k times larger for that
    variable alone."""
    factor = s.optimizer.batch_norm_lr_multiplier
    if factor == 1:
        return gradvars
    return [(g * factor if v.op.name.endswith(resnet.BATCH_NORM_PARAMETERS) else g, v)
            for g, v in gradvars]



def consolidation_device(s: ModelSettings) -> str:
    """Where the towers' results meet (their predictions, the mean loss, the update, the
    metrics): the variables' device for towers; under a tf.distribute strategy the strategy
    places them ("")."""
    return "" if _replica_count() else towers.consolidation_device(s.variable_strategy,
                                                                     s.devices)


@dataclasses.dataclass(frozen=True)
class Outputs:
    """The towers' predictions, joined."""

    logits: tf.Tensor
    classes: tf.Tensor
    predictions: dict  # classes and probabilities, as served


def outputs(built: Towers) -> Outputs:
    """The towers' logits joined, the top classes and the probabilities (call it on the
    consolidation device)."""
    logits = tf.concat(built.logits, axis=0) if len(built.logits) > 1 else built.logits[0]
    classes = tf.argmax(logits, axis=1, name="classes")
    return Outputs(logits, classes, {"classes": classes,
                                     "probabilities": tf.nn.softmax(logits, name="probabilities")})


def loss(built: Towers) -> tf.Tensor:
    """The towers' mean loss, named ``LOSS_TENSOR``."""
    return tf.reduce_mean(built.losses, name=LOSS_TENSOR.split(":")[0])


def eval_metrics(built: Towers, labels, classes, weight, s: ModelSettings) -> dict:
    """The evaluation's metrics (``metrics.eval_metrics``) of the towers' predictions, each
    example weighted by ``weight`` (the padding of a partial last batch weighs 0)."""
    return metrics.eval_metrics(labels, classes, tf.concat(built.cross_entropy, axis=0),
                                weight, s.class_names)


@dataclasses.dataclass(frozen=True)
class Update:
    """One training step's op, the loss Estimator logs, and the ``SyncReplicasOptimizer`` whose
    hook the session needs (None without ``sync_replicas``)."""

    op: tf.Operation
    loss: tf.Tensor
    sync_optimizer: Optional[tf.compat.v1.train.SyncReplicasOptimizer]


def train(built: Towers, labels, classes, loss_value, s: ModelSettings) -> Update:
    """The learning rate at the global step (named ``LEARNING_RATE_TENSOR``), the training
    summaries, and one update from the towers' averaged gradients (call it on the
    consolidation device)."""
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = tf.identity(
        schedules.learning_rate(global_step, s.schedule),
        name=LEARNING_RATE_TENSOR.split(":")[0])
    accuracy = tf.reduce_mean(tf.cast(tf.equal(classes, tf.cast(labels, tf.int64)), tf.float32),
                              name="train_accuracy_value")
    cross_entropy = tf.reduce_mean(tf.concat(built.cross_entropy, axis=0),
                                   name="cross_entropy_value")
    tf.compat.v1.summary.scalar("learning_rate", learning_rate)
    tf.compat.v1.summary.scalar("train_accuracy", accuracy)
    # The two parts of the loss (tower 0's weight decay: the same in every tower).
    tf.compat.v1.summary.scalar("cross_entropy", cross_entropy)
    tf.compat.v1.summary.scalar("weight_decay", built.weight_decay[0])
    op, synced = _train_op(built, loss_value, learning_rate, global_step, s)
    # Under a strategy Estimator logs the SUM of the replicas' losses: each gives its share.
    replicas = _replica_count()
    return Update(op, loss_value / replicas if replicas else loss_value, synced)
