"""Measuring which precision computes faster on this machine: the probes behind ``auto``.

CPU flags do not tell whether bf16 is faster than fp32. Two CPUs with AVX512_BF16 and no AMX
train this ResNet-20 faster in bf16 than in fp32 (AMD Zen 5) and slower (an Intel Xeon), so
``--precision auto`` times the real thing instead (docs/cpus.md, "CPUs measured so far"):

- ``measure_training``: the training step the run will run (the model_fn's graph for its network,
  depth, batch, data format, towers and session settings, on a fixed random batch), once in each
  precision, in one process.
- ``measure_serving``: the export's network (frozen, folded weights) at a serving batch.

Each builds both versions first, warms them up (oneDNN creates its kernels on the first calls),
then times them alternately, A B A B ..., so that a neighbour stealing CPU time slows both
alike, and reports each one's median images/s. A probe stops after ``budget_secs`` of timed
calls, or after ``max_rounds`` rounds; every probe times at least ``MIN_ROUNDS`` rounds.
"""

import dataclasses
import logging
import statistics
import time
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from cifar10_estimator.config import plan as plans
from cifar10_estimator.config.plan import DTYPES
from cifar10_estimator.config.settings import DevicesSection, ModelSection, ScheduleSection
from cifar10_estimator.data import schema
from cifar10_estimator.model import networks
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.serving.signatures import RandomWeights, ServingModule
from cifar10_estimator.platform import precision, precision_cache
from cifar10_estimator.platform.cpu import CpuInfo
from cifar10_estimator.platform.precision import Choice, Measured
from cifar10_estimator.platform.precision_cache import PrecisionCache

log = logging.getLogger("cifar10_estimator")

# Rounds (one timed call of each precision) a probe takes at least: a median of three is the
# fewest that drops one outlier (a call slowed by a neighbour).
MIN_ROUNDS = 3
# Untimed calls of each version before timing: oneDNN creates and caches its kernels on the
# first call, which took 2.5-4x as long as the next ones (ResNet-20 and -44, AMD EPYC Zen 4).
WARMUP_CALLS = 1
# The serving probe's batch: the batch size of Keras' Model.predict by default, and the middle
# column of benchmarks/serving_bench.py (1, 32, 256).
SERVING_BATCH = 32


def time_alternately(calls: dict[str, Callable[[], object]], images_per_call: int,
                     budget_secs: float, max_rounds: int,
                     clock: Callable[[], float] = time.perf_counter) -> tuple[dict, int]:
    """Warms up each call, then times them in turn; the median images/s of each, and the rounds.

    Stops once ``budget_secs`` of timed calls have passed (after at least ``MIN_ROUNDS``
    rounds) or after ``max_rounds`` rounds.
    """
    for call in calls.values():
        for _ in range(WARMUP_CALLS):
            call()
    durations: dict[str, list[float]] = {name: [] for name in calls}
    spent, rounds = 0.0, 0
    while rounds < MIN_ROUNDS or (spent < budget_secs and rounds < max_rounds):
        for name, call in calls.items():
            start = clock()
            call()
            durations[name].append(clock() - start)
            spent += durations[name][-1]
        rounds += 1
    return {name: images_per_call / statistics.median(d) for name, d in durations.items()}, rounds


def _random_batch(batch_size: int, num_classes: int):
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, [batch_size, schema.HEIGHT, schema.WIDTH, schema.CHANNELS])
    return images.astype(np.float32), rng.integers(0, num_classes, batch_size).astype(np.int32)


def measure_training(make_train_step: Callable[[ModelSettings], Callable],
                     settings: ModelSettings,
                     batch_size: int, session_config: tf.compat.v1.ConfigProto,
                     budget_secs: float = 1.5, max_rounds: int = 8) -> Measured:
    """Times the training step of ``settings`` in fp32 and bf16.

    The step is the train op that ``make_train_step(settings)`` builds (the trainer's,
    ``training.estimator.model_fn.make_train_step``: this room sits below the Estimator-facing
    one, which hands it in) on one fixed random batch of ``batch_size`` (a worker's
    batch, split over the settings' towers), in a graph and session of its own with
    ``session_config`` (the trainer's: threads, logical CPU devices, XLA). Workers' gradient
    aggregation (``sync``) is left out: its cost is the same in both precisions.

    Raises:
      tf.errors.OpError: a version cannot run here (the caller treats it as a failed probe).
    """
    started = time.perf_counter()
    images, labels = _random_batch(batch_size, settings.num_classes)
    sessions, calls = [], {}
    try:
        for name, dtype in DTYPES.items():
            graph = tf.Graph()
            with graph.as_default():
                tf.compat.v1.set_random_seed(0)
                spec = make_train_step(dataclasses.replace(
                    settings, sync_replicas=False, compute_dtype=dtype, num_workers=1,
                    is_chief=True))({"image": tf.constant(images)}, tf.constant(labels))
                init = tf.compat.v1.global_variables_initializer()
            session = tf.compat.v1.Session(graph=graph, config=session_config)
            sessions.append(session)
            session.run(init)
            calls[name] = lambda s=session, op=spec.train_op: s.run(op)
        per_sec, rounds = time_alternately(calls, batch_size, budget_secs, max_rounds)
    finally:
        for session in sessions:
            session.close()
    return _measured(per_sec, rounds, started)


def measure_serving(settings, batch_size: int, budget_secs: float = 1.0,
                    max_rounds: int = 20) -> Measured:
    """Times the export's network for ``settings`` in fp32 and bf16 at ``batch_size`` pictures.

    The network is the serving one (``serving.signatures``: frozen, folded weights, here
    random ones of the right shapes), called as a SavedModel's signature is.
    """
    started = time.perf_counter()
    images = tf.constant(_random_batch(batch_size, 1)[0])
    calls = {}
    for name, dtype in DTYPES.items():
        network = ServingModule(dataclasses.replace(settings, compute_dtype=dtype),
                                RandomWeights()).network
        calls[name] = lambda f=network: f(images)["probabilities"].numpy()
    per_sec, rounds = time_alternately(calls, batch_size, budget_secs, max_rounds)
    return _measured(per_sec, rounds, started)


def _measured(per_sec: dict, rounds: int, started: float) -> Measured:
    return Measured(per_sec, f"measured now: medians of {rounds} alternating runs, "
                             f"{time.perf_counter() - started:.1f} s")


def serving_choice(requested: str, trained: str, settings, cpu: CpuInfo, onednn: bool,
                   cache: PrecisionCache) -> Choice:
    """``--serving-precision`` resolved for the export of ``settings`` (a model trained in
    ``trained``), measured at ``SERVING_BATCH`` and cached."""
    work = f"serving {networks.describe(settings.model)}, batch {SERVING_BATCH}"
    return precision.resolve_serving_precision(
        requested, trained, cpu, onednn=onednn,
        measure=lambda: precision_cache.measured(
            cache, cpu.describe(), work, lambda: measure_serving(settings, SERVING_BATCH)))


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the precision choice measures on: the CPU as oneDNN sees it, oneDNN's state and
    the probes' cache."""

    cpu: CpuInfo
    onednn: bool
    cache: PrecisionCache


def check_requested(requested: str, num_gpus: int, machine: Machine) -> None:
    """Refuses ``--precision bf16`` on a machine that cannot run it fast, in one line."""
    precision.check_requested(requested, machine.cpu, onednn=machine.onednn,
                              gpu_capabilities=precision.gpu_capabilities(num_gpus))


def choose_training(model: ModelSection, schedule: ScheduleSection, devices: DevicesSection,
                    session: tf.compat.v1.ConfigProto, data_dir: str,
                    class_names: Sequence[str], machine: Machine, recorded: Optional[str],
                    make_train_step: Callable[[ModelSettings], Callable]) -> str:
    """What the job computes in: ``--precision`` (``devices.precision``) itself, or for
    ``auto`` the job's ``recorded`` choice, else what fits this machine (measured on one
    worker's training step of ``model`` at ``schedule``'s batch, the train op
    ``make_train_step`` builds, on the devices and in the
    layout the plan will have, in sessions configured by ``session``, where the CPU has native
    bf16); logs the CPU and the choice with its reason. It runs before the task's plan is made:
    the plan holds the precision this returns."""
    # Grouped by room (the plan's rules, the network's name, the CPU): a reader follows each
    # once (tools/call_walk.py).
    layout, optimizer = plans.data_format(model.model, devices), plans.optimizer_of(schedule)
    towers, batch = devices.tower_devices, schedule.train_batch_size
    work = (f"training {networks.describe(model)}, batch {batch} on "
            f"{', '.join(towers)}, {layout}, threads "
            f"{devices.num_intra_threads}/{devices.num_inter_threads}"
            f"{', XLA' if devices.xla else ''}")
    describe_cpu = machine.cpu.describe()
    step = ModelSettings(model=model, optimizer=optimizer,
                         data_format=layout, devices=towers,
                         variable_strategy=devices.variable_strategy,
                         class_names=tuple(class_names), data_dir=data_dir)
    choice = precision.resolve_precision(
        devices.precision, machine.cpu, onednn=machine.onednn,
        gpu_capabilities=precision.gpu_capabilities(devices.num_gpus),
        measure=lambda: precision_cache.measured(
            machine.cache, describe_cpu, work, lambda: measure_training(make_train_step, step, batch,
                                                         session)),
        cached=precision_cache.cached(machine.cache, describe_cpu, work),
        recorded=recorded if devices.precision == "auto" else None)
    log.info("CPU: %s; oneDNN %s", describe_cpu, "on" if machine.onednn else "off")
    log.info("precision %s: %s", devices.precision, choice.reason)
    if choice.warning:
        log.warning("warning: %s", choice.warning)
    return choice.precision


def choose_serving(trained: ModelSettings, requested: str, trained_in: str,
                   machine: Machine) -> ModelSettings:
    """What the task's exports compute with: the model of ``trained`` (the job's model_fn
    settings, trained in ``trained_in``) in the precision ``requested``
    (``--serving-precision``) resolves to (``serving_choice``); logs the choice."""
    choice = serving_choice(requested, trained_in, trained, machine.cpu, machine.onednn,
                            machine.cache)
    log.info("serving precision %s: %s", requested, choice.reason)
    if choice.warning:
        log.warning("warning: %s", choice.warning)
    return dataclasses.replace(trained, compute_dtype=DTYPES[choice.precision])
