"""Training: settings and flags, the CPU and precision, the ``train_and_evaluate`` driver, the
evaluator and cluster tasks, progress, guards, reports and the local cluster launcher."""
