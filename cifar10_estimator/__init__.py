"""Train, evaluate and serve a CIFAR-10 ResNet with tf.estimator.

The package turns CIFAR-10's python batches into TFRecords (``generate``), reads them with a
``tf.data`` pipeline (``dataset``), builds a multi-tower ResNet ``model_fn`` (``resnet``,
``towers``, ``model_fn``), drives ``tf.estimator.train_and_evaluate`` from a command line
(``main``, ``train``) and exports a SavedModel that ``predict`` serves. Importing the package is
cheap: nothing here imports TensorFlow.
"""

__version__ = "0.1.0"
