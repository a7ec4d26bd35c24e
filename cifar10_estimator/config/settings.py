"""Every setting of the package, once, in sections: ``Settings`` holds one frozen section per
help group (``DataSection``, ``ModelSection``, ``ScheduleSection``, ``DevicesSection``,
``ClusterSection``, ``OutputSection``, ``LoggingSection``), with the facts that follow from a
section alone (its tower devices, its checkpoint interval, its export folder).

Each field is declared with ``fields.setting``: its default, help, whether it is part of the
run record, its range, the models it applies to and whether recipes set it; its section is its
help group. The defaults are the ResNet tutorial's (``--num-layers 44``, batch 128, momentum
0.9, weight decay 2e-4, learning rate 0.1, batch norm 0.997 / 1e-5); each ``--model`` and
``--recipe`` changes some of them (``overlays``).

No TensorFlow here: command lines import this before it loads.
"""

import dataclasses
import os
import typing
from typing import Any, Optional

from cifar10_estimator.config.fields import (AT_LEAST_0, AT_LEAST_1, FRACTION, GROUPS, POSITIVE,
                                             Check, flag, setting)

RESNET = "resnet"
TUTORIAL_CNN = "tutorial-cnn"
MODELS = (RESNET, TUTORIAL_CNN)
PRECISIONS = ("auto", "fp32", "bf16")
# How gradients meet: hand-built towers (one worker; several with parameter servers), or
# TensorFlow's collective all-reduce strategies through Estimator's train_distribute.
TOWERS, MIRRORED, MULTI_WORKER_MIRRORED = "towers", "mirrored", "multi-worker-mirrored"
STRATEGIES = (TOWERS, MIRRORED, MULTI_WORKER_MIRRORED)
# The strategies whose global step takes a batch from every worker (all-reduce; towers do so
# only with --sync): ``config.plan.steps_together`` applies it, and the help below says it
# from this tuple.
ALL_REDUCE_STRATEGIES = (MIRRORED, MULTI_WORKER_MIRRORED)
STEPS_TOGETHER = (f"with --sync or --distribution-strategy "
                  f"{' or '.join(ALL_REDUCE_STRATEGIES)}")
GLOBAL_BATCH = f"--train-batch-size, times the workers {STEPS_TOGETHER}"
# Both tutorials' batch: 128 images per step.
TUTORIAL_BATCH = 128
# Estimator's RunConfig saves a checkpoint every 600 s unless told otherwise, and its EvalSpec
# evaluates at most every 600 s (tf.estimator.RunConfig, tf.estimator.EvalSpec).
ESTIMATOR_SECS = 600
# One-cycle's shape (Smith and Topin 2017, arXiv:1708.07120), as PyTorch's OneCycleLR sets it by
# default: it rises from peak / div_factor (25) over pct_start (30 %) of the run, then falls to
# peak / (div_factor x final_div_factor (1e4)).
ONE_CYCLE_START_DIVISOR = 25.0
ONE_CYCLE_END_DIVISOR = ONE_CYCLE_START_DIVISOR * 1e4
ONE_CYCLE_RISE = 0.3
# He et al. 2015 (arXiv:1512.03385), section 4.2: the rate "divided by 10 at 32k and 48k
# iterations", the run ending at 64k: drops at 50 % and 75 % of the run, to 0.1 and 0.01.
HE_FRACTIONS = (0.5, 0.75)
HE_FACTORS = (1.0, 0.1, 0.01)
# airbench's triangular schedule (Jordan 2024, github.com/KellerJordan/cifar10-zoo,
# airbench_ablations/main2_dirac.py): linear from a fifth of the peak to the peak over the
# first fifth of the run, then linear down to 0 at its last step.
TRIANGULAR_START = 0.2
TRIANGULAR_RISE = 0.2
LR_SCHEDULES = ("piecewise", "he", "cosine", "one-cycle", "triangular")
# The schedules whose shape depends on the run's length: their steps follow --train-steps or
# --train-epochs, so the settings record keeps the length they span (``config.plan``).
LENGTH_SHAPED_SCHEDULES = ("he", "cosine", "one-cycle", "triangular")
# The settings that say where the piecewise schedule drops; a ResNet on --recipe paper whose
# length is given in --train-epochs and none of these takes ``he`` (``overlays.follows_he``).
SCHEDULE_FIELDS = ("lr_schedule", "lr_boundary_epochs", "lr_decay_factors")
# He et al. 2015 (arXiv:1512.03385), section 4.2: a CIFAR ResNet has 6n+2 layers, a stem,
# three stages of n two-layer blocks and the dense layer; n >= 1.
RESNET_DEPTH = Check(lambda v: v >= 8 and (v - 2) % 6 == 0,
                     "6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...)")

# Training's crops move a picture by at most PAD (4) pixels (data/pipeline.py): a larger shift
# would show the network views it never trained on.
TEST_TIME_SHIFT = Check(lambda v: 0 <= v <= 4, "0 to 4 pixels (training's crops move a "
                                               "picture by 4 at most)")


def depth_problem(num_layers: int) -> Optional[str]:
    """Why ``num_layers`` is not a CIFAR ResNet depth, or None."""
    return RESNET_DEPTH.problem("num_layers", num_layers)


def blocks_per_stage(num_layers: int) -> int:
    """n for a ResNet of depth 6n+2; ValueError for other depths."""
    problem = depth_problem(num_layers)
    if problem:
        raise ValueError(f"ResNet depth: {problem}")
    return (num_layers - 2) // 6


def depth(blocks: int) -> int:
    """The depth of a ResNet with ``blocks`` blocks per stage."""
    return 6 * blocks + 2


@dataclasses.dataclass(frozen=True)
class DataSection:
    """The records and how training reads them: the folder, augmentation, the eval batch, the
    seed."""

    data_dir: Optional[str] = setting(
        None, "folder with train.tfrecords and eval.tfrecords (required except on a ps task)")
    use_distortion_for_training: bool = setting(
        True, "augment training images (the model's recipe: pad, crop and flip for the ResNet; "
              "crop, flip and colour for the tutorial CNN) (true/false)", record=True)
    alternating_flips: bool = setting(
        False, "flip each training picture in every other epoch instead of at random: a "
               "random half in the first epoch, then the other half, and so on (airbench, "
               "Jordan 2024, arXiv:2404.00498) (true/false)", record=True, recipe=True)
    eval_batch_size: int = setting(100, "images per evaluation step, split over the towers",
                                   check=AT_LEAST_1)
    seed: Optional[int] = setting(
        None, "random seed for initialisation, shuffling and augmentation")


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """The network and its regularisation: what a checkpoint's weights mean."""

    model: str = setting(
        RESNET, "the network: resnet (He et al. 2015, the ResNet tutorial's) or tutorial-cnn "
                "(the original CIFAR-10 tutorial's CNN, with its input recipe, schedule, weight "
                "decay and averaged weights as its defaults)", record=True, choices=MODELS)
    num_layers: int = setting(44, "ResNet depth, 6n+2 (20, 32, 44, 56, 110, ...)",
                              record=True, check=RESNET_DEPTH, models=(RESNET,))
    resnet_version: int = setting(
        1, "1: post-activation blocks (He et al. 2015); 2: pre-activation (He et al. 2016)",
        record=True, choices=(1, 2), models=(RESNET,))
    weight_decay: float = setting(
        2e-4, "L2 coefficient of the weights (the ResNet's: every trainable variable; the "
              "tutorial CNN's: its hidden layers' weights)", record=True, check=AT_LEAST_0)
    no_bias_decay: bool = setting(
        False, "the ResNet's weight decay covers its convolution and dense kernels only, not "
               "the batch-norm scales and shifts or the dense bias (He et al. 2019, "
               "arXiv:1812.01187, section 3.1) (true/false)",
        record=True, models=(RESNET,), recipe=True)
    batch_norm_decay: float = setting(
        0.997, "batch-norm moving-average decay; the first steps use a smaller one that grows "
               "to it, so that short runs evaluate right (docs/training.md)",
        record=True, check=FRACTION, models=(RESNET,))
    batch_norm_epsilon: float = setting(1e-5, "batch-norm epsilon", record=True,
                                        check=POSITIVE, models=(RESNET,))
    zero_init_residual: bool = setting(
        False, "start the scale of each v1 block's last batch norm at 0, so that every residual "
               "block begins as the identity (Goyal et al. 2017, arXiv:1706.02677, section "
               "5.1) (true/false)", record=True, models=(RESNET,))
    dirac_init: bool = setting(
        False, "start every convolution after the stem with its first filters as the identity "
               "(airbench's dirac initialisation, Jordan 2024) (true/false)",
        record=True, models=(RESNET,), recipe=True)
    label_smoothing: float = setting(
        0.0, "label smoothing of the training loss, in [0, 1): the target puts 1 - e on the "
             "true class and e spread over all classes (Szegedy et al. 2016); 0 is off",
        record=True, check=FRACTION, recipe=True)
    moving_average_decay: float = setting(
        0.0, "keep an exponential moving average of the trainable weights with this decay (0: "
             "off); evaluation, --export-best and the export use the averaged weights; the "
             "first steps use a smaller decay that grows to it (as ExponentialMovingAverage's "
             "num_updates does)", record=True, check=FRACTION, recipe=True)
    test_time_mirror: bool = setting(
        False, "test-time augmentation: evaluation, prediction and the export average the "
               "logits of each picture and of its mirror image (twice the network's work per "
               "picture; training is unchanged) (true/false)", record=True, recipe=True)
    test_time_shift: int = setting(
        0, "multi-crop test-time augmentation: evaluation, prediction and the export also "
           "classify each picture shifted by this many pixels up-left and down-right (edges "
           "reflected), weighing the picture 1/2 and each shift 1/4, each with its mirror "
           "under --test-time-mirror (airbench, Jordan 2024, arXiv:2404.00498: 1 "
           "pixel); three times the network's work per picture; 0 is off",
        record=True, check=TEST_TIME_SHIFT, models=(RESNET,), recipe=True)
    whitening_patch: int = setting(
        0, "a frozen whitening layer in front of the ResNet: a convolution whose filters are "
           "the principal components of the training pictures' PATCHxPATCH patches, each "
           "scaled to unit variance, computed once from up to 5,000 training pictures when the "
           "job starts and kept in the checkpoints and the export (airbench, Jordan 2024, "
           "arXiv:2404.00498: 2x2); the stem then reads 3xPATCH^2 channels; 0 is "
           "off", record=True, choices=(0, 2, 3), models=(RESNET,), recipe=True)
    precise_bn_batches: int = setting(
        50, "before each checkpoint is saved, recompute the batch-norm statistics with its "
            "weights over this many training batches (0: off; off with --moving-average-decay, "
            "whose averaged weights the statistics would not fit)",
        check=AT_LEAST_0, models=(RESNET,), recipe=True)


@dataclasses.dataclass(frozen=True)
class ScheduleSection:
    """How long and how fast it trains: the length, the batch, the optimizer, the learning
    rate's schedule, the share of small pictures."""

    train_batch_size: int = setting(
        TUTORIAL_BATCH, f"images per step per worker, split evenly over its towers or replicas "
                        f"(a global step takes this from every worker {STEPS_TOGETHER})",
        record=True, check=AT_LEAST_1, recipe=True)
    momentum: float = setting(0.9, "momentum of the SGD optimizer (0: plain SGD)",
                              record=True, check=FRACTION)
    nesterov: bool = setting(
        False, "Nesterov momentum (Sutskever et al. 2013) instead of the classic one",
        record=True, recipe=True)
    learning_rate: float = setting(
        0.1, "peak learning rate: the base of the piecewise and he schedules (multiplied by "
             "--lr-decay-factors at --lr-boundary-epochs), the start of cosine decay, the top "
             "of the one-cycle", record=True, check=POSITIVE, recipe=True)
    lr_reference_batch: int = setting(
        0, f"scale the peak learning rate linearly with the batch (Goyal et al. 2017): the peak "
           f"is --learning-rate x B / N for a global batch of B images ({GLOBAL_BATCH}); 0: "
           f"no scaling, --learning-rate is the peak", record=True, check=AT_LEAST_0, recipe=True)
    lr_schedule: str = setting(
        "piecewise", f"piecewise: the tutorial's drops at --lr-boundary-epochs; he: the "
                     f"paper's proportions of any run, x{HE_FACTORS[1]:g} at "
                     f"{HE_FRACTIONS[0] * 100:.0f}%% and x{HE_FACTORS[2]:g} at "
                     f"{HE_FRACTIONS[1] * 100:.0f}%% "
                     f"of its steps (He et al. 2015); cosine: from the peak down to 0 at the "
                     f"end of the run (Loshchilov and Hutter 2017); one-cycle: up from "
                     f"peak/{ONE_CYCLE_START_DIVISOR:g} to the peak, then down to "
                     f"peak/{ONE_CYCLE_END_DIVISOR:g} at the end (Smith and Topin 2017); "
                     f"triangular: linear from peak x{TRIANGULAR_START:g} to the peak over "
                     f"{TRIANGULAR_RISE * 100:.0f}%% of the run, then linear down to 0 "
                     f"(airbench, Jordan 2024). "
                     f"{', '.join(LENGTH_SHAPED_SCHEDULES)} follow the run's length: the job "
                     f"dir records it, and a rerun of another length needs --change-settings",
        record=True, choices=LR_SCHEDULES,
        recipe=True)
    warmup_epochs: float = setting(
        0.0, f"epochs of linear warm-up from 0 to the peak rate before the schedule (Goyal et "
             f"al. 2017); for one-cycle and triangular, the length of their rising part (0: "
             f"{ONE_CYCLE_RISE * 100:.0f}%% and {TRIANGULAR_RISE * 100:.0f}%% of the run)",
        record=True, check=AT_LEAST_0, recipe=True)
    lr_boundary_epochs: tuple[float, ...] = setting(
        (82, 123, 300), "epochs at which the learning rate drops (comma-separated, fractions "
                        "allowed); the schedule of tensorpack's cifar10-resnet that the "
                        "tutorial used", record=True)
    lr_decay_factors: tuple[float, ...] = setting(
        (1.0, 0.1, 0.01, 0.002), "learning-rate multipliers, one more than the boundaries",
        record=True)
    batch_norm_lr_multiplier: float = setting(
        1.0, "learning-rate multiplier of the batch-norm scales and shifts (airbench, Jordan "
             "2024, arXiv:2404.00498, trains the shifts 64 times faster than the weights)",
        record=True, check=POSITIVE, models=(RESNET,), recipe=True)
    lookahead_steps: int = setting(
        0, "Lookahead (Zhang et al. 2019, arXiv:1907.08610): every K steps the weights move to "
           "slow weights that step --lookahead-alpha of the way towards them; K is 5 in the "
           "paper; 0 is off (--distribution-strategy towers without --sync only: one "
           "worker, or asynchronous parameter servers)",
        record=True, check=AT_LEAST_0, recipe=True)
    lookahead_alpha: float = setting(
        0.5, "Lookahead's step of the slow weights towards the fast ones (the paper's 0.5)",
        record=True, check=Check(lambda v: 0 < v <= 1, "in (0, 1]"),
        recipe=True)
    # None (a recipe's overlay only): the recipe's share for the training file's size
    # (overlays.LOW_RES_SHARES), which the plan resolves and the settings record keeps.
    low_res_fraction: Optional[float] = setting(
        0.0, "progressive resizing: the first F of the run's steps (0 <= F < 1) train on "
             "pictures scaled down to --low-res-size pixels a side, the rest at full size, as "
             "evaluation and serving see them (Hoffer et al. 2019, arXiv:1908.08986: a "
             "convolutional network trains faster on smaller pictures and keeps its accuracy "
             "at the full size); 0 is off",
        record=True, check=FRACTION, models=(RESNET,), recipe=True)
    low_res_size: int = setting(
        24, "the side, in pixels, of the pictures of the first --low-res-fraction of the run: 24 "
            "(our choice: three quarters of 32, so about 0.56 of the network's work per "
            "picture)", record=True, check=Check(lambda v: 8 <= v <= 32, "in [8, 32]"),
        models=(RESNET,), recipe=True)
    recipe: str = setting(
        "paper", "a set of defaults for the schedule, batch, regularisation and precision (see "
                 "docs/training.md); a flag given explicitly wins over the recipe's value",
        choices=("paper", "fast"))
    train_steps: Optional[int] = setting(
        None, "global step at which training stops (default: the recipe's own length where "
              "it has one, see --recipe, else the model's, see docs/training.md; unless "
              "--train-epochs is given)", check=AT_LEAST_0)
    train_epochs: Optional[float] = setting(
        None, f"train this many epochs of the training file instead of --train-steps (an "
              f"epoch counted as the schedule counts it: train records // the global batch, "
              f"{GLOBAL_BATCH}); fractions allowed. A ResNet on --recipe paper given none of "
              f"{', '.join(flag(name) for name in SCHEDULE_FIELDS)} then takes --lr-schedule he "
              f"(the paper's proportions of this length, not the tutorial's drops)",
        check=POSITIVE)


@dataclasses.dataclass(frozen=True)
class DevicesSection:
    """Where and in what precision it computes: GPUs or logical CPU towers, the layout, the
    precision asked for, threads, XLA."""

    variable_strategy: str = setting(
        "CPU", "where variables live: CPU keeps them on /cpu:0, GPU spreads them over the "
               "GPUs by byte size", choices=("CPU", "GPU"))
    num_gpus: int = setting(0, "GPUs per worker, one tower or replica each; 0 trains on the "
                               "CPU", check=AT_LEAST_0)
    num_cpu_towers: int = setting(
        1, "with --num-gpus 0: towers (or mirrored replicas) on this many logical CPU devices, "
           "to exercise the multi-device path without GPUs", check=AT_LEAST_1)
    data_format: Optional[str] = setting(
        None, "channels_first (NCHW) or channels_last (NHWC) (default: channels_last on CPU, "
              "channels_first with GPUs)", choices=("channels_first", "channels_last"))
    precision: str = setting(
        "fp32", "fp32; bf16: convolutions in bfloat16 (CPUs with native bf16, AVX512_BF16 or "
                "AMX, or GPUs of compute capability 8.0+), variables, batch-norm statistics "
                "and the loss stay float32; auto: bf16 where it trains this network clearly "
                "faster than fp32, measured on this CPU in a few seconds (and cached), else "
                "fp32; a job keeps the precision it first chose (docs/cpus.md)",
        record=True, choices=PRECISIONS, recipe=True)
    serving_precision: str = setting(
        "auto", "what the export computes in: auto gives fp32, unless the run trains in bf16 "
                "and the export's network measured faster in bf16 on this CPU; an export served "
                "on a machine without native bf16 (avx512_bf16, amx_bf16) wants fp32",
        choices=PRECISIONS)
    xla: bool = setting(False, "compile the training step with XLA (global JIT)")
    num_intra_threads: int = setting(
        0, "threads inside one op (0: TensorFlow's choice, one per core)", check=AT_LEAST_0)
    num_inter_threads: int = setting(0, "ops run in parallel (0: TensorFlow's choice)",
                                     check=AT_LEAST_0)

    @property
    def tower_devices(self) -> tuple[str, ...]:
        """The compute device of each tower or replica of one worker: ``--num-gpus`` GPUs, else
        ``--num-cpu-towers`` logical CPUs (``model.towers`` places ops on them)."""
        if self.num_gpus > 0:
            return tuple(f"/gpu:{i}" for i in range(self.num_gpus))
        return tuple(f"/cpu:{i}" for i in range(max(1, self.num_cpu_towers)))

    @property
    def logical_cpus(self) -> int:
        """The CPU devices TensorFlow must split this machine's CPU into (several CPU towers
        without GPUs), else 0: the session's device count and a strategy's devices follow it."""
        return self.num_cpu_towers if self.num_gpus == 0 and self.num_cpu_towers > 1 else 0


@dataclasses.dataclass(frozen=True)
class ClusterSection:
    """Several tasks: how their gradients meet and how long they wait for each other."""

    sync: bool = setting(
        False, "with --distribution-strategy towers in a cluster, aggregate one gradient per "
               "worker per step (SyncReplicasOptimizer); without it, workers on parameter "
               "servers update asynchronously (the all-reduce strategies step together "
               "anyway)", record=True)
    distribution_strategy: str = setting(
        TOWERS, "how replicas combine gradients: towers, the tutorial's (one tower per device "
                "on a machine; in a cluster, parameter servers, asynchronous or with --sync); "
                "mirrored, TensorFlow's MirroredStrategy (all-reduce over one machine's GPUs, "
                "or --num-cpu-towers logical CPUs); multi-worker-mirrored, collective "
                "all-reduce over a cluster of chief and workers from TF_CONFIG, no parameter "
                "servers (docs/distributed.md)", choices=STRATEGIES)
    cluster_timeout_secs: int = setting(
        600, "in a cluster, how long a task waits for the others (for the parameter servers "
             "to answer, for the chief's first checkpoint, for the chief to initialise the "
             "model) before it fails with an error; TensorFlow's own wait is 2 hours",
        check=AT_LEAST_1)
    max_worker_delay_secs: Optional[int] = setting(
        None, "in a cluster, cap on the staggered start of worker i, min(cap, 5*(i+1)) s "
              "(Estimator's, to let async training settle before all workers push updates) "
              f"(default: 60 asynchronous; 0 when the workers step together, {STEPS_TOGETHER})",
        check=AT_LEAST_0)


@dataclasses.dataclass(frozen=True)
class OutputSection:
    """The job dir: checkpoints, evaluations, exports."""

    job_dir: Optional[str] = setting(
        None, "folder for checkpoints, summaries and the export; shared by all tasks of a "
              "cluster; rerunning with the same folder resumes (required; the model_dir argument "
              "SageMaker passes is taken as it)",
        aliases=("--model_dir", "--model-dir"))
    save_checkpoints_steps: Optional[int] = setting(
        None, "save a checkpoint every N steps (instead of --save-checkpoints-secs)",
        check=AT_LEAST_1)
    save_checkpoints_epochs: Optional[float] = setting(
        None, "save a checkpoint every E epochs of the training file (fractions allowed), "
              "each evaluated once it is saved with --eval-throttle-secs 0: what a sweep's "
              "early stopping acts on (instead of --save-checkpoints-secs)",
        check=POSITIVE)
    save_checkpoints_secs: Optional[int] = setting(
        None, f"save a checkpoint every N seconds (default: {ESTIMATOR_SECS}, Estimator's, "
              f"unless --save-checkpoints-steps or --save-checkpoints-epochs is given)", check=AT_LEAST_1)
    keep_checkpoint_max: int = setting(5, "how many recent checkpoints to keep", check=AT_LEAST_1)
    eval_throttle_secs: int = setting(
        ESTIMATOR_SECS, "evaluate a new checkpoint at most this often during training",
        check=AT_LEAST_0)
    export_dir: Optional[str] = setting(
        None, "where the SavedModel goes, in a numbered subfolder (default: JOB_DIR/export)")
    export_best: bool = setting(
        False, "also export every evaluation that beats the best accuracy so far into "
               "EXPORT_DIR/best/<version>, keeping only the best (true/false); evaluations run "
               "in a local job or on a cluster's evaluator task")
    change_settings: bool = setting(
        False, "accept settings that differ from the ones JOB_DIR/settings.json recorded at the "
               "job's first start, and record them (chief or local run); without it such a "
               "rerun is refused")

    @property
    def checkpoint_secs(self) -> Optional[int]:
        """Seconds between checkpoints; Estimator's unless steps were chosen."""
        if (self.save_checkpoints_steps is None and self.save_checkpoints_secs is None
                and self.save_checkpoints_epochs is None):
            return ESTIMATOR_SECS
        return self.save_checkpoints_secs

    @property
    def resolved_export_dir(self) -> str:
        return self.export_dir or os.path.join(self.job_dir or "", EXPORT_SUBDIR)


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    """What the log and TensorBoard show."""

    progress_secs: float = setting(
        15.0, "seconds of wall time between two progress lines (step/total, images/s, ETA)",
        check=POSITIVE)
    save_summary_steps: int = setting(
        100, "write the training scalars (loss, learning rate, accuracy, images/s) for "
             "TensorBoard every N global steps", check=AT_LEAST_1)
    log_device_placement: bool = setting(False, "log the device of every op")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every setting of one job (one task of a cluster), in the sections the help lists them
    in (``fields.GROUPS``, in order), and those in three groups (``problem``, ``trainer``,
    ``runtime``): the root functions of a task's run take the groups, and each function they
    call the sections it reads. A setting's name is unique over the sections, so the flags,
    the overlays and the settings record name it alone (``of``, ``flat``)."""

    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    schedule: ScheduleSection = ScheduleSection()
    devices: DevicesSection = DevicesSection()
    cluster: ClusterSection = ClusterSection()
    output: OutputSection = OutputSection()
    logging: LoggingSection = LoggingSection()

    @classmethod
    def of(cls, **values: Any) -> "Settings":
        """The settings with ``values`` (setting name -> value) and the fields' defaults for
        the rest; a name that is no setting is a TypeError."""
        unknown = set(values) - set(SECTION_OF)
        if unknown:
            raise TypeError(f"not settings: {', '.join(sorted(unknown))}")
        return cls(**{name: section(**{f.name: values[f.name] for f in dataclasses.fields(section)
                                       if f.name in values})
                      for name, section in SECTIONS})

    def flat(self) -> dict[str, Any]:
        """Every setting by name, in the help's order."""
        return values_of(*(getattr(self, name) for name, _ in SECTIONS))

    def value(self, name: str) -> Any:
        """The setting called ``name`` (``num_layers``), from its section."""
        return getattr(getattr(self, SECTION_OF[name]), name)

    def replace(self, **values: Any) -> "Settings":
        """These settings with ``values`` (setting name -> value) changed."""
        return Settings.of(**{**self.flat(), **values})

    # The sections in their three groups, which the root functions of a task's run take
    # (``training.driver``, ``training.start``), as Model Garden's config tree groups them.
    @property
    def problem(self) -> "ProblemSettings":
        return ProblemSettings(self.data, self.model)

    @property
    def trainer(self) -> "TrainerSettings":
        return TrainerSettings(self.schedule, self.output, self.logging)

    @property
    def runtime(self) -> "RuntimeSettings":
        return RuntimeSettings(self.devices, self.cluster)

    @classmethod
    def of_groups(cls, problem: "ProblemSettings", trainer: "TrainerSettings",
                  runtime: "RuntimeSettings") -> "Settings":
        """The settings whose groups these are: what the settings record and the flags name
        setting by setting."""
        return cls(data=problem.data, model=problem.model, schedule=trainer.schedule,
                   devices=runtime.devices, cluster=runtime.cluster, output=trainer.output,
                   logging=trainer.logging)


@dataclasses.dataclass(frozen=True)
class ProblemSettings:
    """What is learned, from what: the data and the model sections. (Model Garden's config
    tree calls this group the task; here a task is one process of a cluster.)"""

    data: DataSection = DataSection()
    model: ModelSection = ModelSection()


@dataclasses.dataclass(frozen=True)
class TrainerSettings:
    """How it is trained and what the run leaves: the schedule, output and logging sections
    (Model Garden's trainer)."""

    schedule: ScheduleSection = ScheduleSection()
    output: OutputSection = OutputSection()
    logging: LoggingSection = LoggingSection()


@dataclasses.dataclass(frozen=True)
class RuntimeSettings:
    """Where it runs: the devices and cluster sections (Model Garden's runtime)."""

    devices: DevicesSection = DevicesSection()
    cluster: ClusterSection = ClusterSection()


def values_of(*sections: Any) -> dict[str, Any]:
    """The settings of ``sections`` by name (all seven: what ``Settings.flat`` gives)."""
    return {f.name: getattr(section, f.name) for section in sections
            for f in dataclasses.fields(section)}


# (help group, section class), in the help's order; every setting's field, in that order; the
# section that holds each setting.
SECTIONS = tuple((f.name, f.type) for f in dataclasses.fields(Settings))
assert tuple(name for name, _ in SECTIONS) == tuple(name for name, _ in GROUPS)
FIELDS = tuple(f for _, section in SECTIONS for f in dataclasses.fields(section))
SECTION_OF = {f.name: name for name, section in SECTIONS for f in dataclasses.fields(section)}
# Every setting's type, as its field declares it (``Optional[int]``, ``tuple[float, ...]``).
TYPES = {name: hint for _, section in SECTIONS
         for name, hint in typing.get_type_hints(section).items()}
assert len(SECTION_OF) == len(FIELDS), "a setting's name is unique over the sections"
# JOB_DIR/export: where the SavedModel versions go by default.
EXPORT_SUBDIR = "export"
# The settings that define a run (what its checkpoints mean), recorded in JOB/settings.json.
RUN_FIELDS = tuple(f.name for f in FIELDS if f.metadata["record"])
# The settings a recipe may set, shown in the trainer's recipe line.
RECIPE_FIELDS = tuple(f.name for f in FIELDS if f.metadata["recipe"])
