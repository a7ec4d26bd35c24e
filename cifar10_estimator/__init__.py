"""Train, evaluate and serve CIFAR-10 classifiers (a ResNet, or the original tutorial's CNN)
with tf.estimator.

Five foundations every layer may use (``errors``, ``cli``, ``storage``, ``logs``, ``engines``:
the managed engines' conventions), then the settings' home,
the subpackages along the data's path up to the training loop, and the rooms that outlive one
trainer process; each imports only from those before it:

- ``config``: every setting once, its flag, its checks, the models', strategies' and
  recipes' overlays on the defaults, a task's role and its plan;
- ``data``: python batches, archives, sample data and image folders -> TFRecords, and the
  ``tf.data`` input pipeline that reads them back;
- ``model``: the networks (the ResNet and the first tutorial's CNN), towers, the Estimator
  ``model_fn``, its schedules and metrics, and what a checkpoint holds;
- ``serving``: the SavedModel export and its warm-up requests, the check of an export before
  it is loaded, and the client that classifies image files with it;
- ``platform``: the machine: its CPU and oneDNN, the precision that fits it (probed and
  cached), the local cluster's private network namespace;
- ``jobdir``: the job dir's checks, its one-trainer lock and its settings record;
- ``task``: inside one task of a cluster: ``TF_CONFIG``'s role, the other tasks' waits and
  parameter servers, the all-reduce strategies, the evaluator task's loop;
- ``evaluation``: evaluating an export or a checkpoint once, and the evaluation report;
- ``training``: a task's start (its plan resolved), the ``train_and_evaluate`` driver, progress,
  the lock holder's fence, preemption, precise batch norm, the end of training (result, final
  export and report) and the run summary;
- ``launch``: a cluster's tasks launched for as long as the job runs: their layout, the launch
  loop and where it places them (this host's processes, Ray actors);
- ``sweeps``: a sweep's trials and their records, run by Ray Tune (the driver's side and the
  trial's), and TensorBoard's HParams summaries.

The top-level modules beside them are the commands (``train``/``__main__``, ``generate``,
``predict``, ``evaluate``, ``convert``, ``demo``, ``cluster``, ``sweep``).
docs/architecture.md draws the cut.
Importing the package is cheap: nothing here imports TensorFlow, and nothing changes the
import system. The estimator layer, which lets ``tf.estimator`` load on TensorFlow 2.16 and
newer (``tf_estimator_compat``, a distribution of its own in ``tf-estimator-compat/``), is
installed by a process's set-up (``platform.process.prepare_process``).
"""

__version__ = "0.1.0"
