"""Keeping a job's state safe: job-dir checks before training, clear errors during it.

Before anything is written, ``check_job_dir`` makes sure the job dir can be written and that any
checkpoints in it belong to the network the flags describe (the model, a ResNet's depth and
block version, read from the checkpoint's variable names, so it also works on job dirs this
package did not write). ``training_errors`` turns the TensorFlow errors a user can cause or fix
into one-line ``UserError`` messages: a corrupt or truncated record file (named), a loss that
became NaN, a checkpoint that does not fit the model, a checkpoint that cannot be written (a
full disk or a quota, recognised by the operating system's own words for them). Interrupted
runs need little: TensorFlow writes each checkpoint's files and then atomically replaces the
``checkpoint`` index, so a kill at any moment leaves the previous checkpoint as the latest, and
a rerun resumes from it; the shards a save killed midway left are removed by the next holder
of the job dir's lock (``remove_unfinished_saves``).
"""

import contextlib
import os
from typing import Iterator

import tensorflow as tf

from cifar10_estimator import storage
from cifar10_estimator.data import metadata, schema
from cifar10_estimator.errors import UserError
from cifar10_estimator.model import networks
from cifar10_estimator.model.checkpoints import checkpoint_model, model_flags
from cifar10_estimator.model.model_settings import NAN_LOSS_MESSAGE
from cifar10_estimator.config.settings import ModelSection



def check_job_dir(job_dir: str, params: ModelSection,
                  num_classes: int = schema.NUM_CLASSES) -> None:
    """Creates ``job_dir`` if needed; UserError if it is unusable or holds another model."""
    storage.check_writable(job_dir, "--job-dir")
    latest = tf.train.latest_checkpoint(job_dir)
    if not latest:
        return
    try:
        found = checkpoint_model(latest)
    except (tf.errors.OpError, ValueError):
        raise UserError(f"the latest checkpoint in --job-dir {job_dir} ({latest}) cannot be "
                        f"read; delete it to resume from the one before, or use a new "
                        f"--job-dir") from None
    if found is None:
        raise UserError(f"--job-dir {job_dir} holds checkpoints of a different model "
                        f"({os.path.basename(latest)} has neither network's variables); use a "
                        f"new --job-dir")
    network, classes = found
    if networks.describe(network) != networks.describe(params):
        raise UserError(
            f"--job-dir {job_dir} holds checkpoints of {networks.describe(network)}, but the "
            f"flags ask for {networks.describe(params)}; resume with {model_flags(network)}, "
            f"or use a new --job-dir")
    if classes != num_classes:
        raise UserError(
            f"--job-dir {job_dir} holds checkpoints of a model with {classes} classes, but "
            f"the records in --data-dir have {num_classes}; use the --data-dir it was trained "
            f"on, or a new --job-dir")


@contextlib.contextmanager
def training_errors(data_dir: str, job_dir: str, holds_job_dir: bool = True) -> Iterator[None]:
    """Maps user-fixable TensorFlow errors raised inside the block to one-line UserErrors.
    ``holds_job_dir``: this task holds the job dir's lock (the chief, or a run alone), so a
    save that found no room is its own to clean up; another task's error must leave the
    chief's saves in the job dir alone (an all-reduce worker's removed the chief's save in
    progress, which then failed with a traceback: issue 76)."""
    try:
        yield
    except tf.errors.DataLossError as e:
        path = metadata.find_corrupt_record_file(data_dir) or f"a record file in {data_dir}"
        raise UserError(f"{path} is truncated or corrupt ({e.message.splitlines()[0]}); "
                        f"regenerate it with {schema.GENERATOR_COMMAND}") from None
    except (tf.errors.InvalidArgumentError, tf.compat.v1.train.NanLossDuringTrainingError) as e:
        message = getattr(e, "message", str(e))
        if NAN_LOSS_MESSAGE not in message and not isinstance(
                e, tf.compat.v1.train.NanLossDuringTrainingError):
            # A store gone during a save fails MergeV2Checkpoints with this error (a shard
            # NOT_FOUND), not a connection error: one line too, as for any other op's error.
            _raise_if_unreachable(job_dir)
            raise
        latest = tf.train.latest_checkpoint(job_dir)
        kept = f"the last good checkpoint, {latest}, is kept" if latest else "no checkpoint"
        raise UserError(f"training stopped: the loss became NaN or infinite; {kept}. Lower "
                        f"--learning-rate (or raise --weight-decay) and rerun") from None
    except tf.errors.OpError as e:
        reason = storage.no_room(e.message)
        if reason is None:
            _raise_if_unreachable(job_dir)
            raise
        raise UserError(_unwritable_checkpoint(job_dir, reason, clean=holds_job_dir)) from None
    except Exception as e:
        # TensorBoard's event writer re-raises its thread's failure as a plain Python error
        # (an IndexError for "File too large"), not as a TensorFlow one.
        reason = storage.no_room(str(e))
        if reason is None:
            _raise_if_unreachable(job_dir)
            raise
        raise UserError(_unwritable_checkpoint(job_dir, reason, "TensorBoard events",
                                               clean=holds_job_dir)) from None


def _raise_if_unreachable(job_dir: str) -> None:
    """UserError if ``job_dir`` is on object storage that does not answer now (a server gone,
    a network down): TensorFlow writes each checkpoint's index last, so the latest one in the
    store is whole, and the same command resumes from it once the store answers."""
    if not storage.is_url(job_dir):
        return
    failure = storage.write_failure(job_dir)
    if failure is None:
        return  # it answers: the error was something else
    raise UserError(f"--job-dir {job_dir} stopped answering ({failure}); every checkpoint the "
                    f"store holds is whole. Rerun the same command to resume from the latest "
                    f"once it answers again") from None


def remove_unfinished_saves(job_dir: str) -> None:
    """Removes what saves that never finished left in ``job_dir``: the ``<prefix>_temp`` shards
    of a trainer killed inside a save. Nothing refers to them (TensorFlow writes a
    checkpoint's index and the ``checkpoint`` file after its shards), and a later save of the
    same step left the folder behind, its own files merged out of it. Only the holder of the
    job dir's lock calls this, when no other trainer saves there."""
    for partial in tf.io.gfile.glob(os.path.join(job_dir, "*_temp")):
        try:
            tf.io.gfile.rmtree(partial)
        except tf.errors.NotFoundError:
            pass  # gone meanwhile: TensorFlow removes the folder of a save that ended


def _unwritable_checkpoint(job_dir: str, reason: str, what: str = "a checkpoint",
                           clean: bool = True) -> str:
    """Cleans up a failed save and says what is kept.

    TensorFlow writes a checkpoint's shards under ``<prefix>_temp`` and only then its index and
    the ``checkpoint`` file, so the previous checkpoint stays the latest; the partial shards
    are removed to give the space back (``clean``: by the job dir's lock holder only).
    """
    if clean:
        remove_unfinished_saves(job_dir)
    latest = tf.train.latest_checkpoint(job_dir)
    kept = (f"the latest checkpoint, {latest}, is kept" if latest
            else "no checkpoint was written yet")
    return (f"cannot write {what} in --job-dir {job_dir} ({reason}); {kept}. Free space "
            f"(or raise the quota) and rerun the same command to resume")
