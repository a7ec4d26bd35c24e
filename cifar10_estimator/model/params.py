"""The model's hyperparameters: their defaults, meaning and constraints, stated once.

``ModelParams`` holds what the ``model_fn`` reads from the user's settings: the network, the
optimisation and how towers and workers combine gradients. The trainer's settings
(``training.config.TrainConfig``) extend it with the job's own, and the command line makes one
flag per field from the field's name, type and ``help`` (``training.flags``), so a hyperparameter
is added here once. The defaults are the original TensorFlow tutorial's (``--num-layers 44``,
batch 128, momentum 0.9, weight decay 2e-4, learning rate 0.1, batch norm 0.997 / 1e-5).

``--model`` picks the network. Each has its own defaults (``MODEL_DEFAULTS``), which take the
place of the fields' defaults: the ResNet's are the fields' own, the original tutorial CNN's are
its tutorial's.

No TensorFlow here: command lines import this before TensorFlow loads.
"""

import dataclasses
from typing import Optional


RESNET = "resnet"
TUTORIAL_CNN = "tutorial-cnn"
# The defaults each model puts in place of the fields' own. The tutorial CNN's are those of
# TensorFlow's original CIFAR-10 tutorial (cifar10.py and cifar10_train.py): learning rate 0.1,
# decayed by 0.1 every 350 epochs (staircase; no run of this package reaches a second drop),
# batch 128, plain SGD (no momentum), weight decay 0.004 (on its hidden layers' weights only,
# model.tutorial_cnn), and evaluation with moving averages of all trainable weights at 0.9999.
MODEL_DEFAULTS: dict[str, dict] = {
    RESNET: {},
    TUTORIAL_CNN: {
        "learning_rate": 0.1,
        "lr_boundary_epochs": (350.0,),
        "lr_decay_factors": (1.0, 0.1),
        "train_batch_size": 128,
        "momentum": 0.0,
        "weight_decay": 0.004,
        "moving_average_decay": 0.9999,
    },
}


def setting(default, help: str, **extra):
    """A dataclass field with the ``help`` (and ``choices``) its command-line flag shows."""
    return dataclasses.field(default=default, metadata={"help": help, **extra})


def flag(name: str) -> str:
    """The command-line spelling of a setting's field name (``num_layers`` -> ``--num-layers``)."""
    return "--" + name.replace("_", "-")


def depth_problem(num_layers: int) -> Optional[str]:
    """Why ``num_layers`` is not a CIFAR ResNet depth, or None.

    He et al. 2015 (arXiv:1512.03385), section 4.2: 6n+2 layers, a stem, three stages of n
    two-layer blocks and the dense layer; n >= 1.
    """
    if num_layers < 8 or (num_layers - 2) % 6:
        return f"must be 6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...), got {num_layers}"
    return None


def blocks_per_stage(num_layers: int) -> int:
    """n for a ResNet of depth 6n+2; ValueError for other depths."""
    problem = depth_problem(num_layers)
    if problem:
        raise ValueError(f"ResNet depth {problem}")
    return (num_layers - 2) // 6


def global_batch(params: "ModelParams", num_workers: int) -> int:
    """Images per global step: a batch from every worker with ``sync``, one batch without."""
    return params.train_batch_size * (num_workers if params.sync else 1)


def depth(blocks: int) -> int:
    """The depth of a ResNet with ``blocks`` blocks per stage."""
    return 6 * blocks + 2


@dataclasses.dataclass(frozen=True)
class ModelParams:
    """The hyperparameters the model_fn reads (one worker's view)."""

    model: str = setting(
        RESNET, "the network: resnet (He et al. 2015, the ResNet tutorial's) or tutorial-cnn "
                "(the original CIFAR-10 tutorial's CNN, with its input recipe, schedule, weight "
                "decay and averaged weights as its defaults)", choices=tuple(MODEL_DEFAULTS))
    num_layers: int = setting(44, "ResNet depth, 6n+2 (20, 32, 44, 56, 110, ...)")
    resnet_version: int = setting(
        1, "1: post-activation blocks (He et al. 2015); 2: pre-activation (He et al. 2016)",
        choices=(1, 2))
    train_batch_size: int = setting(
        128, "images per step per worker, split evenly over its towers")
    momentum: float = setting(0.9, "momentum of the SGD optimizer")
    weight_decay: float = setting(2e-4, "L2 coefficient applied to all trainable variables")
    learning_rate: float = setting(
        0.1, "peak learning rate: the base of the piecewise schedule (multiplied by "
             "--lr-decay-factors at --lr-boundary-epochs), the start of cosine decay, the top "
             "of the one-cycle")
    lr_reference_batch: int = setting(
        0, "scale the peak learning rate linearly with the batch (Goyal et al. 2017): the peak "
           "is --learning-rate x B / N for a global batch of B images (--train-batch-size, "
           "times the workers with --sync); 0: no scaling, --learning-rate is the peak")
    lr_schedule: str = setting(
        "piecewise", "piecewise: the paper's drops at --lr-boundary-epochs; cosine: from the "
                     "peak down to 0 at the end of the run (Loshchilov and Hutter 2017); "
                     "one-cycle: up from peak/25 to the peak, then down to peak/250000 at the "
                     "end (Smith and Topin 2017)",
        choices=("piecewise", "cosine", "one-cycle"))
    warmup_epochs: float = setting(
        0.0, "epochs of linear warm-up from 0 to the peak rate before the schedule (Goyal et "
             "al. 2017); for one-cycle, the length of its rising half (default: 30%% of the "
             "run)")
    lr_boundary_epochs: tuple[float, ...] = setting(
        (82, 123, 300), "epochs at which the learning rate drops (comma-separated, fractions "
                        "allowed); the schedule of tensorpack's cifar10-resnet that the "
                        "tutorial used")
    lr_decay_factors: tuple[float, ...] = setting(
        (1.0, 0.1, 0.01, 0.002), "learning-rate multipliers, one more than the boundaries")
    batch_norm_decay: float = setting(
        0.997, "batch-norm moving-average decay; the decay used at step t is "
               "min(decay, (1+t)/(10+t)), so short runs evaluate right")
    batch_norm_epsilon: float = setting(1e-5, "batch-norm epsilon")
    label_smoothing: float = setting(
        0.0, "label smoothing of the training loss, in [0, 1): the target puts 1 - e on the "
             "true class and e spread over all classes (Szegedy et al. 2016); 0 is off")
    moving_average_decay: float = setting(
        0.0, "keep an exponential moving average of the trainable weights with this decay (0: "
             "off); evaluation, --export-best and the export use the averaged weights. The "
             "decay at step t is min(decay, (1+t)/(10+t)), as ExponentialMovingAverage's "
             "num_updates gives it")
    variable_strategy: str = setting(
        "CPU", "where variables live: CPU keeps them on /cpu:0, GPU spreads them over the "
               "GPUs by byte size", choices=("CPU", "GPU"))
    sync: bool = setting(
        False, "in a cluster, aggregate one gradient per worker per step "
               "(SyncReplicasOptimizer); default is asynchronous")
