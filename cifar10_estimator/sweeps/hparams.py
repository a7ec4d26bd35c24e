"""A sweep in TensorBoard's HParams dashboard: ``tensorboard --logdir SWEEP`` compares the
trials.

TensorBoard's HParams plugin (``tensorboard.plugins.hparams``) reads three kinds of summary:

- the experiment, in the sweep dir (the run ``.``): each varied flag as an hparam with its
  values as a discrete domain, and the metrics, which are the final evaluation's scalars that
  Estimator already writes into each trial's ``JOB/eval`` (the run ``<trial>/eval``: group
  ``eval``, tags ``accuracy``, ``cross_entropy``, ``loss``, and ``--metric`` where it is
  another);
- a session per trial, in its job dir (the run ``<trial>``): its settings and its start;
- the session's end, in the same run: success (finished or stopped early) or failure, with
  two metrics of the run itself, the ``epochs`` it trained and ``stopped_early`` (1 for a
  trial the scheduler stopped, else 0): scalars that TensorBoard loads as they come, where a
  session's hparams, written again, would keep their first value in a running TensorBoard.

Each is written through TensorFlow's summary writer (so a bucket works as a local folder
does), into event files of its own whose names end in ``SUFFIX``. TensorBoard keeps the first
summary of a tag in a run, so a trial that runs again (it failed before) first deletes the
event files of its earlier session, and the experiment's are replaced when the grid changes.

TensorFlow is imported when the first summary is written (the command prepares the process
for it first).
"""

from typing import Any, Mapping, Optional, Sequence

from cifar10_estimator import logs, storage
from cifar10_estimator.sweeps import records

# The end of the names of the event files written here (and only here).
SUFFIX = ".hparams"
# The final evaluation's scalars the dashboard shows as the trials' metrics, in JOB/eval.
EVAL_GROUP = "eval"
METRICS = ("accuracy", "cross_entropy", "loss")
# The session's own metrics: the epochs it trained, and whether the scheduler stopped it.
EPOCHS, STOPPED_EARLY = "epochs", "stopped_early"


def _tf():
    # Before TensorBoard's hparams modules, which import TensorFlow: quietly, once.
    logs.import_tensorflow_quietly()
    import tensorflow as tf

    return tf


def _replace(folder: str, write) -> None:
    """Deletes ``folder``'s event files of this module, then writes ``write()``'s summaries
    into a new one."""
    tf = _tf()
    storage.makedirs(folder)  # on a bucket, loads its file system first (storage)
    for old in storage.glob(storage.join(folder, f"events.out.tfevents.*{SUFFIX}")):
        storage.remove(old)
    _append(tf, folder, write)


def _append(tf, folder: str, write) -> None:
    with storage.os_errors(folder):  # a full disk, a bucket gone: as the records' writes fail
        writer = tf.summary.create_file_writer(folder, filename_suffix=SUFFIX)
        with writer.as_default():
            write()
        writer.close()


def write_experiment(sweep_dir: str, varied: Sequence[records.Varied], metric: str) -> None:
    """The experiment: the varied flags with their values, the evaluation's metrics."""
    _tf()
    from tensorboard.plugins.hparams import api as hp

    hparams = []
    for v in varied:
        values = [records.typed_settings([v], {v.flag: value})[v.flag] for value in v.values]
        hparams.append(hp.HParam(v.flag, hp.Discrete(values)))
    names = list(METRICS) + ([metric] if metric not in METRICS else [])
    metrics = [hp.Metric(name, group=EVAL_GROUP, display_name=f"{name} (last evaluation)")
               for name in names]
    metrics.append(hp.Metric(EPOCHS, display_name="epochs trained"))
    metrics.append(hp.Metric(STOPPED_EARLY, display_name="stopped early (1) or not (0)"))
    _replace(sweep_dir, lambda: hp.hparams_config(hparams=hparams, metrics=metrics))


def start_session(job_dir: str, name: str, settings: Mapping[str, Any], when: float) -> None:
    """A trial's session: its settings (as parsed values) and start; earlier sessions' files
    deleted."""
    _tf()
    from tensorboard.plugins.hparams import api as hp

    _replace(job_dir, lambda: hp.hparams(dict(settings), trial_id=name, start_time_secs=when))


def end_session(job_dir: str, ok: bool, when: float, epochs: Optional[float] = None,
                stopped: bool = False) -> None:
    """The end of a trial's session: success or failure, the epochs it trained and whether the
    scheduler stopped it early."""
    tf = _tf()
    from tensorboard.plugins.hparams import api_pb2, summary

    status = api_pb2.STATUS_SUCCESS if ok else api_pb2.STATUS_FAILURE
    end = summary.session_end_pb(status, end_time_secs=when).SerializeToString()

    def write():
        tf.summary.experimental.write_raw_pb(end, step=0)
        if epochs is not None:
            tf.summary.scalar(EPOCHS, epochs, step=0)
        tf.summary.scalar(STOPPED_EARLY, float(stopped), step=0)

    _append(tf, job_dir, write)


class SessionWriter(records.TrialListener):
    """Writes each trial's HParams session as it starts and ends."""

    def __init__(self, varied: Sequence[records.Varied]):
        self.varied = list(varied)

    def started(self, trial: records.Trial, when: float) -> None:
        start_session(trial.job_dir, trial.name,
                      records.typed_settings(self.varied, trial.settings), when)

    def ended(self, trial: records.Trial, ok: bool, when: float) -> None:
        end_session(trial.job_dir, ok, when, trial.epochs, trial.status == records.STOPPED)
