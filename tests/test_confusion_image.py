"""The labelled confusion-matrix picture: its names, shades and percentages, pixel by pixel."""

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import bitmap_font as font, confusion_image

NAMES = ["cat", "Dog", "a_rather_long_class_name"]
COUNTS = np.array([[4, 0, 0], [1, 3, 0], [0, 0, 0]])


def test_the_font_draws_known_glyphs_upper_cases_and_marks_unknown_characters():
    mask = font.render("Ab\u00e9")
    assert mask.shape == (font.LINE_HEIGHT, 3 * font.ADVANCE)
    assert not mask[0].any() and not mask[:, font.GLYPH_WIDTH].any()  # spacing stays blank
    cells = [mask[1:1 + font.GLYPH_HEIGHT, i * font.ADVANCE:i * font.ADVANCE + font.GLYPH_WIDTH]
             for i in range(3)]
    assert (cells[0] == font.glyph("A")).all() and (cells[1] == font.glyph("B")).all()
    assert (cells[2] == font.glyph("?")).all()
    assert len({font.glyph(c).tobytes() for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"}) == 36
    assert font.render("abcdefgh", max_chars=5).shape[1] == 5 * font.ADVANCE
    assert (font.render("abcdefgh", max_chars=5) == font.render("abcd.")).all()


@pytest.fixture(scope="module")
def picture():
    return confusion_image.draw(tf.constant(COUNTS, tf.float32), NAMES).numpy()


def _ink(region: np.ndarray, colour=(0, 0, 0)) -> np.ndarray:
    return (region == colour).all(axis=-1)


def test_rows_and_columns_carry_the_class_names(picture):
    plan = confusion_image.layout(NAMES)
    assert picture.shape == (1, *plan.canvas.shape)
    image = picture[0]
    cell = plan.cell
    for i, name in enumerate(NAMES):
        label = font.render(name, confusion_image.MAX_LABEL_CHARS)
        top = plan.top + i * cell + (cell - font.LINE_HEIGHT) // 2
        left = plan.left - 3 - label.shape[1]
        row_label = image[top:top + label.shape[0], left:left + label.shape[1]]
        assert (_ink(row_label) == label).all(), name
        upward = np.rot90(label)
        top = plan.top - 3 - upward.shape[0]
        left = plan.left + i * cell + (cell - font.LINE_HEIGHT) // 2
        column_label = image[top:top + upward.shape[0], left:left + upward.shape[1]]
        assert (_ink(column_label) == upward).all(), name
    legend = font.render(confusion_image.LEGEND)
    assert (_ink(image[:legend.shape[0], 1:1 + legend.shape[1]]) == legend).all()


def _cell(image, plan, row, column):
    top, left = plan.top + row * plan.cell, plan.left + column * plan.cell
    return image[top:top + plan.cell, left:left + plan.cell]


def _number(cell: np.ndarray, colour) -> np.ndarray:
    """The ink of the number written in a cell, cut to the 3-character box."""
    top = (len(cell) - font.GLYPH_HEIGHT) // 2
    left = (len(cell) - (3 * font.ADVANCE - 1)) // 2
    return _ink(cell, colour)[top - 1:top - 1 + font.LINE_HEIGHT,
                              left:left + 3 * font.ADVANCE]


def test_cells_are_shaded_by_their_share_of_the_row_and_say_it_in_percent(picture):
    plan = confusion_image.layout(NAMES)
    assert plan.show_numbers
    image = picture[0]
    white, black = (255, 255, 255), (0, 0, 0)
    full = _cell(image, plan, 0, 0)  # 4 of 4: the darkest shade, "100" in white
    assert (full[0, 0] == confusion_image.DARK).all()
    assert (_number(full, white) == font.render("100")).all()
    quarter = _cell(image, plan, 1, 0)  # 1 of 4: a light shade, " 25" in black
    expected = np.round(255 + (np.array(confusion_image.DARK) - 255) * 0.25)
    assert (quarter[0, 0] == expected).all()
    assert (_number(quarter, black) == font.render(" 25")).all()
    most = _cell(image, plan, 1, 1)  # 3 of 4: dark, " 75" in white
    assert (_number(most, white) == font.render(" 75")).all()
    empty = _cell(image, plan, 2, 2)  # a class with no images: white, "  0"
    assert (empty[0, 0] == white).all()
    assert (_number(empty, black) == font.render("  0")).all()


def test_a_hundred_classes_keep_every_label_and_drop_the_numbers():
    names = [f"class_{i}" for i in range(100)]
    plan = confusion_image.layout(names)
    assert plan.cell == font.LINE_HEIGHT and not plan.show_numbers
    image = confusion_image.draw(tf.eye(100) * 5, names).numpy()[0]
    assert image.shape == plan.canvas.shape
    assert (_cell(image, plan, 99, 99)[0, 0] == confusion_image.DARK).all()
    assert (_cell(image, plan, 99, 98)[0, 0] == (255, 255, 255)).all()


def test_it_is_a_graph_op_over_a_variable_as_the_evaluation_uses_it():
    with tf.Graph().as_default():
        counts = tf.compat.v1.get_local_variable("counts", [3, 3], tf.float32,
                                                 initializer=tf.compat.v1.zeros_initializer())
        update = tf.compat.v1.assign_add(counts, tf.constant(COUNTS, tf.float32))
        summary = tf.compat.v1.summary.image("confusion_matrix",
                                             confusion_image.draw(counts, NAMES))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.local_variables_initializer())
            sess.run(update)
            value = tf.compat.v1.Summary.FromString(sess.run(summary)).value[0]
    encoded = tf.io.decode_png(value.image.encoded_image_string).numpy()
    np.testing.assert_array_equal(encoded, confusion_image.draw(
        tf.constant(COUNTS, tf.float32), NAMES).numpy()[0])
