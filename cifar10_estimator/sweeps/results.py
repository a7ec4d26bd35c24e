"""A sweep's results as a user reads them at its end: the ranked table the command prints,
the same rows as ``SWEEP/results.csv``, and each trial's ``--metric`` over its epochs as a
picture (``SWEEP/curves.png``) and as TensorBoard scalars (``SWEEP/curves/<trial>``).

The order (``ranked``): the finished trials by their ``--metric``, best first (as
``records.best`` picks), then the ones the scheduler stopped early, those that trained longest
first, each by its last evaluation; then the failed, interrupted, running and pending ones,
unranked, by number. Trials out of the grid (an earlier grid's, an earlier seed's) are left
out, as they are of the ranking in ``sweep.json``.

Every file goes through ``storage`` (a local folder, a shared one or a bucket); the picture
is drawn by matplotlib's Agg canvas, the scalars written by TensorFlow's summary writer (which
the sweep's driver has loaded for TensorBoard's HParams, ``hparams``).
"""

import csv
import io
import math
from typing import Optional, Sequence

from cifar10_estimator import storage
from cifar10_estimator.sweeps import records

CSV_FILE = "results.csv"
PNG_FILE = "curves.png"
CURVES_DIR = "curves"
# The end of the names of the event files written here (and only here): a rerun replaces them.
SUFFIX = ".curves"
# The picture: 9 x 5.5 inches at 100 dpi (900 x 550 pixels), matplotlib's default resolution.
PNG_INCHES, PNG_DPI = (9.0, 5.5), 100


def _value(trial: records.Trial, metric: str) -> Optional[float]:
    """The trial's ``metric``: its final figures, else its last evaluation that has it."""
    value = records.value_of(trial, metric)
    if value is None:
        for report in reversed(trial.reports):
            found = report.get(metric)
            if found is not None and not math.isnan(found):
                return float(found)
    return value


def ranked(trials: Sequence[records.Trial], metric: str, mode: str
           ) -> list[tuple[Optional[int], records.Trial]]:
    """The grid's trials in the table's order, each with its rank (None: unranked)."""
    sign = -1 if mode == "max" else 1
    grid = [t for t in trials if t.in_grid]

    def by_value(t: records.Trial):
        return (sign * _value(t, metric), t.number)

    finished = sorted((t for t in grid if t.status == records.FINISHED
                       and _value(t, metric) is not None), key=by_value)
    stopped = sorted((t for t in grid if t.status == records.STOPPED
                      and _value(t, metric) is not None),
                     key=lambda t: (-(t.epochs or 0), *by_value(t)))
    ranks = finished + stopped
    rest = sorted((t for t in grid if t not in ranks), key=lambda t: t.number)
    return [(i + 1, t) for i, t in enumerate(ranks)] + [(None, t) for t in rest]


def _secs(secs: Optional[float]) -> str:
    if secs is None:
        return "-"
    secs = round(secs)
    if secs < 60:
        return f"{secs} s"
    minutes, secs = divmod(secs, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _shown(value: Optional[float], digits: str = ".4g") -> str:
    return "-" if value is None else format(value, digits)


def table(trials: Sequence[records.Trial], metric: str, mode: str) -> list[str]:
    """The ranked table as lines of aligned columns: rank, trial, its settings, ``metric``,
    epochs trained, wall time, status; best first, failed and unfinished trials last."""
    header = ["rank", "trial", "settings", metric, "epochs", "time", "status"]
    rows = [[str(rank) if rank else "-", t.name, records.shown_settings(t.settings),
             _shown(_value(t, metric)), _shown(t.epochs, ".3g"), _secs(t.secs), t.status]
            for rank, t in ranked(trials, metric, mode)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    # Numbers right-aligned, words left-aligned.
    right = {0, 3, 4, 5}
    return ["  ".join(cell.rjust(w) if i in right else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in [header, *rows]]


def rows(trials: Sequence[records.Trial], metric: str, mode: str) -> list[list]:
    """The table's rows for ``results.csv``: a column per varied flag, numbers in full."""
    order = ranked(trials, metric, mode)
    flags_: list[str] = []
    for _, t in order:
        flags_ += [f for f in t.settings if f not in flags_]
    out: list[list] = [["rank", "trial", *flags_, metric, "epochs", "secs", "status",
                        "job_dir"]]
    for rank, t in order:
        out.append([rank if rank else "", t.name, *(t.settings.get(f, "") for f in flags_),
                    _blank(_value(t, metric)), _blank(t.epochs), _blank(t.secs), t.status,
                    t.job_dir])
    return out


def _blank(value: Optional[float]):
    return "" if value is None else value


def write_csv(sweep_dir: str, trials: Sequence[records.Trial], metric: str, mode: str) -> str:
    """``SWEEP/results.csv``, written atomically; its path."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows(trials, metric, mode))
    path = storage.join(sweep_dir, CSV_FILE)
    storage.write_bytes_atomic(path, buffer.getvalue().encode())
    return path


def curve(trial: records.Trial, metric: str) -> list[tuple[float, float, int]]:
    """The trial's evaluations that have ``metric``: (epoch, value, global step), in order."""
    return [(float(r.get("epoch", math.nan)), float(r[metric]), int(r.get("global_step", 0)))
            for r in trial.reports if r.get(metric) is not None and not math.isnan(r[metric])]


def plot_curves(sweep_dir: str, trials: Sequence[records.Trial], metric: str) -> list[str]:
    """Each grid trial's ``metric`` over its epochs: ``SWEEP/curves.png`` (a stopped trial's
    curve ends in a cross, where the scheduler cut it) and TensorBoard scalars in
    ``SWEEP/curves/<trial>`` (tag ``metric`` at each evaluation's global step, and the
    evaluation's ``epoch``). The paths written; none when no trial reported ``metric``."""
    curves = {t.name: (t, curve(t, metric)) for t in trials if t.in_grid}
    curves = {name: (t, points) for name, (t, points) in curves.items() if points}
    if not curves:
        return []
    png = storage.join(sweep_dir, PNG_FILE)
    storage.write_bytes_atomic(png, _picture(curves, metric))
    folders = [_scalars(storage.join(sweep_dir, CURVES_DIR, name), metric, points)
               for name, (_, points) in curves.items()]
    return [png, *folders]


def _picture(curves: dict, metric: str) -> bytes:
    # matplotlib is imported here: only the sweep's end pays its import time.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A Figure with its own Agg canvas, not pyplot (as model/confusion_image.py draws): no
    # global backend or figure registry.
    figure = Figure(figsize=PNG_INCHES, dpi=PNG_DPI, facecolor="white")
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    cross = {"marker": "x", "markersize": 10, "markeredgewidth": 2, "linestyle": "none"}
    stopped = False
    for name, (trial, points) in sorted(curves.items()):
        epochs, values = [p[0] for p in points], [p[1] for p in points]
        line, = axes.plot(epochs, values, marker="o", markersize=3, linewidth=1.2, label=name)
        if trial.status == records.STOPPED:
            axes.plot(epochs[-1:], values[-1:], color=line.get_color(), **cross)
            stopped = True
    if stopped:  # the legend's entry for the crosses, in no trial's colour
        axes.plot([], [], color="black", label="stopped early", **cross)
    axes.set_xlabel("epoch")
    axes.set_ylabel(metric)
    axes.set_title(f"{metric} at each evaluation")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7, loc="best", ncol=1 + len(curves) // 16)
    figure.tight_layout()
    buffer = io.BytesIO()
    canvas.print_png(buffer)
    return buffer.getvalue()


def _scalars(folder: str, metric: str, points: list[tuple[float, float, int]]) -> str:
    """The curve's scalars in ``folder``, replacing the ones an earlier run wrote there."""
    from cifar10_estimator import logs

    logs.import_tensorflow_quietly()
    import tensorflow as tf

    storage.makedirs(folder)  # on a bucket, loads its file system first (storage)
    for old in storage.glob(storage.join(folder, f"events.out.tfevents.*{SUFFIX}")):
        storage.remove(old)
    writer = tf.summary.create_file_writer(folder, filename_suffix=SUFFIX)
    with writer.as_default():
        for epoch, value, step in points:
            tf.summary.scalar(metric, value, step=step)
            tf.summary.scalar("epoch", epoch, step=step)
    writer.close()
    return folder
