"""The Estimator-facing surface: everything TensorFlow's Estimator calls back, in one room.

The model_fn (``model_fn``, with ``sync_replicas``' hook for ``SyncReplicasOptimizer``), the
input_fns (``input_fn``), the session hooks and checkpoint listeners a training or evaluation
session runs (``progress``, ``preemption_hooks``, ``fence``, ``precise_bn``,
``cluster_hooks``) and the exporter Estimator calls after each evaluation (``exporter``). When
a TensorFlow release changes what Estimator calls or how, this room and the compatibility
layer (``estimator_compat``) are the two places to open; the rooms below it reach the model
through ``model.model_settings`` and know nothing of Estimator's callbacks, and the rooms above
(``training``) assemble these parts into RunConfig, specs and ``train_and_evaluate``.
"""
