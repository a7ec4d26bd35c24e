"""The confusion-matrix picture, rendered for real: its size, shades, text and graph op."""

import types
import warnings

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator.model import confusion_image

CIFAR10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck"]
BLUES_DARKEST = np.array([8, 48, 107])  # Blues at 1.0 (ColorBrewer #08306b)


def _decode(png: bytes) -> np.ndarray:
    return tf.io.decode_png(png, channels=3).numpy()


def _pitch(rendering) -> int:
    """Pixels from one cell centre to the next (cells are square)."""
    centres = rendering.cell_centres
    return int(centres[0, 1, 1] - centres[0, 0, 1])


def _background(image, rendering, row, column) -> np.ndarray:
    """A cell's colour away from its number: a pixel a third of a cell off its centre."""
    offset = _pitch(rendering) // 3
    y, x = rendering.cell_centres[row, column]
    return image[y + offset, x + offset].astype(int)


def _is_dark(rgb) -> bool:
    return bool(np.abs(rgb - BLUES_DARKEST).max() <= 12)


def _is_white(rgb) -> bool:
    return bool(rgb.min() >= 240)


@pytest.fixture(scope="module")
def diagonal():
    """Ten classes of different sizes, every image right."""
    counts = np.diag(np.arange(1, 11) * 10.0)
    rendering = confusion_image.render(counts, CIFAR10)
    return rendering, _decode(rendering.png)


@pytest.fixture(scope="module")
def hundred():
    names = [f"class_{i}" for i in range(100)]
    rendering = confusion_image.render(np.eye(100) * 5, names)
    return rendering, _decode(rendering.png)


def test_ten_classes_make_a_png_about_700_px_wide(diagonal):
    rendering, image = diagonal
    height, width, channels = image.shape
    assert channels == 3 and image.dtype == np.uint8
    assert 600 <= width <= 800 and 500 <= height <= 800
    assert rendering.cell_centres.shape == (10, 10, 2)
    assert 40 <= _pitch(rendering)  # room for "100" in each cell


def test_a_hundred_classes_make_a_larger_png_with_a_line_per_class(diagonal, hundred):
    rendering, image = hundred
    small = diagonal[1]
    assert image.shape[0] > 1.5 * small.shape[0] and image.shape[1] > 1.5 * small.shape[1]
    assert _pitch(rendering) >= 12  # a tick label's line at 8 pt and 100 dpi
    centres = rendering.cell_centres
    assert (0 <= centres).all() and (centres[..., 0] < image.shape[0]).all()
    assert (centres[..., 1] < image.shape[1]).all()
    # Too many cells for numbers; the centres show the shades themselves.
    assert all(text == "" for row in rendering.cell_texts for text in row)
    assert _is_dark(image[tuple(centres[99, 99])].astype(int))
    assert _is_white(image[tuple(centres[99, 98])].astype(int))
    assert _is_white(image[tuple(centres[0, 99])].astype(int))


def test_cells_are_shaded_by_their_share_of_the_row(diagonal):
    rendering, image = diagonal
    for i in range(10):
        assert _is_dark(_background(image, rendering, i, i)), i
        assert _is_white(_background(image, rendering, i, (i + 1) % 10)), i
    # Class 0 always taken for class 1: the shade moves off the diagonal.
    counts = np.diag(np.arange(1, 11) * 10.0)
    counts[0] = 0
    counts[0, 1] = 10
    swapped = confusion_image.render(counts, CIFAR10)
    image = _decode(swapped.png)
    assert _is_white(_background(image, swapped, 0, 0))
    assert _is_dark(_background(image, swapped, 0, 1))
    assert _is_dark(_background(image, swapped, 1, 1))


def test_shares_not_counts_set_the_shade_and_the_percentages():
    # A big class right half the time, a small one always right, one wrong a quarter.
    counts = np.array([[100, 100, 0], [0, 10, 0], [1, 0, 3]], np.float64)
    rendering = confusion_image.render(counts, ["big", "small", "quarter"])
    image = _decode(rendering.png)
    assert rendering.cell_texts == (("50", "50", "0"), ("0", "100", "0"), ("25", "0", "75"))
    half = _background(image, rendering, 0, 0)
    full = _background(image, rendering, 1, 1)
    quarter = _background(image, rendering, 2, 0)
    most = _background(image, rendering, 2, 2)
    assert _is_dark(full) and not _is_dark(half)
    brightness = [int(c.sum()) for c in (full, most, half, quarter)]
    assert brightness == sorted(brightness) and len(set(brightness)) == 4
    # Ink that reads on its cell: white on the full cell, black on a light one.
    pitch = _pitch(rendering)
    for (row, column), ink in [((1, 1), "white"), ((2, 0), "black")]:
        y, x = rendering.cell_centres[row, column]
        patch = image[y - pitch // 4:y + pitch // 4, x - pitch // 4:x + pitch // 4].astype(int)
        if ink == "white":
            assert (patch.min(axis=-1) >= 240).any()
        else:
            assert (patch.max(axis=-1) <= 60).any()


def test_a_rare_mistake_is_not_rounded_away():
    # 1 of 200: 0.5 % reads "<1" and its row's 99.5 % reads ">99", not "0" and "100".
    counts = np.array([[199, 1], [0, 200]], np.float64)
    assert confusion_image.render(counts, ["disc", "square"]).cell_texts == (
        (">99", "<1"), ("0", "100"))


def test_numbers_up_to_twenty_classes_only():
    twenty = confusion_image.render(np.eye(20), [f"c{i}" for i in range(20)])
    assert twenty.cell_texts[0][:2] == ("100", "0")
    more = confusion_image.render(np.eye(21), [f"c{i}" for i in range(21)])
    assert set(sum(more.cell_texts, ())) == {""}


def test_class_names_are_the_tick_labels_as_written():
    names = ["cat", "a_rather_long_class_name_in_lower_case", "caf\u00e9 cr\u00e8me \u03b1\u03b2",
             "price $5 and $6", "not math: $\\unknowncommand$"]
    counts = np.arange(25, dtype=np.float64).reshape(5, 5)
    with warnings.catch_warnings():
        # A glyph missing from DejaVu Sans would warn; "$...$" read as a formula would fail
        # on the unknown command.
        warnings.simplefilter("error")
        rendering = confusion_image.render(counts, names)
    assert rendering.row_labels == tuple(names)
    assert rendering.column_labels == tuple(names)
    assert _decode(rendering.png).shape[1] > 600


def test_rows_without_images_stay_white_and_zero():
    counts = np.zeros((10, 10))
    counts[3, 3] = 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division by zero
        shares = confusion_image.row_shares(counts)
        rendering = confusion_image.render(counts, CIFAR10)
    assert np.isfinite(shares).all() and shares.sum() == 1.0
    image = _decode(rendering.png)
    assert _is_dark(_background(image, rendering, 3, 3))
    for row in (0, 9):
        assert rendering.cell_texts[row] == ("0",) * 10
        assert _is_white(_background(image, rendering, row, row))
    # Nothing counted yet, as at the start of an evaluation.
    assert _decode(confusion_image.render_png(np.zeros((10, 10)), CIFAR10)).shape[2] == 3


def test_wrong_shapes_are_refused():
    with pytest.raises(ValueError):
        confusion_image.render_png(np.zeros((3, 3)), ["a", "b"])


def test_it_is_a_graph_op_over_a_variable_as_the_evaluation_uses_it():
    counts = np.array([[4, 0, 0], [1, 3, 0], [0, 0, 0]], np.float32)
    names = ["cat", "dog", "a_rather_long_class_name"]
    with tf.Graph().as_default():
        variable = tf.compat.v1.get_local_variable(
            "counts", [3, 3], tf.float32, initializer=tf.compat.v1.zeros_initializer())
        update = tf.compat.v1.assign_add(variable, tf.constant(counts))
        picture = confusion_image.draw(variable, names)
        assert picture.dtype == tf.uint8 and picture.shape.as_list() == [1, None, None, 3]
        summary = tf.compat.v1.summary.image("confusion_matrix", picture, collections=[])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.local_variables_initializer())
            sess.run(update)
            pixels, serialized = sess.run([picture, summary])
    expected = _decode(confusion_image.render_png(counts, names))
    assert pixels.dtype == np.uint8 and pixels.shape == (1, *expected.shape)
    np.testing.assert_array_equal(pixels[0], expected)
    value = tf.compat.v1.Summary.FromString(serialized).value[0]
    assert (value.image.height, value.image.width) == expected.shape[:2]
    np.testing.assert_array_equal(_decode(value.image.encoded_image_string), expected)


def test_matplotlib_is_imported_only_to_render():
    assert not [name for name, value in vars(confusion_image).items()
                if isinstance(value, types.ModuleType) and value.__name__.startswith("matplotlib")]
