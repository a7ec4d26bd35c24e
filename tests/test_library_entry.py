"""``train.run`` as another program calls it: from a worker thread (as Ray Train does) and from
the main thread, in a fresh process (the one under test, so this one is untouched). It trains,
returns its result, and leaves the process's signal handlers, environment, log and warning
filters as it found them."""

import json
import os
import subprocess
import sys

import pytest

from trainer_fixtures import trainer_args, work_dir

pytestmark = pytest.mark.slow  # it trains

# The caller: its own SIGTERM handler and SIGINT's default, a log handler of its own on the
# package's logger, then two runs: one in a thread (first: TensorFlow loads in it), one on the
# main thread. Each run is compared with the state before it.
CALLER = r"""
import json, logging, os, signal, sys, threading, warnings

import tf_estimator_compat as layer
from cifar10_estimator import train

args = json.loads(sys.argv[1])
layer_before = layer.installed()  # importing the trainer does not install it

def on_term(signum, frame):
    pass

signal.signal(signal.SIGTERM, on_term)
package_log = logging.getLogger("cifar10_estimator")
package_log.addHandler(logging.NullHandler())

def state():
    loggers = [logging.getLogger(n) for n in ("cifar10_estimator", "tensorflow")]
    return {
        "handlers": [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)],
        "environ": dict(os.environ),
        "loggers": [(l.level, l.propagate) for l in loggers],
        "package_handlers": list(package_log.handlers),
        "warnings": list(warnings.filters),
    }

def compare(before, after):
    return sorted(key for key in before if before[key] != after[key])

def summary(result):
    return {"export_path": result.export_path, "steps_trained": result.steps_trained,
            "metrics": sorted(result.eval_metrics or {})}

out = {}
before = state()
results = []
worker = threading.Thread(target=lambda: results.append(train.run(args[0])))
worker.start()
worker.join()
out["thread"] = summary(results[0])
# Loading TensorFlow adds its and its dependencies' warning filters (numpy's, urllib3's):
# the first run is held to removing its own.
out["thread_changed"] = compare({**before, "warnings": None}, {**state(), "warnings": None})
out["filter_left"] = [str(f[1]) for f in warnings.filters
                      if f[1] is not None and "preserve tf.data options" in f[1].pattern]
out["tf_env_set"] = [n for n in ("TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MIN_LOG_LEVEL")
                     if n in os.environ]

before = state()
seen_during = []
from cifar10_estimator.training import preemption
original = preemption.Preemption.install
def install(self, *args):
    done = original(self, *args)
    seen_during.append(signal.getsignal(signal.SIGTERM) is not on_term)
    return done
preemption.Preemption.install = install
out["main"] = summary(train.run(args[1]))
out["main_changed"] = compare(before, state())
out["main_installed"] = seen_during
import tensorflow as tf
# The run's set-up installed tf.estimator's compatibility layer, which stays (from 2.16 on; on
# 2.15 it leaves once TensorFlow has loaded, with nothing to supply).
out["layer"] = [layer_before, layer.installed(),
                layer.release(tf.__version__) > layer.COMPLETE]
print(json.dumps(out))
"""


@pytest.mark.timeout(900)
def test_run_from_a_thread_and_from_the_main_thread_restores_the_process(tiny_records,
                                                                          tmp_path):
    data_dir, _ = tiny_records
    tiny = ("--train-steps", "2", "--eval-throttle-secs", "100000")
    args = [trainer_args(data_dir, tmp_path / "thread-job", *tiny),
            trainer_args(data_dir, tmp_path / "main-job", *tiny)]
    # Neither variable set: the run sets both before TensorFlow loads, and must remove them.
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MIN_LOG_LEVEL")}
    # What Ray Train's TensorflowTrainer sets in a worker of one: legacy Keras on (without
    # tf_keras installed, tf.estimator cannot import) and a TF_CONFIG of one worker (a local
    # run). The run turns both off for itself and must put them back.
    env.update(TF_USE_LEGACY_KERAS="1", TF_CONFIG=json.dumps(
        {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}))
    done = subprocess.run([sys.executable, "-c", CALLER, json.dumps(args, default=str)],
                          capture_output=True, text=True, timeout=850, cwd=work_dir(), env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for run, job in [("thread", "thread-job"), ("main", "main-job")]:
        assert out[run]["steps_trained"] == 2
        assert out[run]["export_path"].startswith(str(tmp_path / job / "export"))
        assert os.path.isfile(os.path.join(out[run]["export_path"], "saved_model.pb"))
        assert "accuracy" in out[run]["metrics"]
        assert out[f"{run}_changed"] == [], run  # handlers, environ, log, warnings: as found
    assert out["tf_env_set"] == [] and out["filter_left"] == []
    assert out["main_installed"] == [True]  # on the main thread it does handle signals
    layer_before, layer_after, needed = out["layer"]
    assert layer_before is False and layer_after is needed
    # Off the main thread it installs nothing and says so, once.
    said = done.stderr.count("SIGTERM and SIGINT are the caller's to handle")
    assert said == 1, done.stderr[-4000:]
