"""What a sweep's trial runs on its Ray node: Ray Tune's function trainable (``tuner``).

- It checks that its node sees the sweep dir: the driver wrote ``sweep.json`` with this run's
  id before any trial started, and a local sweep dir that a node does not show with that id
  is not shared (each node would keep its own trials). A bucket is shared by nature.
- It runs the trainer, ``python -m cifar10_estimator`` with the trial's flags, as a process
  of its own (a fresh TensorFlow for every trial), through ``ray_node.TaskRunner``: the node's
  environment, which Ray gives the trial's actor (``OMP_NUM_THREADS`` = the CPUs asked for),
  plus the driver's storage and TensorFlow variables and the two of Vertex AI's hypertune
  convention, through which the trainer hands back its final evaluation's scalars
  (``engines``: ``CLOUD_ML_TRIAL_ID`` = the trial's name, ``CLOUD_ML_HP_METRIC_FILE`` = a
  file in a temporary folder of the node). The trainer dies with its actor.
- A trainer that a signal ended (exit status 128 or more, or killed; not the sweep's own
  stop below), as a preempted or killed process is, is started again in place, as the cluster
  launcher does, and resumes from its latest checkpoint; its failures (1 to 127) end the trial.
- Its output goes to ``JOB/trial.log`` as it comes (a trainer started again in the trial adds
  to it); for a job dir in a bucket, to a local file
  whose text goes to the driver with the result, and the driver writes it into the bucket: the
  trial itself touches no bucket, so it loads no TensorFlow (only its trainer does).
- It reports each evaluation to Ray Tune (``ray.tune.report``) as the trainer adds it to the
  metric file (its scalars, ``epoch``, ``global_step``, ``images_per_sec``), then the final
  evaluation's scalars marked ``FINAL`` once the trainer has ended by itself; or, when the
  trainer exited non-zero, raises ``TrialFailed`` with the trainer's last error line, which
  Ray Tune shows as the trial's error (status ERROR). The driver records all of it
  (``records``).
- When the sweep's scheduler stops the trial at a report, Ray Tune stops the trial's actor:
  ``stop`` (called from the actor's clean-up, ``tuner``) sends the trainer SIGTERM and waits
  for it to save its step and exit 143, as a preempted trainer does, so its job dir stays
  valid and resumable; a trainer outliving its actor is killed (``ray_node``).
- A resumed sweep (a driver killed and started again) hands each trial the reports it made
  before (``replays``): the trial gives them back to Ray Tune first, so that the scheduler
  weighs the same evaluations again, then a trial that had not ended resumes its trainer
  from the job dir's checkpoint; one that had ended stops there.
"""

import os
import signal
import tempfile
import threading
import time
from typing import Callable, Mapping, Optional, Sequence

from cifar10_estimator import engines, storage
from cifar10_estimator.jobdir.lock import IN_USE
from cifar10_estimator.launch.layout import ended_by_signal, how_ended
from cifar10_estimator.launch.ray_node import TaskRunner
from cifar10_estimator.sweeps import records

# How often the trial moves the trainer's new output to its log (as ray_actors reads it).
_READ_SECS = 0.2
# A trainer's one-line error: ``<command>: error: <what>`` (errors.run_cli).
_ERROR_MARK = ": error: "
# The result's key of a trial's whole log, for a job dir in a bucket (the driver writes it).
LOG_RESULT = "trial_log"
# The result's key that marks a trial's last report, after its trainer ended by itself: a
# trial whose last result lacks it was stopped early by the sweep's scheduler.
FINAL = "final"
# How long a stopped trial's trainer may take to save and exit before its actor goes (a
# checkpoint of the largest ResNet takes seconds; Ray Tune itself kills a trial's actor that
# takes longer than TUNE_FORCE_TRIAL_CLEANUP_S, 600 s by default, to stop).
STOP_SECS = 300
# How long a trial whose trainer is refused because another trainer holds the job dir
# (jobdir.lock's IN_USE) waits for it to go: the trainers of a sweep whose driver was killed end
# within seconds, as Ray ends that driver's actors (a few seconds on a local Ray cluster).
LOCK_WAIT_SECS = 120
LOCK_POLL_SECS = 2
# The trainers running in this process (an actor runs one trial at a time), for ``stop``.
_running: list = []


class TrialFailed(Exception):
    """A trial's trainer exited non-zero; the message is its last error line. ``exit_status``
    is the trainer's."""

    def __init__(self, message: str, exit_status: Optional[int] = None,
                 log: Optional[str] = None):
        super().__init__(message, exit_status, log)  # all in args: what pickle rebuilds from
        self.message, self.exit_status, self.log = message, exit_status, log

    def __str__(self) -> str:
        return self.message


def not_shared(record: str, run_id: str, node: str) -> Optional[str]:
    """Why this node cannot take part (it does not see the driver's ``sweep.json`` of this
    run), or None. A bucket's path is not checked."""
    if storage.is_url(record):
        return None
    try:
        with open(record, "rb") as f:
            seen = run_id.encode() in f.read()
    except OSError:
        seen = False
    if seen:
        return None
    return (f"--sweep-dir {storage.parent(record)} is not shared by the Ray cluster's nodes "
            f"(this trial's node, {node}, does not see its {records.RECORD_FILE}): use a bucket "
            f"(s3://, gs://) or a folder every node mounts at the same path")


def last_error(lines: list[str]) -> str:
    """The trainer's error line: its last ``...: error: ...`` line, else its last line."""
    shown = [line.strip() for line in lines if line.strip()]
    marked = [line for line in shown if _ERROR_MARK in line]
    return (marked or shown or ["the trainer said nothing"])[-1][:1000]


def run(config: Mapping, env: Mapping[str, str],
        replays: Optional[Mapping[str, list]] = None, ended: Sequence[str] = ()) -> None:
    """Ray Tune's trainable: one trial (``config["trial"]``: its name, trainer flags, job dir,
    the sweep's record and run id); ``env``: the driver's variables for the trainer.
    ``replays``: the reports trials made in an earlier run of the sweep, by name, which each
    hands back first (its scheduler weighs them again); the trials in ``ended`` (finished or
    stopped then) stop there, without training again."""
    from ray import tune
    import ray

    spec = config["trial"]
    replayed = (replays or {}).get(spec["name"], ())
    for report in replayed:
        tune.report(dict(report))
    if spec["name"] in ended:
        return
    refusal = not_shared(spec["record"], spec["run_id"], ray.util.get_node_ip_address())
    if refusal:
        raise TrialFailed(refusal)
    with tempfile.TemporaryDirectory(prefix="cifar10-sweep-trial-") as temp:
        metric_file = os.path.join(temp, "output.metrics")
        variables = {**env, engines.TRIAL_ID_ENV: spec["name"],
                     engines.METRIC_FILE_ENV: metric_file}
        trainer = _Trainer(spec["job_dir"], temp, metric_file, tune.report,
                           replayed[-1] if replayed else None)
        code, tail, log = trainer.run(spec["argv"], variables)
        deadline = time.monotonic() + LOCK_WAIT_SECS
        while code != 0 and not trainer.stopping:
            if ended_by_signal(code):
                # Stopped by a signal that was not the sweep's (a preempted or killed process):
                # started again in place, as the cluster launcher does, and it resumes from its
                # latest checkpoint. Its own failures (1 to 127) end the trial.
                note = (f"sweep: {spec['name']}'s trainer stopped by a signal "
                        f"({how_ended(code)}): starting it again")
            elif IN_USE in last_error(tail) and time.monotonic() < deadline:
                # The trainer of a sweep whose driver was killed, still saving or not yet ended
                # by its actor's end: this trial's trainer starts again once it is gone.
                time.sleep(LOCK_POLL_SECS)
                note = None
            else:
                break
            code, tail, log = trainer.run(spec["argv"], variables, note)
        if code != 0:
            raise TrialFailed(last_error(tail), code, log)
        try:
            with open(metric_file) as f:
                metrics, step = engines.read(f.read())
        except (OSError, ValueError) as e:
            raise TrialFailed(f"the trainer ended without its final evaluation's figures in "
                              f"{metric_file} ({e})", code, log) from None
    epoch = trainer.epoch_at(step or 0)
    tune.report({**metrics, "global_step": step or 0, FINAL: 1,
                 **({"epoch": epoch} if epoch is not None else {}),
                 **({LOG_RESULT: log} if log is not None else {})})


def run_drawn(config: Mapping, env: Mapping[str, str], dimensions: Sequence,
              trainer_flags: Sequence[str], sweep_dir: str, record: str, run_id: str) -> None:
    """Ray Tune's trainable for a trial its searcher drew (``--search tpe``): ``config`` is the
    point of ``space.ray_search_space(dimensions)``; the trial's name is the one the driver gave
    it as Ray Tune made it (``tuner.run_drawn``). Its settings go through the trainer's checks
    before its trainer starts, as every trial's do; then it runs as ``run`` does."""
    from ray import tune

    from cifar10_estimator.errors import UserError
    from cifar10_estimator.sweeps import space

    settings = space.point(dimensions, config)
    name = tune.get_context().get_trial_name()
    try:
        records.check_trials(trainer_flags, [settings])
    except UserError as e:
        raise TrialFailed(str(e)) from None
    job_dir = storage.join(sweep_dir, name)
    run({"trial": {"name": name, "job_dir": job_dir, "record": record, "run_id": run_id,
                   "argv": records.trainer_argv(trainer_flags, settings, job_dir)}}, env)


def stop() -> None:
    """Ray Tune stops this trial (its scheduler stopped it early, or the sweep ends): its
    trainer, if it runs, gets SIGTERM, saves its step as a preempted trainer does and exits
    143, leaving its job dir resumable; this waits for that (``STOP_SECS`` at most) before the
    actor goes, which would kill it unsaved."""
    if _running:
        _running[-1].stop()


class _Trainer:
    """The trial's trainer process: its output to the trial's log, each evaluation's report
    to Ray Tune as it appears in the metric file."""

    def __init__(self, job_dir: str, temp: str, metric_file: str, report: Callable,
                 last: Optional[Mapping] = None):
        log = storage.join(job_dir, records.TRIAL_LOG_FILE)
        self.local = not storage.is_url(log)
        if self.local:
            os.makedirs(job_dir, exist_ok=True)
        self.path = log if self.local else os.path.join(temp, records.TRIAL_LOG_FILE)
        self.metric_file, self.report = metric_file, report
        self.runner = TaskRunner()
        self.tail: list[str] = []
        # The last report's epoch and step (``last``: the last one handed back already).
        self.epoch: Optional[float] = last.get("epoch") if last else None
        self._reported_step = last.get("global_step", -1) if last else -1
        self._lock = threading.Lock()  # the log: the trial's thread, or ``stop``'s
        self._out = None
        self._runs = 0
        self.stopping = False  # the sweep stopped the trial (``stop``): not started again

    def run(self, argv: list[str], variables: Mapping[str, str], note: Optional[str] = None
            ) -> tuple[int, list[str], Optional[str]]:
        """Runs the trainer to its end: (exit status, its last lines, the whole log where the
        job dir is a bucket's, for the driver to write there). A trainer started again in this
        trial adds its lines to the log after ``note``."""
        _running.append(self)
        self._runs += 1
        try:
            with open(self.path, "w" if self._runs == 1 else "a") as self._out:
                if note:
                    self._out.write(note + "\n")
                self.runner.start(argv, dict(variables))
                try:
                    while True:
                        code = self._copy_output()
                        self._report_new()
                        if code is not None:
                            break
                        time.sleep(_READ_SECS)
                finally:
                    if self.runner.poll() is None:  # the log could not be written: it stops
                        self.runner.send(signal.SIGTERM)
        finally:
            _running.remove(self)
        if self.local:
            return code, self.tail, None
        with open(self.path, errors="replace") as f:
            return code, self.tail, f.read()

    def _copy_output(self) -> Optional[int]:
        with self._lock:
            lines, code = self.runner.read()
            if self._out is not None and not self._out.closed:
                self._out.writelines(lines)
                self._out.flush()
            self.tail = (self.tail + lines)[-50:]
            return code

    def _report_new(self) -> None:
        """Each evaluation the trainer reported since the last call, to Ray Tune (which may
        keep this thread there for good: its scheduler stopped the trial, ``stop``)."""
        try:
            with open(self.metric_file) as f:
                found = engines.reports(f.read())
        except OSError:
            return
        for report in found:
            if "epoch" in report and report["global_step"] > self._reported_step:
                self._reported_step, self.epoch = report["global_step"], report["epoch"]
                self.report({**report, **self._log_so_far()})

    def _log_so_far(self) -> dict:
        """For a job dir in a bucket, the log so far, which the driver writes there if this
        report turns out to be the trial's last (its scheduler stops it); else nothing."""
        if self.local:
            return {}
        with self._lock, open(self.path, errors="replace") as f:
            return {LOG_RESULT: f.read()}

    def epoch_at(self, step: float) -> Optional[float]:
        """The epoch of global step ``step``, at the steps per epoch the reports show (None
        without a report)."""
        if self.epoch is None or self._reported_step <= 0:
            return self.epoch
        return self.epoch * step / self._reported_step

    def stop(self) -> None:
        self.stopping = True
        if self.runner.poll() is None:
            self.runner.send(signal.SIGTERM)
            deadline = time.monotonic() + STOP_SECS
            while self.runner.poll() is None and time.monotonic() < deadline:
                self._copy_output()
                time.sleep(_READ_SECS)
        while self._copy_output() is None and self.runner.poll() is not None:
            time.sleep(_READ_SECS)  # the last lines still coming
