"""``python -m cifar10_estimator``: the trainer's command line (see ``train``)."""

from cifar10_estimator.train import command

command()
