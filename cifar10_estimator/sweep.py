"""The sweep command: ``python -m cifar10_estimator.sweep`` (``cifar10-sweep``).

    python -m cifar10_estimator.sweep --ray HEAD:6379 --sweep-dir s3://bucket/sweep \\
        --vary learning-rate=0.05,0.1 --vary num-layers=20,32 -- --data-dir s3://bucket/data

trains one trial per point of the grid of ``--vary`` values (or per point drawn from their
ranges, ``--search random``), each a run of the trainer in its own job dir
(``SWEEP/trial-NNN-<settings>``), with Ray Tune on a Ray cluster's nodes, and names the best by
the final evaluation's ``--metric``. A rerun skips the finished trials and runs the rest.
``sweeps.records`` holds the grid and the records, ``sweeps.space`` the ranges and the draws,
``sweeps.tuner`` and ``sweeps.trainable`` the run, ``sweeps.hparams`` TensorBoard's HParams
summaries, ``sweeps.results`` the closing table, CSV and curves; this module reads the
command line and the environment and prints. Exits 0 when every trial finished, 1
when one failed, 2 for a mistake in the command line, 130 when interrupted (docs/sweeps.md).
"""

import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from typing import Optional, Sequence, TextIO

from cifar10_estimator import cli, storage
from cifar10_estimator.errors import UserError, run_cli
from cifar10_estimator.config import flags
from cifar10_estimator.sweeps import records, results, space

# --scheduler's choices (sweeps.tuner.scheduler).
SCHEDULERS = ("asha", "hyperband")
# Successive halving's eta: 3 is the value Li et al. 2018 (arXiv:1603.06560, section 2.6)
# recommend and Ray Tune's HyperBandScheduler's default.
REDUCTION_FACTOR = 3.0
MODULE = "cifar10_estimator.sweep"
# Ray Tune's switch between its console outputs (ray/tune/experimental/output.py).
RAY_NEW_OUTPUT_ENV = "RAY_AIR_NEW_OUTPUT"


def build_parser() -> cli.Parser:
    prog = cli.invoked_as(MODULE)
    parser = cli.Parser(
        MODULE,
        usage="%(prog)s --ray ADDRESS --sweep-dir DIR --vary FLAG=A,B [--vary FLAG=C,D ...] "
              "[--search random|tpe --num-trials N [--seed S]] [--metric NAME] [--mode max|min] "
              "[--max-concurrent N] [--cpus-per-trial C] [@FLAGFILE] -- TRAINER_FLAGS...",
        examples=(f"{prog} --ray auto --sweep-dir sweep --vary learning-rate=0.05,0.1 "
                  f"--vary num-layers=20,32 -- --data-dir cifar10-data --train-epochs 30",
                  f"{prog} --ray HEAD:6379 --sweep-dir s3://bucket/sweep --vary "
                  f"weight-decay=1e-4,5e-4 --cpus-per-trial 8 -- @job.flags",
                  f"{prog} --ray local --sweep-dir sweep --vary recipe=paper,fast --metric "
                  f"loss -- --data-dir cifar10-data",
                  f"{prog} --ray auto --sweep-dir sweep --search random --num-trials 12 --vary "
                  f"learning-rate=loguniform:0.01:1 --vary weight-decay=loguniform:1e-5:1e-3 "
                  f"--scheduler asha --grace-epochs 1 -- --data-dir cifar10-data "
                  f"--train-epochs 30"),
        description="Train one trial for each point of the grid of --vary values (the "
                    "cartesian product), or for --num-trials points drawn from their ranges "
                    "(--search random or tpe), each `python -m cifar10_estimator TRAINER_FLAGS "
                    "--job-dir SWEEP/trial-NNN-...` as a process of its own, run by Ray Tune "
                    "on a Ray cluster's nodes; then name the best by the final evaluation's "
                    "--metric. SWEEP/sweep.json lists every trial; `tensorboard --logdir "
                    "SWEEP` compares them (HParams). A rerun skips the finished trials. Exits "
                    "0 when every trial finished, 1 when one failed.")
    parser.add_argument(
        "--ray", metavar="ADDRESS", required=True,
        help="the Ray cluster to run the trials on: the address `ray start --head` prints, "
             "auto for the one this host belongs to, or local for a Ray of this sweep's own "
             "on this machine")
    parser.add_argument(
        "--sweep-dir", metavar="DIR", required=True,
        help="the sweep's folder: sweep.json and one job dir per trial; a bucket (s3://, "
             "gs://) or a folder every Ray node mounts at the same path")
    parser.add_argument(
        "--vary", metavar="FLAG=A,B", action="append", required=True,
        help="a trainer flag (as the trainer spells it, without the dashes) and the values "
             "the trials take, separated by commas (by ';' for a flag whose value is a list: "
             "--vary 'lr-boundary-epochs=82,123;50,75'); once per flag; a value here wins over "
             "the same flag after --. With --search random or tpe, a range instead: "
             "uniform:LOW:HIGH, loguniform:LOW:HIGH, int:LOW:HIGH (for num-layers the depths "
             "6n+2 in it), or values, choice:A,B")
    parser.add_argument(
        "--metric", default="accuracy",
        help="the final evaluation's scalar that ranks the trials: accuracy, cross_entropy, "
             "loss or per_class_accuracy/<class>")
    parser.add_argument(
        "--mode", choices=("max", "min"), default=None,
        help="whether the best trial's --metric is the largest or the smallest (default: max "
             "for accuracy and per-class accuracy, min for loss and cross_entropy)")
    parser.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                        help="at most N trials at once (default: as many as the cluster's "
                             "CPUs and GPUs hold)")
    parser.add_argument("--cpus-per-trial", type=float, default=1.0, metavar="C",
                        help="CPUs each trial asks Ray for; Ray sets its trainer's "
                             "OMP_NUM_THREADS to match")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0, metavar="G",
                        help="GPUs each trial asks Ray for (whole GPUs: its trainer's "
                             "--num-gpus)")
    parser.add_argument(
        "--max-failures", type=int, default=None, metavar="N",
        help="how many times the trials lost with their Ray worker (a node gone) are run "
             "again, each resuming from its checkpoint, before they count as failed "
             "(default: 3; 0: at once)")
    parser.add_argument(
        "--change-trainer-flags", action="store_true",
        help="take trainer flags that differ from the ones sweep.json recorded: every trial "
             "runs again with them, each trainer resuming its job dir (a setting its "
             "settings.json records changes only with the trainer's own --change-settings)")
    search = parser.add_argument_group(
        "search", "which trials run: every point of the grid of --vary values, or trials drawn "
                  "from their ranges")
    search.add_argument(
        "--search", choices=space.SEARCHES, default=space.GRID,
        help="grid: every combination of the --vary values; random: --num-trials points "
             "drawn at random from the --vary ranges and values, seeded by --seed; tpe: "
             "--num-trials points drawn one after another by Optuna's TPE from the results so "
             "far (the tune extra)")
    search.add_argument(
        "--num-trials", type=int, default=None, metavar="N",
        help="how many trials --search random or tpe draws (required there)")
    search.add_argument(
        "--seed", type=int, default=None, metavar="S",
        help="the seed of --search random's and tpe's draws (default 0: a rerun draws the "
             "same trials); the trainers' own seed is --seed after --")
    stopping = parser.add_argument_group(
        "early stopping", "stop the trials that fall behind at their evaluations, each saved "
                          "as a preempted trainer is (its job dir resumable)")
    stopping.add_argument(
        "--scheduler", choices=SCHEDULERS, default=None,
        help="asha: asynchronous successive halving (Li et al. 2020, arXiv:1810.05934); "
             "hyperband: HyperBand's brackets (Li et al. 2018, arXiv:1603.06560), run "
             "asynchronously as ASHA over each; both through "
             "Ray Tune, on the trials' epochs, every trial evaluating each "
             "--save-checkpoints-epochs (default: every trial runs to its end)")
    stopping.add_argument(
        "--grace-epochs", type=float, default=1.0, metavar="E",
        help="epochs every trial trains before it can be stopped (asha)")
    stopping.add_argument(
        "--reduction-factor", type=float, default=REDUCTION_FACTOR, metavar="R",
        help="at each rung, keep the best 1 in R trials going")
    return parser


def _interrupt(signum, frame):
    """SIGTERM (a job scheduler's stop) as Ctrl-C: Ray Tune's handler of SIGINT while it runs
    (it stops the trials and returns), else KeyboardInterrupt."""
    signal.raise_signal(signal.SIGINT)


def run(argv: Optional[Sequence[str]] = None, out: TextIO = sys.stdout) -> int:
    """Parses the command line and runs the sweep; returns the exit status."""
    own, trainer = cli.split_at_dashes(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if not trainer:
        raise UserError("give the trainer's flags after --, e.g. -- --data-dir DATA "
                        "--train-epochs 30")
    cwd = os.getcwd()
    trainer_parser = flags.handed_on_parser(MODULE)
    trainer = trainer_parser.expand_flag_files(trainer)
    parsed = trainer_parser.parse_args(trainer)
    for name, why in records.OWN_FLAGS.items():
        if getattr(parsed, name.replace("-", "_")) is not None:
            raise UserError(f"--{name} among the trainer flags: {why}; leave it out")
    args.dimensions = space.parse(args.vary, cwd)
    _check_search(args)
    if not parsed.data_dir and "data-dir" not in [d.flag for d in args.dimensions]:
        raise UserError("the trainer needs --data-dir (after --)")
    mode = records.default_mode(args.metric)
    mode = args.mode or mode
    if args.max_failures is not None and args.max_failures < 0:
        raise UserError(f"--max-failures must be 0 or more, got {args.max_failures}")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UserError(f"--max-concurrent must be 1 or more, got {args.max_concurrent}")
    if args.cpus_per_trial < 0 or args.gpus_per_trial < 0:
        raise UserError("--cpus-per-trial and --gpus-per-trial must be 0 or more")
    if not args.grace_epochs > 0:
        raise UserError(f"--grace-epochs must be positive, got {args.grace_epochs:g}")
    if not args.reduction_factor >= 2:
        raise UserError(f"--reduction-factor must be 2 or more (1 would keep every trial), "
                        f"got {args.reduction_factor:g}")
    args.max_epochs = _max_epochs(parsed)
    if args.scheduler:
        trainer = _evaluating_often(trainer, args.grace_epochs)
    from cifar10_estimator.launch import ray_actors

    trainer = ray_actors.with_gpus(records.absolute_paths(trainer, cwd), args.gpus_per_trial,
                                     parsed.num_gpus)
    varied, points = _points(args, trainer)
    records.check_trials(trainer, points)
    sweep_dir = records.absolute(args.sweep_dir, cwd)
    # What the trainers get from this environment, taken before the process is prepared for
    # TensorFlow below (its oneDNN choice is this machine's, not the nodes').
    env = ray_actors.forwarded(os.environ)
    from cifar10_estimator.platform.process import prepare_process

    prepare_process(os.environ)  # before TensorFlow loads: HParams summaries, a bucket
    storage.check_reachable(sweep_dir, "--sweep-dir")
    storage.check_writable(sweep_dir, "--sweep-dir")
    state = _state(sweep_dir, trainer, varied, points, args, mode, out)
    return _run(state, args, env)


def _check_search(args) -> None:
    """--search, --num-trials and --seed together, and the grid's --vary values (no ranges)."""
    if args.search == space.GRID:
        if args.num_trials is not None:
            raise UserError("--num-trials is for --search random or tpe: a grid's trials are "
                            "its points; leave it out, or add --search random")
        if args.seed is not None:
            raise UserError("--seed is for --search random or tpe: a grid draws nothing (the "
                            "trainers' own seed is --seed after --)")
        space.grid(args.dimensions)
        return
    if args.num_trials is None:
        raise UserError(f"--search {args.search} needs --num-trials N, how many trials to "
                        f"draw, e.g. --num-trials 12")
    if args.num_trials < 1:
        raise UserError(f"--num-trials must be 1 or more, got {args.num_trials}")
    if args.seed is not None and not 0 <= args.seed <= space.MAX_SEED:
        raise UserError(f"--seed must be from 0 to {space.MAX_SEED}, got {args.seed}")
    space.check_installed(args.search)


def _points(args, trainer: list[str]) -> tuple[list[records.Varied], list[dict[str, str]]]:
    """The varied flags and the trials' settings: the grid's points, or the random draws."""
    if args.search == space.GRID:
        varied = space.grid(args.dimensions)
        return varied, records.grid(varied)
    space.check_ends(trainer, args.dimensions)
    if args.search == space.TPE:
        # TPE draws each trial from the results so far, as the sweep runs (tuner.run_drawn):
        # no point is known before; each drawn one passes the trainer's checks in its trial,
        # before its trainer starts.
        return space.varied(args.dimensions, []), []
    points = space.draw(args.dimensions, args.num_trials, args.seed or 0)
    return space.varied(args.dimensions, points), points


def _evaluating_often(trainer: list[str], grace_epochs: float) -> list[str]:
    """The trainer flags with a checkpoint, and its evaluation, every epoch (every
    ``grace_epochs`` when that is less), where the flags do not say otherwise: the scheduler
    acts on evaluations, which the trainer makes of checkpoints."""
    given = vars(flags.build_parser(defaults=False).parse_args(trainer))
    added = []
    if not {"save_checkpoints_steps", "save_checkpoints_epochs",
            "save_checkpoints_secs"} & set(given):
        added.append(f"--save-checkpoints-epochs={min(1.0, grace_epochs):g}")
    if "eval_throttle_secs" not in given:
        added.append("--eval-throttle-secs=0")
    return added + trainer


def _max_epochs(parsed) -> Optional[float]:
    """The trials' length in epochs, where the trainer flags give it (the schedulers' last
    rung)."""
    return math.ceil(parsed.train_epochs) if parsed.train_epochs else None


def _state(sweep_dir: str, trainer: list[str], varied, points, args, mode: str, out: TextIO
           ) -> records.Sweep:
    """The sweep's trials, from the grid and what the sweep dir already holds."""
    from cifar10_estimator.sweeps import hparams

    recorded = records.read_json(storage.join(sweep_dir, records.RECORD_FILE))
    if recorded is not None and recorded.get("trainer_flags") != trainer:
        changed = records.trainer_flags_changed(recorded.get("trainer_flags") or [], trainer)
        if changed and not args.change_trainer_flags:
            raise UserError(
                f"--sweep-dir {sweep_dir} was swept with other trainer flags "
                f"({records.RECORD_FILE}): {'; '.join(changed)}; rerun with the recorded flags, "
                f"use a new --sweep-dir, or add --change-trainer-flags to run every trial "
                f"again with the new ones")
    trials = records.assign(points, recorded, sweep_dir)
    if args.search == space.TPE:  # the trials TPE drew in earlier runs are this sweep's
        for trial in trials:
            trial.in_grid = True
    for trial in trials:
        records.read_back(trial, trainer)
    records.restore_reports(trials, recorded)
    state = records.Sweep(sweep_dir, records.new_run_id(), trainer, varied, trials, args.metric,
                        mode, out, listener=hparams.SessionWriter(varied))
    content = state.content()
    if args.search != space.TPE and (recorded is None or any(
            recorded.get(k) != content[k] for k in ("vary", "metric"))):
        hparams.write_experiment(sweep_dir, varied, args.metric)  # TPE's: at its end (_run)
    return state


def _run(state: records.Sweep, args, env: dict) -> int:
    pending = state.pending()
    grid_size = sum(t.in_grid for t in state.trials.values())
    drawn = max(0, args.num_trials - grid_size) if args.search == space.TPE else 0
    shape = (" x ".join(f"{v.flag} {','.join(v.values)}" for v in state.varied)
             if args.search == space.GRID else
             f"drawn {'by TPE' if args.search == space.TPE else 'at random'} with seed "
             f"{args.seed or 0} from {space.describe(args.dimensions)}")
    state.say(f"{grid_size + drawn} trials ({shape}) in {state.sweep_dir}: "
              f"{grid_size - len(pending)} ended already, {len(pending) + drawn} to run")
    state.save()
    if pending or drawn:
        # Ray Tune's console output of Ray 2.x prints its configuration and the paths of its
        # own results (a folder deleted at the end) whatever the verbosity; its older output,
        # at verbosity 0, prints nothing: the sweep's lines are the ones to read.
        os.environ.setdefault(RAY_NEW_OUTPUT_ENV, "0")
        try:
            _tune(state, pending, args, env, drawn)
        except KeyboardInterrupt:
            state.interrupted()
            raise
    if args.search == space.TPE:  # the experiment's values: the ones TPE drew
        from cifar10_estimator.sweeps import hparams

        state.varied = space.varied(args.dimensions, [t.settings for t in state.trials.values()
                                                      if t.in_grid])
        hparams.write_experiment(state.sweep_dir, state.varied, state.metric)
    state.save()
    for line in state.summary():
        state.say(line)
    _results(state)
    tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    state.say(f"TensorBoard: {tensorboard if os.access(tensorboard, os.X_OK) else 'tensorboard'}"
              f" --logdir {state.sweep_dir}  (the HParams tab compares the trials)")
    missing = state.missing_metric()
    if missing:
        raise UserError(missing)
    unfinished = [t.name for t in state.pending() if t.status != records.FAILED]
    if unfinished:  # Ray Tune stopped early (interrupted)
        state.interrupted()
        state.say(f"stopped before {', '.join(unfinished)} ended; rerun the same command to "
                  f"run them")
        return 130
    failures = state.failures()
    if failures:
        state.say(failures)
        return 1
    return 0


def _results(state: records.Sweep) -> None:
    """The ranked table, SWEEP/results.csv, and the trials' curves (a PNG, TensorBoard)."""
    trials = list(state.trials.values())
    for line in results.table(trials, state.metric, state.mode):
        state.say(line)
    written = results.plot_curves(state.sweep_dir, trials, state.metric)
    state.say(f"the table: {results.write_csv(state.sweep_dir, trials, state.metric, state.mode)}"
              + (f"; {state.metric} over the epochs: {written[0]} and "
                 f"{storage.join(state.sweep_dir, results.CURVES_DIR)} (TensorBoard)"
                 if written else ""))


class _SaidBySweep(logging.Filter):
    """Ray Tune's log lines that the sweep's own lines say better: a failed trial's traceback
    (ray/tune/execution/tune_controller.py, "Trial task failed for trial ..."), the trials that
    did not complete, and on Ctrl-C how to resume with ``Tuner.restore`` from Ray Tune's own
    results, which the sweep deletes (ray/tune/tune.py): a rerun of the sweep resumes. Anything
    else Ray Tune logs still shows."""

    SAID = ("Trial task failed for trial", "Trials did not complete", "Stop signal received",
            "Experiment has been interrupted")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.SAID)


def _tune(state: records.Sweep, pending, args, env: dict, drawn: int = 0) -> None:
    """Runs the trials ``pending`` on the Ray cluster, then ``drawn`` more that TPE draws."""
    from cifar10_estimator.launch import ray_actors
    from cifar10_estimator.sweeps import tuner
    import ray

    for name in ("ray.tune.execution.tune_controller", "ray.tune.tune"):
        logging.getLogger(name).addFilter(_SaidBySweep())
    ray_actors.connect(args.ray)
    signal.signal(signal.SIGTERM, _interrupt)  # after Ray's own handler, which ends the process
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = ray.cluster_resources().get("CPU", 0)
    state.say(f"Ray cluster at {args.ray}: {len(nodes)} node(s), {cpus:g} CPUs; each trial "
              f"asks for {args.cpus_per_trial:g} CPU(s)"
              + (f" and {args.gpus_per_trial:g} GPU(s)" if args.gpus_per_trial else "")
              + (f", at most {args.max_concurrent} at once" if args.max_concurrent else ""))
    results = tempfile.mkdtemp(prefix="cifar10-sweep-tune-")
    try:
        early_stop = tuner.scheduler(args.scheduler, state.metric, state.mode, args.grace_epochs,
                                     args.reduction_factor, args.max_epochs)
        common = {"cpus": args.cpus_per_trial, "gpus": args.gpus_per_trial,
                  "max_concurrent": args.max_concurrent, "env": env, "storage_path": results}
        if pending:
            tuner.run(state, pending, early_stop=early_stop, **common)
        if drawn:
            known = [(space.config_of(args.dimensions, t.settings),
                      records.value_of(t, state.metric)) for t in state.trials.values()
                     if t.in_grid and t.status in records.ENDED
                     and records.value_of(t, state.metric) is not None]
            searcher = space.searcher(args.search, state.metric, state.mode, args.seed or 0,
                                      known)
            early_stop = tuner.scheduler(args.scheduler, state.metric, state.mode,
                                         args.grace_epochs, args.reduction_factor,
                                         args.max_epochs)  # a scheduler serves one run
            tuner.run_drawn(state, args.dimensions, searcher, drawn, early_stop=early_stop,
                            **common)
        _run_lost_again(state, args, common)
    except Exception:
        # What the records' writes raised inside Ray Tune's callbacks comes out wrapped in Ray
        # Tune's own error, a traceback as text: the line is the records' (``Sweep.writing``).
        if state.write_error is not None:
            raise state.write_error from None
        raise
    finally:
        shutil.rmtree(results, ignore_errors=True)


def _run_lost_again(state: records.Sweep, args, common: dict) -> None:
    """Runs the trials lost with their Ray worker (a node gone) again, each resuming from its
    job dir's checkpoint, at most ``--max-failures`` times, as the cluster launcher places a
    job that lost a node again; they fail for good after that."""
    from cifar10_estimator.launch import ray_actors
    from cifar10_estimator.sweeps import tuner

    most = ray_actors.MAX_FAILURES if args.max_failures is None else args.max_failures
    for restart in range(1, most + 1):
        lost = state.lost()
        if not lost:
            return
        names = ", ".join(t.name for t in lost)
        state.say(f"{len(lost)} trial(s) lost with their Ray worker ({names}): running them "
                  f"again, restart {restart} of {most} (--max-failures); each resumes from its "
                  f"latest checkpoint")
        early_stop = tuner.scheduler(args.scheduler, state.metric, state.mode, args.grace_epochs,
                                     args.reduction_factor, args.max_epochs)
        tuner.run(state, lost, early_stop=early_stop, **common)
    if state.lost():
        names = ", ".join(t.name for t in state.lost())
        state.say(f"{names}: lost with their Ray worker; no restarts left (--max-failures "
                  f"{most})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_cli(lambda: run(argv), MODULE)


if __name__ == "__main__":
    sys.exit(main())
