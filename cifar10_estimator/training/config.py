"""Every trainer setting in one frozen dataclass: defaults, units, validation, derived values.

``TrainConfig`` is the model's hyperparameters (``model.params.ModelParams``) plus the job's own
settings: data, devices, checkpoints, evaluation, cluster waits. ``flags`` builds one
command-line flag per field (``num_layers`` -> ``--num-layers``) from the field's type and
``help`` metadata, so adding a setting is a one-field change. ``validate`` rejects bad values
and combinations once, naming the flag.
"""

import dataclasses
import os
from typing import Optional

from cifar10_estimator.errors import UserError
from cifar10_estimator.model.params import (RESNET, TUTORIAL_CNN, ModelParams, depth_problem,
                                            flag)
from cifar10_estimator.model.params import setting as _field
from cifar10_estimator.training.precision import BF16_MIN_SPEEDUP
from cifar10_estimator.training.recipes import RECIPES, recipe_help

# The tutorial's length: 80,000 steps of batch 128 on 45,000 images (the paper stopped at 64k).
DEFAULT_TRAIN_STEPS = 80_000
# Each model's default length: the original CIFAR-10 tutorial quoted its accuracy (about 86 %)
# after 100,000 steps of batch 128.
MODEL_TRAIN_STEPS = {RESNET: DEFAULT_TRAIN_STEPS, TUTORIAL_CNN: 100_000}


@dataclasses.dataclass(frozen=True)
class TrainConfig(ModelParams):
    """Settings of one training job (one task of a cluster)."""

    data_dir: Optional[str] = _field(
        None, "folder with train.tfrecords and eval.tfrecords (required except on a ps task)")
    job_dir: Optional[str] = _field(
        None, "folder for checkpoints, summaries and the export; shared by all tasks of a "
              "cluster; rerunning with the same folder resumes (required)")
    recipe: str = _field("paper", recipe_help(), choices=tuple(RECIPES))
    num_gpus: int = _field(0, "GPUs per worker, one tower each; 0 trains on the CPU")
    num_cpu_towers: int = _field(
        1, "with --num-gpus 0: towers on this many logical CPU devices (to exercise the "
           "multi-tower path without GPUs)")
    train_steps: Optional[int] = _field(
        None, f"global step at which training stops (default {DEFAULT_TRAIN_STEPS:,}, "
              f"{MODEL_TRAIN_STEPS[TUTORIAL_CNN]:,} for the tutorial CNN, unless --train-epochs "
              f"is given)")
    train_epochs: Optional[float] = _field(
        None, "train this many epochs of the training file instead of --train-steps (an "
              "epoch counted as the schedule counts it: train records // batch, times the "
              "workers with --sync); fractions allowed")
    eval_batch_size: int = _field(100, "images per evaluation step, split over the towers")
    use_distortion_for_training: bool = _field(
        True, "pad, random-crop and flip training images (true/false)")
    num_intra_threads: int = _field(
        0, "threads inside one op (0: TensorFlow's choice, one per core)")
    num_inter_threads: int = _field(
        0, "ops run in parallel (0: TensorFlow's choice)")
    data_format: Optional[str] = _field(
        None, "channels_first (NCHW) or channels_last (NHWC); default: channels_last on CPU, "
              "channels_first with GPUs", choices=("channels_first", "channels_last"))
    log_device_placement: bool = _field(False, "log the device of every op")
    precision: str = _field(
        "fp32", "fp32; bf16: convolutions in bfloat16 (CPUs with native bf16, AVX512_BF16 or "
                "AMX, or GPUs of compute capability 8.0+), variables, batch-norm statistics "
                f"and the loss stay float32; auto: bf16 where it trains this network at least "
                f"{BF16_MIN_SPEEDUP:g}x as fast as fp32, measured on this CPU in a few seconds (and cached), else "
                "fp32; a job keeps the precision it first chose",
        choices=("auto", "fp32", "bf16"))
    serving_precision: str = _field(
        "auto", "what the export computes in: auto gives fp32, unless the run trains in bf16 and "
                "the export's network measured faster in bf16 on this CPU; an export served on "
                "a machine without native bf16 (avx512_bf16, amx_bf16) wants fp32",
        choices=("auto", "fp32", "bf16"))
    xla: bool = _field(False, "compile the training step with XLA (global JIT)")
    save_checkpoints_steps: Optional[int] = _field(
        None, "save a checkpoint every N steps (instead of --save-checkpoints-secs)")
    save_checkpoints_secs: Optional[int] = _field(
        None, "save a checkpoint every N seconds (default 600 unless "
              "--save-checkpoints-steps is given)")
    precise_bn_batches: int = _field(
        50, "before the final checkpoint is saved, recompute the batch-norm statistics with the "
            "final weights over this many training batches (0: off; off with "
            "--moving-average-decay, whose averaged weights the statistics would not fit)")
    eval_throttle_secs: int = _field(
        600, "evaluate a new checkpoint at most this often during training")
    keep_checkpoint_max: int = _field(5, "how many recent checkpoints to keep")
    save_summary_steps: int = _field(
        100, "write the training scalars (loss, learning rate, accuracy, images/s) for "
             "TensorBoard every N global steps")
    progress_secs: float = _field(
        15.0, "seconds of wall time between two progress lines (step/total, images/s, ETA)")
    export_dir: Optional[str] = _field(
        None, "where the SavedModel goes, in a numbered subfolder (default: JOB_DIR/export)")
    export_best: bool = _field(
        False, "also export every evaluation that beats the best accuracy so far into "
               "EXPORT_DIR/best/<version>, keeping only the best (true/false); evaluations run "
               "in a local job or on a cluster's evaluator task")
    seed: Optional[int] = _field(None, "random seed for initialisation, shuffling and augmentation")
    change_settings: bool = _field(
        False, "accept settings that differ from the ones JOB_DIR/settings.json recorded at the "
               "job's first start, and record them (chief or local run); without it such a "
               "rerun is refused")
    cluster_timeout_secs: int = _field(
        600, "in a cluster, how long a task waits for the others (for the parameter servers "
             "to answer, for the chief's first checkpoint, for the chief to initialise the "
             "model) before it fails with an error; TensorFlow's own default is 2 hours")
    max_worker_delay_secs: Optional[int] = _field(
        None, "in a cluster, cap on the staggered start of worker i, min(cap, 5*(i+1)) s "
              "(Estimator's, to let async training settle before all workers push updates); "
              "default 60 asynchronous, 0 with --sync")

    @property
    def checkpoint_secs(self) -> Optional[int]:
        """Seconds between checkpoints; Estimator's 600 s unless steps were chosen."""
        if self.save_checkpoints_steps is None and self.save_checkpoints_secs is None:
            return 600
        return self.save_checkpoints_secs

    def resolved_data_format(self) -> str:
        if self.data_format:
            return self.data_format
        if self.model == TUTORIAL_CNN:
            return "channels_last"  # its local response normalisation has no other layout
        return "channels_first" if self.num_gpus > 0 else "channels_last"

    @property
    def num_towers(self) -> int:
        return self.num_gpus if self.num_gpus > 0 else max(1, self.num_cpu_towers)

    @property
    def resolved_export_dir(self) -> str:
        return self.export_dir or os.path.join(self.job_dir or "", "export")


def _check_ranges(config: TrainConfig) -> None:
    for name in ("num_gpus", "train_steps", "eval_throttle_secs", "num_intra_threads",
                 "precise_bn_batches",
                 "num_inter_threads", "max_worker_delay_secs", "weight_decay",
                 "lr_reference_batch"):
        value = getattr(config, name)
        if value is not None and value < 0:
            raise UserError(f"{flag(name)} must be 0 or more, got {value}")
    for name in ("num_cpu_towers", "train_batch_size", "eval_batch_size", "keep_checkpoint_max",
                 "cluster_timeout_secs", "save_summary_steps", "save_checkpoints_steps",
                 "save_checkpoints_secs"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise UserError(f"{flag(name)} must be 1 or more, got {value}")
    if config.train_epochs is not None and not config.train_epochs > 0:
        raise UserError(f"--train-epochs must be positive, got {config.train_epochs}")
    if not 0 <= config.warmup_epochs:
        raise UserError(f"--warmup-epochs must be 0 or more, got {config.warmup_epochs}")
    if not 0 <= config.moving_average_decay < 1:
        raise UserError(f"--moving-average-decay must be in [0, 1), got "
                        f"{config.moving_average_decay}")
    if not 0 <= config.label_smoothing < 1:
        raise UserError(f"--label-smoothing must be in [0, 1), got {config.label_smoothing}")
    for name in ("learning_rate", "batch_norm_epsilon", "progress_secs"):
        if not getattr(config, name) > 0:
            raise UserError(f"{flag(name)} must be positive, got {getattr(config, name)}")
    for name in ("momentum", "batch_norm_decay"):
        if not 0 <= getattr(config, name) < 1:
            raise UserError(f"{flag(name)} must be in [0, 1), got {getattr(config, name)}")
    problem = depth_problem(config.num_layers)
    if problem:
        raise UserError(f"--num-layers {problem}")


def _check_schedule(config: TrainConfig) -> None:
    if len(config.lr_decay_factors) != len(config.lr_boundary_epochs) + 1:
        raise UserError("--lr-decay-factors needs exactly one more value than "
                        "--lr-boundary-epochs")
    if list(config.lr_boundary_epochs) != sorted(set(config.lr_boundary_epochs)) or any(
            e <= 0 for e in config.lr_boundary_epochs):
        raise UserError("--lr-boundary-epochs must be positive and strictly increasing")
    if config.save_checkpoints_steps is not None and config.save_checkpoints_secs is not None:
        raise UserError("--save-checkpoints-steps and --save-checkpoints-secs exclude each "
                        "other; give one")
    if config.train_steps is not None and config.train_epochs is not None:
        raise UserError("--train-steps and --train-epochs exclude each other; give one")
    if (config.lr_schedule != "piecewise" and config.train_epochs is not None
            and config.warmup_epochs >= config.train_epochs):
        raise UserError(f"--warmup-epochs {config.warmup_epochs:g} leaves nothing of the "
                        f"{config.train_epochs:g} --train-epochs for the {config.lr_schedule} "
                        f"schedule; use fewer warm-up epochs")


def _check_devices(config: TrainConfig, num_visible_gpus: int, onednn_enabled: bool) -> None:
    if config.num_gpus > 0 and num_visible_gpus < config.num_gpus:
        raise UserError(f"--num-gpus {config.num_gpus} requested but TensorFlow sees "
                        f"{num_visible_gpus} GPU(s); use --num-gpus {num_visible_gpus}")
    if config.num_gpus > 0 and config.num_cpu_towers != 1:
        raise UserError("--num-cpu-towers applies only with --num-gpus 0")
    if config.variable_strategy == "GPU" and config.num_gpus == 0:
        raise UserError("--variable-strategy GPU needs GPUs; with --num-gpus 0 use "
                        "--variable-strategy CPU")
    if config.model == TUTORIAL_CNN and config.resolved_data_format() == "channels_first":
        raise UserError("--data-format channels_first: the tutorial CNN computes in "
                        "channels_last only (TensorFlow's local response normalisation has no "
                        "other layout); leave --data-format unset")
    if (config.num_gpus == 0 and config.resolved_data_format() == "channels_first"
            and not onednn_enabled):
        # TF 2.15's Eigen CPU kernels have no NCHW pooling ("Default AvgPoolingOp only
        # supports NHWC on device type CPU"); its oneDNN kernels do.
        raise UserError("--data-format channels_first on a CPU needs TensorFlow's oneDNN "
                        "kernels, which are off in this process; set TF_ENABLE_ONEDNN_OPTS=1 "
                        "(or unset it) or use --data-format channels_last")
    for name in ("train_batch_size", "eval_batch_size"):
        if getattr(config, name) % config.num_towers:
            raise UserError(f"{flag(name)} {getattr(config, name)} is not divisible by the "
                            f"{config.num_towers} towers; use a multiple of {config.num_towers}")


def validate(config: TrainConfig, num_visible_gpus: int, needs_data: bool = True,
             onednn_enabled: bool = True) -> None:
    """Raises UserError naming the flag for every invalid setting or combination.

    Args:
      config: the settings.
      num_visible_gpus: GPUs TensorFlow can see on this machine.
      needs_data: False on a parameter-server task, which needs neither data nor model flags.
      onednn_enabled: whether TensorFlow's oneDNN kernels are on in this process
        (``cpu.onednn_enabled``); without them a CPU cannot pool in channels_first.
    """
    if not needs_data:
        return  # a parameter server only serves variables: no flag matters to it
    if not config.job_dir:
        raise UserError("--job-dir is required: the folder for checkpoints and the export")
    if not config.data_dir:
        raise UserError("--data-dir is required: the folder with the .tfrecords files")
    _check_ranges(config)
    _check_schedule(config)
    _check_devices(config, num_visible_gpus, onednn_enabled)
