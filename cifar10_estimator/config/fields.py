"""How a setting is declared: one dataclass field that carries everything said about it.

A setting is a field of one of the sections of ``settings.Settings`` (one per help group,
``GROUPS``, in order) made with ``setting(default, help, ...)``. Its metadata is the only place
that says

- ``help``: what the flag's help prints (the default is added by ``cli``, never restated);
- ``record``: whether it defines the run, so that ``JOB/settings.json`` records it and a rerun
  that changes it is refused (``jobdir.settings_record``);
- ``check``: the range it must be in (``Check``), tested before anything runs;
- ``choices``: the values it takes, if they are few;
- ``models``: the ``--model`` values it applies to (all, if not given); given on the command
  line for another model it is refused;
- ``recipe``: whether recipes may set it; the trainer's recipe line shows every such setting.

``flags``, ``checks``, ``overlays`` and the settings record derive everything from these, so a
new setting is one field. No TensorFlow here: command lines import this before it loads.
"""

import dataclasses
from typing import Any, Callable, Optional

from cifar10_estimator.cli import shown  # a value as a user types it

# The trainer's help sections, in order: (name, what its settings are about).
GROUPS = (
    ("data", "the records and how training reads them"),
    ("model", "the network and its regularisation"),
    ("schedule", "how long and how fast it trains"),
    ("devices", "where and in what precision it computes"),
    ("cluster", "several tasks (their roles come from TF_CONFIG)"),
    ("output", "the job dir: checkpoints, evaluations, exports"),
    ("logging", "what the log and TensorBoard show"),
)
REQUIRED = ("help", "record")


@dataclasses.dataclass(frozen=True)
class Check:
    """A range a value must be in: ``test(value)`` is true inside it; ``wording`` ends the
    error line ``--flag must be <wording>, got <value>``. ``None`` (an unset optional
    setting) always passes."""

    test: Callable[[Any], bool]
    wording: str

    def problem(self, name: str, value: Any) -> Optional[str]:
        if value is None or self.test(value):
            return None
        return f"{flag(name)} must be {self.wording}, got {shown(value)}"


AT_LEAST_0 = Check(lambda v: v >= 0, "0 or more")
AT_LEAST_1 = Check(lambda v: v >= 1, "1 or more")
POSITIVE = Check(lambda v: v > 0, "positive")
FRACTION = Check(lambda v: 0 <= v < 1, "in [0, 1)")


def setting(default, help: str, *, record: bool = False,
            check: Optional[Check] = None, choices: Optional[tuple] = None,
            models: Optional[tuple[str, ...]] = None, recipe: bool = False,
            aliases: Optional[tuple[str, ...]] = None):
    """A dataclass field for one setting (see the module for what each argument means;
    ``aliases``: other spellings of its flag, as an engine passes it)."""
    metadata = {"help": help, "record": record, "recipe": recipe}
    for key, value in (("check", check), ("choices", choices), ("models", models),
                       ("aliases", aliases)):
        if value is not None:
            metadata[key] = value
    return dataclasses.field(default=default, metadata=metadata)


def flag(name: str) -> str:
    """The command-line spelling of a setting's field name (``num_layers`` -> ``--num-layers``)."""
    return "--" + name.replace("_", "-")
