"""Several tasks: the cluster's roles and waits, parameter servers, the evaluator task's loop and
the local cluster launcher."""
