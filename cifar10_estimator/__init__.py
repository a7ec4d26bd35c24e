"""Train, evaluate and serve CIFAR-10 ResNets with tf.estimator.

The package follows the data's path; each subpackage imports only from those before it:

- ``data``: python batches, archives, sample data and image folders -> TFRecords, and the
  ``tf.data`` input pipeline that reads them back;
- ``model``: the networks (the ResNet and the first tutorial's CNN), towers, the Estimator ``model_fn``, its metrics and checkpoints;
- ``serving``: the SavedModel export and its clients;
- ``training``: settings and flags, the ``train_and_evaluate`` driver, clusters, progress and
  reports.

The top-level modules are the commands (``train``/``__main__``, ``generate``, ``predict``,
``evaluate``, ``demo``, ``cluster``) and four foundations every layer uses (``errors``,
``cli``, ``storage``, ``logs``).
docs/architecture.md draws the cut. Importing the package is cheap: nothing here imports
TensorFlow.
"""

__version__ = "0.1.0"
