"""Training you can watch: progress lines, TensorBoard tags through the real server, reports."""

import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.model import graph as model_graph
from cifar10_estimator.training.estimator import model_fn
from cifar10_estimator.model import confusion_image
from cifar10_estimator.training.estimator import progress
from cifar10_estimator.evaluation import report
from cluster_fixtures import tensorboard_server
from trainer_fixtures import trainer_args


def test_progress_line_says_step_total_percent_rate_and_eta():
    line = progress.progress_line(1200, 80_000, 650.25, 10.0, loss=0.51234, learning_rate=0.1)
    # 78,800 steps left at 10 steps/s: 7,880 s.
    assert line == ("step 1200/80000 (1.5%), loss 0.5123, lr 0.1: 650.2 images/s, "
                    "ETA 2:11:20")
    cluster = progress.progress_line(50, 100, 300.0, 4.0, cluster_images_per_sec=600.0)
    assert cluster == ("step 50/100 (50.0%): 300.0 images/s on this worker, cluster "
                       "600.0 images/s, ETA 0:00:12")  # 12.5 s rounds to 12
    assert progress.format_duration(2 * 86400 + 3723) == "2 days, 1:02:03"
    assert progress.format_duration(86400 + 7.4) == "1 day, 0:00:07"
    assert progress.progress_line(5, 5, 1.0, 0.0).endswith("ETA -")


def _progress_lines(caplog, every_secs: float, steps: int) -> list[str]:
    """Progress lines of ``steps`` real steps from 500 that "take" 0.5 s each."""
    now = [100.0]
    with tf.Graph().as_default():
        step = tf.compat.v1.get_variable(  # a run resumed at step 500
            "global_step", [], tf.int64, initializer=tf.compat.v1.constant_initializer(500),
            trainable=False, collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                                          tf.compat.v1.GraphKeys.GLOBAL_STEP])
        train_op = tf.compat.v1.assign_add(step, 1)
        # What the model_fn names its loss and learning rate: the hook fetches them so.
        tf.constant(0.25, name=model_graph.LOSS_TENSOR.split(":")[0])
        tf.constant(0.1, name=model_graph.LEARNING_RATE_TENSOR.split(":")[0])
        hook = progress.ProgressHook(batch_size=8, total_steps=560, every_secs=every_secs,
                                     clock=lambda: now[0])
        with caplog.at_level("INFO", logger="cifar10_estimator"):
            with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
                for _ in range(steps):
                    now[0] += 0.5
                    sess.run(train_op)
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]


def test_the_first_line_comes_5_s_after_the_first_step_then_one_every_interval(caplog):
    # 59 timed steps of 0.5 s with --progress-secs 15: lines at 5 s and at 20 s.
    lines = _progress_lines(caplog, 15.0, 60)
    assert len(lines) == 2, lines
    assert lines[0].startswith(("step 510/560", "step 511/560")), lines[0]


def test_the_hook_logs_by_wall_time_and_counts_the_eta_from_a_resumed_start(caplog):
    # A real graph and MonitoredSession; only the clock is ours: every step "takes" 0.5 s.
    lines = _progress_lines(caplog, 4.0, 40)
    # 39 steps of 0.5 s after the first (untimed) one: a line every 4 s, never every step.
    assert len(lines) == 4, lines
    # The step is read in the same run as its increment (either order): 509 or 510 after
    # 9 steps from 500, 4 s after the first. 8 steps x 8 images in 4 s: 16 images/s.
    import re

    match = re.fullmatch(r"step (509|510)/560 \(9[01]\.\d%\), loss 0\.2500, lr 0\.1: "
                         r"16\.0 images/s, ETA 0:00:(\d\d)", lines[0])
    assert match, lines[0]
    # About 50 steps left at about 2 global steps/s (counted from the resumed start, not from
    # step 0): 25 s. Each of the rate's two reads of the global step (after the first step:
    # 501 or 502; now: 509 or 510) comes before or after its run's increment, so the rate
    # over those 4 s is 7, 8 or 9 steps: ETA 29 s (51 left at 1.75/s), 25 or 26 s (50 or 51
    # at 2/s) or 22 s (50 at 2.25/s). The machine's load decides which (CI runs saw 22).
    assert 22 <= int(match.group(2)) <= 29
    assert any(r.getMessage().startswith("this task ran 40 training steps")
               for r in caplog.records)


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def watched_run(tiny_records, tmp_path_factory):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path_factory.mktemp("watched") / "job")
    result = train.run(trainer_args(data_dir, job_dir, "--train-steps", "12",
                                    "--save-summary-steps", "2",
                                    "--eval-throttle-secs", "100000"))
    return job_dir, result


@pytest.mark.slow
def test_tensorboard_serves_the_training_scalars_under_plain_names(watched_run, tmp_path):
    job_dir, _ = watched_run
    with tensorboard_server(job_dir, tmp_path) as base:
        deadline = time.monotonic() + 90
        tags = {}
        while time.monotonic() < deadline:
            try:
                tags = _get_json(f"{base}/data/plugin/scalars/tags")
                if "." in tags and "eval" in tags and "images_per_sec" in tags["."]:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        train = set(tags.get(".", {}))
        assert {"loss", "learning_rate", "train_accuracy", "cross_entropy", "weight_decay",
                "images_per_sec", "global_step/sec"} <= train, tags
        assert not [t for t in train if t.endswith("_1")], train  # no clashing names
        evaluation = set(tags["eval"])
        assert {"accuracy", "cross_entropy", "loss"} <= evaluation
        assert {f"per_class_accuracy/{n}" for n in
                ("airplane", "automobile", "truck")} <= evaluation
        points = _get_json(f"{base}/data/plugin/scalars/scalars?run=.&tag=images_per_sec")
        assert points and all(p[2] > 0 for p in points)  # [wall time, step, value]
        assert [p[1] for p in points] == sorted(p[1] for p in points)
        images = _get_json(f"{base}/data/plugin/images/tags")
        tag = next((t for t in images.get("eval", {}) if "confusion_matrix" in t), None)
        assert tag, images
        entries = _get_json(f"{base}/data/plugin/images/images?run=eval&sample=0&tag="
                            + urllib.parse.quote(tag))
        with urllib.request.urlopen(f"{base}/data/plugin/images/individualImage?"
                                    + entries[-1]["query"], timeout=10) as response:
            picture = tf.io.decode_png(response.read()).numpy()
        # The final evaluation's labelled picture: the renderer's, pixel for pixel, from the
        # counts the report wrote.
        content = json.load(open(os.path.join(job_dir, report.REPORT_FILE)))
        expected = tf.io.decode_png(confusion_image.render_png(
            np.array(content["confusion_matrix"], np.float32), content["class_names"]),
            channels=3).numpy()
        np.testing.assert_array_equal(picture, expected)


@pytest.mark.slow
def test_the_final_evaluation_writes_a_report_and_the_run_ends_with_a_summary(
        watched_run, tiny_records):
    job_dir, result = watched_run
    content = json.load(open(os.path.join(job_dir, report.REPORT_FILE)))
    assert result.report_path == os.path.join(job_dir, report.REPORT_FILE)
    assert content["global_step"] == 12 and content["dataset"] == "cifar10"
    assert len(content["class_names"]) == 10
    confusion = np.array(content["confusion_matrix"])
    assert confusion.shape == (10, 10) and confusion.sum() == 37  # every eval record once
    assert content["accuracy"] == pytest.approx(np.trace(confusion) / 37, abs=1e-6)
    per_class = content["per_class_accuracy"]
    _, rows = tiny_records
    for i, name in enumerate(content["class_names"]):
        count = int((rows["eval"][1] == i).sum())
        assert confusion[i].sum() == count
        assert per_class[name] == pytest.approx(confusion[i, i] / count if count else 0.0)


def test_report_helpers_find_the_most_confused_pairs():
    confusion = np.array([[5, 3, 0], [0, 6, 1], [4, 0, 2]])
    pairs = report.most_confused(confusion, ["a", "b", "c"])
    assert pairs == [("c", "a", 4), ("a", "b", 3), ("b", "c", 1)]
    lines = report.log_lines(report.build(
        {"confusion_matrix": confusion, "global_step": 7, "accuracy": 13 / 21},
        ["a", "b", "c"], "test"))
    assert lines[0] == "per-class accuracy at step 7 (test):"
    assert "a  62.5% (5/8)" in lines[1] and "c  33.3% (2/6)" in lines[1]
    assert lines[-1] == ("most confused: c taken for a (4 images); a taken for b (3 images); "
                         "b taken for c (1 image)")


@pytest.mark.slow
def test_the_command_line_prints_progress_table_and_summary(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    job_dir = str(tmp_path / "job")
    # TF_ENABLE_ONEDNN_OPTS unset, as a user's shell leaves it (tests/test_cpu.py's check).
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    proc = subprocess.run([sys.executable, "-m", "cifar10_estimator",
                           *trainer_args(data_dir, job_dir, "--train-steps", "60",
                                         "--progress-secs", "0.2",
                                         "--eval-throttle-secs", "100000")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The first lines name the CPU and oneDNN's state: unset -> on, on every x86 CPU.
    assert "; oneDNN on" in proc.stderr
    lines = proc.stderr.splitlines()
    progress = [l for l in lines if " step " in l and "/60 (" in l]
    assert progress and "images/s" in progress[-1] and "ETA" in progress[-1]
    assert any("per-class accuracy at step 60 (cifar10):" in l for l in lines)
    assert any("most confused:" in l for l in lines) or all(
        "100.0%" in l for l in lines if "%" in l and "(" in l)
    summary = lines.index(next(l for l in lines if "run summary:" in l))
    tail = "\n".join(lines[summary:])
    assert "final accuracy" in tail and "images/s" in tail
    assert f"report:     {job_dir}/eval_report.json" in tail
    # The commands work when pasted into a shell without the virtual environment active.
    commands = dict(re.match(r"^[\d:]+\s+(\w+):\s+(.*)$", line).groups()
                    for line in lines[summary + 1:])
    assert commands["predict"].startswith(
        f"{shlex.quote(sys.executable)} -m cifar10_estimator.predict --saved-model ")
    picture = str(tmp_path / "picture.png")
    with open(picture, "wb") as f:
        f.write(tf.io.encode_png(np.full((20, 30, 3), 90, np.uint8)).numpy())
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    shell = tmp_path / "shell"  # the folder the commands are pasted in
    shell.mkdir()
    for command, says in ((commands["predict"].replace("IMAGE...", picture), picture + ": "),
                          (commands["evaluate"], "on the eval split")):
        pasted = subprocess.run(command, shell=True, env=bare, capture_output=True, text=True,
                                cwd=shell, timeout=300)
        assert pasted.returncode == 0 and says in pasted.stdout, pasted.stderr[-2000:]
    assert os.listdir(shell) == []  # nothing written where they were pasted
    tensorboard = shlex.split(commands["TensorBoard"])[0]
    assert os.access(tensorboard, os.X_OK), tensorboard
    assert "\x1b[" not in proc.stderr and "\r" not in proc.stderr  # no terminal controls
