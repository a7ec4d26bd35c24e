"""A sweep's search space besides the grid: the ranges ``--vary`` takes, the seeded random draws
of ``--search random``, and Ray Tune's domains and Optuna's TPE searcher for ``--search tpe``.

What ``--vary FLAG=...`` takes (docs/sweeps.md, "Search spaces"):

- ``A,B,C`` or ``choice:A,B,C``: values (a grid's), drawn among with equal chances;
- ``uniform:LOW:HIGH``: a number from LOW to HIGH, both included, every value as likely;
- ``loguniform:LOW:HIGH``: the same on a log scale (as likely in 0.01-0.1 as in 0.1-1), LOW
  above 0;
- ``int:LOW:HIGH``: a whole number from LOW to HIGH, both included; for ``num-layers`` the
  ResNet depths 6n+2 in the range, each as likely (n is drawn, the depth is 6n+2).

Each flag is the trainer's and each value is checked as the grid's are (``records.parse_vary``);
a range's kind must fit the flag's type and both its ends must pass the trainer's own checks
(``check_ends``), so a bad range is one line before anything runs. A drawn point is the grid
point's kind, flag -> value as the trainer's parser takes it, and goes through the same path
(``records.check_trials``, ``records.assign``). What runs the trials is ``tuner``; the command is
``cifar10_estimator.sweep``.

Random draws use Python's ``random.Random(seed).random()`` alone, which Python keeps the same
across its versions for a given seed (docs.python.org/3/library/random.html, "Notes on
Reproducibility"), and map each draw to a value themselves: a rerun with the same seed draws
the same trials, on any Python and NumPy. Ray and Optuna are imported only by the functions of
``--search tpe``.
"""

import dataclasses
import math
import random
from typing import Any, Mapping, Optional, Sequence

from cifar10_estimator.config import flags
from cifar10_estimator.errors import UserError
from cifar10_estimator.sweeps import records

GRID, RANDOM, TPE = "grid", "random", "tpe"
SEARCHES = (GRID, RANDOM, TPE)
CHOICE, UNIFORM, LOGUNIFORM, INT = "choice", "uniform", "loguniform", "int"
RANGES = (UNIFORM, LOGUNIFORM, INT)
# The flag whose whole numbers are ResNet depths, 6n+2 (settings.RESNET_DEPTH).
DEPTH_FLAG = "num-layers"
# A drawn number keeps 4 significant digits: trial names and tables stay readable
# (records.MAX_SHORT_NAME), and a log-uniform range still has some 9,000 values per decade,
# far more than a sweep draws.
SIGNIFICANT = 4
# How many draws a random sweep makes at most per trial, looking for points it has not drawn
# yet, before it says the space is too small.
MAX_DRAWS_PER_TRIAL = 100
# The install that brings Optuna (pyproject.toml's extra).
TUNE_EXTRA = "pip install 'cifar10_estimator[tune]'"
# numpy's RandomState, behind Optuna's TPESampler, takes seeds from 0 to 2**32 - 1.
MAX_SEED = 2 ** 32 - 1


@dataclasses.dataclass(frozen=True)
class Dimension:
    """One ``--vary``: the trainer's flag, its kind and ``spec`` as given. Choices keep the
    grid's ``records.Varied`` (values as the trainer takes them); a number range its ``low``
    and ``high``; a whole-number range the values ``step * k + offset`` for ``k`` from
    ``first`` to ``first + count - 1`` (``step`` 6 and ``offset`` 2 for depths)."""
    flag: str
    kind: str
    spec: str
    varied: Optional[records.Varied] = None
    low: float = 0.0
    high: float = 0.0
    first: int = 0
    count: int = 0
    step: int = 1
    offset: int = 0

    def whole(self, k: int) -> int:
        return self.step * k + self.offset

    @property
    def size(self) -> Optional[int]:
        """How many values it holds; None for a number range (as many as it has digits)."""
        if self.kind == CHOICE:
            return len(self.varied.values)
        return self.count if self.kind == INT else None


def _number(text: str, spec: str, whole: bool) -> float:
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise UserError(f"--vary {spec}: {text.strip()!r} is not {kind}") from None
    if not math.isfinite(value):
        raise UserError(f"--vary {spec}: {text.strip()!r} is not a finite number")
    return value


_EXAMPLES = {UNIFORM: "uniform:0:0.2", LOGUNIFORM: "loguniform:0.01:1", INT: "int:8:56"}


def _range(name: str, kind: str, text: str, spec: str, action) -> Dimension:
    parts = text.split(":")
    if len(parts) != 2:
        raise UserError(f"--vary {spec}: give {kind}:LOW:HIGH, e.g. "
                        f"--vary {name}={_EXAMPLES[kind]}")
    if kind == INT and action.type is not int:
        raise UserError(f"--vary {spec}: --{name} does not take whole numbers; int:LOW:HIGH "
                        f"is for flags such as --num-layers"
                        + ("; use uniform: or loguniform:" if action.type is float else ""))
    if kind != INT and action.type is not float:
        why = ("takes whole numbers: use int:LOW:HIGH" if action.type is int
               else "is not a number: give its values, choice:A,B")
        raise UserError(f"--vary {spec}: --{name} {why}")
    low, high = (_number(p, spec, kind == INT) for p in parts)
    if low >= high:
        raise UserError(f"--vary {spec}: LOW ({parts[0].strip()}) must be below HIGH "
                        f"({parts[1].strip()})")
    if kind == LOGUNIFORM and low <= 0:
        raise UserError(f"--vary {spec}: a log-uniform range needs LOW above 0 (the log of "
                        f"{parts[0].strip()} is undefined); use uniform: for ranges from 0")
    if kind != INT:
        return Dimension(name, kind, spec, low=low, high=high)
    if name != DEPTH_FLAG:
        return Dimension(name, kind, spec, first=int(low), count=int(high - low) + 1)
    # He et al. 2015 (arXiv:1512.03385), section 4.2: depth 6n+2 with n >= 1.
    first = max(1, math.ceil((low - 2) / 6))
    last = math.floor((high - 2) / 6)
    if last < first:
        raise UserError(f"--vary {spec}: no ResNet depth between {int(low)} and {int(high)} "
                        f"(--num-layers is 6n+2: 8, 14, 20, 26, 32, ...); widen the range")
    return Dimension(name, kind, spec, first=first, count=last - first + 1, step=6, offset=2)


def parse(specs: Sequence[str], cwd: str) -> list[Dimension]:
    """Each ``--vary``, values or a range, checked against the trainer's flag (one-line
    UserErrors naming the ``--vary``); relative paths made absolute from ``cwd``."""
    actions = records._actions(flags.build_parser())
    dimensions: list[Dimension] = []
    for spec in specs:
        name, _, text = spec.partition("=")
        name = name.strip().removeprefix("--")
        kind, colon, rest = text.strip().partition(":")
        if name in [d.flag for d in dimensions]:
            raise UserError(f"--vary {name} is given twice; give its values or range in one "
                            f"--vary")
        if not colon or kind not in (CHOICE, *RANGES):
            dimensions.append(_choices(spec, spec, cwd))
        elif kind == CHOICE:
            dimensions.append(_choices(f"{name}={rest}", spec, cwd))
        elif name in records.OWN_FLAGS or actions.get(name) is None or name == "verbose":
            records.parse_vary([spec], cwd)  # the grid's one-line error about the flag
            raise AssertionError(f"records.parse_vary took --vary {spec}")
        else:
            dimensions.append(_range(name, kind, rest, spec, actions[name]))
    return dimensions


def _choices(values_spec: str, spec: str, cwd: str) -> Dimension:
    try:
        varied, = records.parse_vary([values_spec], cwd)
    except UserError as e:  # named as the user spelled it
        raise UserError(str(e).replace(f"--vary {values_spec}", f"--vary {spec}", 1)) from None
    return Dimension(varied.flag, CHOICE, spec, varied=varied)


def grid(dimensions: Sequence[Dimension]) -> list[records.Varied]:
    """The grid's ``--vary`` values; a range is refused in one line (a grid needs values)."""
    for d in dimensions:
        if d.kind != CHOICE:
            raise UserError(f"--vary {d.spec}: a grid needs values (--vary {d.flag}=A,B,C); a "
                            f"range is drawn from with --search random or tpe and --num-trials")
    return [d.varied for d in dimensions]


def ends(dimensions: Sequence[Dimension]) -> list[tuple[Dimension, str]]:
    """Each range's two ends and each choice, as the trainer takes them."""
    out = []
    for d in dimensions:
        if d.kind == CHOICE:
            out += [(d, v) for v in d.varied.values]
        elif d.kind == INT:
            out += [(d, str(d.whole(d.first))), (d, str(d.whole(d.first + d.count - 1)))]
        else:
            out += [(d, records.canonical(d.low)), (d, records.canonical(d.high))]
    return out


def check_ends(trainer_flags: Sequence[str], dimensions: Sequence[Dimension]) -> None:
    """Each range's ends and each choice through the trainer's checks, the other flags at
    their first value: a range the trainer refuses a part of is one line before any draw."""
    first = {d.flag: value for d, value in reversed(ends(dimensions))}
    for d, value in ends(dimensions):
        point = {**first, d.flag: value}
        try:
            records.check_trials(trainer_flags, [point])
        except UserError as e:
            if d.kind == CHOICE:
                raise
            why = str(e).removeprefix(f"the trial {records.shown_settings(point)}: ")
            raise UserError(f"--vary {d.spec}: the trainer refuses its end {value} ({why}); "
                            f"narrow the range") from None


# --- random ---------------------------------------------------------------------------------


def _rounded(d: Dimension, value: float) -> float:
    """A drawn number at ``SIGNIFICANT`` digits, kept within its range."""
    return min(max(float(f"{value:.{SIGNIFICANT}g}"), d.low), d.high)


def _value(d: Dimension, u: float) -> str:
    """The value a uniform draw ``u`` in [0, 1) stands for, as the trainer takes it."""
    if d.kind in (CHOICE, INT):
        index = min(int(u * d.size), d.size - 1)
        return d.varied.values[index] if d.kind == CHOICE else str(d.whole(d.first + index))
    if d.kind == UNIFORM:
        return records.canonical(_rounded(d, d.low + u * (d.high - d.low)))
    log_low, log_high = math.log(d.low), math.log(d.high)
    return records.canonical(_rounded(d, math.exp(log_low + u * (log_high - log_low))))


def size(dimensions: Sequence[Dimension]) -> Optional[int]:
    """How many points the space holds; None when a number range makes it unbounded."""
    sizes = [d.size for d in dimensions]
    return None if None in sizes else math.prod(sizes)


def draw(dimensions: Sequence[Dimension], num_trials: int, seed: int
         ) -> list[dict[str, str]]:
    """``num_trials`` different points drawn at random with ``seed``, each flag in ``--vary``
    order taking one draw per point: the same seed draws the same points, and a larger
    ``num_trials`` draws the same first ones and more."""
    total = size(dimensions)
    if total is not None and total < num_trials:
        shape = " x ".join(f"{d.flag} {d.size}" for d in dimensions)
        raise UserError(f"--num-trials {num_trials}: the --vary values hold only {total} "
                        f"different trials ({shape}); lower --num-trials, or give a range "
                        f"(--search grid runs them all)")
    rng = random.Random(seed)
    points: list[dict[str, str]] = []
    seen: set[tuple] = set()
    for _ in range(MAX_DRAWS_PER_TRIAL * num_trials):
        point = {d.flag: _value(d, rng.random()) for d in dimensions}
        key = tuple(point.values())
        if key not in seen:
            seen.add(key)
            points.append(point)
            if len(points) == num_trials:
                return points
    raise UserError(f"--num-trials {num_trials}: {MAX_DRAWS_PER_TRIAL * num_trials} draws "
                    f"found only {len(points)} different trials (a range narrower than "
                    f"{SIGNIFICANT} significant digits tell apart); widen a range or lower "
                    f"--num-trials")


def varied(dimensions: Sequence[Dimension], points: Sequence[dict[str, str]]
           ) -> list[records.Varied]:
    """The sweep's ``records.Varied`` for drawn points: choices as given, a range's values the
    ones drawn, in order (what sweep.json lists and TensorBoard's HParams shows)."""
    out = []
    for d in dimensions:
        if d.kind == CHOICE:
            out.append(d.varied)
            continue
        parse_value = int if d.kind == INT else float
        typed = sorted({parse_value(p[d.flag]) for p in points})
        out.append(records.Varied(d.flag, tuple(records.canonical(v) for v in typed),
                                  tuple(typed)))
    return out


def describe(dimensions: Sequence[Dimension]) -> str:
    """The space in a line: ``learning-rate loguniform:0.01:1 x nesterov true,false``."""
    return " x ".join(f"{d.flag} {','.join(d.varied.values)}" if d.kind == CHOICE
                      else f"{d.flag} {d.spec.partition('=')[2].strip()}" for d in dimensions)


# --- tpe: Ray Tune's search space, Optuna's TPE ----------------------------------------------


def ray_search_space(dimensions: Sequence[Dimension]) -> dict[str, Any]:
    """Ray Tune's domains, one per flag: ``tune.choice`` of the values as the trainer takes
    them, ``tune.uniform``, ``tune.loguniform``, ``tune.randint`` over k for a whole-number
    range (for depths k is n of 6n+2: the searcher sees the order of the depths). ``point``
    turns a config drawn from it into the trial's settings."""
    from ray import tune

    space = {}
    for d in dimensions:
        if d.kind == CHOICE:
            space[d.flag] = tune.choice(list(d.varied.values))
        elif d.kind == INT:
            space[d.flag] = tune.randint(d.first, d.first + d.count)  # the upper end excluded
        else:
            space[d.flag] = (tune.uniform if d.kind == UNIFORM else tune.loguniform)(d.low,
                                                                                   d.high)
    return space


def point(dimensions: Sequence[Dimension], config: Mapping[str, Any]) -> dict[str, str]:
    """A trial's settings (flag -> value as the trainer takes it) from a config drawn from
    ``ray_search_space``; numbers at ``SIGNIFICANT`` digits, as random draws are."""
    settings_: dict[str, str] = {}
    for d in dimensions:
        value = config[d.flag]
        if d.kind == CHOICE:
            settings_[d.flag] = str(value)
        elif d.kind == INT:
            settings_[d.flag] = str(d.whole(int(value)))
        else:
            settings_[d.flag] = records.canonical(_rounded(d, float(value)))
    return settings_


def config_of(dimensions: Sequence[Dimension], settings: Mapping[str, str]
              ) -> dict[str, Any]:
    """``point``'s inverse: a trial's settings as a config of ``ray_search_space`` (for a
    searcher told of the trials that ended before it ran)."""
    config: dict[str, Any] = {}
    for d in dimensions:
        text = settings[d.flag]
        if d.kind == CHOICE:
            config[d.flag] = text
        elif d.kind == INT:
            config[d.flag] = next(k for k in range(d.first, d.first + d.count)
                                  if d.whole(k) == int(text))
        else:
            config[d.flag] = float(text)
    return config


def check_installed(search: str) -> None:
    """A one-line UserError when ``search`` needs a package this install lacks."""
    if search != TPE:
        return
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UserError(f"--search tpe needs Optuna, which is not installed: "
                        f"{TUNE_EXTRA}") from None


def searcher(kind: str, metric: str, mode: str, seed: int,
             known: Sequence[tuple[dict[str, Any], float]] = ()):
    """Ray Tune's searcher for ``--search kind``: ``OptunaSearch`` with Optuna's
    ``TPESampler(seed=seed)`` (the search space is the Tuner's ``param_space``, from
    ``ray_search_space``). Optuna's TPE draws its first 10 trials at random
    (``TPESampler``'s ``n_startup_trials``) and models the results after that."""
    if kind != TPE:
        raise UserError(f"--search {kind}: a searcher is for --search {TPE}")
    check_installed(kind)
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    # Optuna's own log says "A new study created in memory" at INFO: the sweep's lines say
    # what runs.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The sampler carries the seed: OptunaSearch ignores its own seed beside a sampler
    # (ray/tune/search/optuna/optuna_search.py, Ray 2.60).
    # ``known``: (config, value) of the trials that ended in earlier runs of the sweep, which
    # the study starts from as trials already evaluated (it draws none of them again).
    # TPE's first draws are random from its seed whatever the study holds: a rerun's seed moves
    # on by the trials known, so that it does not draw the earlier runs' points again.
    return OptunaSearch(metric=metric, mode=mode,
                        sampler=optuna.samplers.TPESampler(seed=seed + len(known)),
                        points_to_evaluate=[c for c, _ in known] or None,
                        evaluated_rewards=[v for _, v in known] or None)
