"""Sweeps (docs/sweeps.md): the grid, the trials' names and records, the command's one-line
errors and Vertex AI's metric file, in this process; the trainer reporting to that file; and a
real sweep on two Ray nodes (``test_ray``'s cluster) with its sweep dir in a bucket of the
local S3 server where s3:// works, else in a shared folder: four trials, TensorBoard's HParams
dashboard over them, a rerun that starts nothing, and a grid extended by points that fail."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Iterator

import pytest

from cifar10_estimator import sweep as command
from cifar10_estimator import engines
from cifar10_estimator.sweeps import hparams, records
from cifar10_estimator.errors import UserError
from cluster_fixtures import tensorboard_server
from trainer_fixtures import (TINY_BATCHES, TINY_FLAGS, run_trainer, trainer_args, trainer_env,
                              work_dir)

pytestmark = [pytest.mark.timeout(120)]  # the sweep on Ray has a limit of its own

try:  # the Ray cluster's fixture, where Ray is installed (the unit tests run without it)
    from test_ray import _node_of, _wait_for, ray_cluster, ray_nodes  # noqa: F401
    from test_object_storage import bucket, s3_server, shared_store  # noqa: F401
except pytest.skip.Exception:
    ray_cluster = None


# --- the grid, the names, the records: in this process ------------------------------------


def test_the_grid_is_the_product_of_the_values_first_flag_slowest_as_the_trainer_reads_them():
    varied = records.parse_vary(["learning-rate=0.05,.1", "num-layers=8,14",
                               "lr-boundary-epochs=82,123;50,75", "sync=yes,false",
                               "data-dir=data,/abs/data"], "/work")
    assert [v.values for v in varied] == [("0.05", "0.1"), ("8", "14"),
                                          ("82.0,123.0", "50.0,75.0"), ("true", "false"),
                                          ("/work/data", "/abs/data")]
    points = records.grid(varied)
    assert len(points) == 32 and points[0] == {
        "learning-rate": "0.05", "num-layers": "8", "lr-boundary-epochs": "82.0,123.0",
        "sync": "true", "data-dir": "/work/data"}
    assert [p["num-layers"] for p in points[:16:8]] == ["8", "14"]  # the second flag, faster
    assert points[16]["learning-rate"] == "0.1"
    assert records.typed_settings(varied, points[0]) == {
        "learning-rate": 0.05, "num-layers": 8, "lr-boundary-epochs": "82.0,123.0",
        "sync": True, "data-dir": "/work/data"}
    # Each trial's trainer command line: the sweep's flags, its settings (which win), its dir.
    assert records.trainer_argv(["--data-dir", "d", "--learning-rate", "1"], points[0], "J")[-7:] \
        == ["--learning-rate=0.05", "--num-layers=8", "--lr-boundary-epochs=82.0,123.0",
            "--sync=true", "--data-dir=/work/data", "--job-dir", "J"]
    assert records.absolute_paths(["--data-dir", "d", "--data-dir=e", "--seed", "1"], "/w") == [
        "--data-dir", "/w/d", "--data-dir=/w/e", "--seed", "1"]


def test_trial_names_are_numbered_short_and_kept_when_the_grid_grows(tmp_path):
    assert records.trial_name(7, {"learning-rate": "0.05", "num-layers": "8"}) == \
        "trial-007-lr0.05_nl8"
    # Flags with the same initials are spelled out; odd characters and length are bounded.
    assert records.short_name({"lr-schedule": "cosine", "label-smoothing": "0.1"}) == \
        "lrschedulecosine_labelsmoothing0.1"
    assert records.short_name({"data-dir": "/x/my data!", "recipe": "fast"}) == "ddmy_data_rfast"
    assert len(records.short_name({"weight-decay": "0." + "1" * 80})) == records.MAX_SHORT_NAME
    first = records.assign([{"learning-rate": "0.05"}, {"learning-rate": "0.1"}], None,
                         str(tmp_path))
    assert [t.name for t in first] == ["trial-001-lr0.05", "trial-002-lr0.1"]
    assert first[1].job_dir == str(tmp_path / "trial-002-lr0.1")
    recorded = {"trials": [{"name": t.name, "settings": t.settings} for t in first]}
    # A new value is a new trial with the next number; a point dropped stays, out of the grid.
    later = records.assign([{"learning-rate": "0.2"}, {"learning-rate": "0.05"}], recorded,
                         str(tmp_path))
    assert [(t.name, t.in_grid) for t in later] == [
        ("trial-003-lr0.2", True), ("trial-001-lr0.05", True), ("trial-002-lr0.1", False)]


@pytest.mark.parametrize("spec, fragments", [
    ("learning-rat=0.1", ["--vary learning-rat=0.1", "no flag --learning-rat",
                          "did you mean --learning-rate?"]),
    ("num-layers=8,x", ["'x' is not a value of --num-layers", "a whole number"]),
    ("learning-rate=", ["an empty value"]),
    ("model=resnet,foo", ["--model takes resnet, tutorial-cnn, not 'foo'"]),
    ("learning-rate=0.1,0.10", ["0.1 given more than once"]),
    ("job-dir=a,b", ["each trial has its own --job-dir"]),
    ("export-dir=a", ["each trial exports into its own job dir"]),
    ("learning-rate", ["give a trainer flag and its values"]),
    ("sync=maybe", ["'maybe' is not a value of --sync"]),
])
def test_a_wrong_vary_is_one_line_naming_the_flag(spec, fragments):
    with pytest.raises(UserError) as error:
        records.parse_vary([spec], "/w")
    assert "\n" not in str(error.value)
    for fragment in fragments:
        assert fragment in str(error.value)


def test_every_trial_passes_the_trainers_checks_before_anything_runs():
    with pytest.raises(UserError, match=r"^the trial learning-rate=0.1 num-layers=9: "
                                        r"--num-layers must be 6n\+2"):
        records.check_trials(["--data-dir", "d"], [{"learning-rate": "0.1", "num-layers": "8"},
                                                 {"learning-rate": "0.1", "num-layers": "9"}])


def test_the_metric_and_its_direction():
    assert [records.default_mode(m) for m in ("accuracy", "loss", "cross_entropy",
                                            "per_class_accuracy/cat")] == [
        "max", "min", "min", "max"]
    with pytest.raises(UserError, match="did you mean accuracy"):
        records.default_mode("acuracy")


def _state(tmp_path, trials, metric="accuracy", mode="max", out=None):
    import io

    varied = records.parse_vary(["learning-rate=0.05,0.1"], "/w")
    return records.Sweep(str(tmp_path), "run-1", ["--data-dir", "d"], varied, trials, metric,
                       mode, out or io.StringIO())


@pytest.mark.skipif(ray_cluster is None, reason="the ray extra installs Ray")
@pytest.mark.parametrize("kind, grace, factor, epochs, rungs", [
    ("asha", 1, 3, 4, [[3, 1]]),
    # HyperBand: one bracket per rung, bracket s from the s-th rung on (Li et al. 2018).
    ("hyperband", 1, 3, 4, [[3, 1], [3]]),
    # No rung at the end: a trial that trains to it finishes (the last bracket stops none).
    ("asha", 1, 2, 8, [[4, 2, 1]]),
    ("hyperband", 1, 2, 8, [[4, 2, 1], [4, 2], [4], []]),
    ("hyperband", 2, 3, 30, [[18, 6, 2], [18, 6], [18]]),
])
def test_the_schedulers_rungs_in_epochs(kind, grace, factor, epochs, rungs):
    from cifar10_estimator.sweeps import tuner

    scheduler = tuner.scheduler(kind, "accuracy", "max", grace, factor, epochs)
    # Ray Tune's asynchronous scheduler: no trial is ever paused, so none gives back its node.
    assert type(scheduler).__name__ == "AsyncHyperBandScheduler"
    assert [[rung for rung, _ in bracket._rungs] for bracket in scheduler._brackets] == rungs
    assert tuner.scheduler(None, "accuracy", "max", grace, factor, epochs) is None


def test_records_a_rerun_skips_the_finished_trials_and_names_the_best(tmp_path):
    trials = records.assign(records.grid(records.parse_vary(["learning-rate=0.05,0.1,0.2"], "/w")),
                          None, str(tmp_path))
    state = _state(tmp_path, trials)
    for trial in trials:
        state.started(trial.name)
    state.finished(trials[0].name, {"accuracy": 0.5, "loss": 2.0})
    state.finished(trials[1].name, {"accuracy": 0.75, "loss": 3.0})
    state.failed(trials[2].name, "cifar10_estimator: error: training stopped", 2)
    content = json.loads((tmp_path / "sweep.json").read_text())
    assert content["best"] == trials[1].name and content["metric"] == "accuracy"
    assert [(t["status"], t["value"]) for t in content["trials"]] == [
        ("finished", 0.5), ("finished", 0.75), ("failed", None)]
    assert content["trials"][2]["error"] == "cifar10_estimator: error: training stopped"
    assert content["counts"]["finished"] == 2 and content["counts"]["failed"] == 1
    record = json.loads((tmp_path / trials[0].name / "trial.json").read_text())
    assert record["status"] == "finished" and record["metrics"]["loss"] == 2.0
    assert record["trainer_argv"][-3:] == ["--learning-rate=0.05", "--job-dir",
                                           trials[0].job_dir]
    assert state.summary()[1].startswith(f"best: {trials[1].name} (learning-rate=0.1): "
                                         f"accuracy 0.75 (max); job dir ")
    assert state.failures() == (f"1 trial failed: {trials[2].name} (cifar10_estimator: error: "
                                f"training stopped); its line above and JOB/trial.log say why; "
                                f"rerun the same command to run it again")
    # A rerun: the finished trials are read back, the failed one runs again; with other
    # trainer flags none counts as finished.
    again = records.assign(records.grid(records.parse_vary(["learning-rate=0.05,0.1,0.2"], "/w")),
                         content, str(tmp_path))
    assert [records.read_back(t, ["--data-dir", "d"]) for t in again] == [True, True, False]
    assert again[1].metrics == {"accuracy": 0.75, "loss": 3.0}
    assert not any(records.read_back(t, ["--data-dir", "e"]) for t in again)
    # Another metric ranks them from the same records, nothing trained: loss, the smallest.
    assert records.best(again[:2], "loss", "min").name == trials[0].name
    assert records.trainer_flags_changed(["--data-dir", "d", "--train-steps", "4"],
                                       ["--data-dir=d", "--train-steps", "8", "--seed", "3"]) \
        == ["--seed unset (now 3)", "--train-steps 4 (now 8)"]


def test_a_trials_pieces_its_error_line_its_node_and_a_log_the_driver_writes(tmp_path):
    import pickle

    from cifar10_estimator.sweeps import trainable

    lines = ["step 2/4\n", "cifar10_estimator: error: training stopped: NaN\n",
             "E0000 00:00 a C++ line after it\n"]
    assert trainable.last_error(lines) == "cifar10_estimator: error: training stopped: NaN"
    assert trainable.last_error(["Traceback\n", "KeyError: 'x'\n", "\n"]) == "KeyError: 'x'"
    # Ray pickles the trainable's error: every field comes back.
    again = pickle.loads(pickle.dumps(trainable.TrialFailed("the line", 2, "the log")))
    assert (str(again), again.exit_status, again.log) == ("the line", 2, "the log")
    record = tmp_path / "sweep.json"
    record.write_text('{"run_id": "abc"}')
    assert trainable.not_shared(str(record), "abc", "10.0.0.2") is None
    assert trainable.not_shared(str(record), "other", "10.0.0.2") == (
        f"--sweep-dir {tmp_path} is not shared by the Ray cluster's nodes (this trial's node, "
        f"10.0.0.2, does not see its sweep.json): use a bucket (s3://, gs://) or a folder every "
        f"node mounts at the same path")
    assert trainable.not_shared("s3://bucket/sweep/sweep.json", "abc", "10.0.0.2") is None
    # A bucket's trial hands its log to the driver, which writes it into the job dir.
    trials = records.assign([{"learning-rate": "0.05"}], None, str(tmp_path))
    state = _state(tmp_path, trials)
    state.started(trials[0].name)
    state.failed(trials[0].name, "the line", 2, log="line 1\nthe line\n")
    assert (tmp_path / trials[0].name / "trial.log").read_text() == "line 1\nthe line\n"


def test_a_metric_no_trial_reported_is_one_line(tmp_path):
    trials = records.assign([{"learning-rate": "0.05"}], None, str(tmp_path))
    state = _state(tmp_path, trials, metric="per_class_accuracy/dgo")
    state.started(trials[0].name)
    state.finished(trials[0].name, {"accuracy": 0.5, "per_class_accuracy/dog": 0.4})
    assert state.missing_metric() == (
        "--metric per_class_accuracy/dgo: no trial's final evaluation has it (theirs: "
        "accuracy, per_class_accuracy/dog); rerun with one of those: nothing is trained again")


def test_hparams_summaries_the_experiment_and_a_session_replaced_when_it_runs_again(tmp_path):
    import tensorflow as tf
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    varied = records.parse_vary(["learning-rate=0.05,0.1", "sync=true,false"], "/w")
    hparams.write_experiment(str(tmp_path), varied, "loss")
    job = tmp_path / "trial-001"

    def summaries(folder) -> dict:
        found = {}
        for path in sorted(folder.glob("events.out.tfevents.*" + hparams.SUFFIX)):
            for event in tf.compat.v1.train.summary_iterator(str(path)):
                for value in event.summary.value:
                    data = plugin_data_pb2.HParamsPluginData.FromString(
                        value.metadata.plugin_data.content)
                    found[value.tag] = data
        return found

    experiment = summaries(tmp_path)[metadata.EXPERIMENT_TAG].experiment
    assert [(h.name, [getattr(v, v.WhichOneof("kind")) for v in h.domain_discrete.values])
            for h in experiment.hparam_infos] == [
        ("learning-rate", [0.05, 0.1]), ("sync", [False, True])]  # sorted by TensorBoard
    assert [(m.name.group, m.name.tag) for m in experiment.metric_infos] == [
        ("eval", "accuracy"), ("eval", "cross_entropy"), ("eval", "loss"), ("", "epochs"),
        ("", "stopped_early")]
    hparams.start_session(str(job), "trial-001", {"learning-rate": 0.05, "sync": True}, 1)
    hparams.end_session(str(job), False, 2)
    first = summaries(job)
    assert first[metadata.SESSION_START_INFO_TAG].session_start_info.hparams[
        "learning-rate"].number_value == 0.05
    assert first[metadata.SESSION_END_INFO_TAG].session_end_info.status == api_pb2.STATUS_FAILURE
    hparams.start_session(str(job), "trial-001", {"learning-rate": 0.05, "sync": True}, 5)
    again = summaries(job)  # the earlier session's files are gone: TensorBoard keeps a tag's first
    assert metadata.SESSION_END_INFO_TAG not in again
    assert again[metadata.SESSION_START_INFO_TAG].session_start_info.start_time_secs == 5


# --- Vertex AI's metric file ---------------------------------------------------------------


def test_the_metric_file_is_cloudml_hypertunes_format_one_line_per_scalar(tmp_path):
    import numpy as np

    metrics = {"global_step": np.int64(400), "loss": np.float32(0.25), "accuracy": 0.875,
               "cross_entropy": 0.125, "per_class_accuracy/cat": 0.5,
               "confusion_matrix": np.zeros((2, 2)), "confusion_matrix_image": b"png"}
    text = engines.lines("7", metrics, "job/model.ckpt-400", timestamp=1700000000.5)
    rows = text.splitlines()
    # cloudml-hypertune 0.1.0.dev6: json.dumps(metric_body, sort_keys=True), the value and the
    # step as strings, the trial id as a string.
    assert rows[0] == ('{"accuracy": "0.875", "checkpoint_path": "job/model.ckpt-400", '
                       '"global_step": "400", "timestamp": 1700000000.5, "trial": "7"}')
    assert [next(k for k in json.loads(r) if k not in ("checkpoint_path", "global_step",
                                                        "timestamp", "trial")) for r in rows] \
        == ["accuracy", "cross_entropy", "loss", "per_class_accuracy/cat"]
    before = time.time()
    default = json.loads(engines.lines(None, {"accuracy": 1.0}))
    assert before <= default.pop("timestamp") <= time.time()
    assert default == {"accuracy": "1.0", "checkpoint_path": "", "global_step": "0",
                       "trial": "0"}
    assert engines.read(text) == ({"accuracy": 0.875, "cross_entropy": 0.125, "loss": 0.25,
                                     "per_class_accuracy/cat": 0.5}, 400)
    # CIFAR-100's classes would pass the file's 100 lines: the whole set's scalars only.
    many = {"accuracy": 0.5, **{f"per_class_accuracy/c{i}": 0.5 for i in range(100)}}
    assert list(engines.scalars(many)) == ["accuracy"]
    path, tags = engines.write(str(tmp_path / "new" / "output.metrics"), "3", metrics)
    assert tags[:3] == ["accuracy", "cross_entropy", "loss"]
    assert engines.read(open(path).read())[0]["loss"] == 0.25
    assert os.listdir(tmp_path / "new") == ["output.metrics"]  # the temporary name is gone
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"^the hyperparameter-tuning metric file .*"
                                        r"\(CLOUD_ML_HP_METRIC_FILE\) cannot be written"):
        engines.write(str(tmp_path / "file" / "output.metrics"), "3", metrics)
    with pytest.raises(ValueError, match="line 1 is not a metric line"):
        engines.read('{"trial": "1"}\n')
    assert engines.DEFAULT_METRIC_FILE == "/tmp/hypertune/output.metrics"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_trainer_in_a_vertex_ai_trial_reports_its_final_scalars(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    metric_file = tmp_path / "hypertune" / "output.metrics"
    proc = run_trainer(*trainer_args(data_dir, tmp_path / "job", "--train-steps", "2",
                                     "--precise-bn-batches", "0", "--eval-throttle-secs",
                                     "100000"),
                       env_extra={"CLOUD_ML_TRIAL_ID": "12",
                                  "CLOUD_ML_HP_METRIC_FILE": str(metric_file)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in metric_file.read_text().splitlines()]
    assert {r["trial"] for r in rows} == {"12"} and {r["global_step"] for r in rows} == {"2"}
    assert {r["checkpoint_path"] for r in rows} == {str(tmp_path / "job" / "model.ckpt-2")}
    metrics, _ = engines.read(metric_file.read_text())
    report = json.loads((tmp_path / "job" / "eval_report.json").read_text())
    assert metrics["accuracy"] == pytest.approx(report["accuracy"])
    assert {"cross_entropy", "loss", "per_class_accuracy/cat"} <= set(metrics)
    assert (f"reported accuracy, cross_entropy, loss and 10 per-class accuracies to the "
            f"hyperparameter-tuning metric file {metric_file} (trial 12)") in proc.stderr
    # Each evaluation as it ended (here the one at the end of training), then the final one.
    each, final = engines.reports(metric_file.read_text())
    assert each["epoch"] == pytest.approx(2 / 12) and each["images_per_sec"] > 0
    assert each["accuracy"] == final["accuracy"] and "epoch" not in final


# --- the command's mistakes: one line, before anything runs --------------------------------


@pytest.mark.parametrize("argv, fragments", [
    (["--vary", "learning-rate=0.1"], ["give the trainer's flags after --"]),
    (["--vary", "learning-rate=0.1", "--", "--data-dir", "d", "--job-dir", "j"],
     ["--job-dir among the trainer flags"]),
    (["--vary", "learning-rate=0.1", "--", "--data-dir", "d", "--export-dir", "e"],
     ["--export-dir among the trainer flags"]),
    (["--vary", "learning-rate=0.1", "--", "--train-steps", "4"], ["needs --data-dir"]),
    (["--vary", "num-layers=8,9", "--", "--data-dir", "d"],
     ["the trial num-layers=9: --num-layers must be 6n+2"]),
    (["--vary", "learning-rate=0.1", "--metric", "acc", "--", "--data-dir", "d"],
     ["--metric acc:", "accuracy, cross_entropy, loss and per_class_accuracy/<class>"]),
    (["--vary", "learning-rate=0.1", "--max-concurrent", "0", "--", "--data-dir", "d"],
     ["--max-concurrent must be 1 or more"]),
    (["--vary", "learning-rate=0.1", "--max-failures", "-1", "--", "--data-dir", "d"],
     ["--max-failures must be 0 or more, got -1"]),
    (["--vary", "learning-rate=0.1", "--", "--data-dir", "d", "--num-layer", "8"],
     ["sweep (trainer flags): error: unrecognized arguments: --num-layer", "--num-layers"]),
])
def test_a_mistake_in_the_command_line_is_one_line_and_runs_nothing(argv, fragments, tmp_path,
                                                                    capsys):
    try:
        code = command.main(["--ray", "127.0.0.1:1", "--sweep-dir", str(tmp_path / "s"), *argv])
    except SystemExit as e:  # argparse's refusal, printed
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err
    assert not (tmp_path / "s").exists()


def test_other_trainer_flags_for_a_recorded_sweep_are_refused_in_one_line(tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the command prepares its process
    sweep_dir = tmp_path / "s"
    sweep_dir.mkdir()
    state = _state(sweep_dir, records.assign([{"learning-rate": "0.05"}], None, str(sweep_dir)))
    state.trainer_flags = ["--data-dir", str(tmp_path / "d"), "--train-steps", "4"]
    state.save()
    code = command.main(["--ray", "127.0.0.1:1", "--sweep-dir", str(sweep_dir), "--vary",
                         "learning-rate=0.05", "--", "--data-dir", str(tmp_path / "d"),
                         "--train-steps", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (
        f"cifar10_estimator.sweep: error: --sweep-dir {sweep_dir} was swept with other trainer "
        f"flags (sweep.json): --train-steps 4 (now 8); rerun with the recorded flags, use a new "
        f"--sweep-dir, or add --change-trainer-flags to run every trial again with the new ones")


# --- a sweep on two Ray nodes --------------------------------------------------------------


def _sweep(address: str, sweep_dir: str, vary: list[str], trainer: list[str], env: dict,
           timeout: float = 300) -> subprocess.CompletedProcess:
    vary_flags = [token for spec in vary for token in ("--vary", spec)]
    return subprocess.run([sys.executable, "-m", "cifar10_estimator.sweep", "--ray", address,
                           "--sweep-dir", sweep_dir, *vary_flags, "--cpus-per-trial", "2", "--",
                           *trainer], capture_output=True, text=True, timeout=timeout,
                          cwd=work_dir(), env=env)


def _post_json(url: str, body: dict):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def _hparams_dashboard(sweep_dir: str, tmp_path, sessions: int, env: dict
                      ) -> tuple[dict, dict]:
    """The real TensorBoard against the sweep dir (a bucket's too: TensorBoard loads
    tensorflow-io for s3:// itself): its HParams plugin's experiment and session groups (the
    JSON requests its dashboard posts), once it shows ``sessions`` of them, each ended."""
    statuses = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
    query = {"experimentName": "", "allowedStatuses": statuses, "startIndex": 0,
             "sliceSize": 100, "colParams": [
                 {"metric": {"group": "eval", "tag": "accuracy"}, "order": "ORDER_DESC"}]}
    with tensorboard_server(sweep_dir, tmp_path, env) as base:
        plugin = f"{base}/data/plugin/hparams"
        deadline = time.monotonic() + 90
        while True:
            try:
                groups = _post_json(f"{plugin}/session_groups", query)
                # Every trial ended (its session's end read too: TensorBoard loads event files
                # in passes, a bucket's slowly, and shows an unread end as STATUS_UNKNOWN), and
                # every finished one's evaluation read (its eval run, loaded apart).
                if len(groups.get("sessionGroups", ())) >= sessions and all(
                        g["sessions"][0].get("status") not in (None, "STATUS_UNKNOWN")
                        and (g["sessions"][0]["status"] != "STATUS_SUCCESS" or any(
                            m["name"]["tag"] == "accuracy"
                            for m in g["sessions"][0].get("metricValues", ())))
                        for g in groups["sessionGroups"]):
                    return _post_json(f"{plugin}/experiment", {"experimentName": ""}), groups
            except OSError:
                pass
            assert time.monotonic() < deadline, "TensorBoard served no HParams sessions"
            time.sleep(0.5)


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(ray_cluster is None, reason="the ray extra installs Ray")
def test_a_sweep_on_ray_its_dashboard_a_rerun_that_starts_nothing_and_failed_trials(
        ray_cluster, shared_store, tiny_records, tmp_path):
    local_data, _ = tiny_records
    shared_store.upload(local_data, "data")
    sweep_dir = f"{shared_store.root}/sweep"
    trainer = ["--data-dir", f"{shared_store.root}/data", *TINY_BATCHES, "--train-steps", "4",
               "--precise-bn-batches", "0", "--eval-throttle-secs", "100000"]
    grid = ["learning-rate=0.05,0.1", "num-layers=8,14"]
    env = trainer_env(extra=shared_store.env)
    done = _sweep(ray_cluster, sweep_dir, grid, trainer, env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    out = done.stdout
    assert f"sweep: 4 trials (learning-rate 0.05,0.1 x num-layers 8,14) in {sweep_dir}: 0 " \
           f"ended already, 4 to run" in out
    assert "Ray cluster at" in out and "2 node(s)" in out
    names = ["trial-001-lr0.05_nl8", "trial-002-lr0.05_nl14", "trial-003-lr0.1_nl8",
             "trial-004-lr0.1_nl14"]
    for name in names:
        assert re.search(rf"sweep: {name} finished in \d+ s: accuracy [\d.]+", out), out
    record = json.loads(shared_store.read("sweep/sweep.json"))
    assert [(t["name"], t["status"]) for t in record["trials"]] == [(n, "finished")
                                                                     for n in names]
    values = {t["name"]: t["value"] for t in record["trials"]}
    best = max(names, key=lambda n: (values[n], -names.index(n)))
    assert record["best"] == best
    best_line = re.search(r"sweep: best: (\S+) \((.*)\): accuracy ([\d.]+) \(max\); job dir "
                          r"(\S+); export (\S+)", out)
    assert best_line and best_line.group(1) == best, out
    assert re.fullmatch(rf"{re.escape(sweep_dir)}/{best}/export/\d+", best_line.group(5))
    keys = shared_store.keys("sweep/")
    for name in names:
        trial = json.loads(shared_store.read(f"sweep/{name}/trial.json"))
        assert trial["status"] == "finished" and trial["metrics"]["accuracy"] == values[name]
        assert f"sweep/{name}/eval_report.json" in keys and f"sweep/{name}/trial.log" in keys
        assert any(re.fullmatch(rf"sweep/{name}/export/\d+/saved_model\.pb", k) for k in keys)
        log = shared_store.read(f"sweep/{name}/trial.log").decode()
        assert "reported accuracy, cross_entropy, loss and 10 per-class accuracies" in log
    # TensorBoard's HParams dashboard compares the four.
    experiment, groups = _hparams_dashboard(sweep_dir, tmp_path, 4, env)
    assert {h["name"] for h in experiment["hparamInfos"]} == {"learning-rate", "num-layers"}
    assert {"accuracy", "loss"} <= {m["name"]["tag"] for m in experiment["metricInfos"]}
    assert len(groups["sessionGroups"]) == 4
    for group in groups["sessionGroups"]:
        session = group["sessions"][0]
        assert session["status"] == "STATUS_SUCCESS"
        accuracy = next(m["value"] for m in session["metricValues"]
                        if m["name"]["tag"] == "accuracy")
        assert accuracy == pytest.approx(values[group["name"]], abs=1e-6)
        assert group["hparams"]["num-layers"] in (8, 14)
    assert groups["sessionGroups"][0]["name"] == best  # sorted by accuracy, descending
    # The same command again: every trial read back, nothing started, Ray not even joined.
    logs_before = {n: shared_store.read(f"sweep/{n}/trial.log") for n in names}
    again = _sweep(ray_cluster, sweep_dir, grid, trainer, env)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "4 ended already, 0 to run" in again.stdout
    assert "started" not in again.stdout and "Ray cluster at" not in again.stdout
    assert f"sweep: best: {best} " in again.stdout
    assert {n: shared_store.read(f"sweep/{n}/trial.log") for n in names} == logs_before
    # The grid grown by a learning rate that the trainer refuses at its second step (the loss
    # becomes infinite): the four are skipped, the two new trials fail and say why.
    grown = _sweep(ray_cluster, sweep_dir, ["learning-rate=0.05,0.1,1e30", "num-layers=8,14"],
                   trainer, env)
    assert grown.returncode == 1, (grown.stdout + grown.stderr)[-6000:]
    assert "6 trials" in grown.stdout and "4 ended already, 2 to run" in grown.stdout
    failed = ["trial-005-lr1e+30_nl8", "trial-006-lr1e+30_nl14"]
    for name in failed:
        assert re.search(rf"sweep: {re.escape(name)} failed \(exit status 2\) after \d+ s: "
                         rf"cifar10_estimator: error: training stopped: the loss became NaN",
                         grown.stdout), grown.stdout
    last = grown.stdout.strip().splitlines()[-1]
    assert last.startswith(f"sweep: 2 trials failed: {', '.join(failed)} (the first: "
                           f"cifar10_estimator: error: training stopped: the loss became NaN"), last
    assert f"sweep: best: {best} " in grown.stdout
    record = json.loads(shared_store.read("sweep/sweep.json"))
    assert [t["status"] for t in record["trials"]] == ["finished"] * 4 + ["failed"] * 2
    assert record["counts"]["failed"] == 2 and "became NaN" in record["trials"][5]["error"]
    _, groups = _hparams_dashboard(sweep_dir, tmp_path, 6, env)
    statuses = {g["name"]: g["sessions"][0]["status"] for g in groups["sessionGroups"]}
    assert statuses == {**{n: "STATUS_SUCCESS" for n in names},
                        **{n: "STATUS_FAILURE" for n in failed}}


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(ray_cluster is None, reason="the ray extra installs Ray")
def test_asha_stops_the_losers_saved_and_a_sweep_outlives_its_driver_killed(
        ray_cluster, shared_store, tiny_records, tmp_path):
    # One trial at a time, the first a learner and the next two at learning rates that learn
    # nothing: ASHA (grace 1 epoch of 12 steps, rungs at epochs 1 and 3) keeps the first to its
    # end and stops the other two at a rung (at the first unless chance put them level with the
    # learner there). The driver is killed (SIGKILL) while the first trains; the same command
    # resumes the sweep. ResNet-8 at learning rate 0.1 with its batch-norm statistics
    # recomputed before each evaluation is past 40% of the 37 evaluation images by epoch 3 (seeds
    # 1-3, Zen 5), where the two at 1e-7 stay near chance (at most 14%); without the recomputed
    # statistics an evaluation after 12 steps is noise, and an unseeded network at rest can
    # score 32% (CI saw a loser kept so).
    local_data, _ = tiny_records
    shared_store.upload(local_data, "data")
    sweep_dir = f"{shared_store.root}/asha"
    command_line = [
        sys.executable, "-m", "cifar10_estimator.sweep", "--ray", ray_cluster, "--sweep-dir",
        sweep_dir, "--vary", "learning-rate=0.1,1e-7,2e-7", "--cpus-per-trial", "2",
        "--max-concurrent", "1", "--scheduler", "asha", "--grace-epochs", "1", "--",
        "--data-dir", f"{shared_store.root}/data", *TINY_FLAGS, "--train-epochs", "4",
        "--seed", "1", "--precise-bn-batches", "12"]
    env = trainer_env(extra=shared_store.env)
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(command_line, stdout=out, stderr=subprocess.STDOUT,
                                  cwd=work_dir(), env=env)
    try:
        _wait_for(log, r"sweep: trial-001-lr0.1 epoch 1: accuracy", driver, 300)
    finally:
        driver.kill()  # SIGKILL: no handler runs, the sweep's records stay as they were
        driver.wait(30)
    killed = json.loads(shared_store.read("asha/sweep.json"))
    assert killed["trials"][0]["status"] == "running" and killed["trials"][0]["reports"]
    again = subprocess.run(command_line, capture_output=True, text=True, timeout=400,
                           cwd=work_dir(), env=env)
    assert again.returncode == 0, (again.stdout + again.stderr)[-6000:]
    record = json.loads(shared_store.read("asha/sweep.json"))
    first, *losers = record["trials"]
    assert [t["status"] for t in record["trials"]] == ["finished", "stopped", "stopped"], \
        again.stdout
    # The first kept the reports it made before the kill, then trained on from its checkpoint
    # to its end: every evaluation once, in order; its table row says 4 epochs.
    steps = [r["global_step"] for r in first["reports"]]
    assert steps == sorted(set(steps)) and steps[0] == killed["trials"][0]["reports"][0][
        "global_step"] and first["epochs"] == pytest.approx(4)
    assert record["best"] == first["name"] and "1 of 3 trials finished, 2 stopped early" in \
        again.stdout
    for loser in losers:
        rung = loser["epochs"]
        assert rung in (1, 3) and len(loser["reports"]) == rung, loser
        assert re.search(rf"sweep: {loser['name']} stopped early at epoch {rung:g} after \d+ s: "
                         rf"accuracy [\d.]+", again.stdout), again.stdout
        trial = json.loads(shared_store.read(f"asha/{loser['name']}/trial.json"))
        assert trial["status"] == "stopped" and trial["metrics"]["accuracy"] == loser["value"]
        # Saved as a preempted trainer saves: a checkpoint past the evaluation it stopped at.
        keys = shared_store.keys(f"asha/{loser['name']}/")
        saved = [int(m.group(1)) for k in keys
                 for m in [re.search(r"model\.ckpt-(\d+)\.index$", k)] if m]
        assert max(saved) >= 12 * rung, keys
        assert f"asha/{loser['name']}/trial.log" in keys
    # Nothing trained twice at once: no trainer was refused a job dir; the table and its CSV.
    assert "in use by another trainer" not in again.stdout
    rows = shared_store.read("asha/results.csv").decode().splitlines()
    assert len(rows) == 4 and rows[1].split(",")[1] == first["name"]
    # A rerun keeps every trial as it ended: nothing runs again.
    last = subprocess.run(command_line, capture_output=True, text=True, timeout=120,
                          cwd=work_dir(), env=env)
    assert last.returncode == 0 and "3 ended already, 0 to run" in last.stdout, last.stdout


def _two_trials(address: str, sweep_dir, data_dir: str, steps: int) -> list[str]:
    """A sweep's command line: two trials of ``steps`` steps, a checkpoint every 40, one CPU
    each, its sweep dir a folder of this host."""
    return [sys.executable, "-m", "cifar10_estimator.sweep", "--ray", address, "--sweep-dir",
            str(sweep_dir), "--vary", "learning-rate=0.05,0.1", "--cpus-per-trial", "1", "--",
            "--data-dir", data_dir, *TINY_FLAGS, "--train-steps", str(steps),
            "--save-checkpoints-steps", "40", "--precise-bn-batches", "0",
            "--eval-throttle-secs", "100000", "--progress-secs", "1"]


@contextlib.contextmanager
def _driver(command_line: list[str], log) -> Iterator[subprocess.Popen]:
    """The sweep's driver, its output to ``log``, killed if it still runs when the block
    ends."""
    with open(log, "w") as out:
        driver = subprocess.Popen(command_line, stdout=out, stderr=subprocess.STDOUT,
                                  cwd=work_dir(), env=trainer_env())
    try:
        yield driver
    finally:
        driver.kill()
        driver.wait(30)


def _until(predicate, driver: subprocess.Popen, log, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.2)


def _trainers_of(sweep_dir) -> dict[str, int]:
    """The live trainer processes of a sweep's trials on this host: {trial name: pid}."""
    mark = f"--job-dir\0{sweep_dir}/".encode()
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                line = f.read()
        except OSError:
            continue
        if b"-m\0cifar10_estimator\0" in line and mark in line:
            found[line.split(mark, 1)[1].split(b"\0", 1)[0].decode()] = int(entry)
    return found


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(500)
@pytest.mark.skipif(ray_cluster is None, reason="the ray extra installs Ray")
def test_a_trainer_a_signal_ends_trains_on_and_a_trial_lost_with_its_node_runs_again(
        tiny_records, tmp_path):
    # Two trials on two nodes of one CPU each (one trial per node), their sweep dir a folder
    # both see. Once each has saved, the trainer on the head is killed (SIGKILL) and the other
    # node goes, every process of it at once, as a machine that goes away: the first trial
    # starts its trainer again in place, the second is run again by the sweep; both resume
    # from their checkpoints, and the sweep ends as an undisturbed one.
    local_data, _ = tiny_records
    sweep_dir = tmp_path / "sweep"
    log = tmp_path / "driver.log"
    with ray_nodes(2, 1) as (address, nodes):
        command_line = _two_trials(address, sweep_dir, local_data, 1000)
        with _driver(command_line, log) as driver:
            _until(lambda: len(_trainers_of(sweep_dir)) == 2 and all(
                (sweep_dir / name / "model.ckpt-40.index").exists()
                for name in _trainers_of(sweep_dir)), driver, log)
            trainers = _trainers_of(sweep_dir)
            on_node = {name: _node_of(pid, nodes) for name, pid in trainers.items()}
            assert sorted(on_node.values()) == [0, 1], on_node
            (killed,) = [name for name, node in on_node.items() if node == 0]
            (lost,) = [name for name, node in on_node.items() if node == 1]
            os.kill(trainers[killed], signal.SIGKILL)
            # The node's group and its raylet's workers, which Ray puts in groups of their own.
            doomed = [int(p) for p in subprocess.run(
                ["pgrep", "-g", str(nodes[1].pid)], capture_output=True, text=True).stdout.split()]
            doomed += [trainers[lost], *map(int, subprocess.run(
                ["pgrep", "-P", ",".join(map(str, doomed))], capture_output=True,
                text=True).stdout.split())]
            for pid in doomed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            status = driver.wait(400)
    out = log.read_text()
    assert status == 0, out[-6000:]
    assert re.search(rf"sweep: {lost} was lost with its Ray worker \(its node gone\?\) after "
                     rf"\d+ s: ", out), out[-6000:]
    assert (f"sweep: 1 trial(s) lost with their Ray worker ({lost}): running them again, "
            f"restart 1 of 3 (--max-failures)") in out
    assert f"sweep: {killed} failed" not in out and "2 of 2 trials finished" in out, out
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert {t["name"]: t["status"] for t in record["trials"]} == {killed: "finished",
                                                                  lost: "finished"}
    trial_log = (sweep_dir / killed / "trial.log").read_text()
    said = trial_log.index(f"sweep: {killed}'s trainer stopped by a signal (killed by SIGKILL): "
                           f"starting it again")
    for name, text in ((killed, trial_log[said:]), (lost, (sweep_dir / lost / "trial.log")
                                                    .read_text())):
        resumed = re.search(r"resuming from \S*model\.ckpt-(\d+)", text)
        assert resumed and 40 <= int(resumed.group(1)) < 1000, text[-3000:]
        assert (sweep_dir / name / "model.ckpt-1000.index").exists()
        assert any(v.isdigit() for v in os.listdir(sweep_dir / name / "export"))


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(500)
@pytest.mark.skipif(ray_cluster is None, reason="the ray extra installs Ray")
@pytest.mark.skipif(os.geteuid() != 0, reason="the sweep dir is a tmpfs of its own (mount)")
def test_a_full_sweep_dir_ends_the_sweep_in_one_line_and_the_same_command_resumes_it(
        tiny_records, tmp_path):
    # The chaos campaign's full disk (issue 76): the sweep dir fills while two trials train.
    # Their trainers stop with their own line, and the driver, which cannot record that, ended
    # with a traceback of Ray Tune's from its callback. Now it ends with one line; once space
    # is free the same command resumes both trials from their checkpoints.
    local_data, _ = tiny_records
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(sweep_dir)],
                   check=True)
    filler = sweep_dir / "filler"
    log = tmp_path / "driver.log"
    try:
        with ray_nodes(1, 2) as (address, _):
            command_line = _two_trials(address, sweep_dir, local_data, 600)
            with _driver(command_line, log) as driver:
                _until(lambda: len(list(sweep_dir.glob("trial-*/model.ckpt-40.index"))) == 2,
                       driver, log)
                subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"],
                               capture_output=True)
                status = driver.wait(300)
            out = log.read_text()
            assert status == 2, out[-6000:]
            assert out.strip().splitlines()[-1] == (
                f"cifar10_estimator.sweep: error: cannot write the sweep's records in "
                f"--sweep-dir {sweep_dir} (No space left on device); free space (or raise "
                f"the quota) and rerun the same command"), out[-6000:]
            assert "Traceback" not in out and "TuneError" not in out, out[-6000:]
            filler.unlink()
            again = subprocess.run(command_line, capture_output=True, text=True, timeout=300,
                                   cwd=work_dir(), env=trainer_env())
    finally:
        subprocess.run(["umount", "-l", str(sweep_dir)], capture_output=True)
    assert again.returncode == 0, again.stdout[-6000:] + again.stderr[-3000:]
    assert "2 of 2 trials finished" in again.stdout, again.stdout[-4000:]
    assert "Traceback" not in again.stdout + again.stderr


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(ray_cluster is None, reason="the ray extra installs Ray")
def test_tpe_draws_its_trials_as_the_sweep_runs_and_a_rerun_draws_new_ones(
        ray_cluster, shared_store, tiny_records):
    local_data, _ = tiny_records
    shared_store.upload(local_data, "data")
    sweep_dir = f"{shared_store.root}/tpe"
    env = trainer_env(extra=shared_store.env)

    def tpe(num_trials: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "cifar10_estimator.sweep", "--ray", ray_cluster,
             "--sweep-dir", sweep_dir, "--search", "tpe", "--num-trials", str(num_trials),
             "--vary", "learning-rate=loguniform:0.001:0.5", "--vary", "num-layers=int:8:14",
             "--cpus-per-trial", "2", "--max-concurrent", "1", "--", "--data-dir",
             f"{shared_store.root}/data", *TINY_BATCHES, "--train-steps", "4",
             "--precise-bn-batches", "0", "--eval-throttle-secs", "100000"],
            capture_output=True, text=True, timeout=300, cwd=work_dir(), env=env)

    first = tpe(2)
    assert first.returncode == 0, (first.stdout + first.stderr)[-6000:]
    assert "2 trials (drawn by TPE with seed 0 from learning-rate loguniform:0.001:0.5 x " \
           "num-layers int:8:14)" in first.stdout and "0 ended already, 2 to run" in first.stdout
    record = json.loads(shared_store.read("tpe/sweep.json"))
    drawn = [t["settings"] for t in record["trials"]]
    assert [t["status"] for t in record["trials"]] == ["finished"] * 2
    for settings in drawn:  # each drawn point in its range, a depth 6n+2
        assert 0.001 <= float(settings["learning-rate"]) <= 0.5
        assert settings["num-layers"] in ("8", "14")
    # The same sweep grown by one: the two kept, one new point drawn, not one of theirs.
    grown = tpe(3)
    assert grown.returncode == 0, (grown.stdout + grown.stderr)[-6000:]
    assert "2 ended already, 1 to run" in grown.stdout
    record = json.loads(shared_store.read("tpe/sweep.json"))
    assert [t["settings"] for t in record["trials"]][:2] == drawn
    assert len(record["trials"]) == 3 and record["trials"][2]["settings"] not in drawn
    assert record["trials"][2]["name"].startswith("trial-003-") and \
        record["trials"][2]["status"] == "finished"
