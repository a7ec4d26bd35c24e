"""``python -m cifar10_estimator``: the trainer's command line (see ``main``)."""

import sys

from cifar10_estimator.main import main

sys.exit(main())
