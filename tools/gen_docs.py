#!/usr/bin/env python3
"""Regenerates the parts of the docs that state facts the code owns.

``python tools/gen_docs.py`` rewrites them; ``python tools/gen_docs.py --check`` changes nothing
and exits 1 with one line naming the first doc and section that differ from the code.

A generated part sits between ``<!-- generated: NAME ... -->`` and ``<!-- end generated -->``
and is rendered from the one place that declares its facts:

- ``flags``: the trainer's flags, as ``config/flags.py`` builds them (help group, help text),
  with each default from the fields and the overlays of ``config/overlays.py``;
- ``recorded-settings``: what ``JOB/settings.json`` records (the fields marked ``record=``, the
  data set's facts, the schedule's length) and what a rerun may change freely;
- ``jobdir-files``: every file a job dir holds, the names read from the constants that define
  them.

Most job-dir names live in modules that import TensorFlow, so they are read from the source
(``ast``) rather than imported: the check stays a fraction of a second. A name the code builds
in place rather than in a constant is checked against the source of the module that builds it.
"""

import argparse
import ast
import dataclasses
import os
import re
import sys
import textwrap
from typing import Callable, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import cifar10_estimator
except ImportError:
    # Run from a checkout that is not installed: use the package beside this folder.
    sys.path.insert(0, REPO)
    import cifar10_estimator

from cifar10_estimator.config import fields, flags, overlays, settings  # noqa: E402
from cifar10_estimator.jobdir import settings_record  # noqa: E402

PACKAGE = "cifar10_estimator"
COMMAND = "python tools/gen_docs.py"
TRAINING = "docs/training.md"
_START = re.compile(r"^<!-- generated: ([\w-]+)\b.*-->\s*$")
_END = "<!-- end generated -->"


class DocsError(Exception):
    """A doc or a source file the generator cannot use (one line)."""


# ----------------------------------------------------------------------------------------------
# Constants read from the package's source.

# The package's source, wherever the imported package lives: the constants read from it and
# the settings imported from it are one version.
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cifar10_estimator.__file__)))


def _source(module: str) -> str:
    with open(os.path.join(SOURCE_ROOT, *module.split(".")) + ".py", encoding="utf-8") as f:
        return f.read()


def constant(module: str, name: str):
    """The value of ``module.name``, a top-level constant made of literals, other constants
    (of this module or one it imports by name) and ``os.path.join``."""
    tree = ast.parse(_source(module))
    assigned, imported = {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned[target.id] = node.value
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)

    def value(node):
        try:
            return ast.literal_eval(node)
        except ValueError:
            pass
        if isinstance(node, ast.Name) and node.id in assigned:
            return value(assigned[node.id])
        if isinstance(node, ast.Name) and node.id in imported:
            source, attr = imported[node.id]
            return constant(source, attr)
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in imported):
            source, attr = imported[node.value.id]
            return constant(f"{source}.{attr}", node.attr)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "os.path.join":
            return "/".join(value(arg) for arg in node.args)
        raise DocsError(f"{module}.{name} is not a constant the docs generator can read "
                        f"({ast.unparse(node)})")

    if name not in assigned:
        raise DocsError(f"{module} defines no constant {name}; update {COMMAND}")
    return value(assigned[name])


def built_in(module: str, code: str, shown: str) -> str:
    """``shown``, a name that ``module`` builds in place (``code`` is how its source spells it);
    DocsError once the source no longer does."""
    if code not in _source(module):
        raise DocsError(f"{module} no longer builds {shown} as {code!r}; update {COMMAND}")
    return shown


# ----------------------------------------------------------------------------------------------
# Markdown.

_FLAG = re.compile(r"(?<![\w`-])(--[a-z][a-z0-9-]*)")
_DOC = re.compile(r"\bdocs/(\w+)\.md\b")


def cell(text: str) -> str:
    """Help text as a Markdown table cell: flags as code, doc paths as links."""
    text = text.replace("%%", "%")  # argparse's escape in help strings
    text = text.replace("|", "\\|").replace("*", "\\*").replace("<", "&lt;").replace(">", "&gt;")
    text = _FLAG.sub(r"`\1`", text)
    return _DOC.sub(r"[docs/\1.md](\1.md)", text)


def code_list(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def wrapped(paragraph: str, width: int = 96) -> str:
    """A paragraph or a list item wrapped as the docs are (a list item's lines indented)."""
    indent = "  " if paragraph.startswith("- ") else ""
    return "\n".join(textwrap.wrap(paragraph, width, subsequent_indent=indent,
                                    break_long_words=False, break_on_hyphens=False))


# ----------------------------------------------------------------------------------------------
# The flag tables.

_FIELDS = {f.name: f for f in settings.FIELDS}


def _shown(name: str, value, recipe: Optional[str] = None) -> str:
    if value is None:
        if name == "train_steps" and recipe in overlays.RUN_LENGTHS:
            return "its own length ([Recipes](#recipes))"
        if name == "low_res_fraction" and recipe in overlays.LOW_RES_SHARES:
            return f"{overlays.BY_SIZE} ([Recipes](#recipes))"
        help_text = _FIELDS[name].metadata["help"] if name in _FIELDS else ""
        return "required" if "(required" in help_text else "unset"
    return fields.shown(value)


def default_cell(name: str, default) -> str:
    """A flag's default, and where a ``--model``, ``--distribution-strategy`` or ``--recipe``
    overlay gives it another (``overlays.defaults``)."""
    if name not in _FIELDS:
        return fields.shown(default)
    base = {key: _FIELDS[key].default for key in ("model", "recipe", "distribution_strategy")}
    ours = overlays.defaults(base["model"], base["recipe"], base["distribution_strategy"])
    variants = []
    for key, flag_name in (("model", "model"), ("distribution_strategy", "distribution_strategy"),
                           ("recipe", "recipe")):
        for choice in _FIELDS[key].metadata["choices"]:
            if choice == base[key]:
                continue
            given = {**base, key: choice}
            value = overlays.defaults(given["model"], given["recipe"],
                                      given["distribution_strategy"])[name]
            if value != ours[name]:
                variants.append(f"`{fields.flag(flag_name)} {choice}`: "
                                f"{_shown(name, value, given['recipe'])}")
    shown = _shown(name, ours[name])
    return f"{shown} ({'; '.join(variants)})" if variants else shown


def render_flags() -> str:
    parser = flags.build_parser()
    described = dict(fields.GROUPS)
    parts = []
    # argparse has no public listing of its groups: _action_groups is what --help walks.
    for group in parser._action_groups:
        if group.title not in described:
            continue
        rows = ["| flag | default | meaning |", "|---|---|---|"]
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS:  # --no-x, the other spelling of --x
                continue
            meaning = cell(action.help)
            field = _FIELDS.get(action.dest)  # None for --verbose, which is no setting
            models = field.metadata.get("models") if field else None
            if models:
                meaning += " (" + " or ".join(f"`--model {m}`" for m in models) + " only)"
            rows.append(f"| `{action.option_strings[0]}` | "
                        f"{cell_text(default_cell(action.dest, action.default))} | {meaning} |")
        parts.append(wrapped(f"**{group.title}**: {described[group.title]}") + "\n\n"
                     + "\n".join(rows))
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------------------------
# What settings.json records.

def render_recorded_settings() -> str:
    recorded = {title: [] for title, _ in fields.GROUPS}
    free = {title: [] for title, _ in fields.GROUPS}
    for title, section in settings.SECTIONS:  # a setting's help group is its section
        for field in dataclasses.fields(section):
            side = recorded if field.name in settings.RUN_FIELDS else free
            side[title].append(fields.flag(field.name))
    spans = constant(f"{PACKAGE}.config.settings", "LENGTH_SHAPED_SCHEDULES")
    lines = [f"`{settings_record.RECORD_FILE}` records these settings (the fields of "
             f"`config/settings.py` with `record=True`), by help group:", ""]
    lines += [f"- {title}: {code_list(names)};" for title, names in recorded.items() if names]
    lines += [f"- from the data set's metadata: {code_list(settings_record.DATA_FIELDS)};",
              f"- for {' and '.join(f'`{s}`' for s in spans)} only, "
              f"`{settings_record.SCHEDULE_STEPS}`: the steps the schedule spans (from "
              f"`--train-steps` or `--train-epochs`).",
              "",
              "Every other flag may change from one run of the job to the next (the run's "
              "length within the rule above):",
              ""]
    lines += [f"- {title}: {code_list(names)};" for title, names in free.items() if names]
    lines[-1] = lines[-1][:-1] + "."
    return "\n".join(wrapped(line) for line in lines)


# ----------------------------------------------------------------------------------------------
# The job dir's files.

def render_jobdir_files() -> str:
    def const(module: str, name: str):
        return constant(f"{PACKAGE}.{module}", name)

    record = settings_record.RECORD_FILE
    lock = const("jobdir.lock", "LOCK_FILE")
    heartbeat = fields.shown(float(const("jobdir.lock", "HEARTBEAT_SECS")))
    report = const("evaluation.report", "REPORT_FILE")
    export = settings.EXPORT_SUBDIR
    best = const("serving.best_export", "BEST_SUBDIR")
    extra = const("serving.warmup", "ASSETS_EXTRA")
    in_extra = [os.path.basename(const(module, name)) for module, name in (
        ("serving.export", "CLASS_NAMES_FILE"), ("serving.export", "EXPORT_INFO_FILE"),
        ("serving.warmup", "WARMUP_FILE"))]
    metrics = os.path.basename(const("serving.export", "EVAL_METRICS_FILE"))
    stop = const("task.allreduce", "STOP_FILE")
    offline = f"{PACKAGE}.evaluation.offline"
    step_report = built_in(offline, 'f"eval_report_{split}_step{model.global_step}.json"',
                           "eval_report_<split>_step<N>.json")
    export_report = built_in(offline,
                             'f"eval_report_{split}_{storage.basename(export)}.json"',
                             "eval_report_<split>_<version>.json")
    unfinished = built_in(f"{PACKAGE}.serving.export", 'f".{version}.tmp"',
                          ".<version>.tmp")
    stale = built_in(f"{PACKAGE}.jobdir.lock", 'f"{self.path}.stale-{os.getpid()}"',
                     f"{lock}.stale-<pid>")
    probe = built_in(f"{PACKAGE}.storage.access", 'f".write-test-{os.getpid()}"',
                     ".write-test-<pid>")
    atomic = built_in(f"{PACKAGE}.storage.atomic",
                      'prefix=f".{os.path.basename(final_path)}."',
                      ".NAME.*.tmp")
    secs = fields.shown(settings.ESTIMATOR_SECS)
    keep = _FIELDS["keep_checkpoint_max"].default
    rows = [
        ("`model.ckpt-N.index`, `model.ckpt-N.data-*-of-*`",
         "a local run or a cluster's chief (Estimator's checkpoint saver)",
         f"at the session's start, every `--save-checkpoints-secs` ({secs} by default) or "
         f"`--save-checkpoints-steps`, at the last step, and on SIGTERM or SIGINT; the "
         f"`--keep-checkpoint-max` ({keep}) newest are kept. Before each save but the first and "
         f"a signal's, precise batch norm recomputes the statistics (see "
         f"[Batch-norm decay](#batch-norm-decay)). No `.meta` or `graph.pbtxt` files."),
        ("`checkpoint`", "the same (TensorFlow)",
         "after each save: the index of the checkpoints, replaced atomically"),
        ("`events.out.tfevents.*`", "a local run or the chief",
         "the training scalars every `--save-summary-steps`, and the graph (see "
         "[TensorBoard](#tensorboard))"),
        ("`eval/events.out.tfevents.*`",
         "the task that evaluates: a local run, or a cluster's evaluator",
         "after each evaluation: its scalars, per-class accuracy and the confusion-matrix "
         "picture"),
        (f"`{record}`", "a local run or the chief",
         "at the job's first start; again with `--change-settings` (below), or when this "
         "version records a setting that the record lacks"),
        (f"`{lock}`", "a local run or the chief",
         f"while it runs, rewritten every {heartbeat} s, deleted when it ends"),
        (f"`{report}`",
         "the task that ran the final evaluation: a local run, or a cluster's evaluator",
         "after the final evaluation "
         "([Per-class results](#per-class-results-and-the-run-summary))"),
        (f"`{step_report}`", "`evaluate JOB`",
         "when it evaluates the checkpoint of step N, unless `--report` is given "
         "([Evaluating a model again](#evaluating-a-model-again))"),
        (f"`{export}/<version>/`", "a local run or the chief",
         f"at the end of training: `saved_model.pb`, `fingerprint.pb`, `variables/` and "
         f"`assets/` (written by `tf.saved_model.save`; the weights are constants in the graph), "
         f"and `{extra}/` with {code_list(in_extra[:2])} (the checkpoint, its step and the "
         f"compute dtype), `{in_extra[2]}` and, when the final evaluation was of the exported "
         f"checkpoint, `{metrics}` ([Serving](serving.md))"),
        (f"`{export}/{best}/<version>/`", "with `--export-best`, the task that evaluates",
         "after each evaluation that beats the best so far; one version is kept "
         "([Serving](serving.md#the-best-evaluation-too))"),
        (f"`{export}/{export_report}`",
         f"`evaluate JOB/{export}` or `evaluate JOB/{export}/<version>`",
         "beside the export it evaluated, unless `--report` is given"),
        (f"`{stop}`",
         "with `--distribution-strategy multi-worker-mirrored`, the task that received SIGTERM "
         "or SIGINT",
         "when the signal arrives: the step every task stops after ([Distributed "
         "training](distributed.md#when-a-task-of-an-all-reduce-job-dies-or-is-preempted)); a "
         "restarted job ignores a stale one"),
        ("`tmp_worker_<i>/`",
         "with `--distribution-strategy multi-worker-mirrored`, worker i (Estimator's "
         "distribute coordinator)",
         "the worker's own checkpoints, which nothing reads"),
    ]
    table = ["| file or folder | written by | when |", "|---|---|---|"]
    table += [f"| {name} | {cell_text(who)} | {cell_text(when)} |" for name, who, when in rows]
    atomic_names = [atomic.replace("NAME", n) for n in (record, report, lock, stop)]
    temporaries = (
        f"Files are written under a temporary name and renamed when complete: "
        f"`{export}/{unfinished}/` while an export is written; {code_list(atomic_names)} (and "
        f"the same for `evaluate`'s reports) for a moment; `model.ckpt-N_temp/` while "
        f"TensorFlow writes a checkpoint; `{stale}` while a dead trainer's lock is taken over. "
        f"A job dir is checked for writing with a file `{probe}`, deleted at once.")
    return "\n".join(table) + "\n\n" + wrapped(temporaries)


def cell_text(text: str) -> str:
    """Prose of this module's own rows: already Markdown, only the column bar escaped."""
    return text.replace("|", "\\|")


# ----------------------------------------------------------------------------------------------
# The regions and the docs.

REGIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "flags": (TRAINING, render_flags),
    "recorded-settings": (TRAINING, render_recorded_settings),
    "jobdir-files": (TRAINING, render_jobdir_files),
}


@dataclasses.dataclass(frozen=True)
class Region:
    name: str
    section: str  # the heading above the region
    start: int  # the line after its start marker
    end: int  # its end marker's line


def find_regions(doc: str, lines: Sequence[str]) -> dict[str, Region]:
    found, heading, fenced, open_at = {}, "(top)", False, None
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        match = _START.match(line)
        if match:
            if open_at:
                raise DocsError(f"{doc}:{i + 1}: a generated region starts inside "
                                f"{open_at[0]!r}")
            open_at = (match.group(1), heading, i + 1)
        elif line.strip() == _END:
            if not open_at:
                raise DocsError(f"{doc}:{i + 1}: {_END} without a start marker")
            name, section, start = open_at
            if name in found:
                raise DocsError(f"{doc}: the generated region {name!r} appears twice")
            found[name] = Region(name, section, start, i)
            open_at = None
    if open_at:
        raise DocsError(f"{doc}: the generated region {open_at[0]!r} has no {_END}")
    return found


def regenerate(root: str) -> dict[str, tuple[str, str]]:
    """{doc: (its text now, its text as the code generates it)} for every doc with regions."""
    docs: dict[str, tuple[str, str]] = {}
    for doc in sorted({doc for doc, _ in REGIONS.values()}):
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            text = f.read()
        lines = text.split("\n")
        regions = find_regions(doc, lines)
        for name, (where, _) in REGIONS.items():
            if where == doc and name not in regions:
                raise DocsError(f"{doc} has no <!-- generated: {name} --> region")
        for region in sorted(regions.values(), key=lambda r: r.start, reverse=True):
            if region.name not in REGIONS or REGIONS[region.name][0] != doc:
                raise DocsError(f"{doc}: unknown generated region {region.name!r}")
            body = REGIONS[region.name][1]()
            lines[region.start:region.end] = ["", *body.split("\n"), ""]
        docs[doc] = (text, "\n".join(lines))
    return docs


def differences(root: str) -> list[str]:
    """One line for each generated region whose text differs from what the code generates."""
    stale = []
    for doc, (now, generated) in regenerate(root).items():
        if now == generated:
            continue
        ours = find_regions(doc, generated.split("\n"))
        theirs = find_regions(doc, now.split("\n"))
        now_lines, new_lines = now.split("\n"), generated.split("\n")
        for name, region in theirs.items():
            mine = ours[name]
            if now_lines[region.start:region.end] != new_lines[mine.start:mine.end]:
                stale.append(f"{doc}, section \"{region.section}\" (generated: {name})")
    return stale


def write(root: str) -> list[str]:
    """Rewrites the docs whose regions differ; returns the docs written."""
    written = []
    for doc, (now, generated) in regenerate(root).items():
        if now != generated:
            with open(os.path.join(root, doc), "w", encoding="utf-8") as f:
                f.write(generated)
            written.append(doc)
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Rewrite the generated regions of the docs from the code.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a generated region differs from the code")
    parser.add_argument("--root", default=REPO, help="the checkout (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = differences(args.root)
            if stale:
                more = f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""
                print(f"{COMMAND}: {stale[0]} differs from the code{more}; run {COMMAND}",
                      file=sys.stderr)
                return 1
            return 0
        for doc in write(args.root):
            print(f"rewrote the generated regions of {doc}")
        return 0
    except (DocsError, OSError) as e:
        print(f"{COMMAND}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
