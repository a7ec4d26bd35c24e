"""Time to the first training step: graph build, session start, first step, in a fresh process.

Each run is a new Python process that trains a ResNet (default 44) for one step through the
pieces the package's driver uses (Estimator, input pipeline, model_fn, hooks) and reports
where the time went: importing TensorFlow, building the graph, creating the session (variable
initialisation, the step-0 checkpoint, graph.pbtxt) and running the first step (graph
optimisation, the first input batch). Median of several runs.

    python benchmarks/startup_bench.py --depth 44 --runs 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from sample_records import make_sample_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = r"""
import json, os, sys, time
t_start = time.perf_counter()
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
from cifar10_estimator.platform.process import prepare_process
prepare_process(os.environ)  # as the trainer does: oneDNN, and tf.estimator's compat layer
import tensorflow as tf
t_import = time.perf_counter()
from cifar10_estimator.data import schema
from cifar10_estimator.data.pipeline import Cifar10DataSet
from cifar10_estimator.training.estimator.model_fn import make_model_fn
from cifar10_estimator.config import plan
from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import Settings
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.platform.session import session_config

data_dir, job_dir, depth, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
stamps = {}

class Stamp(tf.estimator.SessionRunHook):
    def begin(self):
        stamps["graph"] = time.perf_counter()
    def after_create_session(self, session, coord):
        stamps["session"] = time.perf_counter()
    def after_run(self, run_context, run_values):
        stamps.setdefault("step", time.perf_counter())

config = Settings.of(data_dir=data_dir, job_dir=job_dir, num_layers=depth,
                     precision=extra[0] if extra else "fp32")
rc = tf.estimator.RunConfig(model_dir=job_dir, session_config=session_config(config.devices),
                            checkpoint_save_graph_def=False, log_step_count_steps=None)
settings = ModelSettings.of(plan.resolve(
    Role(), config.model, config.schedule, config.devices, config.cluster,
    dataset="cifar10", class_names=schema.CLASS_NAMES,
    train_records=Cifar10DataSet(data_dir, "train").num_examples(),
    precision=config.devices.precision), config.model, data_dir)
estimator = tf.estimator.Estimator(make_model_fn(settings), config=rc)
t_begin = time.perf_counter()
estimator.train(lambda: Cifar10DataSet(data_dir, "train").make_batch(128), max_steps=1,
                hooks=[Stamp()])
print(json.dumps({"import_tf": t_import - t_start, "graph_build": stamps["graph"] - t_begin,
                  "session_start": stamps["session"] - stamps["graph"],
                  "first_step": stamps["step"] - stamps["session"],
                  "to_first_step": stamps["step"] - t_start}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=44)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="c10start.")
    data_dir = make_sample_records(work)
    runs = []
    for i in range(args.runs):
        proc = subprocess.run([sys.executable, "-c", _CHILD, data_dir,
                               tempfile.mkdtemp(dir=work), str(args.depth), args.precision],
                              capture_output=True, text=True, cwd=REPO)
        if proc.returncode:
            raise SystemExit(proc.stderr[-3000:])
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"run {i + 1}: {runs[-1]['to_first_step']:.2f} s", file=sys.stderr, flush=True)
    print(f"\nResNet-{args.depth} {args.precision}, time to first step, median of {args.runs} "
          f"fresh processes (seconds):")
    for key in ("import_tf", "graph_build", "session_start", "first_step", "to_first_step"):
        print(f"  {key:<14} {statistics.median(r[key] for r in runs):6.2f}")


if __name__ == "__main__":
    main()
