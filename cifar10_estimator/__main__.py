"""``python -m cifar10_estimator``: the trainer's command line (see ``train``)."""

import sys

from cifar10_estimator.train import main

sys.exit(main())
