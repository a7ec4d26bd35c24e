"""A sweep's search spaces and its results (docs/sweeps.md): ranges in ``--vary`` and their
one-line refusals (in this process and through the command), seeded random draws, Ray Tune's
domains and Optuna's TPE searcher; the ranked table, ``results.csv``, ``curves.png`` and the
TensorBoard curves, from trials built here."""

import csv
import io
import os
import subprocess
import sys

import pytest

from cifar10_estimator.errors import UserError
from cifar10_estimator.sweeps import records, results, space
from trainer_fixtures import trainer_env, work_dir

pytestmark = [pytest.mark.timeout(120)]

SPACE = ["learning-rate=loguniform:0.01:1", "weight-decay=loguniform:1e-5:1e-3",
         "label-smoothing=uniform:0:0.2", "num-layers=int:8:56", "nesterov=choice:true,false",
         "recipe=paper,fast"]


# --- the search space ------------------------------------------------------------------------


def test_random_draws_are_seeded_different_within_their_ranges_and_depths_are_6n_plus_2():
    dimensions = space.parse(SPACE, "/w")
    points = space.draw(dimensions, 200, seed=0)
    assert points == space.draw(space.parse(SPACE, "/w"), 200, seed=0)
    assert points[:12] == space.draw(dimensions, 12, seed=0)  # more trials: the same first ones
    assert points[:12] != space.draw(dimensions, 12, seed=1)
    # The first draw of seed 0, pinned: random.Random(seed).random() is the same on every
    # Python (its documentation's "Notes on Reproducibility"), so a rerun anywhere draws it.
    assert points[0] == {"learning-rate": "0.4885", "weight-decay": "0.000328",
                         "label-smoothing": "0.08411", "num-layers": "20", "nesterov": "false",
                         "recipe": "paper"}
    assert len({tuple(p.values()) for p in points}) == 200
    for p in points:
        assert 0.01 <= float(p["learning-rate"]) <= 1 and 1e-5 <= float(p["weight-decay"]) <= 1e-3
        assert 0 <= float(p["label-smoothing"]) <= 0.2
        depth = int(p["num-layers"])
        assert 8 <= depth <= 56 and (depth - 2) % 6 == 0
        assert p["nesterov"] in ("true", "false") and p["recipe"] in ("paper", "fast")
        # As the trainer takes them, the grid's way: 4 significant digits at most.
        assert records.canonical(float(p["learning-rate"])) == p["learning-rate"]
        assert len(p["learning-rate"].replace("0.", "", 1).lstrip("0")) <= 4
    # Log-uniform: as many below 0.1 as above it; uniform: as many below 0.1 as above.
    below = sum(float(p["learning-rate"]) < 0.1 for p in points) / len(points)
    assert 0.38 < below < 0.62
    assert 0.38 < sum(float(p["label-smoothing"]) < 0.1 for p in points) / len(points) < 0.62
    # Every depth in range, each as likely: 9 trials are the 9 depths; a 10th cannot be.
    depths = space.parse(["num-layers=int:8:56"], "/w")
    assert sorted(int(p["num-layers"]) for p in space.draw(depths, 9, 0)) == [
        8, 14, 20, 26, 32, 38, 44, 50, 56]
    assert {p["num-layers"] for p in space.draw(space.parse(["num-layers=int:10:30"], "/w"),
                                                 3, 5)} == {"14", "20", "26"}
    with pytest.raises(UserError, match=r"^--num-trials 10: the --vary values hold only 9 "
                                        r"different trials \(num-layers 9\)"):
        space.draw(depths, 10, 0)
    # The sweep's varied flags for drawn points: the values drawn, in order.
    varied = space.varied(dimensions, points[:3])
    assert varied[0].values == tuple(sorted((p["learning-rate"] for p in points[:3]), key=float))
    assert varied[4] == records.parse_vary(["nesterov=true,false"], "/w")[0]
    assert records.typed_settings(varied, points[0])["num-layers"] == 20


def test_drawn_trials_pass_the_trainers_checks_and_a_rerun_maps_them_to_the_same_trials(
        tmp_path):
    dimensions = space.parse(SPACE, "/w")
    space.check_ends(["--data-dir", "d"], dimensions)
    points = space.draw(dimensions, 6, seed=3)
    records.check_trials(["--data-dir", "d"], points)
    first = records.assign(points, None, str(tmp_path))
    recorded = {"trials": [{"name": t.name, "settings": t.settings} for t in first]}
    again = records.assign(space.draw(space.parse(SPACE, "/w"), 6, seed=3), recorded,
                           str(tmp_path))
    assert [t.name for t in again] == [t.name for t in first]
    assert all(t.in_grid for t in again)
    # Another seed: new trials, numbered after; the earlier draws stay listed, out of the run.
    other = records.assign(space.draw(dimensions, 6, seed=4), recorded, str(tmp_path))
    assert [t.number for t in other if t.in_grid] == list(range(7, 13))
    assert sum(not t.in_grid for t in other) == 6


@pytest.mark.parametrize("spec, message", [
    ("learning-rate=loguniform:0:1", "--vary learning-rate=loguniform:0:1: a log-uniform range "
                                     "needs LOW above 0"),
    ("learning-rate=loguniform:-1:1", "a log-uniform range needs LOW above 0"),
    ("learning-rate=uniform:1:0.5", "--vary learning-rate=uniform:1:0.5: LOW (1) must be below "
                                    "HIGH (0.5)"),
    ("learning-rate=uniform:0.1:0.1", "LOW (0.1) must be below HIGH (0.1)"),
    ("learning-rate=uniform:a:1", "--vary learning-rate=uniform:a:1: 'a' is not a number"),
    ("learning-rate=uniform:0.1:nan", "'nan' is not a finite number"),
    ("learning-rate=loguniform:0.1", "give loguniform:LOW:HIGH, e.g. --vary "
                                     "learning-rate=loguniform:0.01:1"),
    ("num-layers=int:9:13", "--vary num-layers=int:9:13: no ResNet depth between 9 and 13"),
    ("num-layers=int:8:1.5", "'1.5' is not a whole number"),
    ("num-layers=uniform:8:20", "--num-layers takes whole numbers: use int:LOW:HIGH"),
    ("learning-rate=int:1:3", "--learning-rate does not take whole numbers"),
    ("nesterov=uniform:0:1", "--nesterov is not a number: give its values, choice:A,B"),
    ("nesterov=choice:maybe", "--vary nesterov=choice:maybe: 'maybe' is not a value of "
                              "--nesterov"),
    ("learning-rat=uniform:0:1", "the trainer has no flag --learning-rat (did you mean "
                                 "--learning-rate?)"),
    ("job-dir=uniform:0:1", "each trial has its own --job-dir"),
])
def test_a_bad_range_is_one_line_naming_the_vary(spec, message):
    with pytest.raises(UserError) as error:
        space.parse([spec], "/w")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_ranges_the_trainer_refuses_part_of_and_ranges_in_a_grid_are_one_line():
    with pytest.raises(UserError, match=r"^--vary label-smoothing=uniform:0:1: the trainer "
                                        r"refuses its end 1.0 \(--label-smoothing must be in "
                                        r"\[0, 1\), got 1\); narrow the range$"):
        space.check_ends(["--data-dir", "d"], space.parse(["label-smoothing=uniform:0:1"], "/w"))
    with pytest.raises(UserError, match=r"^--vary learning-rate=loguniform:0.01:1: a grid "
                                        r"needs values"):
        space.grid(space.parse(["learning-rate=loguniform:0.01:1"], "/w"))
    # choice: is values, for a grid too; plain values are choices for a random search.
    assert space.grid(space.parse(["nesterov=choice:true,false"], "/w")) == \
        records.parse_vary(["nesterov=true,false"], "/w")
    with pytest.raises(UserError, match="--vary learning-rate is given twice"):
        space.parse(["learning-rate=0.1", "learning-rate=uniform:0.1:1"], "/w")


def test_tpes_search_space_and_its_seeded_searcher():
    pytest.importorskip("ray.tune")
    pytest.importorskip("optuna")
    from ray.tune.search import sample
    from ray.tune.search.optuna import OptunaSearch

    dimensions = space.parse(["learning-rate=loguniform:0.01:1", "label-smoothing=uniform:0:0.2",
                              "num-layers=int:8:56", "nesterov=true,false"], "/w")
    domains = space.ray_search_space(dimensions)
    assert isinstance(domains["learning-rate"].get_sampler(), sample.LogUniform)
    assert (domains["learning-rate"].lower, domains["learning-rate"].upper) == (0.01, 1)
    assert isinstance(domains["label-smoothing"].get_sampler(), sample.Uniform)
    # Depths as n of 6n+2, 1 to 9 (randint's upper end excluded).
    assert (domains["num-layers"].lower, domains["num-layers"].upper) == (1, 10)
    assert domains["nesterov"].categories == ["true", "false"]
    assert space.point(dimensions, {"learning-rate": 0.0123456, "label-smoothing": 0.2,
                                    "num-layers": 9, "nesterov": "false"}) == {
        "learning-rate": "0.01235", "label-smoothing": "0.2", "num-layers": "56",
        "nesterov": "false"}

    def suggested(seed: int) -> list[dict]:
        searcher = space.searcher(space.TPE, "accuracy", "max", seed)
        assert isinstance(searcher, OptunaSearch)
        assert type(searcher._sampler).__name__ == "TPESampler"
        searcher.set_search_properties("accuracy", "max", {"settings": domains})
        points = []
        for i in range(4):
            config = searcher.suggest(f"t{i}")["settings"]
            points.append(space.point(dimensions, config))
            searcher.on_trial_complete(f"t{i}", {"accuracy": 0.1 * i})
        return points

    drawn = suggested(0)
    assert drawn == suggested(0) and drawn != suggested(1)
    assert all((int(p["num-layers"]) - 2) % 6 == 0 for p in drawn)
    records.check_trials(["--data-dir", "d"], drawn)


# --- the command's refusals, in a process of its own: one line, exit 2 ---------------------


def _sweep(*argv: str, code: str = "") -> subprocess.CompletedProcess:
    """The sweep command in a process of its own; with ``code``, that Python first, then the
    command's ``main``."""
    command = ["-m", "cifar10_estimator.sweep"]
    if code:
        command = ["-c", f"{code}\nimport sys\nfrom cifar10_estimator import sweep\n"
                         f"sys.exit(sweep.main(sys.argv[1:]))"]
    return subprocess.run([sys.executable, *command, "--ray", "127.0.0.1:1", "--sweep-dir",
                           os.path.join(work_dir(), "never-made"), *argv],
                          capture_output=True, text=True, timeout=60, cwd=work_dir(),
                          env=trainer_env())


@pytest.mark.parametrize("argv, message", [
    (["--vary", "learning-rate=loguniform:0.01:1"],
     "--vary learning-rate=loguniform:0.01:1: a grid needs values"),
    (["--search", "random", "--vary", "learning-rate=loguniform:0.01:1"],
     "--search random needs --num-trials N"),
    (["--num-trials", "4", "--vary", "learning-rate=0.1,0.2"],
     "--num-trials is for --search random or tpe"),
    (["--seed", "4", "--vary", "learning-rate=0.1,0.2"], "--seed is for --search random or tpe"),
    (["--search", "random", "--num-trials", "0", "--vary", "learning-rate=0.1,0.2"],
     "--num-trials must be 1 or more, got 0"),
    (["--search", "random", "--num-trials", "2", "--seed", "-1", "--vary", "learning-rate=0.1,0.2"],
     "--seed must be from 0 to 4294967295, got -1"),
    (["--search", "random", "--num-trials", "3", "--vary", "learning-rate=0.1,0.2"],
     "--num-trials 3: the --vary values hold only 2 different trials"),
    (["--search", "random", "--num-trials", "4", "--vary", "learning-rate=loguniform:0:1"],
     "--vary learning-rate=loguniform:0:1: a log-uniform range needs LOW above 0"),
    (["--search", "random", "--num-trials", "4", "--vary", "learning-rate=uniform:1:0.5"],
     "LOW (1) must be below HIGH (0.5)"),
    (["--search", "random", "--num-trials", "4", "--vary", "learning-rate=uniform:x:1"],
     "'x' is not a number"),
    (["--search", "random", "--num-trials", "4", "--vary", "num-layers=int:15:19"],
     "--vary num-layers=int:15:19: no ResNet depth between 15 and 19"),
    (["--search", "random", "--num-trials", "4", "--vary", "label-smoothing=uniform:0:1"],
     "the trainer refuses its end 1.0"),
    (["--search", "anneal", "--vary", "learning-rate=0.1"], "invalid choice: 'anneal'"),
])
def test_a_bad_search_or_range_is_one_line_before_anything_runs(argv, message):
    proc = _sweep(*argv, "--", "--data-dir", "d")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("cifar10_estimator.sweep: error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not os.path.exists(os.path.join(work_dir(), "never-made"))


def test_tpe_without_optuna_names_the_extra_in_one_line():
    proc = _sweep("--search", "tpe", "--num-trials", "12", "--vary",
                  "learning-rate=loguniform:0.01:1", "--", "--data-dir", "d",
                  code="import sys\nsys.modules['optuna'] = None  # as if not installed")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("cifar10_estimator.sweep: error: --search tpe needs Optuna, "
                                   "which is not installed: pip install "
                                   "'cifar10_estimator[tune]'")


# --- the results -----------------------------------------------------------------------------


def _trial(tmp_path, number: int, lr: str, status: str, accuracies=(), secs=None,
           metrics=None) -> records.Trial:
    settings = {"learning-rate": lr, "num-layers": "8"}
    name = records.trial_name(number, settings)
    trial = records.Trial(name, settings, str(tmp_path / name), status=status, secs=secs,
                          metrics=dict(metrics or {}))
    trial.reports = [{"epoch": float(i + 1), "global_step": float(10 * (i + 1)),
                      "accuracy": a, "loss": 2.0 - a, "images_per_sec": 100.0}
                     for i, a in enumerate(accuracies)]
    if status in (records.FINISHED, records.STOPPED) and accuracies and not metrics:
        trial.metrics = {"accuracy": accuracies[-1], "loss": 2.0 - accuracies[-1]}
    return trial


def _trials(tmp_path) -> list[records.Trial]:
    return [
        _trial(tmp_path, 1, "0.05", records.FINISHED, (0.2, 0.3, 0.4, 0.5), 41.4),
        _trial(tmp_path, 2, "0.1", records.STOPPED, (0.1,), 9.0),
        _trial(tmp_path, 3, "0.2", records.FAILED, (), 3.0),
        _trial(tmp_path, 4, "0.4", records.FINISHED, (0.3, 0.5, 0.6, 0.7), 3725.0),
        _trial(tmp_path, 5, "0.8", records.STOPPED, (0.15, 0.2), 20.0),
        _trial(tmp_path, 6, "1.6", records.PENDING),
        _trial(tmp_path, 7, "3.2", records.FINISHED, (0.9,), 5.0),
    ]


def test_the_table_ranks_finished_then_stopped_trials_best_first_the_rest_last(tmp_path):
    trials = _trials(tmp_path)
    trials[6].in_grid = False  # an earlier draw's trial: not in the table
    lines = results.table(trials, "accuracy", "max")
    assert lines[0].split() == ["rank", "trial", "settings", "accuracy", "epochs", "time",
                                "status"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1], r[-1]) for r in rows] == [
        ("1", "trial-004-lr0.4_nl8", "finished"), ("2", "trial-001-lr0.05_nl8", "finished"),
        ("3", "trial-005-lr0.8_nl8", "stopped"), ("4", "trial-002-lr0.1_nl8", "stopped"),
        ("-", "trial-003-lr0.2_nl8", "failed"), ("-", "trial-006-lr1.6_nl8", "pending")]
    assert rows[0][2:] == ["learning-rate=0.4", "num-layers=8", "0.7", "4", "1:02:05",
                           "finished"]
    assert rows[1][4:7] == ["0.5", "4", "41"] and rows[2][4:7] == ["0.2", "2", "20"]
    assert rows[4][4:] == ["-", "-", "3", "s", "failed"]
    assert len({line.index(" trial") for line in lines}) == 1  # the columns line up
    # By loss, the smallest first.
    by_loss = results.table(trials, "loss", "min")
    assert [line.split()[1] for line in by_loss[1:3]] == ["trial-004-lr0.4_nl8",
                                                         "trial-001-lr0.05_nl8"]


def test_results_csv_holds_the_tables_rows(tmp_path):
    trials = _trials(tmp_path)
    path = results.write_csv(str(tmp_path), trials, "accuracy", "max")
    assert path == str(tmp_path / "results.csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert list(rows[0]) == ["rank", "trial", "learning-rate", "num-layers", "accuracy",
                             "epochs", "secs", "status", "job_dir"]
    assert [(r["rank"], r["trial"], r["status"]) for r in rows] == [
        ("1", "trial-007-lr3.2_nl8", "finished"), ("2", "trial-004-lr0.4_nl8", "finished"),
        ("3", "trial-001-lr0.05_nl8", "finished"), ("4", "trial-005-lr0.8_nl8", "stopped"),
        ("5", "trial-002-lr0.1_nl8", "stopped"), ("", "trial-003-lr0.2_nl8", "failed"),
        ("", "trial-006-lr1.6_nl8", "pending")]
    assert float(rows[1]["accuracy"]) == 0.7 and float(rows[1]["secs"]) == 3725.0
    assert rows[1]["learning-rate"] == "0.4" and float(rows[3]["epochs"]) == 2.0
    assert rows[5]["accuracy"] == "" and rows[1]["job_dir"] == str(tmp_path /
                                                                  "trial-004-lr0.4_nl8")
    assert sorted(os.listdir(tmp_path)) == ["results.csv"]  # no temporary file left


@pytest.mark.slow
def test_the_curves_a_png_and_tensorboard_scalars_replaced_on_a_rerun(tmp_path):
    from PIL import Image
    import tensorflow as tf

    trials = _trials(tmp_path)
    written = results.plot_curves(str(tmp_path), trials, "accuracy")
    with_reports = [t.name for t in trials if t.reports]
    assert written[0] == str(tmp_path / "curves.png")
    assert sorted(written[1:]) == sorted(str(tmp_path / "curves" / n) for n in with_reports)
    assert (tmp_path / "curves.png").stat().st_size > 0
    with Image.open(tmp_path / "curves.png") as picture:
        assert picture.format == "PNG" and picture.size == (900, 550)

    def scalars(name: str) -> list[tuple[int, str, float]]:
        found = []
        for path in sorted((tmp_path / "curves" / name).glob("events.out.tfevents.*")):
            for event in tf.compat.v1.train.summary_iterator(str(path)):
                for value in event.summary.value:
                    found.append((event.step, value.tag,
                                  float(tf.make_ndarray(value.tensor))))
        return found

    assert scalars("trial-004-lr0.4_nl8") == [
        (step, tag, pytest.approx(v)) for step, epoch, accuracy in
        [(10, 1, 0.3), (20, 2, 0.5), (30, 3, 0.6), (40, 4, 0.7)]
        for tag, v in (("accuracy", accuracy), ("epoch", epoch))]
    assert [s[2] for s in scalars("trial-002-lr0.1_nl8")] == [pytest.approx(0.1), 1.0]
    # A rerun's curves replace the earlier ones: each evaluation once.
    trials[3].reports.append({"epoch": 5.0, "global_step": 50.0, "accuracy": 0.75})
    results.plot_curves(str(tmp_path), trials, "accuracy")
    assert [s for s in scalars("trial-004-lr0.4_nl8") if s[1] == "accuracy"][-1][0] == 50
    assert len(list((tmp_path / "curves" / "trial-004-lr0.4_nl8").iterdir())) == 1
    # No trial reported the metric: nothing drawn.
    assert results.plot_curves(str(tmp_path / "none"), trials, "per_class_accuracy/cat") == []
    assert not (tmp_path / "none").exists()
