"""Several tasks: ``TF_CONFIG`` parsed into a role, the other tasks (waits, parameter servers),
the all-reduce strategies, the evaluator task's loop, and the launchers that start a cluster's
tasks here or on a Ray cluster's nodes (its layout, its local processes, its Ray actors)."""
