#!/usr/bin/env python3
"""Convert CIFAR-10's python batches to TFRecords: ``python tools/generate_tfrecords.py --help``.

A thin wrapper around ``cifar10_estimator.generate.command`` (also installed as the console script
``cifar10-generate-tfrecords``).
"""

import os
import sys

try:
    from cifar10_estimator.generate import command
except ImportError:
    # Run from a checkout that is not installed: use the package beside this folder.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from cifar10_estimator.generate import command

if __name__ == "__main__":
    command()
