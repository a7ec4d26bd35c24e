"""Recipes: named sets of training settings that ``--recipe`` picks, and the line that shows them.

- ``paper``: the tutorial's settings, which are the flags' defaults (He et al. 2015, section 4.2,
  by way of the TensorFlow CIFAR-10 estimator tutorial): the piecewise schedule from 0.1 at batch
  128, no warm-up, no label smoothing, no weight averaging, float32. It sets nothing.
- ``fast``: the settings that reached the paper recipe's accuracy soonest in wall time on a
  2-core CPU, measured with ``benchmarks/convergence.py`` (the figures are in
  docs/performance.md): the one-cycle schedule at a linearly scaled peak, a larger batch, label
  smoothing and bf16 where the CPU has it.

A recipe only changes defaults: it wins over the model's (``--model``), a flag given on the
command line wins over it (``training.flags``), and the trainer logs every value a recipe
sets, marking those given.
"""

import dataclasses
from typing import Any

from cifar10_estimator.model.params import MODEL_DEFAULTS, flag

RECIPES: dict[str, dict[str, Any]] = {
    "paper": {},
    "fast": {
        # Smith and Topin 2017 (arXiv:1708.07120): one cycle of the rate reaches a given
        # accuracy in fewer epochs than a piecewise schedule; its rise is 30 % of the run.
        "lr_schedule": "one-cycle",
        # Twice the tutorial's 0.1 at its batch of 128, scaled with the batch (Goyal et al.
        # 2017): 0.4 at batch 256. On Fashion-MNIST (8 epochs) it ended 0.4 points above
        # half that peak (docs/performance.md, "Time to accuracy").
        "learning_rate": 0.2,
        "lr_reference_batch": 128,
        # Fewer, larger steps: about 1,300 images/s in bf16 on the Xeon of
        # docs/performance.md, against about 1,200 at batch 128.
        "train_batch_size": 256,
        # Szegedy et al. 2016 (arXiv:1512.00567, section 7): 0.1, as they used.
        "label_smoothing": 0.1,
        "precision": "auto",
    },
}
# What the log line shows for every recipe: the settings any recipe sets, and the ones the
# issue's recipes are made of (warm-up, weight averaging, precise batch norm).
SHOWN = ("lr_schedule", "learning_rate", "lr_reference_batch", "warmup_epochs",
         "train_batch_size", "label_smoothing", "moving_average_decay", "precise_bn_batches",
         "precision")


def recipe_help() -> str:
    """The ``--recipe`` flag's help: what each recipe sets."""
    sets = "; ".join(f"{name}: " + (", ".join(f"{flag(k)} {_shown(v)}" for k, v in values.items())
                                    or "the defaults")
                     for name, values in RECIPES.items())
    return (f"a set of defaults for the schedule, batch, regularisation and precision ({sets}); "
            f"a flag given explicitly wins over the recipe's value")


def describe(config) -> str:
    """``recipe NAME: --flag value, ...`` for a config, marking the values given by flags."""
    recipe = RECIPES[config.recipe]
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    defaults.update(MODEL_DEFAULTS[config.model])
    parts = []
    for name in SHOWN:
        value = getattr(config, name)
        given = value != recipe.get(name, defaults[name])
        parts.append(f"{flag(name)} {_shown(value)}{' (given)' if given else ''}")
    return f"recipe {config.recipe}: {', '.join(parts)}"


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
