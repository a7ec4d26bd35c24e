"""A canned estimator on feature columns, trained from a CSV file, exported with a parsing
receiver and asked for predictions through the SavedModel, as estimator code did on
TensorFlow 2.15, here on any TensorFlow from 2.15 to 2.21.

    pip install 'tf-estimator-compat[keras]'
    TF_USE_LEGACY_KERAS=1 python canned_csv.py --csv FILE.csv --label COLUMN --model-dir DIR

The CSV's first row names its columns; a column whose values are all numbers is a numeric
feature, any other a categorical one (its vocabulary read from the file); ``--label`` is the
class, 0 or 1. Without ``--csv`` the example writes a small CSV of its own first, so that it
runs as it is. The canned estimators build Keras 2 layers: on TensorFlow 2.16 and later they
need tf-keras (the ``keras`` extra) and ``TF_USE_LEGACY_KERAS=1`` before Python starts.
"""

import argparse
import csv
import os
import random
import sys

import tf_estimator_compat

tf_estimator_compat.install()  # before or after TensorFlow loads; once a process

import tensorflow as tf  # noqa: E402


def write_toy_csv(path: str, rows: int = 600, seed: int = 0) -> None:
    """Two numbers and a colour per row; the class is whether a weighted sum of them passes a
    threshold, which a linear model learns."""
    draw = random.Random(seed)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["x1", "x2", "colour", "label"])
        for _ in range(rows):
            x1, x2, colour = draw.random(), draw.random(), draw.choice(["red", "green", "blue"])
            score = x1 + 2 * x2 + {"red": 0.6, "green": 0.0, "blue": -0.6}[colour]
            out.writerow([f"{x1:.4f}", f"{x2:.4f}", colour, int(score > 1.5)])


def feature_columns(path: str, label: str) -> list:
    """A numeric column for each all-number column of the CSV, an indicator of its vocabulary
    for each other one."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or label not in rows[0]:
        sys.exit(f"canned_csv.py: error: {path} has no column {label!r}")
    columns = []
    for name in rows[0]:
        if name == label:
            continue
        values = [row[name] for row in rows]
        try:
            [float(v) for v in values]
            columns.append(tf.feature_column.numeric_column(name))
        except ValueError:
            vocabulary = tf.feature_column.categorical_column_with_vocabulary_list(
                name, sorted(set(values)))
            columns.append(tf.feature_column.indicator_column(vocabulary))
    return columns


def input_fn(path: str, label: str, batch_size: int, epochs=None, shuffle: bool = True):
    def make():
        return tf.data.experimental.make_csv_dataset(
            path, batch_size, label_name=label, num_epochs=epochs, shuffle=shuffle,
            shuffle_seed=0)
    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", help="the data (default: a toy CSV written into --model-dir)")
    parser.add_argument("--label", default="label", help="the class column, 0 or 1")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    os.makedirs(args.model_dir, exist_ok=True)
    path = args.csv or os.path.join(args.model_dir, "toy.csv")
    if not args.csv:
        write_toy_csv(path)

    columns = feature_columns(path, args.label)
    # (Its own optimizer, FTRL; one of yours must be a tf.keras.optimizers.legacy one, as on
    # TensorFlow 2.15.)
    estimator = tf.estimator.LinearClassifier(columns, model_dir=args.model_dir)
    estimator.train(input_fn(path, args.label, 32), max_steps=args.steps)
    metrics = estimator.evaluate(input_fn(path, args.label, 100, epochs=1, shuffle=False))
    print(f"accuracy {metrics['accuracy']:.4f} at step {metrics['global_step']}")

    # The export takes serialized tf.Example protos, as TensorFlow Serving's users send them.
    receiver = tf.estimator.export.build_parsing_serving_input_receiver_fn(
        tf.feature_column.make_parse_example_spec(columns))
    export = estimator.export_saved_model(os.path.join(args.model_dir, "export"), receiver)
    predict = tf.saved_model.load(export).signatures["predict"]
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))[:6]
    examples = []
    for row in rows:
        features = {}
        for name, value in row.items():
            if name == args.label:
                continue
            try:
                features[name] = tf.train.Feature(float_list=tf.train.FloatList(
                    value=[float(value)]))
            except ValueError:
                features[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[value.encode()]))
        examples.append(tf.train.Example(features=tf.train.Features(feature=features))
                        .SerializeToString())
    classes = predict(examples=tf.constant(examples))["class_ids"].numpy().ravel()
    print(f"export {export.decode() if isinstance(export, bytes) else export}")
    print("predicted", " ".join(map(str, classes)), "labels",
          " ".join(row[args.label] for row in rows))


if __name__ == "__main__":
    main()
