"""The model: the networks ``--model`` picks (the ResNet and the original tutorial's CNN, both
built through ``networks``), towers and device placement, the ``model_fn`` with its
learning-rate schedules, metrics and confusion-matrix picture, the ``SyncReplicasOptimizer``
hooks, and what a checkpoint holds. The hyperparameters it reads are ``config``'s."""
