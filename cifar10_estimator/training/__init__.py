"""Training: the ``train_and_evaluate`` driver and what runs inside it: progress, preemption,
precise batch norm, and the run summary."""
