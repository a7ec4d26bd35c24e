"""The confusion matrix as a labelled picture for TensorBoard's image tab.

This module owns the picture: its layout, colours and text (``render``, pure numpy and
matplotlib, usable from plain Python) and the graph op that makes it an evaluation summary from
the running counts (``draw``). It is drawn the way TensorBoard's confusion-matrix guide draws
one (tensorflow.org/tensorboard/image_summaries): rows are true classes and columns predicted
ones, each labelled with its class name as written; each cell is shaded with the "Blues" colour
map by its share of its row, so classes of different sizes compare; small matrices also write
that share in whole percent in each cell; a colour bar gives the scale.
"""

import dataclasses
import io
import math
from typing import Sequence

import numpy as np
import tensorflow as tf

DPI = 100  # fixed, so every size below in pixels is the picture's own
# Up to this many classes each cell says its percentage. A legibility choice, not a standard:
# at the smallest cell that leaves room for "100" (MIN_NUMBERED_CELL) a 20-class matrix is
# 600 px, and beyond it a wall of numbers reads worse than the shades.
MAX_NUMBERED_CLASSES = 20
# Cell sides in pixels. The matrix aims at TARGET_SIDE (10 classes: 50 px cells, a picture
# about 700 px wide); cells never get smaller than a line of tick-label text (MIN_CELL, so 100
# classes keep every name readable: a 1400 px matrix) or, with numbers, than "100" at about 9 pt
# needs with a margin (MIN_NUMBERED_CELL). Chosen by eye on 10, 20 and 100 classes.
TARGET_SIDE = 500
MIN_CELL = 14
MIN_NUMBERED_CELL = 30
MAX_FONT_PT = 10.0  # tick labels and cell numbers on large cells
LINE_SPACING = 1.2  # a text line's height over its font size (matplotlib's default spacing)
BAR_WIDTH = 20  # pixels of the colour bar's strip
GAP = 16  # pixels between the matrix and the colour bar
PAD = 8  # pixels of white around everything
CMAP = "Blues"


@dataclasses.dataclass(frozen=True)
class Rendering:
    """A rendered picture and where its parts ended up (for tests and callers that annotate).

    ``cell_centres`` is int [C, C, 2]: for true class i and predicted class j, the (row, column)
    pixel index of that cell's centre in the decoded PNG. ``row_labels`` and ``column_labels``
    are the tick labels' texts as drawn; ``cell_texts`` the number written in each cell (rows
    of empty strings when the matrix is too large for numbers).
    """

    png: bytes
    cell_centres: np.ndarray
    row_labels: tuple[str, ...]
    column_labels: tuple[str, ...]
    cell_texts: tuple[tuple[str, ...], ...]


def row_shares(counts: np.ndarray) -> np.ndarray:
    """float [C, C]: each count over its row's total; rows with no images stay all zero."""
    counts = np.asarray(counts, np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def cell_pixels(num_classes: int) -> int:
    """The side of one cell in pixels for this many classes."""
    smallest = MIN_NUMBERED_CELL if num_classes <= MAX_NUMBERED_CLASSES else MIN_CELL
    return max(smallest, TARGET_SIDE // max(num_classes, 1))


def _points(pixels: float) -> float:
    return pixels * 72.0 / DPI


def _relative_luminance(rgb) -> float:
    """WCAG 2.x relative luminance of an sRGB colour with components in 0..1."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb[:3]]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _ink(rgb) -> str:
    """White or black, whichever contrasts more with a cell of this colour (WCAG 2.x contrast
    ratio, (L1 + 0.05) / (L2 + 0.05); white wins below a luminance of about 0.18)."""
    luminance = _relative_luminance(rgb)
    return "white" if (1.05 / (luminance + 0.05)) > ((luminance + 0.05) / 0.05) else "black"


def _label(axes, names: tuple[str, ...], cell: int, total: float) -> None:
    """Tick labels (the class names as written), axis labels and the title."""
    num = len(names)
    # Tick labels as large as fit one per cell; at 45 degrees neighbouring labels stand
    # cell * sin(45) apart, so they turn upright when that is less than a line.
    label_pt = min(MAX_FONT_PT, _points(cell) / LINE_SPACING)
    line = label_pt * LINE_SPACING * DPI / 72.0
    rotation = 45 if cell * math.sin(math.radians(45)) >= line else 90
    ticks = np.arange(num)
    # parse_math=False: a "$" in a class name is text, not the start of a formula.
    axes.set_xticks(ticks, labels=names, fontsize=label_pt, parse_math=False,
                    rotation=rotation, rotation_mode="anchor" if rotation == 45 else "default",
                    ha="right" if rotation == 45 else "center", va="top")
    axes.set_yticks(ticks, labels=names, fontsize=label_pt, parse_math=False)
    axes.tick_params(length=3 if num > MAX_NUMBERED_CLASSES else 4)
    axes.set_xlabel("predicted class", fontsize=MAX_FONT_PT + 1)
    axes.set_ylabel("true class", fontsize=MAX_FONT_PT + 1)
    axes.set_title(f"confusion matrix, {total:,.0f} images", fontsize=MAX_FONT_PT + 2,
                   parse_math=False)


def percent_text(share: float) -> str:
    """A share of the row in whole percent, never hiding a mistake: a few wrong images among
    many read "<1", not "0", and a class all but perfect reads ">99", not "100"."""
    percent = round(100.0 * share)
    if percent == 0 and share > 0:
        return "<1"
    if percent == 100 and share < 1:
        return ">99"
    return f"{percent:d}"


def _write_shares(axes, shares: np.ndarray, cmap, cell: int) -> tuple[tuple[str, ...], ...]:
    """Writes each cell's share in whole percent (up to MAX_NUMBERED_CLASSES); returns the
    texts written, rows of empty strings when there are too many classes."""
    num = len(shares)
    if num > MAX_NUMBERED_CLASSES:
        return tuple(("",) * num for _ in range(num))
    # "100" is about 1.9 em wide in DejaVu Sans: 0.4 cell per em leaves a fifth of the
    # cell as margin.
    number_pt = min(MAX_FONT_PT, _points(cell) * 0.4)
    texts = tuple(tuple(percent_text(s) for s in row) for row in shares)
    for i in range(num):
        for j in range(num):
            axes.text(j, i, texts[i][j], ha="center", va="center", fontsize=number_pt,
                      color=_ink(cmap(shares[i, j])))
    return texts


def render(counts: np.ndarray, names: Sequence[str]) -> Rendering:
    """Draws a [C, C] confusion matrix of counts (rows: true class, columns: predicted),
    C = len(names), and returns the PNG with where its cells and labels are."""
    # matplotlib is imported here, not at the top: importing the package and building the
    # evaluation graph must not pay its import time (about 0.3 s warm), only rendering does.
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    names = tuple(str(n) for n in names)
    num = len(names)
    counts = np.asarray(counts, np.float64)
    if num == 0 or counts.shape != (num, num):
        raise ValueError(f"counts of shape {counts.shape} for {num} class names")
    shares = row_shares(counts)
    cell = cell_pixels(num)
    side = num * cell
    # A Figure with its own Agg canvas, not pyplot: no global figure registry, no backend
    # switch, nothing to close; the figure is garbage-collected with this frame.
    figure = Figure(dpi=DPI, facecolor="white")
    canvas = FigureCanvasAgg(figure)
    axes = figure.add_axes((0, 0, 1, 1))
    bar_axes = figure.add_axes((0, 0, 1, 1))
    cmap = colormaps[CMAP]
    image = axes.imshow(shares, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest",
                        aspect="equal")
    _label(axes, names, cell, counts.sum())
    texts = _write_shares(axes, shares, cmap, cell)
    bar = figure.colorbar(image, cax=bar_axes)
    bar.ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
    bar.ax.tick_params(labelsize=MAX_FONT_PT - 1)
    bar.set_label("share of the row (true class)", fontsize=MAX_FONT_PT)

    width, height = _fit(figure, axes, bar_axes, side)
    buffer = io.BytesIO()
    canvas.print_png(buffer)  # draws the figure at its final size

    # Cell centres from the data transform of that final draw: display y grows upward from
    # the bottom edge, the PNG's rows downward from the top.
    ticks = np.arange(num)
    rows, columns = np.meshgrid(ticks, ticks, indexing="ij")
    xy = axes.transData.transform(np.stack([columns.ravel(), rows.ravel()], axis=-1))
    centres = np.stack([height - xy[:, 1], xy[:, 0]], axis=-1)
    centres = np.clip(np.floor(centres), 0, [height - 1, width - 1]).astype(np.int64)
    return Rendering(
        png=buffer.getvalue(),
        cell_centres=centres.reshape(num, num, 2),
        row_labels=tuple(t.get_text() for t in axes.get_yticklabels()),
        column_labels=tuple(t.get_text() for t in axes.get_xticklabels()),
        cell_texts=texts)


def _fit(figure, axes, bar_axes, side: int) -> tuple[int, int]:
    """Sizes the figure to the matrix (``side`` px square) and its measured text; returns the
    picture's (width, height) in pixels.

    Fonts have fixed sizes in points and the DPI is fixed, so the labels' extents around the
    axes do not depend on the figure's size: place the axes anywhere, measure once, then size
    the figure to fit exactly. (``bbox_inches="tight"`` would crop after drawing and move the
    cells away from where the axes' transform puts them.)
    """
    provisional = 4 * side + 1000  # room on every side for any measured text
    origin = provisional // 2 - side // 2
    _place(figure, axes, bar_axes, side, provisional, provisional, origin, origin)
    renderer = figure.canvas.get_renderer()
    around = axes.get_tightbbox(renderer)
    bar_around = bar_axes.get_tightbbox(renderer)
    left = origin - around.x0
    bottom = origin - min(around.y0, bar_around.y0)
    top = max(around.y1, bar_around.y1) - (origin + side)
    right = max(bar_around.x1 - (origin + side + GAP + BAR_WIDTH),
                around.x1 - (origin + side + GAP + BAR_WIDTH), 0)
    x0 = math.ceil(PAD + left)
    y0 = math.ceil(PAD + bottom)
    width = x0 + side + GAP + BAR_WIDTH + math.ceil(right + PAD)
    height = y0 + side + math.ceil(top + PAD)
    _place(figure, axes, bar_axes, side, width, height, x0, y0)
    return width, height


def _place(figure, axes, bar_axes, side, width, height, x0, y0) -> None:
    """Figure of width x height px; the matrix's lower-left corner at (x0, y0) px."""
    figure.set_size_inches(width / DPI, height / DPI)
    axes.set_position((x0 / width, y0 / height, side / width, side / height))
    bar_axes.set_position(((x0 + side + GAP) / width, y0 / height, BAR_WIDTH / width,
                           side / height))


def render_png(counts: np.ndarray, names: Sequence[str]) -> bytes:
    """PNG bytes of the picture of a [C, C] confusion matrix of counts, C = len(names)."""
    return render(counts, names).png


def draw(counts: tf.Tensor, names: Sequence[str]) -> tf.Tensor:
    """uint8 [1, height, width, 3]: the picture of a [C, C] confusion matrix of counts (rows:
    true class, columns: predicted), C = len(names), as a graph op for an image summary.

    The counts are read when the op runs (at the end of an evaluation) and rendered in Python
    by ``render_png``; the names are fixed when the graph is built.
    """
    names = tuple(str(n) for n in names)

    def _png(values: np.ndarray) -> bytes:
        return render_png(values, names)

    png = tf.numpy_function(_png, [tf.convert_to_tensor(counts)], tf.string,
                            name="render_confusion_matrix")
    pixels = tf.io.decode_png(tf.reshape(png, []), channels=3)
    pixels = tf.expand_dims(pixels, 0)
    # The size is known only once rendered; the summary op needs rank 4 and the channels.
    pixels.set_shape([1, None, None, 3])
    return pixels
