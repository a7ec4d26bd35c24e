"""A sweep's trials and their records: the grid of ``--vary`` values, each trial's name and job
dir, ``SWEEP/sweep.json`` and each trial's ``JOB/trial.json``, which trials a rerun skips, the
objective and the best trial. What runs the trials is ``tuner`` (Ray Tune, on the
driver) and ``trainable`` (on the nodes); the command is ``cifar10_estimator.sweep``.

- The trials are the cartesian product of the ``--vary`` values, the first ``--vary`` slowest.
  Each flag is the trainer's (``config.flags``), each value is parsed by that flag's own type,
  and each trial's whole command line passes the trainer's checks (``config.checks``), before
  anything runs: a mistake is one line naming the flag, the value or the trial.
- A trial is named ``trial-NNN-<short>``: its number, in the order trials first joined the
  sweep dir (``sweep.json`` keeps them), and its settings shortened (``lr0.05_nl8``). Its job
  dir is ``SWEEP/<name>``.
- A trial is finished when its ``JOB/trial.json`` says so for the same settings and trainer
  flags: a rerun reads its figures from there and starts nothing for it. New grid points are new
  trials; trials of points no longer in the grid stay listed (``in_grid`` false), never run
  nor ranked. Trainer flags that differ from the recorded ones are refused unless the command
  is told to take them (then every trial runs again, each trainer resuming its job dir).
- ``sweep.json`` lists every trial (settings, status, value, figures, job dir, export, error),
  the best and the counts; it is written atomically at the start, as each trial starts and
  ends, and at the end, so an interrupted sweep leaves it current.

Every path goes through ``storage`` (a local folder, a shared one, or a bucket). No Ray here;
TensorFlow only where a finished trial's export is looked up (``serving.client``), on the
driver, which loads it for TensorBoard's HParams summaries anyway (``hparams``).
"""

import argparse
import contextlib
import dataclasses
import datetime
import difflib
import itertools
import json
import math
import re
import time
import typing
import uuid
from typing import Any, Optional, Sequence, TextIO

from cifar10_estimator import storage
from cifar10_estimator.config import checks, flags
from cifar10_estimator.config.settings import EXPORT_SUBDIR, TYPES
from cifar10_estimator.errors import UserError

RECORD_FILE = "sweep.json"
TRIAL_RECORD_FILE = "trial.json"
TRIAL_LOG_FILE = "trial.log"
RECORD_VERSION = 1
PENDING, RUNNING, FINISHED, FAILED, INTERRUPTED, STOPPED = (
    "pending", "running", "finished", "failed", "interrupted", "stopped")
# The trials that ended and that a rerun keeps: finished, or stopped early by the scheduler
# (their job dirs hold the checkpoint they stopped at).
ENDED = (FINISHED, STOPPED)
# The final evaluation's scalars and which way is better (model/metrics.py: accuracy,
# cross_entropy and each class's per_class_accuracy/<name>; Estimator adds loss).
OBJECTIVES = {"accuracy": "max", "cross_entropy": "min", "loss": "min"}
PER_CLASS_PREFIX = "per_class_accuracy/"
# Flags a sweep sets itself, or that trials must not share.
OWN_FLAGS = {
    "job-dir": "each trial has its own --job-dir, SWEEP/trial-NNN-...",
    "export-dir": "each trial exports into its own job dir (JOB/export); trials sharing an "
                  "--export-dir would mix their versions",
}
# Flags whose values are paths: a relative one is made absolute where the sweep starts, since
# a trial's trainer runs elsewhere (a Ray node, a trial's own folder).
PATH_FLAGS = ("data-dir",)
# What a flag of a plain type expects, for an error (argparse's own words name Python's types).
_KINDS = {int: "a whole number", float: "a number"}
# The longest short name of a trial's settings (the folder name stays readable).
MAX_SHORT_NAME = 48


def default_mode(metric: str) -> str:
    """``max`` or ``min`` for a scalar of the final evaluation; UserError for another name."""
    if metric in OBJECTIVES:
        return OBJECTIVES[metric]
    if metric.startswith(PER_CLASS_PREFIX) and len(metric) > len(PER_CLASS_PREFIX):
        return "max"
    close = difflib.get_close_matches(metric, list(OBJECTIVES), n=1)
    raise UserError(f"--metric {metric}: the final evaluation's scalars are "
                    f"{', '.join(OBJECTIVES)} and {PER_CLASS_PREFIX}<class>"
                    + (f"; did you mean {close[0]}?" if close else ""))


# --- the grid ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Varied:
    """One ``--vary FLAG=V1,V2``: the trainer's flag (without dashes) and its values, as the
    trainer will get them (``canonical``) and parsed (``typed``, for TensorBoard)."""
    flag: str
    values: tuple[str, ...]
    typed: tuple[Any, ...]


def _actions(parser) -> dict[str, Any]:
    return {o[2:]: a for a in parser._actions for o in a.option_strings
            if o.startswith("--") and a.dest not in ("help", "version")}


def _is_list(dest: str) -> bool:
    """Whether the setting takes comma-separated values (a tuple)."""
    hint = TYPES.get(dest)
    return typing.get_origin(hint) is tuple


def canonical(value: Any) -> str:
    """A parsed value as the trainer's flag takes it, the same however it was typed (``0.10``
    and ``.1`` are ``0.1``; floats keep every digit)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return ",".join(canonical(v) for v in value)
    return str(value)


def parse_vary(specs: Sequence[str], cwd: str) -> list[Varied]:
    """``--vary FLAG=V1,V2`` (a list flag's values separated by ``;``), each checked against
    the trainer's flag; relative paths made absolute from ``cwd``. One-line UserErrors."""
    actions = _actions(flags.build_parser())
    varied: list[Varied] = []
    for spec in specs:
        name, equals, text = spec.partition("=")
        name = name.strip().removeprefix("--")
        if not equals or not name:
            raise UserError(f"--vary {spec}: give a trainer flag and its values, e.g. "
                            f"--vary learning-rate=0.05,0.1")
        if name in OWN_FLAGS:
            raise UserError(f"--vary {spec}: {OWN_FLAGS[name]}; vary another flag")
        action = actions.get(name)
        if action is None or name == "verbose":
            close = difflib.get_close_matches(name, list(actions), n=1)
            raise UserError(f"--vary {spec}: the trainer has no flag --{name}"
                            + (f" (did you mean --{close[0]}?)" if close else ""))
        if any(v.flag == name for v in varied):
            raise UserError(f"--vary {name} is given twice; give all its values in one "
                            f"--vary {name}=A,B,...")
        separator = ";" if _is_list(action.dest) else ","
        texts = [t.strip() for t in text.split(separator)]
        if not text.strip() or any(not t for t in texts):
            raise UserError(f"--vary {spec}: an empty value; separate the values of --{name} "
                            f"with '{separator}'")
        typed = []
        for t in texts:
            try:
                value = action.type(t) if action.type else t
            except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
                wanted = _KINDS.get(action.type, str(e))
                raise UserError(f"--vary {spec}: {t!r} is not a value of --{name} "
                                f"({wanted})") from None
            if action.choices and value not in action.choices:
                raise UserError(f"--vary {spec}: --{name} takes "
                                f"{', '.join(map(str, action.choices))}, not {t!r}")
            if name in PATH_FLAGS:
                value = absolute(value, cwd)
            typed.append(value)
        values = tuple(canonical(v) for v in typed)
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise UserError(f"--vary {spec}: {', '.join(twice)} given more than once (as the "
                            f"trainer reads them); give each value once")
        varied.append(Varied(name, values, tuple(typed)))
    return varied


def grid(varied: Sequence[Varied]) -> list[dict[str, str]]:
    """The trials' settings (flag -> value), the cartesian product, the first flag slowest."""
    return [dict(zip([v.flag for v in varied], point))
            for point in itertools.product(*(v.values for v in varied))]


def typed_settings(varied: Sequence[Varied], settings: dict[str, str]) -> dict[str, Any]:
    """A trial's settings as parsed values (TensorBoard's HParams want numbers as numbers)."""
    typed, actions = {}, None
    for v in varied:
        text = settings[v.flag]
        if text in v.values:
            value = v.typed[v.values.index(text)]
        else:  # drawn as the sweep runs (--search tpe): parsed by the trainer's flag
            actions = actions or _actions(flags.build_parser())
            action = actions[v.flag]
            value = action.type(text) if action.type else text
        typed[v.flag] = canonical(value) if isinstance(value, tuple) else value
    return typed


def absolute(path: str, cwd: str) -> str:
    """A relative local path made absolute from ``cwd``; URLs and absolute paths as they are."""
    if not path or storage.is_url(path) or path.startswith("/"):
        return path
    return storage.join(cwd, path)


def absolute_paths(trainer_flags: Sequence[str], cwd: str) -> list[str]:
    """The trainer's flags with each ``PATH_FLAGS`` value absolute (``absolute``)."""
    out = list(trainer_flags)
    for i, token in enumerate(out):
        for name in PATH_FLAGS:
            if token == f"--{name}" and i + 1 < len(out):
                out[i + 1] = absolute(out[i + 1], cwd)
            elif token.startswith(f"--{name}="):
                out[i] = f"--{name}={absolute(token.split('=', 1)[1], cwd)}"
    return out


def trainer_argv(trainer_flags: Sequence[str], settings: dict[str, str], job_dir: str
                 ) -> list[str]:
    """A trial's trainer command line: the sweep's flags, its settings (which win), its job
    dir."""
    return [*trainer_flags, *(f"--{k}={v}" for k, v in settings.items()), "--job-dir", job_dir]


def check_trials(trainer_flags: Sequence[str], points: Sequence[dict[str, str]]) -> None:
    """Every trial's command line through the trainer's own checks, as the trainer will run
    them before TensorFlow loads; the first refusal as one line naming the trial's settings."""
    for settings in points:
        argv = trainer_argv(trainer_flags, settings, "JOB")
        try:
            checks.validate(flags.parse(argv)[0])
        except UserError as e:
            raise UserError(f"the trial {shown_settings(settings)}: {e}") from None


def shown_settings(settings: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items())


# --- names ---------------------------------------------------------------------------------


def _abbreviations(flags_: Sequence[str]) -> dict[str, str]:
    """Each flag's initials (``learning-rate`` -> ``lr``), or its name where two flags share
    them."""
    initials = {f: "".join(word[0] for word in f.split("-") if word) for f in flags_}
    return {f: a if list(initials.values()).count(a) == 1 else f.replace("-", "")
            for f, a in initials.items()}


def short_name(settings: dict[str, str]) -> str:
    """A trial's settings in a folder name: ``lr0.05_nl8`` (at most ``MAX_SHORT_NAME``
    characters of letters, digits, ``.``, ``+``, ``-`` and ``_``)."""
    names = _abbreviations(list(settings))
    # A path by its last part; a whole float without its ".0" (82.0,123.0 -> 82,123).
    text = "_".join(names[k] + (storage.basename(v) if k in PATH_FLAGS
                                else re.sub(r"\.0(?=\D|$)", "", v))
                    for k, v in settings.items())
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_.")[:MAX_SHORT_NAME] or "trial"


def trial_name(number: int, settings: dict[str, str]) -> str:
    return f"trial-{number:03d}-{short_name(settings)}"


# --- records -------------------------------------------------------------------------------


@dataclasses.dataclass
class Trial:
    """One trial of the sweep, as ``sweep.json`` lists it."""
    name: str
    settings: dict[str, str]
    job_dir: str
    status: str = PENDING
    value: Optional[float] = None
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    export: Optional[str] = None
    error: Optional[str] = None
    exit_status: Optional[int] = None
    secs: Optional[float] = None
    in_grid: bool = True
    # Each evaluation the trial reported, in order: epoch, global_step and its scalars.
    reports: list = dataclasses.field(default_factory=list)
    # Failed with its Ray worker lost, in this run of the sweep (not recorded: a rerun runs
    # every failed trial again).
    lost: bool = False

    @property
    def epochs(self) -> Optional[float]:
        """The epochs it trained, as its last report says."""
        return self.reports[-1].get("epoch") if self.reports else None

    @property
    def number(self) -> int:
        return int(self.name.split("-")[1])

    @property
    def log(self) -> str:
        return storage.join(self.job_dir, TRIAL_LOG_FILE)


def _key(settings: dict[str, str]) -> tuple:
    return tuple(sorted(settings.items()))


def read_json(path: str) -> Optional[dict]:
    """The JSON object at ``path``, or None where there is none; UserError (one line) for
    one that cannot be read or is damaged."""
    try:
        if not storage.exists(path):
            return None
        content = storage.read_json(path)
        if not isinstance(content, dict):
            raise ValueError(f"a JSON {type(content).__name__}, not an object")
    except (OSError, ValueError) as e:
        why = storage.reason(e)[:200]
        raise UserError(f"{path} cannot be read ({why}); delete it if it is damaged (the "
                        f"trials' job dirs keep their own records) or use a new "
                        f"--sweep-dir") from None
    return content


def write_json(path: str, content: dict) -> None:
    storage.write_bytes_atomic(path, (json.dumps(content, indent=1) + "\n").encode())


def trainer_flags_changed(recorded: Sequence[str], now: Sequence[str]) -> list[str]:
    """What differs between two trainer command lines, flag by flag: ``--train-steps 4 (now
    8)``, as the trainer parses them."""
    parser = flags.build_parser(defaults=False)
    before, after = (vars(parser.parse_args(list(a))) for a in (recorded, now))
    changed = []
    for dest in sorted(set(before) | set(after)):
        if before.get(dest) != after.get(dest):
            changed.append(f"--{dest.replace('_', '-')} "
                           f"{_shown(before.get(dest))} (now {_shown(after.get(dest))})")
    return changed


def _shown(value) -> str:
    return "unset" if value is None else canonical(value)


def assign(points: Sequence[dict[str, str]], recorded: Optional[dict], sweep_dir: str
           ) -> list[Trial]:
    """The trials of ``points`` (in grid order) and the recorded ones no longer in the grid:
    a recorded point keeps its name, a new one takes the next number."""
    known = {}
    for entry in (recorded or {}).get("trials", ()):
        try:
            known[_key(entry["settings"])] = entry["name"]
        except (KeyError, TypeError, AttributeError):
            raise UserError(f"{storage.join(sweep_dir, RECORD_FILE)} is damaged (a trial "
                            f"without its name or settings); delete it or use a new "
                            f"--sweep-dir") from None
    numbers = [int(n.split("-")[1]) for n in known.values() if re.match(r"trial-\d+-", n)]
    next_number = max(numbers, default=0) + 1
    trials = []
    for settings in points:
        name = known.pop(_key(settings), None)
        if name is None:
            name = trial_name(next_number, settings)
            next_number += 1
        trials.append(Trial(name, dict(settings), storage.join(sweep_dir, name)))
    for key, name in known.items():  # earlier grids' points
        trials.append(Trial(name, dict(key), storage.join(sweep_dir, name), in_grid=False))
    return trials


def trial_record(trial: Trial, trainer_flags: Sequence[str], started: Optional[float]) -> dict:
    """``JOB/trial.json``: the trial's settings, the sweep's trainer flags it ran with, its
    command line, status, figures, export or error."""
    return {"name": trial.name, "settings": trial.settings, "status": trial.status,
            "metrics": trial.metrics, "export": trial.export, "error": trial.error,
            "exit_status": trial.exit_status, "secs": trial.secs, "reports": trial.reports,
            "trainer_flags": list(trainer_flags),
            "trainer_argv": trainer_argv(trainer_flags, trial.settings, trial.job_dir),
            "started": _iso(started), "ended": _iso(now())}


def read_back(trial: Trial, trainer_flags: Sequence[str]) -> bool:
    """Takes a trial's result from its ``JOB/trial.json`` if it finished with these settings
    and trainer flags; whether it did. A trial no longer in the grid shows what its record
    says."""
    record = read_json(storage.join(trial.job_dir, TRIAL_RECORD_FILE))
    if not record or record.get("settings") != trial.settings:
        return False
    same_flags = record.get("trainer_flags") == list(trainer_flags)
    if record.get("status") in ENDED and (same_flags or not trial.in_grid):
        trial.status = record["status"]
        trial.metrics = {k: float(v) for k, v in (record.get("metrics") or {}).items()}
        trial.export, trial.secs = record.get("export"), record.get("secs")
        trial.reports = _reports(record.get("reports"))
        return True
    if not trial.in_grid:
        trial.status, trial.error = str(record.get("status", PENDING)), record.get("error")
    return False


def _reports(found: Any) -> list[dict]:
    """A record's reports as numbers, in order; what is not a report is left out."""
    reports = []
    for entry in found if isinstance(found, list) else ():
        if isinstance(entry, dict):
            try:
                reports.append({str(k): float(v) for k, v in entry.items()})
            except (TypeError, ValueError):
                continue
    return reports


def restore_reports(trials: Sequence[Trial], recorded: Optional[dict]) -> None:
    """The reports ``sweep.json`` holds for trials that had not ended (a sweep whose driver
    was killed): a resumed trial's scheduler sees them again."""
    entries = {e.get("name"): e for e in (recorded or {}).get("trials", ())
               if isinstance(e, dict)}
    for trial in trials:
        if not trial.reports and trial.name in entries:
            trial.reports = _reports(entries[trial.name].get("reports"))


def now() -> float:
    return time.time()


def _iso(stamp: Optional[float]) -> Optional[str]:
    if stamp is None:
        return None
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).isoformat(
        timespec="seconds")


def value_of(trial: Trial, metric: str) -> Optional[float]:
    value = trial.metrics.get(metric)
    return None if value is None or math.isnan(value) else value


def best(trials: Sequence[Trial], metric: str, mode: str) -> Optional[Trial]:
    """The grid's finished trial with the best value (the lowest number among equals)."""
    ranked = [t for t in trials if t.in_grid and t.status == FINISHED
              and value_of(t, metric) is not None]
    if not ranked:
        return None
    sign = -1 if mode == "max" else 1
    return min(ranked, key=lambda t: (sign * value_of(t, metric), t.number))


# --- the sweep as it runs ------------------------------------------------------------------


class Sweep:
    """The sweep's state on the driver: its trials, ``sweep.json`` kept current, one line per
    event to ``out``. ``listener`` is told as trials start and end (TensorBoard's HParams
    session summaries: ``hparams.SessionWriter``)."""

    def __init__(self, sweep_dir: str, run_id: str, trainer_flags: Sequence[str],
                 varied: Sequence[Varied], trials: list[Trial], metric: str, mode: str,
                 out: TextIO, listener: Optional["TrialListener"] = None):
        self.sweep_dir, self.run_id = sweep_dir, run_id
        self.trainer_flags, self.varied = list(trainer_flags), list(varied)
        self.trials = {t.name: t for t in trials}
        self.metric, self.mode, self.out = metric, mode, out
        self.listener = listener or TrialListener()
        self._started: dict[str, float] = {}
        self.write_error: Optional[UserError] = None  # the write that ended the sweep

    @property
    def record_path(self) -> str:
        return storage.join(self.sweep_dir, RECORD_FILE)

    def argv(self, trial: Trial) -> list[str]:
        return trainer_argv(self.trainer_flags, trial.settings, trial.job_dir)

    def pending(self) -> list[Trial]:
        return [t for t in self.trials.values() if t.in_grid and t.status not in ENDED]

    def add(self, settings: dict[str, str]) -> Trial:
        """The trial of ``settings``: the one the sweep has, or a new one numbered after the
        last (a trial a searcher draws as the sweep runs, ``--search tpe``)."""
        for trial in self.trials.values():
            if trial.settings == settings:
                return trial
        number = max((t.number for t in self.trials.values()), default=0) + 1
        name = trial_name(number, settings)
        trial = Trial(name, dict(settings), storage.join(self.sweep_dir, name))
        self.trials[name] = trial
        return trial

    def say(self, line: str) -> None:
        print(f"sweep: {line}", file=self.out, flush=True)

    def started(self, name: str, where: str = "") -> None:
        trial = self.trials[name]
        trial.status, trial.error, trial.exit_status, trial.lost = RUNNING, None, None, False
        self._started[name] = now()
        with self.writing():
            self.listener.started(trial, self._started[name])
        self.say(f"{name} started{f' on {where}' if where else ''} "
                 f"({shown_settings(trial.settings)})")
        self.save()

    def finished(self, name: str, metrics: dict[str, float], log: Optional[str] = None
                 ) -> None:
        """A trial that ended well: its figures; ``log``, its trainer's output to write into
        a bucket's job dir (a trial writes a local one itself, as it comes)."""
        trial = self.trials[name]
        self._write_log(trial, log)
        trial.status, trial.metrics = FINISHED, dict(metrics)
        trial.secs = self._secs(name)
        trial.export = find_export(trial.job_dir)
        self._end(trial, True)
        value = value_of(trial, self.metric)
        shown = (f"{self.metric} {value:.4g}" if value is not None
                 else f"no {self.metric} reported")
        self.say(f"{name} finished in {trial.secs:.0f} s: {shown}")

    def reported(self, name: str, report: dict) -> None:
        """An evaluation of a running trial, as it came (an earlier one again is ignored)."""
        trial = self.trials[name]
        step = report.get("global_step", 0)
        if trial.reports and step <= trial.reports[-1].get("global_step", 0):
            return
        trial.reports.append(dict(report))
        self.save()  # before the line: a reader of the line finds the record holding it
        value = report.get(self.metric)
        self.say(f"{name} epoch {report.get('epoch', 0):.3g}: "
                 + (f"{self.metric} {value:.4g}" if value is not None else f"step {step:g}"))

    def stopped(self, name: str, log: Optional[str] = None) -> None:
        """A trial the scheduler stopped early: its last report's figures; its trainer saves
        and exits (its job dir resumable)."""
        trial = self.trials[name]
        self._write_log(trial, log)
        last = trial.reports[-1] if trial.reports else {}
        trial.status = STOPPED
        trial.metrics = {k: v for k, v in last.items() if k not in ("global_step", "epoch")}
        trial.secs = self._secs(name)
        self._end(trial, True)
        value = value_of(trial, self.metric)
        self.say(f"{name} stopped early at epoch {trial.epochs or 0:.3g} after "
                 f"{trial.secs:.0f} s: "
                 + (f"{self.metric} {value:.4g}" if value is not None else "no evaluation"))

    def failed(self, name: str, error: str, exit_status: Optional[int],
               log: Optional[str] = None, lost: bool = False) -> None:
        """The trial failed: its trainer's ``error`` line, or Ray's when the trial was ``lost``
        with its Ray worker (its node died), which the sweep may run again (``lost``)."""
        trial = self.trials[name]
        self._write_log(trial, log)
        trial.status, trial.error, trial.exit_status = FAILED, error, exit_status
        trial.lost = lost
        trial.secs = self._secs(name)
        self._end(trial, False)
        status = f" (exit status {exit_status})" if exit_status is not None else ""
        how = "was lost with its Ray worker (its node gone?)" if lost else f"failed{status}"
        self.say(f"{name} {how} after {trial.secs:.0f} s: {error}; its log: {trial.log}")

    def lost(self) -> list[Trial]:
        """The trials that failed because their Ray worker was lost, in order."""
        return [t for t in self.trials.values() if t.status == FAILED and t.lost]

    def interrupted(self) -> None:
        """Trials still running when the sweep stopped: shown as interrupted."""
        for trial in self.trials.values():
            if trial.status == RUNNING:
                trial.status = INTERRUPTED
        self.save()

    @contextlib.contextmanager
    def writing(self):
        """The sweep's writes into the sweep dir: one that fails (a full disk, a bucket gone)
        ends the sweep with one line, kept in ``write_error`` (Ray Tune wraps what its
        callbacks raise in an error of its own, which the command unwraps by it)."""
        try:
            yield
        except OSError as e:
            why = storage.write_failure(self.sweep_dir) or storage.reason(e)
            fix = (storage.NO_ROOM_FIX if storage.no_room(why)
                   else storage.fix_for(self.sweep_dir, "--sweep-dir"))
            self.write_error = UserError(f"cannot write the sweep's records in --sweep-dir "
                                         f"{self.sweep_dir} ({why}); {fix}")
            raise self.write_error from None

    def _write_log(self, trial: Trial, log: Optional[str]) -> None:
        if log is not None:
            with self.writing():
                storage.makedirs(trial.job_dir)
                storage.write_bytes_atomic(trial.log, log.encode())

    def _secs(self, name: str) -> float:
        return now() - self._started.get(name, now())

    def _end(self, trial: Trial, ok: bool) -> None:
        with self.writing():
            storage.makedirs(trial.job_dir)  # a trial may fail before its trainer makes it
            write_json(storage.join(trial.job_dir, TRIAL_RECORD_FILE),
                       trial_record(trial, self.trainer_flags, self._started.get(trial.name)))
            self.listener.ended(trial, ok, now())
        self.save()

    def content(self) -> dict:
        top = best(self.trials.values(), self.metric, self.mode)
        grid_trials = [t for t in self.trials.values() if t.in_grid]
        counts = {s: sum(t.status == s for t in grid_trials)
                  for s in (FINISHED, STOPPED, FAILED, RUNNING, PENDING, INTERRUPTED)}
        return {
            "version": RECORD_VERSION, "run_id": self.run_id, "updated": _iso(now()),
            "trainer_flags": self.trainer_flags,
            "vary": {v.flag: list(v.values) for v in self.varied},
            "metric": self.metric, "mode": self.mode,
            "best": top.name if top else None, "counts": counts,
            "trials": [{"name": t.name, "settings": t.settings, "status": t.status,
                        "value": value_of(t, self.metric), "metrics": t.metrics,
                        "job_dir": t.job_dir, "export": t.export, "error": t.error,
                        "exit_status": t.exit_status, "secs": t.secs, "in_grid": t.in_grid,
                        "epochs": t.epochs, "reports": t.reports}
                       for t in sorted(self.trials.values(), key=lambda t: t.number)],
        }

    def save(self) -> None:
        with self.writing():
            write_json(self.record_path, self.content())

    def summary(self) -> list[str]:
        """The closing lines: counts, the best trial, the failed ones."""
        grid_trials = [t for t in self.trials.values() if t.in_grid]
        done = [t for t in grid_trials if t.status == FINISHED]
        stopped = [t for t in grid_trials if t.status == STOPPED]
        failed = [t for t in grid_trials if t.status == FAILED]
        lines = [f"{len(done)} of {len(grid_trials)} trials finished, "
                 + (f"{len(stopped)} stopped early, " if stopped else "")
                 + f"{len(failed)} failed; the record: {self.record_path}"]
        top = best(grid_trials, self.metric, self.mode)
        if top is not None:
            lines.append(f"best: {top.name} ({shown_settings(top.settings)}): {self.metric} "
                         f"{value_of(top, self.metric):.4g} ({self.mode}); job dir "
                         f"{top.job_dir}; export {top.export or 'none'}")
        return lines

    def failures(self) -> Optional[str]:
        """One line naming the failed trials, or None."""
        failed = [t for t in self.trials.values() if t.in_grid and t.status == FAILED]
        if not failed:
            return None
        several = len(failed) > 1
        return (f"{len(failed)} trial{'s' if several else ''} failed: "
                f"{', '.join(t.name for t in failed)} ({'the first: ' if several else ''}"
                f"{failed[0].error}); {'their lines' if several else 'its line'} above and "
                f"JOB/{TRIAL_LOG_FILE} say why; rerun the same command to run "
                f"{'them' if several else 'it'} again")

    def missing_metric(self) -> Optional[str]:
        """One line if trials finished but none reported ``--metric``, else None."""
        done = [t for t in self.trials.values() if t.in_grid and t.status in ENDED]
        if not done or any(value_of(t, self.metric) is not None for t in done):
            return None
        return (f"--metric {self.metric}: no trial's final evaluation has it (theirs: "
                f"{', '.join(sorted(done[0].metrics))}); rerun with one of those: nothing is "
                f"trained again")


class TrialListener:
    """Told as a trial starts and ends, beside the records: does nothing, here."""

    def started(self, trial: Trial, when: float) -> None:
        pass

    def ended(self, trial: Trial, ok: bool, when: float) -> None:
        pass


def find_export(job_dir: str) -> Optional[str]:
    """A finished trial's export (``JOB/export/<version>``), or None."""
    from cifar10_estimator.serving import client  # TensorFlow loads

    try:
        return client.newest_export(storage.join(job_dir, EXPORT_SUBDIR))
    except UserError:
        return None


def new_run_id() -> str:
    """This run's id in ``sweep.json``: a trial checks it sees that very file (a shared
    sweep dir)."""
    return uuid.uuid4().hex
