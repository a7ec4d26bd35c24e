"""Rerunning a job: a finished one reports its result and writes nothing new; a schedule that
spans the whole run refuses a new run length unless told, and then says what the learning
rate does."""

import json
import os
import re
import shutil

import pytest

from cifar10_estimator import train
from cifar10_estimator.serving import export
from trainer_fixtures import trainer_args

pytestmark = pytest.mark.slow  # every test here trains
# Every run here: an evaluation as soon as it can come, no precise batch norm.
QUICK = ["--eval-throttle-secs", "1", "--precise-bn-batches", "0"]


def test_a_finished_job_reports_its_result_and_trains_and_exports_nothing(
        tiny_records, tmp_path, capsys):
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    first = train.run(trainer_args(data_dir, job_dir, *QUICK, "--train-steps", "3"))
    capsys.readouterr()
    report = job_dir / "eval_report.json"
    stamp = report.stat().st_mtime_ns
    again = train.run(trainer_args(data_dir, job_dir, *QUICK, "--train-steps", "3"))
    err = capsys.readouterr().err
    assert os.listdir(job_dir / "export") == [os.path.basename(first.export_path)]
    assert report.stat().st_mtime_ns == stamp  # not written again
    assert again.export_path == first.export_path and again.report_path == str(report)
    assert again.eval_metrics["accuracy"] == pytest.approx(first.eval_metrics["accuracy"])
    assert again.steps_trained == 0
    accuracy = json.loads(report.read_text())["accuracy"]
    assert (f"already trained to step 3 in {job_dir}, final accuracy {100 * accuracy:.2f}%: "
            f"nothing to train or export (raise --train-steps to train longer)") in err
    assert "Saving checkpoints" not in err and "exported SavedModel" not in err
    # The run summary names the finished result.
    assert re.search(rf"run summary: .*final accuracy {100 * accuracy:.2f}% at step 3", err)
    # An export lost since (deleted, or cut short by a full disk) is made again, once, with the
    # report's figures: nothing is trained or evaluated.
    shutil.rmtree(first.export_path)
    events = sorted(os.listdir(job_dir / "eval"))
    remade = train.run(trainer_args(data_dir, job_dir, *QUICK, "--train-steps", "3"))
    err = capsys.readouterr().err
    assert "exported its final checkpoint, which had no export" in err
    assert remade.steps_trained == 0 and sorted(os.listdir(job_dir / "eval")) == events
    with open(os.path.join(remade.export_path, export.EVAL_METRICS_FILE)) as f:
        assert json.load(f) == {"accuracy": pytest.approx(accuracy), "global_step": 3}
    # Raising --train-steps trains on and exports the new final step: under the piecewise
    # schedule (the default), a new run length just trains longer, and the record has no
    # length of the schedule to hold it to.
    longer = train.run(trainer_args(data_dir, job_dir, *QUICK, "--train-steps", "5"))
    assert longer.steps_trained == 2 and longer.export_path != first.export_path
    with open(job_dir / "settings.json") as f:
        assert "schedule_steps" not in json.load(f)["settings"]


@pytest.mark.parametrize("schedule", ["one-cycle", "cosine"])
def test_a_new_run_length_under_a_whole_run_schedule_is_refused_unless_told(
        tiny_records, tmp_path, capsys, schedule):
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    flags = trainer_args(data_dir, job_dir, *QUICK, "--lr-schedule", schedule)
    train.run([*flags, "--train-steps", "4"])
    capsys.readouterr()
    # The finished job's advice follows its schedule: a longer run needs --change-settings.
    train.run([*flags, "--train-steps", "4"])
    assert (f"nothing to train or export (to train longer, raise --train-steps with "
            f"--change-settings: the {schedule} schedule then spans the new length)"
            ) in capsys.readouterr().err
    assert train.main([*flags, "--train-steps", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"cifar10_estimator: error: --job-dir {job_dir} was trained with other settings "
        f"(settings.json): the steps the learning-rate schedule spans (from --train-steps or "
        f"--train-epochs) 4 (now 8); rerun with the recorded values, use a new --job-dir, or "
        f"add --change-settings to change them on purpose")
    assert train.main([*flags, "--train-steps", "8", "--change-settings"]) == 0
    err = capsys.readouterr().err
    said = re.search(rf"--change-settings: the {schedule} schedule now spans 8 steps instead of "
                     rf"4: at step 4 the learning rate goes from (\S+) to (\S+), and it reaches "
                     rf"its end at step 8", err)
    assert said, err[-3000:]
    before, after = map(float, said.groups())
    assert after > before  # the old schedule had ended; the new one is half-way


# A new run length under the piecewise schedule just trains longer: the finished job's last
# run above (3 steps, then 5).


def test_a_save_killed_midway_leaves_nothing_once_the_job_resumes(tiny_records, tmp_path):
    # What a trainer killed inside the save of step 3 leaves (a chaos campaign found one left
    # at the end of a finished job, issue 76): the shards under model.ckpt-3_temp, no index,
    # no entry in the checkpoint file. The rerun resumes from step 2 and removes them.
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    train.run(trainer_args(data_dir, job_dir, *QUICK, "--train-steps", "2"))
    partial = job_dir / "model.ckpt-3_temp"
    partial.mkdir()
    for shard in job_dir.glob("model.ckpt-2.data-*"):
        shutil.copy(shard, partial / f"part-00000-of-00001{shard.suffix}")
    resumed = train.run(trainer_args(data_dir, job_dir, *QUICK, "--train-steps", "4"))
    assert resumed.steps_trained == 2
    assert not [p for p in os.listdir(job_dir) if p.endswith("_temp")]

