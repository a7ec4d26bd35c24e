"""Checks of the settings before anything runs: one line naming the flag, nothing written.

Ranges come from the fields' metadata (``fields.Check``); the rest are combinations of
settings, of settings and the cluster (``check_cluster``), or of settings and the machine (GPUs,
oneDNN), that no single field can check.
"""

from typing import Any, Mapping

from cifar10_estimator.config import plan as plans
from cifar10_estimator.config.fields import flag, shown
from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import (FIELDS, MIRRORED, MULTI_WORKER_MIRRORED, TOWERS,
                                               TUTORIAL_CNN, Settings)
from cifar10_estimator import storage
from cifar10_estimator.errors import UserError


def check_given(settings: Settings, given: Mapping[str, Any]) -> None:
    """Refuses a flag given for a model it does not apply to (``models`` in its metadata):
    ``--num-layers`` means nothing to the tutorial CNN."""
    for field in FIELDS:
        models = field.metadata.get("models")
        if field.name in given and models and settings.model.model not in models:
            raise UserError(f"{flag(field.name)} applies to --model {' or '.join(models)}, "
                            f"not to --model {settings.model.model}; leave it out")


def _check_ranges(settings: Settings) -> None:
    for field in FIELDS:
        check = field.metadata.get("check")
        problem = check and check.problem(field.name, settings.value(field.name))
        if problem:
            raise UserError(problem)


def _check_schedule(settings: Settings) -> None:
    schedule, output = settings.schedule, settings.output
    if len(schedule.lr_decay_factors) != len(schedule.lr_boundary_epochs) + 1:
        raise UserError("--lr-decay-factors needs exactly one more value than "
                        "--lr-boundary-epochs")
    if list(schedule.lr_boundary_epochs) != sorted(set(schedule.lr_boundary_epochs)) or any(
            e <= 0 for e in schedule.lr_boundary_epochs):
        raise UserError("--lr-boundary-epochs must be positive and strictly increasing")
    given = [flag(name) for name in ("save_checkpoints_steps", "save_checkpoints_epochs",
                                     "save_checkpoints_secs")
             if getattr(output, name) is not None]
    if len(given) > 1:
        raise UserError(f"{' and '.join(given)} exclude each other; give one")
    if schedule.train_steps is not None and schedule.train_epochs is not None:
        raise UserError("--train-steps and --train-epochs exclude each other; give one")
    if (schedule.lr_schedule != "piecewise" and schedule.train_epochs is not None
            and schedule.warmup_epochs >= schedule.train_epochs):
        raise UserError(f"--warmup-epochs {shown(schedule.warmup_epochs)} leaves nothing of "
                        f"the {shown(schedule.train_epochs)} --train-epochs for the "
                        f"{schedule.lr_schedule} schedule; use fewer warm-up epochs")


def _check_model(settings: Settings) -> None:
    if settings.model.zero_init_residual and settings.model.resnet_version != 1:
        # A v2 block ends in a convolution: a zero scale before its ReLU would get no gradient.
        raise UserError("--zero-init-residual applies to --resnet-version 1 blocks only")


def _check_strategy(settings: Settings) -> None:
    cluster = settings.cluster
    strategy = cluster.distribution_strategy
    if settings.schedule.lookahead_steps and (cluster.sync or strategy != TOWERS):
        # Its update runs after the optimizer's inside the train op, which SyncReplicasOptimizer
        # and a strategy's replicas run apart.
        raise UserError(f"--lookahead-steps: not available with "
                        f"{'--sync' if cluster.sync else f'--distribution-strategy {strategy}'}; "
                        f"set it to 0, or train with --distribution-strategy towers"
                        f"{' and without --sync' if cluster.sync else ''}")
    if strategy == TOWERS:
        return
    if cluster.sync:
        raise UserError(f"--sync: --distribution-strategy {strategy} is synchronous already "
                        f"(every step all-reduces every replica's gradients); leave --sync out")
    if settings.devices.variable_strategy != "CPU":
        raise UserError(f"--variable-strategy {settings.devices.variable_strategy}: with "
                        f"--distribution-strategy {strategy} every replica keeps a copy of the "
                        f"variables; leave --variable-strategy out")
    if strategy == MULTI_WORKER_MIRRORED and settings.devices.num_cpu_towers != 1:
        raise UserError("--num-cpu-towers: --distribution-strategy multi-worker-mirrored runs "
                        "one replica per GPU, or one on the CPU, on every worker; use "
                        "--distribution-strategy mirrored for logical CPU replicas on one "
                        "machine")
    if strategy == MULTI_WORKER_MIRRORED and settings.model.precise_bn_batches:
        # The recompute runs on the chief alone before a checkpoint (when its timer says), and
        # every batch-norm update of an all-reduce job needs every worker.
        raise UserError("--precise-bn-batches: not available with --distribution-strategy "
                        "multi-worker-mirrored (its recompute would run on the chief alone, "
                        "and every batch-norm update there waits for every worker); set it "
                        "to 0, or use --distribution-strategy towers or mirrored")


def _check_devices(settings: Settings) -> None:
    devices = settings.devices
    if devices.num_gpus > 0 and devices.num_cpu_towers != 1:
        raise UserError("--num-cpu-towers applies only with --num-gpus 0")
    if devices.variable_strategy == "GPU" and devices.num_gpus == 0:
        raise UserError("--variable-strategy GPU needs GPUs; with --num-gpus 0 use "
                        "--variable-strategy CPU")
    model = settings.model.model
    if model == TUTORIAL_CNN and plans.data_format(model, devices) == "channels_first":
        raise UserError("--data-format channels_first: the tutorial CNN computes in "
                        "channels_last only (TensorFlow's local response normalisation has no "
                        "other layout); leave --data-format unset")
    towers = len(devices.tower_devices)
    for name in ("train_batch_size", "eval_batch_size"):
        if settings.value(name) % towers:
            raise UserError(f"{flag(name)} {settings.value(name)} is not divisible by the "
                            f"{towers} towers; use a multiple of {towers}")


def validate(settings: Settings, needs_data: bool = True) -> None:
    """Raises UserError naming the flag for every invalid setting or combination that the
    settings alone decide; the trainer runs it before TensorFlow loads (``validate_machine``
    checks the rest, after).

    Args:
      settings: the settings.
      needs_data: False on a parameter-server task, which needs neither data nor model flags.
    """
    if not needs_data:
        return  # a parameter server only serves variables: no flag matters to it
    if not settings.output.job_dir:
        raise UserError("--job-dir is required: the folder for checkpoints and the export")
    if not settings.data.data_dir:
        raise UserError("--data-dir is required: the folder with the .tfrecords files")
    _check_ranges(settings)
    _check_schedule(settings)
    _check_model(settings)
    _check_strategy(settings)
    _check_devices(settings)


def check_cluster(strategy: str, role: Role) -> None:
    """The cluster of ``role`` against ``strategy`` (--distribution-strategy), in one line."""
    trainers = role.num_trainers
    if not role.in_cluster:
        return  # a local run; a ps or an evaluator follows the trainers' strategy
    if strategy == TOWERS and trainers > 1 and not role.num_ps:
        raise UserError(f"TF_CONFIG: the cluster has {trainers} training tasks but no 'ps' "
                        f"job; with --distribution-strategy towers workers share variables "
                        f"through parameter servers (or use --distribution-strategy "
                        f"multi-worker-mirrored); see docs/distributed.md")
    if strategy == MIRRORED and trainers > 1:
        raise UserError(f"TF_CONFIG: --distribution-strategy mirrored runs on one machine, and "
                        f"TF_CONFIG lists {trainers} training tasks; use "
                        f"--distribution-strategy multi-worker-mirrored for a cluster")
    if strategy == MULTI_WORKER_MIRRORED and role.num_ps:
        raise UserError(f"TF_CONFIG: --distribution-strategy multi-worker-mirrored all-reduces "
                        f"among the chief and workers, and TF_CONFIG lists {role.num_ps} 'ps' "
                        f"task(s); leave them out, or use --distribution-strategy towers for "
                        f"parameter servers")


def validate_machine(settings: Settings, num_visible_gpus: int, onednn_enabled: bool) -> None:
    """The settings against this machine and its storage, in one line naming the flag.

    Args:
      num_visible_gpus: GPUs TensorFlow can see on this machine.
      onednn_enabled: whether TensorFlow's oneDNN kernels are on in this process
        (``cpu.onednn_enabled``); without them a CPU cannot pool in channels_first.
    """
    devices = settings.devices
    if devices.num_gpus > 0 and num_visible_gpus < devices.num_gpus:
        raise UserError(f"--num-gpus {devices.num_gpus} requested but TensorFlow sees "
                        f"{num_visible_gpus} GPU(s); use --num-gpus {num_visible_gpus}")
    if (devices.num_gpus == 0 and not onednn_enabled
            and plans.data_format(settings.model.model, devices) == "channels_first"):
        # TF 2.15's Eigen CPU kernels have no NCHW pooling ("Default AvgPoolingOp only
        # supports NHWC on device type CPU"); its oneDNN kernels do.
        raise UserError("--data-format channels_first on a CPU needs TensorFlow's oneDNN "
                        "kernels, which are off in this process; set TF_ENABLE_ONEDNN_OPTS=1 "
                        "(or unset it) or use --data-format channels_last")
    for name in ("job_dir", "data_dir", "export_dir"):
        path = settings.value(name)
        if path:
            storage.check_reachable(path, flag(name))
