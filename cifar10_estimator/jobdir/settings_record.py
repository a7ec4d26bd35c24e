"""The job dir remembers its settings: ``JOB/settings.json``, and reruns checked against it.

At a job's first start the chief (or a local run) writes the settings that define the run, the
way TF Model Garden keeps a ``params.yaml`` beside its checkpoints: the model, the optimisation
and its schedule, the batch size, the precision, augmentation and the data set. A rerun, a
worker or an evaluator whose settings differ would silently train or evaluate something else
on the same checkpoints, so it is refused with one line that names every differing flag with
its recorded and its new value. ``--train-steps`` is not part of the record: raising it is how
a finished run trains longer, except under a schedule that follows the run's length
(``settings.LENGTH_SHAPED_SCHEDULES``), whose length is recorded: a longer run would change
its learning rate mid-run. A deliberate change is made with ``--change-settings`` on the
chief, which records the new values (and logs what changed).

A record written before a setting existed lacks it. That older version trained with the
setting's own default (``config/settings.py``): a setting is added with a default that keeps
what the package did before, and a model's or recipe's overlay of it (``config/overlays``)
cannot be older than the setting itself. So a missing setting is read as that default (one log
line says so), and a rerun that changes it is refused like any recorded setting. (A setting
that existed unrecorded, under an overlay, and became recorded later would need its own rule
here: none has.)

Two settings are recorded as the plan resolved them: ``--precision`` (``auto`` is a request;
a rerun that asks for it again takes the recorded choice) and ``--low-res-fraction`` (a
recipe's share follows the training file's size: a rerun on a file of another size that
would resolve it otherwise is refused like a changed flag).

The file is JSON with one flag per line, for people as much as for the package.
"""

import json
import logging
import math
import os
import typing
from typing import Any, Mapping, Optional

from cifar10_estimator import __version__, storage
from cifar10_estimator.errors import UserError
from cifar10_estimator.config.fields import AT_LEAST_1, flag, shown
from cifar10_estimator.config.plan import Plan
from cifar10_estimator.config.settings import FIELDS, RUN_FIELDS, TYPES

log = logging.getLogger("cifar10_estimator")

RECORD_FILE = "settings.json"
# Facts of the data set, from its metadata (they are not flags: --data-dir decides them).
DATA_FIELDS = ("dataset", "num_classes")
# The global steps a schedule whose shape depends on the run's length spans
# (``settings.LENGTH_SHAPED_SCHEDULES``): a resumed run with another length would change its
# learning rate mid-run.
SCHEDULE_STEPS = "schedule_steps"
_LABELS = {"dataset": "the data set's dataset", "num_classes": "the data set's num_classes",
           SCHEDULE_STEPS: "the steps the learning-rate schedule spans (from --train-steps or "
                           "--train-epochs)"}


def of_plan(plan: Plan, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The values that define ``plan``'s run, as the record keeps them; ``settings`` are the
    job's, by name (``Settings.flat``)."""
    return run_settings(settings, plan.dataset, plan.num_classes, plan.schedule_spans,
                        precision=plan.precision, low_res_fraction=plan.low_res_fraction)


def run_settings(settings: Mapping[str, Any], dataset: str, num_classes: int,
                 schedule_steps: Optional[int] = None, *,
                 precision: Optional[str] = None,
                 low_res_fraction: Optional[float] = None) -> dict[str, Any]:
    """The values that define the run, as JSON values: ``precision`` the one the job computes
    in (else the settings', when that is not "auto"), ``low_res_fraction`` the share the plan
    resolved (else the settings', when a recipe's does not follow the data's size);
    ``schedule_steps`` for a schedule whose shape depends on the run's length. ``settings``:
    every setting by name (``Settings.flat``)."""
    values: dict[str, Any] = {name: settings[name] for name in RUN_FIELDS}
    if precision is not None:
        values["precision"] = precision
    if low_res_fraction is not None:
        values["low_res_fraction"] = low_res_fraction
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    values.update(dataset=dataset, num_classes=num_classes)
    if schedule_steps is not None:
        values[SCHEDULE_STEPS] = schedule_steps
    return values


def read(job_dir: str) -> Optional[dict]:
    """The recorded settings of ``job_dir``, or None if there are none yet; a setting the
    record predates at its default (``with_defaults``)."""
    recorded = _read_written(job_dir)
    return None if recorded is None else with_defaults(recorded)[0]


def with_defaults(recorded: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``recorded`` with every recorded setting it lacks (it was written before the setting
    existed) at the setting's own default, the value that older version trained with; and the
    names of those settings."""
    missing = [name for name in RUN_FIELDS if name not in recorded]
    filled = dict(recorded)
    for name in missing:
        default = _FIELDS[name].default
        filled[name] = list(default) if isinstance(default, tuple) else default
    return filled, missing


def _read_written(job_dir: str) -> Optional[dict]:
    """The settings as the file holds them, or None if there is no file yet."""
    path = storage.join(job_dir, RECORD_FILE)
    try:
        body = storage.read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UserError(f"{path} cannot be read ({type(e).__name__}: "
                        f"{' '.join(str(e).split())[:200]}); restore it, or delete it to "
                        f"record this run's settings anew") from None
    settings = body.get("settings") if isinstance(body, dict) else None
    if not isinstance(settings, dict):
        raise UserError(f"{path} is not a settings record of this package; delete it to "
                        f"record this run's settings anew")
    for name, value in settings.items():
        problem = _problem(name, value)
        if problem:
            raise UserError(f"{path} records {name[:60]!r} as {_kind(value)}, not {problem}; "
                            f"restore it, or delete it to record this run's settings anew")
    return settings


_FIELDS = {f.name: f for f in FIELDS}
_SCALARS = (str, int, float, bool, type(None))


def _problem(name: str, value: Any) -> Optional[str]:
    """What a recorded value should be, if ``value`` is not what this package records for
    ``name`` (readers use the values as they are: ``evaluate`` builds the network from them).
    A setting this version does not know (a newer version's) is a scalar or a list of them."""
    if name in DATA_FIELDS or name == SCHEDULE_STEPS:
        tp = str if name == "dataset" else int
        check = None if name == "dataset" else AT_LEAST_1
    elif name in RUN_FIELDS:
        tp, check = TYPES[name], _FIELDS[name].metadata.get("check")
        if typing.get_origin(tp) is typing.Union:  # None is a request the plan resolves
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
    else:
        items = value if isinstance(value, list) else [value]
        return None if all(isinstance(v, _SCALARS) for v in items) else "a value or a list"
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        if not isinstance(value, list) or any(_problem_of_type(item, v) for v in value):
            return f"a list of {item.__name__} values"
        return None
    wrong = _problem_of_type(tp, value)
    if wrong:
        return wrong
    choices = _FIELDS[name].metadata.get("choices") if name in _FIELDS else None
    if choices and value not in choices:
        return f"one of {', '.join(map(str, choices))}"
    if check and check.problem(name, value):
        return check.wording
    return None


def _problem_of_type(tp, value: Any) -> Optional[str]:
    if tp is float:
        try:  # an int past float's range (JSON has no bound) overflows: not a finite number
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isfinite(value))
        except OverflowError:
            ok = False
        return None if ok else "a finite number"
    if tp is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else \
            "a whole number"
    if tp is bool:
        return None if isinstance(value, bool) else "true or false"
    return None if isinstance(value, str) else "a string"


def _kind(value: Any) -> str:
    """A recorded value for a one-line message: a scalar as written, else its JSON type."""
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "an object"
    return json.dumps(value)[:60]


def write(job_dir: str, settings: Mapping[str, Any]) -> str:
    """Records ``settings`` in ``job_dir`` (atomically); returns the file's path."""
    path = os.path.join(job_dir, RECORD_FILE)
    body = {"written_by": f"cifar10_estimator {__version__}", "settings": dict(settings)}
    text = json.dumps(body, indent=2, sort_keys=True) + "\n"
    storage.write_bytes_atomic(path, text.encode())
    return path


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``--flag OLD (now NEW)`` for every recorded setting the current run changes."""
    changed = []
    for name, old in sorted(recorded.items()):
        if name in current and current[name] != old:
            label = flag(name) if name in RUN_FIELDS else _LABELS.get(name, name)
            changed.append(f"{label} {shown(old)} (now {shown(current[name])})")
    return changed


def check(job_dir: str, current: Mapping[str, Any], *, is_chief: bool,
          change: bool = False) -> None:
    """Checks the run against the job dir's record; the chief writes it if there is none.

    Args:
      job_dir: the job dir.
      current: ``run_settings`` of this task.
      is_chief: the chief (or a local run) records; other tasks only compare.
      change: ``--change-settings``: the chief records the current values instead of
        refusing them.

    Raises:
      UserError: the settings differ (one line naming each flag), or the record is unreadable.
    """
    written = _read_written(job_dir)
    path = os.path.join(job_dir, RECORD_FILE)
    if written is None:
        if is_chief:
            write(job_dir, current)
            log.info("recorded this run's settings in %s", path)
        return
    recorded, predates = with_defaults(written)
    for name in predates:
        log.info("%s was written before %s existed: taking its default, %s", RECORD_FILE,
                 flag(name), shown(recorded[name]))
    changed = differences(recorded, current)
    if not changed:
        # A setting this version records and an older one did not: recorded now (a setting
        # the record predates, at the default it was read as).
        missing = {k: v for k, v in current.items() if k not in recorded}
        if (missing or predates) and is_chief:
            write(job_dir, {**recorded, **missing})
        return
    if change and is_chief:
        write(job_dir, {**recorded, **current})
        log.info("--change-settings: recorded the new settings in %s: %s", path,
                 "; ".join(changed))
        return
    how = ("rerun with the recorded values, use a new --job-dir, or add --change-settings to "
           "change them on purpose" if is_chief else
           "start this task with the same flags as the chief")
    raise UserError(f"--job-dir {job_dir} was trained with other settings ({RECORD_FILE}): "
                    f"{'; '.join(changed)}; {how}")
