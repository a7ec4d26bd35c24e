"""A Keras model turned into an estimator (``model_to_estimator``), trained and evaluated with
input functions, as estimator code did on TensorFlow 2.15, here on any TensorFlow from 2.15 to
2.21.

    pip install 'tf-estimator-compat[keras]'
    TF_USE_LEGACY_KERAS=1 python keras_to_estimator.py --model-dir DIR

``model_to_estimator`` takes a Keras 2 model: on TensorFlow 2.16 and later that is tf-keras
(the ``keras`` extra), which ``tf.keras`` is when ``TF_USE_LEGACY_KERAS=1`` is set before Python
starts. The model is a small classifier on synthetic data.
"""

import argparse
import sys

import tf_estimator_compat

tf_estimator_compat.install()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def data(seed: int, rows: int = 1024):
    """Points inside or outside a circle: a class a small network learns, seeded."""
    x = np.random.default_rng(seed).uniform(-1, 1, size=(rows, 2)).astype(np.float32)
    return x, (np.sum(x * x, axis=1) < 0.5).astype(np.int32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    if not hasattr(tf.keras, "estimator"):  # Keras 3 has none
        sys.exit(f"keras_to_estimator.py: error: tf.keras is {tf.keras.__name__}, not Keras 2: "
                 f"pip install tf-keras and set TF_USE_LEGACY_KERAS=1 before Python starts")

    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(2,), name="point"),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(2),
    ])
    model.compile(optimizer=tf.keras.optimizers.legacy.Adam(0.05),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    estimator = tf.keras.estimator.model_to_estimator(keras_model=model,
                                                      model_dir=args.model_dir)

    def input_fn(seed: int, train: bool):
        x, y = data(seed)
        dataset = tf.data.Dataset.from_tensor_slices(({"point": x}, y))
        return (dataset.shuffle(1024, seed=seed).repeat() if train else dataset).batch(32)

    estimator.train(lambda: input_fn(1, True), max_steps=args.steps)
    result = estimator.evaluate(lambda: input_fn(2, False))
    print(f"accuracy {result['accuracy']:.4f} at step {result['global_step']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
