"""A sweep's trials run by Ray Tune on a Ray cluster: the driver's side.

``run`` gives Ray Tune the trials still to run as a grid (``tune.grid_search`` over their
specs: the trials are ours, already expanded, so finished ones are never handed to Ray Tune),
a function trainable (``trainable.run``) with the CPUs and GPUs each trial asks for, at most
``max_concurrent`` at once, no retries (a failed trial is the user's to see: the sweep
records it and a rerun runs it again), and a callback that records each trial's start and end
as Ray Tune sees them (``records.Sweep``: ``sweep.json``, ``JOB/trial.json``, the HParams
sessions, one line each). Ray Tune's own results go to ``storage_path``, a folder of the
driver's that the command deletes afterwards: the sweep's records are the ones above.

The driver's variables the trainers need (a bucket's endpoint and keys) reach the trials
through Ray's object store (``tune.with_parameters``), not through the trials' configs, which
Ray Tune writes into its result files.

Ray is an optional dependency (the ``ray`` extra); nothing here imports it before it runs.
"""

from typing import Mapping, Optional, Sequence

from cifar10_estimator.sweeps import records, trainable

# Ray Tune's experiment name, a folder in ``storage_path``.
EXPERIMENT = "cifar10-sweep"


def specs(state: records.Sweep, trials: Sequence[records.Trial]) -> list[dict]:
    """What each trial's trainable is given: its name, trainer flags, job dir, and the record
    and run id it checks it sees."""
    return [{"name": t.name, "argv": state.argv(t), "job_dir": t.job_dir,
             "record": state.record_path, "run_id": state.run_id} for t in trials]


def _name(trial) -> str:
    return trial.config["trial"]["name"]


def run(state: records.Sweep, trials: Sequence[records.Trial], *, cpus: float, gpus: float,
        max_concurrent: Optional[int], env: Mapping[str, str], storage_path: str) -> None:
    """Runs ``trials`` with Ray Tune on the cluster this process has joined, recording each in
    ``state`` as it starts and ends."""
    from ray import tune

    function = tune.with_resources(tune.with_parameters(trainable.run, env=dict(env)),
                                   {"cpu": cpus, "gpu": gpus})
    tuner = tune.Tuner(
        function, param_space={"trial": tune.grid_search(specs(state, trials))},
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent,
                                    trial_name_creator=_name, trial_dirname_creator=_name),
        run_config=tune.RunConfig(name=EXPERIMENT, storage_path=storage_path, verbose=0,
                                  callbacks=[_recorder(state)],
                                  failure_config=tune.FailureConfig(max_failures=0)))
    tuner.fit()


def _recorder(state: records.Sweep):
    """A Ray Tune callback that records the trials' events in ``state``."""
    from ray import tune
    from ray.tune.result import AUTO_RESULT_KEYS

    class Recorder(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            state.started(_name(trial))

        def on_trial_complete(self, iteration, trials, trial, **info):
            result = trial.last_result or {}
            metrics = {k: float(v) for k, v in result.items()
                       if k not in AUTO_RESULT_KEYS and k != "global_step"
                       and isinstance(v, (int, float)) and not isinstance(v, bool)
                       and k not in ("done", "trial_id", "experiment_tag")}
            state.finished(_name(trial), metrics, log=result.get(trainable.LOG_RESULT))

        def on_trial_error(self, iteration, trials, trial, **info):
            error, exit_status, log = failure(trial)
            state.failed(_name(trial), error, exit_status, log=log)

    return Recorder()


def failure(trial) -> tuple[str, Optional[int], Optional[str]]:
    """A failed trial's error line, its trainer's exit status (None when the trainer did not
    end by itself: the trial's node was lost, its actor stopped) and the log the driver writes
    (a bucket's job dir only)."""
    # Ray Tune keeps the trial's error in its local staging folder first (error.pkl, the
    # RayTaskError with the trainable's exception as its cause; error.txt, its traceback);
    # Trial.get_pickled_error reads the storage copy, which is synced later.
    from ray import cloudpickle

    try:
        with open(trial.pickled_error_file, "rb") as f:
            error = cloudpickle.load(f)
    except Exception:  # noqa: BLE001  (no file, or one that does not load: the text below)
        error = None
    cause = getattr(error, "cause", error)
    if isinstance(cause, trainable.TrialFailed):
        return cause.message, cause.exit_status, cause.log
    try:
        with open(trial.error_file) as f:
            lines = [line.strip() for line in f if line.strip()]
    except (OSError, TypeError):
        lines = []
    return (lines[-1][:1000] if lines else "Ray Tune gave no reason"), None, None
