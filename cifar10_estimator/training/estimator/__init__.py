"""The Estimator-facing surface in one room: everything TensorFlow's Estimator calls back, and
everything that calls it.

The model_fn (``model_fn``, with ``sync_replicas``' hook for ``SyncReplicasOptimizer``), the
input_fns (``input_fn``), the session hooks and checkpoint listeners a training or evaluation
session runs (``progress``, ``preemption_hooks``, ``fence``, ``precise_bn``,
``cluster_hooks``) and the exporter Estimator calls after each evaluation (``exporter``); the
RunConfig, the Estimator, the specs and the ``train_and_evaluate`` call (``specs``), and an
evaluator task's loop of ``Estimator.evaluate`` calls (``evaluate_loop``). When a TensorFlow
release changes what Estimator calls or how, this room and the compatibility layer
(``tf_estimator_compat``, ``tf-estimator-compat/``) are the two places to open; the rooms below it reach the model through
``model.model_settings`` and know nothing of Estimator, and the driver above
(``training.driver``) hands these parts a started task.
"""
