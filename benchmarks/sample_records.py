"""The benchmarks' shared input: the built-in sample data as TFRecords, made by the real CLI."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_sample_records(work: str) -> str:
    """Runs ``tools/generate_tfrecords.py --sample`` into ``work/data``; returns that folder."""
    data_dir = os.path.join(work, "data")
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "generate_tfrecords.py"),
                    "--data-dir", data_dir, "--sample"], check=True, capture_output=True)
    return data_dir
