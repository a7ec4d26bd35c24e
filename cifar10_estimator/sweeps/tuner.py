"""A sweep's trials run by Ray Tune on a Ray cluster: the driver's side.

``run`` gives Ray Tune the trials still to run as a grid (``tune.grid_search`` over their
specs: the trials are ours, already expanded, so finished ones are never handed to Ray Tune),
a function trainable (``trainable.run``) with the CPUs and GPUs each trial asks for, at most
``max_concurrent`` at once, no retries (a failed trial is the user's to see: the sweep
records it and a rerun runs it again), and a callback that records each trial's start and end
as Ray Tune sees them (``records.Sweep``: ``sweep.json``, ``JOB/trial.json``, the HParams
sessions, one line each), each evaluation a trial reports included. With ``--scheduler`` it
gives Ray Tune the scheduler (``scheduler``), and a trial the scheduler stops is recorded as
stopped early, its trainer saved (``trainable.stop``). Ray Tune's own results go to ``storage_path``, a folder of the
driver's that the command deletes afterwards: the sweep's records are the ones above.

The driver's variables the trainers need (a bucket's endpoint and keys) reach the trials
through Ray's object store (``tune.with_parameters``), not through the trials' configs, which
Ray Tune writes into its result files.

Ray is an optional dependency (the ``ray`` extra); nothing here imports it before it runs.
"""

import math
from typing import Mapping, Optional, Sequence

from cifar10_estimator.sweeps import records, trainable

# Ray Tune's experiment name, a folder in ``storage_path``.
EXPERIMENT = "cifar10-sweep"
# The reports' time attribute the schedulers act on: epochs of the training file.
EPOCH = "epoch"
# A result's numbers that are not the evaluation's figures.
_NOT_FIGURES = ("done", "trial_id", "experiment_tag", "global_step", trainable.FINAL,
                "images_per_sec")


def specs(state: records.Sweep, trials: Sequence[records.Trial]) -> list[dict]:
    """What each trial's trainable is given: its name, trainer flags, job dir, and the record
    and run id it checks it sees."""
    return [{"name": t.name, "argv": state.argv(t), "job_dir": t.job_dir,
             "record": state.record_path, "run_id": state.run_id} for t in trials]


def _name(trial) -> str:
    """A trial's name: in its config (the sweep's own trials), else the one the driver gave it
    as Ray Tune made it (a searcher's, ``run_drawn``)."""
    spec = trial.config.get("trial")
    return spec["name"] if isinstance(spec, dict) else trial.custom_trial_name


def scheduler(kind: Optional[str], metric: str, mode: str, grace_epochs: float,
              reduction_factor: float, max_epochs: Optional[float]):
    """Ray Tune's scheduler for ``--scheduler``: None (every trial to its end), ``asha``
    (``ASHAScheduler``: asynchronous successive halving, Li et al. 2020, arXiv:1810.05934) or
    ``hyperband``: HyperBand's brackets (Li et al. 2018, arXiv:1603.06560) run asynchronously,
    as Li et al. 2020 loop ASHA over them: one bracket per rung, bracket ``s``
    stopping trials from ``grace_epochs`` x ``reduction_factor`` ** s on, each new trial
    placed in one of them (Ray Tune's ``AsyncHyperBandScheduler`` with ``brackets``). Both on
    the trials' epochs, keeping 1 in ``reduction_factor`` at each rung. (Ray Tune's
    synchronous ``HyperBandScheduler`` pauses trials at each rung until their bracket catches
    up: a paused trainer would hold or give back its node, and be restarted, at every rung.)"""
    if kind is None:
        return None
    from ray.tune import schedulers

    # A trial that reaches max_t goes on to its end: its trainer's final evaluation and export
    # come after its last report of an evaluation.
    # Its max_t is set just short of the trainers' last epoch: Ray Tune puts a rung at max_t
    # when it is a power of the factor (1, 2, 4, 8), and one there would stop every trial but
    # the best as it reports its final evaluation, in its final export, though it trained to
    # its end.
    common = {"time_attr": EPOCH, "metric": metric, "mode": mode, "stop_last_trials": False,
              "grace_period": grace_epochs, "reduction_factor": reduction_factor,
              **({"max_t": max(grace_epochs, max_epochs * (1 - 1e-6))} if max_epochs else {})}
    return schedulers.AsyncHyperBandScheduler(
        brackets=1 if kind == "asha" else hyperband_brackets(
            grace_epochs, reduction_factor, max_epochs or _RAY_MAX_T), **common)


# Ray Tune's AsyncHyperBandScheduler's max_t when none is given (ray/tune/schedulers/
# async_hyperband.py): a trainer run by --train-steps has no length in epochs.
_RAY_MAX_T = 100


def hyperband_brackets(grace_epochs: float, reduction_factor: float, max_epochs: float) -> int:
    """HyperBand's bracket count: s_max + 1 (Li et al. 2018, algorithm 1), one per rung that
    ``grace_epochs`` x ``reduction_factor`` ** s reaches up to ``max_epochs``; bracket s's
    first rung is the s-th of ASHA's (``--reduction-factor 3 --grace-epochs 1 --train-epochs
    4``: 2 brackets, rungs at epochs 1 and 3, and at 3 only)."""
    return max(1, int(math.floor(math.log(max_epochs / grace_epochs, reduction_factor)
                                 + 1e-9)) + 1)


def run(state: records.Sweep, trials: Sequence[records.Trial], *, cpus: float, gpus: float,
        max_concurrent: Optional[int], env: Mapping[str, str], storage_path: str,
        early_stop=None) -> None:
    """Runs ``trials`` with Ray Tune on the cluster this process has joined, recording each in
    ``state`` as it starts, reports and ends; ``early_stop``: a scheduler (``scheduler``).

    Where a scheduler stops trials, the trials that ended in an earlier run of the sweep (a
    driver that was killed) go to Ray Tune too, and hand back the reports they made, as do the
    trials that had not ended before they resume: the scheduler weighs the new reports
    against the same ones as before."""
    from ray import tune

    ended = {t.name: t for t in state.trials.values() if t.in_grid and t.status in
             records.ENDED and t.reports} if early_stop is not None else {}
    replays = {name: _replay(t) for name, t in ended.items()}
    replays.update({t.name: t.reports for t in trials if t.reports and early_stop is not None})
    function = tune.with_resources(
        tune.with_parameters(trainable.run, env=dict(env), replays=replays,
                             ended=sorted(ended)),
        {"cpu": cpus, "gpu": gpus})

    Trial = _stopping(function)
    everything = [*ended.values(), *trials]
    tuner = tune.Tuner(
        Trial, param_space={"trial": tune.grid_search(specs(state, everything))},
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent,
                                    scheduler=early_stop, reuse_actors=False,
                                    trial_name_creator=_name, trial_dirname_creator=_name),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=storage_path, verbose=0,
                                  callbacks=[_recorder(state, set(ended))],
                                  failure_config=tune.FailureConfig(max_failures=0)))
    tuner.fit()


def run_drawn(state: records.Sweep, dimensions, search_alg, num_trials: int, *, cpus: float,
              gpus: float, max_concurrent: Optional[int], env: Mapping[str, str],
              storage_path: str, early_stop=None) -> None:
    """Runs ``num_trials`` trials that ``search_alg`` (``space.searcher``) draws from
    ``dimensions`` one after another, from the results so far; each joins ``state`` as Ray
    Tune makes it (its name, number and job dir are the sweep's) and is recorded as the
    others are."""
    from ray import tune

    from cifar10_estimator.sweeps import space

    function = tune.with_resources(
        tune.with_parameters(trainable.run_drawn, env=dict(env), dimensions=list(dimensions),
                             trainer_flags=list(state.trainer_flags),
                             sweep_dir=state.sweep_dir, record=state.record_path,
                             run_id=state.run_id),
        {"cpu": cpus, "gpu": gpus})

    Trial = _stopping(function)
    def name(trial) -> str:  # on the driver, once Ray Tune has the searcher's point
        return state.add(space.point(dimensions, trial.config)).name

    tuner = tune.Tuner(
        Trial, param_space=space.ray_search_space(dimensions),
        tune_config=tune.TuneConfig(search_alg=search_alg, num_samples=num_trials,
                                    max_concurrent_trials=max_concurrent,
                                    scheduler=early_stop, reuse_actors=False,
                                    trial_name_creator=name, trial_dirname_creator=name),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=storage_path, verbose=0,
                                  callbacks=[_recorder(state, set())],
                                  failure_config=tune.FailureConfig(max_failures=0)))
    tuner.fit()


def _stopping(function):
    """Ray Tune's class of the function trainable ``function``, whose trainer saves and exits
    when Ray Tune stops the trial (``trainable.stop``) before its actor goes."""
    from ray.tune.trainable.function_trainable import wrap_function

    class Trial(wrap_function(function)):
        def cleanup(self):
            trainable.stop()
            super().cleanup()

    return Trial


def _replay(trial: records.Trial) -> list[dict]:
    """An ended trial's reports as it hands them back; a finished one's last marked final."""
    reports = [dict(r) for r in trial.reports]
    if trial.status == records.FINISHED:
        reports[-1][trainable.FINAL] = 1
    return reports


def _recorder(state: records.Sweep, ended: set[str]):
    """A Ray Tune callback that records the trials' events in ``state`` (the trials in
    ``ended`` only hand back their reports: nothing of theirs is recorded again)."""
    from ray import tune
    from ray.tune.result import AUTO_RESULT_KEYS

    def figures(result: Mapping) -> dict[str, float]:
        return {k: float(v) for k, v in result.items()
                if k not in AUTO_RESULT_KEYS and k not in _NOT_FIGURES
                and isinstance(v, (int, float)) and not isinstance(v, bool)}

    class Recorder(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            if _name(trial) not in ended:
                state.started(_name(trial))

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if _name(trial) not in ended and EPOCH in result:
                state.reported(_name(trial), {"global_step": float(result.get(
                    "global_step", 0)), **figures(result)})

        def on_trial_complete(self, iteration, trials, trial, **info):
            if _name(trial) in ended:
                return
            result = trial.last_result or {}
            log = result.get(trainable.LOG_RESULT)
            if result.get(trainable.FINAL):
                metrics = figures(result)
                metrics.pop(EPOCH, None)
                state.finished(_name(trial), metrics, log=log)
            else:  # the scheduler stopped it at its last report
                state.stopped(_name(trial), log=log)

        def on_trial_error(self, iteration, trials, trial, **info):
            if _name(trial) in ended:
                return
            error, exit_status, log, lost = failure(trial)
            state.failed(_name(trial), error, exit_status, log=log, lost=lost)

    return Recorder()


def failure(trial) -> tuple[str, Optional[int], Optional[str], bool]:
    """A failed trial's error line, its trainer's exit status (None when the trainer did not
    end by itself: the trial's node was lost, its actor stopped), the log the driver writes
    (a bucket's job dir only), and whether the trial was lost with its Ray worker (its actor
    or node died: not the trial's own failure)."""
    # Ray Tune keeps the trial's error in its local staging folder first (error.pkl, the
    # RayTaskError with the trainable's exception as its cause; error.txt, its traceback);
    # Trial.get_pickled_error reads the storage copy, which is synced later.
    from ray import cloudpickle
    from ray import exceptions

    try:
        with open(trial.pickled_error_file, "rb") as f:
            error = cloudpickle.load(f)
    except Exception:  # noqa: BLE001  (no file, or one that does not load: the text below)
        error = None
    cause = getattr(error, "cause", error)
    if isinstance(cause, trainable.TrialFailed):
        return cause.message, cause.exit_status, cause.log, False
    lost = isinstance(cause, (exceptions.RayActorError, exceptions.WorkerCrashedError,
                              exceptions.NodeDiedError))
    try:
        with open(trial.error_file) as f:
            lines = [line.strip() for line in f if line.strip()]
    except (OSError, TypeError):
        lines = []
    return (lines[-1][:1000] if lines else "Ray Tune gave no reason"), None, None, lost
