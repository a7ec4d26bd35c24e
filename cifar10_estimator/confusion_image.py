"""The confusion matrix as a labelled picture for TensorBoard's image tab.

Rows are true classes and columns predicted ones, labelled with the class names (rows on the
left, columns written upward above them) under a one-line legend. Each cell is shaded from
white to dark blue by its share of its row and, where cells are large enough (20 classes or
fewer), shows that share in whole percent. The labels are fixed when the graph is built (numpy
and ``bitmap_font``); the cells are drawn by TensorFlow ops from the running counts, so the
picture is an evaluation summary like any other, with no plotting library.
"""

import dataclasses
from typing import Sequence

import numpy as np
import tensorflow as tf

from cifar10_estimator import bitmap_font as font

MAX_LABEL_CHARS = 16  # longer class names are cut (the text summary lists them whole)
LEGEND = "ROWS: TRUE CLASS  COLUMNS: PREDICTED  CELLS: % OF ROW"
WHITE = (255, 255, 255)
# The darkest colour of ColorBrewer's sequential "Blues" scheme (Brewer, colorbrewer2.org,
# #08306b), readable under black and white ink alike.
DARK = (8, 48, 107)
BORDER = (160, 160, 160)
_MARGIN = 3  # pixels between labels and the matrix
_DIGITS = 3  # "100"
_NUMBER_WIDTH = _DIGITS * font.ADVANCE - 1


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where everything goes; ``canvas`` is the picture without its cells."""

    cell: int  # pixels per cell side
    top: int  # first pixel row of the matrix
    left: int  # first pixel column of the matrix
    show_numbers: bool
    canvas: np.ndarray  # uint8 [height, width, 3]: legend, labels, border; white cells


def cell_size(num_classes: int) -> int:
    """28 px cells for 10 classes (a 280 px matrix); smaller ones keep the matrix near 400 px,
    but never under a text line, so every row label stays readable (100 classes: 900 px)."""
    return max(font.LINE_HEIGHT, min(28, 400 // num_classes))


def _paint(canvas: np.ndarray, mask: np.ndarray, top: int, left: int, color) -> None:
    region = canvas[top:top + mask.shape[0], left:left + mask.shape[1]]
    region[mask[:region.shape[0], :region.shape[1]]] = color


def layout(names: Sequence[str]) -> Layout:
    """The picture's geometry and its fixed pixels for these class names."""
    num = len(names)
    cell = cell_size(num)
    labels = [font.render(name, MAX_LABEL_CHARS) for name in names]
    label_width = max(label.shape[1] for label in labels)
    legend = font.render(LEGEND)
    left = label_width + 2 * _MARGIN
    top = font.LINE_HEIGHT + label_width + 2 * _MARGIN
    side = num * cell
    height = top + side + _MARGIN
    width = max(left + side + _MARGIN, legend.shape[1] + 2)
    canvas = np.full((height, width, 3), 255, np.uint8)
    _paint(canvas, legend, 0, 1, (0, 0, 0))
    # A one-pixel frame around the matrix, so empty rows still show where it is.
    canvas[top - 1, left - 1:left + side + 1] = BORDER
    canvas[top + side, left - 1:left + side + 1] = BORDER
    canvas[top - 1:top + side + 1, left - 1] = BORDER
    canvas[top - 1:top + side + 1, left + side] = BORDER
    for i, label in enumerate(labels):
        # Row labels right-aligned against the matrix, centred on their row.
        _paint(canvas, label, top + i * cell + (cell - font.LINE_HEIGHT) // 2,
               left - _MARGIN - label.shape[1], (0, 0, 0))
        # Column labels turned a quarter left (read upward), ending just above the matrix.
        upward = np.rot90(label)
        _paint(canvas, upward, top - _MARGIN - upward.shape[0],
               left + i * cell + (cell - font.LINE_HEIGHT) // 2, (0, 0, 0))
    return Layout(cell, top, left, cell >= _NUMBER_WIDTH + 2, canvas)


def _percent_ink(shares: tf.Tensor, cell: int) -> tf.Tensor:
    """Bool [C*cell, C*cell]: each cell's share as a centred whole percent (no leading zeros)."""
    table = np.stack([font.glyph(d) for d in "0123456789"]
                     + [np.zeros((font.GLYPH_HEIGHT, font.GLYPH_WIDTH), bool)])
    blank = 10
    percent = tf.cast(tf.round(100.0 * shares), tf.int32)  # [C, C]
    digits = tf.stack([
        tf.where(percent >= 100, percent // 100, blank),
        tf.where(percent >= 10, (percent // 10) % 10, blank),
        percent % 10], axis=-1)  # [C, C, 3]: hundreds, tens, ones
    glyphs = tf.gather(tf.constant(table, tf.uint8), digits)  # [C, C, 3, 7, 5]
    glyphs = tf.pad(glyphs, [[0, 0]] * 4 + [[0, font.ADVANCE - font.GLYPH_WIDTH]])
    num = tf.shape(shares)[0]
    text = tf.reshape(tf.transpose(glyphs, [0, 1, 3, 2, 4]),
                      [num, num, font.GLYPH_HEIGHT, _DIGITS * font.ADVANCE])
    top = (cell - font.GLYPH_HEIGHT) // 2
    left = (cell - _NUMBER_WIDTH) // 2
    cells = tf.pad(text, [[0, 0], [0, 0],
                          [top, cell - top - font.GLYPH_HEIGHT],
                          [left, cell - left - _DIGITS * font.ADVANCE]])  # [C, C, cell, cell]
    return tf.reshape(tf.transpose(cells, [0, 2, 1, 3]), [num * cell, num * cell]) > 0


def draw(counts: tf.Tensor, names: Sequence[str]) -> tf.Tensor:
    """uint8 [1, height, width, 3]: the labelled picture of a [C, C] confusion matrix of
    counts (rows: true class, columns: predicted), C = len(names)."""
    plan = layout(names)
    num, cell = len(names), plan.cell
    counts = tf.cast(tf.reshape(counts, [num, num]), tf.float32)
    shares = counts / tf.maximum(tf.reduce_sum(counts, axis=1, keepdims=True), 1.0)
    white, dark = tf.constant(WHITE, tf.float32), tf.constant(DARK, tf.float32)
    colours = white + (dark - white) * shares[:, :, None]  # [C, C, 3]
    pixels = tf.repeat(tf.repeat(colours, cell, axis=0), cell, axis=1)
    if plan.show_numbers:
        # Black ink on light cells, white ink on dark ones.
        ink = tf.where(shares[:, :, None] < 0.5, 0.0, 255.0) * tf.ones([1, 1, 3])
        ink = tf.repeat(tf.repeat(ink, cell, axis=0), cell, axis=1)
        pixels = tf.where(_percent_ink(shares, cell)[:, :, None], ink, pixels)
    height, width = plan.canvas.shape[:2]
    side = num * cell
    placed = tf.pad(tf.cast(tf.round(pixels), tf.uint8),
                    [[plan.top, height - plan.top - side],
                     [plan.left, width - plan.left - side], [0, 0]])
    inside = np.zeros((height, width, 1), bool)
    inside[plan.top:plan.top + side, plan.left:plan.left + side] = True
    return tf.where(inside, placed, tf.constant(plan.canvas))[None]
