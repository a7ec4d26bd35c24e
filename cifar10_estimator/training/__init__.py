"""Training: the ``train_and_evaluate`` driver and its parts: a task's start (``start``), what
Estimator is given (``specs``), what runs inside it (progress, preemption, the lock's fence,
precise batch norm), the end of training (``end``: the result, the final export and report)
and the run summary."""
