"""Named overlays on the settings' defaults: each ``--model``'s, ``--distribution-strategy``'s
and ``--recipe``'s.

An overlay is a named set of values that take the place of the fields' defaults, as TF Model
Garden's experiment configurations override its base ones. The order, from weakest to
strongest: the fields' defaults (``settings``), the model's overlay, the strategy's, the
recipe's, and the flags given on the command line (``flags.parse``). The trainer logs every
setting a recipe may set, marking those given (``describe``).

A run length is one fact: a model's overlay gives ``train_steps``; a recipe with a length of
its own (``RUN_LENGTHS``) replaces it with epochs that follow the training file's size, and
``--train-epochs`` or ``--train-steps`` given replace either. A recipe's share of the run at
small pictures follows the size the same way (``LOW_RES_SHARES``), unless
``--low-res-fraction`` is given: its overlay holds None, which the plan resolves.
"""

import math
from typing import Any, Mapping, Optional

from cifar10_estimator.config.fields import flag, shown
from cifar10_estimator.config.settings import (MIRRORED, MULTI_WORKER_MIRRORED, RECIPE_FIELDS,
                                               RESNET, SCHEDULE_FIELDS, TOWERS, TUTORIAL_BATCH,
                                               TUTORIAL_CNN, FIELDS, Settings)

# The tutorial CNN's weights are averaged at this decay for evaluation (cifar10.py's
# MOVING_AVERAGE_DECAY).
TUTORIAL_CNN_AVERAGE_DECAY = 0.9999

# Each model's defaults, where they are not the fields' own.
MODELS: dict[str, Mapping[str, Any]] = {
    # The ResNet tutorial's length: 80,000 steps of batch 128 on 45,000 images (the paper
    # stopped at 64,000).
    RESNET: {"train_steps": 80_000},
    # TensorFlow's original CIFAR-10 tutorial (cifar10.py and cifar10_train.py): learning rate
    # 0.1, decayed by 0.1 every 350 epochs (staircase; no run of this package reaches a second
    # drop), plain SGD, weight decay 0.004 (on its hidden layers' weights only,
    # model.tutorial_cnn), evaluation with averaged weights, and its accuracy (about 86 %)
    # quoted after 100,000 steps.
    TUTORIAL_CNN: {
        "learning_rate": 0.1,
        "lr_boundary_epochs": (350.0,),
        "lr_decay_factors": (1.0, 0.1),
        "momentum": 0.0,
        "weight_decay": 0.004,
        "moving_average_decay": TUTORIAL_CNN_AVERAGE_DECAY,
        "train_steps": 100_000,
    },
}

# Recipes: the settings that reach an accuracy, as measured with benchmarks/convergence.py
# (docs/performance.md, "Time to accuracy").
RECIPES: dict[str, Mapping[str, Any]] = {
    # The tutorial's: the fields' defaults (He et al. 2015, section 4.2, by way of the
    # TensorFlow CIFAR-10 estimator tutorial).
    "paper": {},
    "fast": {
        # Smith and Topin 2017 (arXiv:1708.07120): one cycle of the rate reaches a given
        # accuracy in fewer epochs than a piecewise schedule.
        "lr_schedule": "one-cycle",
        # Four times the tutorial's 0.1 at its batch of 128, scaled with the batch (Goyal et
        # al. 2017): 0.2 at batch 64. With Nesterov momentum it ended above the same run at
        # half that peak after 4 epochs on 10,000 Fashion-MNIST pictures (docs/experiments.md,
        # "Choosing on a validation split", the third round).
        "learning_rate": 0.4,
        "lr_reference_batch": TUTORIAL_BATCH,
        # Sutskever et al. 2013 (ICML, section 3): the step looks ahead along the momentum.
        # It gave the largest gain of the changes tried on the validation split
        # (docs/experiments.md, "Choosing on a validation split", the third round).
        "nesterov": True,
        # More, smaller steps: on 10,000 Fashion-MNIST pictures batch 64 was the only batch
        # that reached the paper recipe's accuracy within 6 epochs, and a 2-core CPU computes
        # it at nearly the images/s of batch 256 (docs/experiments.md, "Choosing on a
        # validation split", "The batch and the run length").
        "train_batch_size": TUTORIAL_BATCH // 2,
        # Szegedy et al. 2016 (arXiv:1512.00567, section 7): 0.1, as they used.
        "label_smoothing": 0.1,
        # He et al. 2019 (arXiv:1812.01187, section 3.1): the weight decay on the kernels only.
        # It let half an epoch less reach the paper recipe's median on 50,000 pictures (4.5 in
        # RUN_LENGTHS), at no cost in time (docs/experiments.md, "Choosing on a validation
        # split", the fourth round).
        "no_bias_decay": True,
        "precision": "auto",
        # The fast trainers' levers that lifted the recipe's validation median (airbench,
        # Jordan 2024, arXiv:2404.00498; docs/experiments.md, "The fifth round"): the frozen
        # whitening layer (+0.74 points), alternating flips (+0.17), batch-norm scales and
        # shifts at 4 times the rate (+0.09). Lookahead (-0.29) is left out; so are the
        # test-time views (+0.17 on the same weights), which cost 6 times the network's work
        # per served picture.
        "whitening_patch": 2,
        "alternating_flips": True,
        "batch_norm_lr_multiplier": 4.0,
        # airbench's identity initialisation of the convolutions after the first (Jordan 2024,
        # airbench_ablations/main2_dirac.py): +0.17 points over the recipe's validation median
        # at 40,000 Fashion-MNIST pictures, the most of the sixth round's levers; its
        # triangular schedule (+0.08 alone) is left out, since with it the pair ended under
        # the identity start alone (docs/experiments.md, "The sixth round").
        "dirac_init": True,
        # Progressive resizing (Hoffer et al. 2019, arXiv:1908.08986), its share of the run
        # following the training file's size (LOW_RES_SHARES).
        "low_res_fraction": None,
    },
}
# A recipe's share of its run at --low-res-size, for a training file of N records, where
# --low-res-fraction is not given: through points (N, share), as RUN_LENGTHS does. None at any
# size since the seventh round: at 40,000 Fashion-MNIST pictures, 6 epochs all at full size
# reached the fair baseline's median within 0.1 points on each of three splits in less time than
# any row with small pictures that did (8 epochs, the first 0.545 at 24 pixels: 0.53 of the
# baseline's time against 0.46, bf16); 10,000: the small pictures cost 0.26 points over three
# splits (docs/experiments.md, "The seventh round" and "The sixth round"). The points stay so
# that a size where small pictures pay (oneDNN at AVX2, where a 24-pixel step costs 0.62 of a
# full one) can be given a share again.
LOW_RES_SHARES: dict[str, tuple[tuple[int, float], ...]] = {
    "fast": ((10_000, 0.0), (40_000, 0.0)),
}
# A recipe's own run length, in epochs, for a training file of N records, where neither
# --train-epochs nor --train-steps is given: through points (N, epochs) measured with
# benchmarks/convergence.py, straight in log N between them and flat beyond them. 40,000: 6
# epochs, the least time whose median over 3 seeds reached the fair baseline's (He et al.'s
# proportions, 15 epochs) within 0.1 points on each of three disjoint splits of Fashion-MNIST
# (validation, test and holdout: +0.09, +0.38 and -0.08 points), in 0.46 of its time in bf16
# on a Zen 5, past a third (docs/experiments.md, "The seventh round"); at 50,000 the same 6
# epochs passed on each split too (+0.16, +0.09, +0.26; 0.47 of the time; "The eighth
# round"), so the length is flat beyond 40,000. 10,000: 5 epochs, the shortest of 4, 5, 6 and
# 8 that passed the same rule (+0.55, +0.56, +0.39; 4 epochs, the length before, ended 0.46
# under on the test split), in 0.43 of the baseline's time in bf16. 20,000: the line between
# those two points gave 5.5 epochs, which ended 0.35 under on the test split; 6 passed
# (+0.18, +0.06, +0.41), so the length is flat from 20,000 ("The ninth round").
RUN_LENGTHS: dict[str, tuple[tuple[int, float], ...]] = {
    "fast": ((10_000, 5.0), (20_000, 6.0), (40_000, 6.0)),
}


def recipe_epochs(recipe: str, train_records: int) -> Optional[float]:
    """The epochs ``recipe`` trains on ``train_records`` records (RUN_LENGTHS); None for a
    recipe without a length of its own (the model's steps apply)."""
    points = RUN_LENGTHS.get(recipe)
    return round(_along(points, train_records), 1) if points else None


def recipe_low_res_fraction(recipe: str, train_records: int) -> float:
    """The share of its run ``recipe`` trains at --low-res-size on ``train_records`` records
    (LOW_RES_SHARES); 0 for a recipe without one."""
    points = LOW_RES_SHARES.get(recipe)
    return round(_along(points, train_records), 3) if points else 0.0


def _along(points: tuple[tuple[int, float], ...], n: int) -> float:
    """The value at ``n`` of a curve through ``points`` (N, value) in increasing N: straight in
    log N between two points, flat beyond the first and the last."""
    (n0, v0), (n1, v1) = points[0], points[-1]
    if n <= n0:
        return v0
    if n >= n1:
        return v1
    for (lo, v_lo), (hi, v_hi) in zip(points, points[1:]):
        if lo <= n <= hi:
            return v_lo + math.log(n / lo) / math.log(hi / lo) * (v_hi - v_lo)
    raise AssertionError("a recipe's points are in increasing N")


# Each --distribution-strategy's defaults: a multi-worker all-reduce job cannot recompute the
# batch-norm statistics before a checkpoint (config/checks.py says why).
STRATEGIES: dict[str, Mapping[str, Any]] = {
    TOWERS: {},
    MIRRORED: {},
    MULTI_WORKER_MIRRORED: {"precise_bn_batches": 0},
}


def follows_he(values: Mapping[str, Any], epochs_given: bool,
               schedule_given: bool) -> bool:
    """Whether a run takes He et al.'s proportions of its length (``lr_schedule`` ``he``) in
    place of the tutorial's drops: a ResNet on the paper recipe whose length is given in epochs
    and whose schedule is not. The tutorial's boundaries (82, 123, 300 epochs) belong to its
    80,000 steps; a 15-epoch run would never reach them. ``--train-steps``, the tutorial's own
    flag, keeps the tutorial's schedule, as it did there."""
    return (values["recipe"] == "paper" and values["model"] == RESNET
            and values["lr_schedule"] == "piecewise" and epochs_given and not schedule_given)


def defaults(model: str, recipe: str, strategy: str = TOWERS) -> dict[str, Any]:
    """Every setting's default for this model, strategy and recipe (the fields', then the
    overlays')."""
    values = {f.name: f.default for f in FIELDS}
    values.update(MODELS[model])
    values.update(STRATEGIES[strategy])
    values.update(RECIPES[recipe])
    if recipe in RUN_LENGTHS:
        values["train_steps"] = None  # the recipe's length replaces the model's
    return values


def build(**given: Any) -> Settings:
    """The settings for the values ``given`` (as on a command line): the rest from the model's
    and the recipe's overlays, then the fields' defaults."""
    fields = {f.name: f.default for f in FIELDS}
    values = defaults(given.get("model", fields["model"]), given.get("recipe", fields["recipe"]),
                      given.get("distribution_strategy", fields["distribution_strategy"]))
    if given.get("train_epochs") is not None and "train_steps" not in given:
        values["train_steps"] = None  # a length given in epochs replaces the model's steps
    values.update(given)
    schedule_given = any(name in given for name in SCHEDULE_FIELDS)
    if follows_he(values, "train_epochs" in given, schedule_given):
        values["lr_schedule"] = "he"
    return Settings.of(**values)


def recipe_help() -> str:
    """What each recipe sets, for the docs and ``--help``: its values, and its run length where
    it has one of its own (RUN_LENGTHS)."""
    return "; ".join(f"{name}: " + (", ".join(f"{flag(k)} {_shown(v)}" for k, v in values.items())
                                    or "the defaults") + _length_help(name)
                     for name, values in RECIPES.items())


def _length_help(recipe: str) -> str:
    """``recipe``'s own run length as the help says it: empty for a recipe without one."""
    points = RUN_LENGTHS.get(recipe)
    if not points:
        return ""
    # A point inside or at the end of a flat stretch adds nothing to say.
    values = [epochs for _, epochs in points]
    turns = [p for i, p in enumerate(points)
             if i == 0 or values[i] != values[i - 1]
             or (i + 1 < len(points) and values[i] != values[i + 1])]
    if len(turns) == 1:
        length = f"{points[0][1]:g} epochs at every size"
    else:
        marks = [f"{epochs:g} epochs for {n:,} training records" for n, epochs in turns]
        marks[0] += " or fewer"
        marks[-1] += " or more"
        length = ", ".join(marks) + ", straight in log N between"
    return (f", and a length of its own: {length} (--train-epochs or --train-steps given "
            f"replaces it)")


# How the help, the log and the docs show a recipe's None: a share that follows the training
# file's size (LOW_RES_SHARES), the only None a recipe holds.
BY_SIZE = "by the training set's size"


def _shown(value: Any) -> str:
    """A recipe's value as the help and the log show it."""
    return BY_SIZE if value is None else shown(value)


def describe(settings: Settings) -> str:
    """``recipe NAME: --flag value, ...``: every setting a recipe may set, marking the values
    that differ from the recipe's (given on the command line), and the schedule a paper run
    given in epochs takes (``follows_he``)."""
    values, schedule = settings.flat(), settings.schedule
    expected = defaults(settings.model.model, schedule.recipe,
                        settings.cluster.distribution_strategy)
    schedule_given = any(values[name] != expected[name]
                         for name in SCHEDULE_FIELDS if name != "lr_schedule")
    switched = schedule.lr_schedule == "he" and follows_he(
        expected, schedule.train_epochs is not None, schedule_given)
    if switched:
        expected["lr_schedule"] = "he"

    def note(name: str) -> str:
        if values[name] != expected[name]:
            return " (given)"
        if switched and name == "lr_schedule":
            return " (--train-epochs: the paper's proportions of the run)"
        return ""

    parts = [f"{flag(name)} {_shown(values[name])}{note(name)}" for name in RECIPE_FIELDS]
    return f"recipe {schedule.recipe}: {', '.join(parts)}"
