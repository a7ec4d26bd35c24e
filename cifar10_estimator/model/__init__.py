"""The model: hyperparameters, the ResNet, towers and device placement, the ``model_fn`` with
its schedules and metrics, and what a checkpoint holds."""
