"""Accuracy against epochs and wall time, trained to the end on real pictures: the paper recipe,
the fast recipe and the same network in Keras.

Four runs, one after the other, each in its own process:

- ``paper``: our trainer, ``--recipe paper --train-epochs E``, with the learning-rate drops
  scaled to the run. The default boundaries (82, 123, 300 epochs) belong to the default run of
  80,000 steps at batch 128 over the tutorial's 45,000 training images, 227.6 epochs; each is
  multiplied by E / 227.6, so a short run drops its rate at the same fractions of its length.
- ``fast``: our trainer, ``--recipe fast --train-epochs F`` (plus ``--fast-flags``, to try
  alternatives).
- ``tutorial``: our trainer with the original tutorial's CNN, ``--model tutorial-cnn``, and
  that model's own defaults (plain SGD at 0.1, weight decay 0.004 on its hidden layers, 24x24
  crops with colour distortions, evaluation with weights averaged at 0.9999), E epochs.
- ``keras``: our ResNet built in Keras (``keras_resnet.build_resnet``) with the paper recipe:
  SGD with momentum 0.9, weight decay 2e-4, the same scaled piecewise schedule, batch 128,
  ``model.fit`` on the same TFRecords through the package's own input pipeline (same
  augmentation), evaluated after every epoch. It has neither our batch-norm decay ramp nor
  precise batch norm, so its early evaluations use moving statistics that still remember their
  start values.

Every run evaluates the whole eval split after every epoch (a checkpoint per epoch and
``--eval-throttle-secs 1`` for the trainer); the wall time of an evaluation is the time from
the start of the run's process to its result line, evaluations included, as a user waits for
them. The pictures are Zalando's Fashion-MNIST from Debian's ``dataset-fashion-mnist``
(60,000 training and 10,000 test pictures, 28x28 grey, 10 classes), written as an image folder
and converted by the package's own generator (``precise_bn_bench.make_records``); the records
are kept in ``--work-dir`` for the next run, as are every run's job folder and full log
(``WORK/runs/NAME/log.txt``, each line stamped with the seconds since the run started).

Printed: the machine, then per run a table of epoch, wall minutes and accuracy, then a summary:
the paper run's final accuracy, when the fast run first reached it (and that time as a share of
the paper run's), both runs at equal epochs, and Keras' final accuracy against ours.

    python benchmarks/convergence.py                      # ResNet-20, 15 and 5 epochs
    python benchmarks/convergence.py --runs paper,fast --json /tmp/convergence.json
    python benchmarks/convergence.py --runs fast --fast-epochs 8 --fast-flags "--label-smoothing 0"
    python benchmarks/convergence.py --per-class 30 --depth 8 --epochs 1 --fast-epochs 1 \\
        --work-dir /tmp/convergence-try                 # a quick try of the plumbing

The defaults take about an hour on a 2-core CPU, estimated from the training rates in
docs/performance.md (ResNet-20 in fp32 at about 740 images/s on its Xeon): about 20 minutes
each for the paper and Keras runs (15 epochs of 60,000 pictures, 15 evaluations of 10,000),
a few for the fast one (5 epochs), under a minute for the records; longer on AVX2-only CPUs
(about 465 images/s under the AVX2 cap). ``--fast-flags`` takes a single flag as
``--fast-flags=--xla`` (argparse reads a lone ``--xla`` as a flag of this script).
"""

import argparse
import collections
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import keras_resnet
import precise_bn_bench as fashion_mnist
from machine import machine_line

from cifar10_estimator import storage
from cifar10_estimator.data import metadata
from cifar10_estimator.errors import UserError, run_cli
from cifar10_estimator.logs import import_tensorflow_quietly
from cifar10_estimator.config.settings import ModelParams
from cifar10_estimator.platform import cpu
from cifar10_estimator.config.overlays import MODELS as MODEL_OVERLAYS
from cifar10_estimator.config.settings import RESNET, TrainConfig
from cifar10_estimator.config import flags as trainer_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = ("paper", "fast", "keras", "tutorial")
DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelParams)}
# The training images the tutorial's 80,000 steps were counted against: its hard-coded 45,000
# (config/overlays.py's comment on the ResNet's train_steps; docs/training.md, "The learning-rate
# schedule"). Not a named constant in the package, which counts the records of the training
# file instead: 40,000 for CIFAR-10 (data_batch_1-4, data/schema.py SPLITS), by which count the
# default run is 256 epochs. This benchmark scales by the tutorial's 227.6.
TUTORIAL_TRAIN_IMAGES = 45_000
# The default run in epochs: 80,000 x 128 / 45,000 = 227.6. The default boundaries
# (ModelParams.lr_boundary_epochs) are placed within a run of this length.
DEFAULT_RUN_EPOCHS = MODEL_OVERLAYS[RESNET]["train_steps"] * DEFAULTS["train_batch_size"] / TUTORIAL_TRAIN_IMAGES
# Fashion-MNIST (Xiao et al. 2017, arXiv:1708.07747): 6,000 training and 1,000 test pictures
# per class.
TEST_PER_CLASS = 1_000
EVAL_BATCH_SIZE = 100  # the trainer's --eval-batch-size default; 10,000 test pictures divide it
# The trainer's evaluation lines (evaluation/report.py evaluation_line, logged by
# training/driver.py and evaluation/report.py; train.py logs the last one again as "final evaluation at step N: ...").
# The accuracy is printed with 4 significant digits (0.8712, 1, 0.1).
EVALUATION = re.compile(r"\bevaluation at step (\d+): accuracy = ([0-9.]+(?:e-?\d+)?)")
# The trainer's line about the data (training/task.py): "... 60000 train records, 468 steps
# per epoch, ..."; the Keras run prints the same words.
STEPS_PER_EPOCH = re.compile(r"\b(\d+) train records, (\d+) steps per epoch")
FAILED_OUTPUT_CHARS = 3000


@dataclasses.dataclass
class Evaluation:
    step: int
    epoch: float
    minutes: float
    accuracy: float


@dataclasses.dataclass
class Run:
    name: str
    command: list[str]
    log: str
    batch_size: int
    steps_per_epoch: int
    evaluations: list[Evaluation] = dataclasses.field(default_factory=list)
    minutes: float = 0.0  # the whole process, start to exit

    @property
    def final(self) -> Evaluation:
        return self.evaluations[-1]


# ---------------------------------------------------------------------------------------------
# Data


def prepare_data(work_dir: str, per_class: int | None) -> str:
    """The Fashion-MNIST records folder in ``work_dir``, generated unless already there."""
    name = "fashion-mnist-all" if per_class is None else f"fashion-mnist-{per_class}-per-class"
    data_dir = os.path.join(work_dir, name)
    ready = all(os.path.isfile(os.path.join(data_dir, f)) for f in (
        "train.tfrecords", "eval.tfrecords", metadata.METADATA_FILENAME))
    if ready:
        print(f"data: {data_dir} (already generated)", flush=True)
        return data_dir
    shutil.rmtree(data_dir, ignore_errors=True)  # incomplete (a file removed since)
    test_per_class = None if per_class is None else min(per_class, TEST_PER_CLASS)
    started = time.monotonic()
    # Made in a temporary folder and renamed, so an interrupted run leaves no half cache.
    with storage.atomic_dir(data_dir) as tmp:
        fashion_mnist.make_records(tmp, per_class, test_per_class)
    print(f"data: {data_dir} (generated in {time.monotonic() - started:.0f} s)", flush=True)
    return data_dir


# ---------------------------------------------------------------------------------------------
# Schedules and batches


def scaled_boundaries(epochs: float) -> str:
    """The default boundaries scaled from the default run's length to ``epochs``: "a,b,c"."""
    return ",".join(f"{b * epochs / DEFAULT_RUN_EPOCHS:.6g}"
                    for b in MODEL_DEFAULTS["lr_boundary_epochs"])


def epoch_steps(train_records: int, batch: int) -> int:
    """Steps per epoch as the trainer counts them (docs/training.md): train records // batch."""
    if train_records < batch:
        raise UserError(f"{train_records} training pictures make no batch of {batch}; use a "
                        f"larger --per-class")
    return train_records // batch


def run_batch(flags: list[str]) -> int:
    """The training batch of a trainer run with these flags, as the trainer resolves it (a
    flag given, else the recipe's, else the model's, else the default)."""
    return trainer_flags.parse(flags)[0].train_batch_size


# ---------------------------------------------------------------------------------------------
# Running and reading a run


def run_logged(run: Run) -> Run:
    """Runs ``run.command``, stamps every line of its output with the seconds since it started
    (into ``run.log``), prints each evaluation as a table row as it arrives; exits on failure."""
    os.makedirs(os.path.dirname(run.log), exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONUNBUFFERED"] = "1"
    print(f"  {'epoch':>7} | {'wall min':>8} | {'accuracy %':>10}", flush=True)
    tail: collections.deque[str] = collections.deque(maxlen=400)
    seen: set[int] = set()
    started = time.monotonic()
    proc = subprocess.Popen(run.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, cwd=REPO, env=env)
    with open(run.log, "w") as log:
        for line in proc.stdout:
            seconds = time.monotonic() - started
            log.write(f"{seconds:9.2f} {line}")
            log.flush()
            tail.append(line)
            sizes = STEPS_PER_EPOCH.search(line)
            if sizes and int(sizes.group(2)) != run.steps_per_epoch:
                print(f"  note: the run counts {sizes.group(2)} steps per epoch, not "
                      f"{run.steps_per_epoch}; using its figure", flush=True)
                run.steps_per_epoch = int(sizes.group(2))
            match = EVALUATION.search(line)
            # The final evaluation is logged twice (as it happens and in the summary).
            if match and int(match.group(1)) not in seen:
                step = int(match.group(1))
                seen.add(step)
                evaluation = Evaluation(step, step / run.steps_per_epoch, seconds / 60,
                                        float(match.group(2)))
                run.evaluations.append(evaluation)
                print(f"  {evaluation.epoch:7.2f} | {evaluation.minutes:8.2f} | "
                      f"{100 * evaluation.accuracy:10.2f}", flush=True)
    status = proc.wait()
    run.minutes = (time.monotonic() - started) / 60
    if status or not run.evaluations:
        sys.stderr.write("".join(tail)[-FAILED_OUTPUT_CHARS:])
        problem = f"exited with status {status}" if status else "logged no evaluation"
        raise SystemExit(f"the {run.name} run {problem}; its whole log: {run.log}")
    print(f"  whole run: {run.minutes:.2f} min (log: {run.log})", flush=True)
    return run


def trainer_run(name: str, args, data_dir: str, train_records: int, epochs: float,
                extra: list[str]) -> Run:
    """Our trainer: --recipe NAME (paper or fast), or the paper recipe with the tutorial CNN."""
    folder = os.path.join(args.work_dir, "runs", name)
    shutil.rmtree(folder, ignore_errors=True)  # a fresh job folder: no resuming
    model = (["--model", "tutorial-cnn", "--recipe", "paper"] if name == "tutorial" else
             ["--num-layers", str(args.depth), "--recipe", name])
    batch = run_batch([*model, *extra])
    steps_per_epoch = epoch_steps(train_records, batch)
    command = [sys.executable, "-m", "cifar10_estimator", "--data-dir", data_dir,
               "--job-dir", os.path.join(folder, "job"), *model,
               "--train-epochs", f"{epochs:g}", "--seed", str(args.seed),
               # A checkpoint per epoch, each evaluated as soon as it is written.
               "--save-checkpoints-steps", str(steps_per_epoch), "--eval-throttle-secs", "1",
               *extra]
    return Run(name, command, os.path.join(folder, "log.txt"), batch, steps_per_epoch)


def keras_run(args, data_dir: str, train_records: int, boundaries: str) -> Run:
    folder = os.path.join(args.work_dir, "runs", "keras")
    shutil.rmtree(folder, ignore_errors=True)
    command = [sys.executable, os.path.abspath(__file__), "--_keras-run",
               "--data-dir", data_dir, "--depth", str(args.depth), "--epochs", str(args.epochs),
               "--seed", str(args.seed), "--lr-boundary-epochs", boundaries]
    return Run("keras", command, os.path.join(folder, "log.txt"), keras_resnet.BATCH_SIZE,
               epoch_steps(train_records, keras_resnet.BATCH_SIZE))


# ---------------------------------------------------------------------------------------------
# The Keras run (in its own process: --_keras-run)


def train_keras(args) -> int:
    """Trains our ResNet with Keras' ``model.fit`` and the paper recipe; prints the trainer's
    data line and one trainer-style evaluation line per epoch, which the parent reads."""
    expected = keras_resnet.expected_params(args.depth)
    cpu.prefer_onednn(os.environ)  # before TensorFlow loads, as our command lines do (cpu.py)
    import_tensorflow_quietly()  # without its load-time C++ lines, as the trainer
    import tensorflow as tf

    from cifar10_estimator.data.pipeline import Cifar10DataSet

    tf.keras.utils.set_random_seed(args.seed)
    train = Cifar10DataSet(args.data_dir, "train")
    train_records = train.num_examples()
    steps_per_epoch = epoch_steps(train_records, keras_resnet.BATCH_SIZE)
    boundary_epochs = [float(e) for e in args.lr_boundary_epochs.split(",")]
    # As the trainer's piecewise schedule (model/schedules.py): int(steps per epoch x epoch),
    # the rate times one factor per phase (ModelParams.lr_decay_factors: 1, 0.1, 0.01, 0.002).
    boundaries = [int(steps_per_epoch * e) for e in boundary_epochs]
    values = [keras_resnet.LEARNING_RATE * f for f in MODEL_DEFAULTS["lr_decay_factors"]]
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values)
    print(f"Keras ResNet-{args.depth}; {train_records} train records, {steps_per_epoch} steps "
          f"per epoch, {args.epochs * steps_per_epoch} steps in all; learning rate "
          f"{', '.join(f'{v:g}' for v in values)} changing at steps {boundaries}", flush=True)

    model = keras_resnet.build_resnet(args.depth, input_dtype="float32")
    params = keras_resnet.trainable_params(model)
    if params != expected:
        raise SystemExit(f"the Keras model has drifted from ours: {params:,} trainable "
                         f"parameters, ours has {expected:,}")
    keras_resnet.add_weight_decay(model)
    model.compile(optimizer=tf.keras.optimizers.SGD(schedule, momentum=keras_resnet.MOMENTUM),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  # weighted_metrics: Keras weighs only these by the sample weights, which
                  # leave out the eval batches' padding rows (weight 0).
                  weighted_metrics=[tf.keras.metrics.SparseCategoricalAccuracy("accuracy")])

    images = train.make_batch(keras_resnet.BATCH_SIZE, seed=args.seed).map(
        lambda features, labels: (features["image"], labels))
    evaluation = Cifar10DataSet(args.data_dir, "eval").make_batch(EVAL_BATCH_SIZE).map(
        lambda features, labels: (features["image"], labels, features["weight"]))

    class EvaluationLine(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            # After the epoch's validation pass; the same words as the trainer's line, then
            # the epoch's training figures (batch statistics, augmented images) for the log.
            print(f"evaluation at step {(epoch + 1) * steps_per_epoch}: accuracy = "
                  f"{logs['val_accuracy']:.4g}, loss = {logs['val_loss']:.4g}", flush=True)
            print(f"epoch {epoch + 1} training: accuracy = {logs['accuracy']:.4g}, loss = "
                  f"{logs['loss']:.4g}", flush=True)

    model.fit(images, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
              validation_data=evaluation, verbose=0, callbacks=[EvaluationLine()])
    return 0


# ---------------------------------------------------------------------------------------------
# Summary


def nearest(run: Run, epoch: float) -> Evaluation:
    return min(run.evaluations, key=lambda e: abs(e.epoch - epoch))


def summarise(runs: dict[str, Run]) -> dict:
    """Prints the comparisons the selected runs allow; returns them for the JSON."""
    summary: dict = {}
    paper, fast, keras = runs.get("paper"), runs.get("fast"), runs.get("keras")
    if paper is None:
        return summary
    target = paper.final
    print(f"paper: {100 * target.accuracy:.2f}% at epoch {target.epoch:.2f}, after "
          f"{target.minutes:.2f} min")
    summary["paper"] = {"accuracy": target.accuracy, "epoch": target.epoch,
                        "minutes": target.minutes}
    if fast is not None:
        reached = next((e for e in fast.evaluations if e.accuracy >= target.accuracy), None)
        if reached is None:
            print(f"fast: not reached (best {100 * max(e.accuracy for e in fast.evaluations):.2f}"
                  f"%, final {100 * fast.final.accuracy:.2f}% after {fast.final.minutes:.2f} "
                  f"min)")
            summary["fast_reached"] = None
        else:
            # The paper run's time to its final evaluation (its export after it left out).
            ratio = reached.minutes / target.minutes
            print(f"fast: reached {100 * reached.accuracy:.2f}% at epoch {reached.epoch:.2f}, "
                  f"after {reached.minutes:.2f} min: {ratio:.2f} of the paper run's time")
            summary["fast_reached"] = {**dataclasses.asdict(reached), "time_ratio": ratio}
        print("at equal epochs (fast against the paper run's nearest evaluation):")
        pairs = []
        for e in fast.evaluations:
            p = nearest(paper, e.epoch)
            print(f"  epoch {e.epoch:6.2f}: fast {100 * e.accuracy:6.2f}%, paper "
                  f"{100 * p.accuracy:6.2f}% (epoch {p.epoch:.2f})")
            pairs.append({"epoch": e.epoch, "fast": e.accuracy, "paper_epoch": p.epoch,
                          "paper": p.accuracy})
        summary["equal_epochs"] = pairs
    tutorial = runs.get("tutorial")
    if tutorial is not None:
        print(f"tutorial CNN: {100 * tutorial.final.accuracy:.2f}% at epoch "
              f"{tutorial.final.epoch:.2f}, after {tutorial.final.minutes:.2f} min")
        summary["tutorial"] = dataclasses.asdict(tutorial.final)
    if keras is not None:
        points = 100 * (keras.final.accuracy - target.accuracy)
        print(f"keras: {100 * keras.final.accuracy:.2f}% at epoch {keras.final.epoch:.2f}, "
              f"{points:+.2f} points against the paper run")
        summary["keras"] = {"accuracy": keras.final.accuracy, "epoch": keras.final.epoch,
                            "points_vs_paper": points}
    return summary


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=15,
                        help="epochs of the paper and Keras runs (default 15)")
    parser.add_argument("--fast-epochs", type=float, default=5.0,
                        help="epochs of the fast run (default 5)")
    parser.add_argument("--depth", type=int, default=20, help="ResNet depth, 6n+2 (default 20)")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"which runs, in this order (default {','.join(RUNS)})")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--per-class", type=int, default=None,
                        help="training (and, up to 1,000, test) pictures per class (default: "
                             "all, 6,000 and 1,000)")
    parser.add_argument("--work-dir", default="/tmp/convergence-bench",
                        help="records (kept for reruns), job folders and logs")
    parser.add_argument("--fast-flags", default="",
                        help='more trainer flags for the fast run, e.g. "--label-smoothing 0"')
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write every figure to PATH as JSON")
    # The Keras run's own process (train_keras) and its two flags of its own.
    parser.add_argument("--_keras-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--lr-boundary-epochs", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._keras_run:
        return args
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = sorted(set(runs) - set(RUNS))
    if unknown or not runs or len(set(runs)) != len(runs):
        parser.error(f"--runs: a subset of {','.join(RUNS)} without repeats, got {args.runs!r}")
    args.runs = runs
    if args.epochs < 1 or args.fast_epochs <= 0:
        parser.error("--epochs must be 1 or more and --fast-epochs above 0")
    if args.per_class is not None and args.per_class < 1:
        parser.error("--per-class must be 1 or more")
    keras_resnet.expected_params(args.depth)  # UserError naming --depth unless it is 6n+2
    args.work_dir = os.path.abspath(args.work_dir)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args._keras_run:
        return train_keras(args)
    fashion_mnist.check_source()
    machine = machine_line()
    print(machine, flush=True)
    data_dir = prepare_data(args.work_dir, args.per_class)
    train_records = metadata.split_size(data_dir, "train")
    eval_records = metadata.split_size(data_dir, "eval")
    boundaries = scaled_boundaries(args.epochs)
    drops = ", ".join(f"{b:g}" for b in MODEL_DEFAULTS["lr_boundary_epochs"])
    print(f"Fashion-MNIST: {train_records:,} training and {eval_records:,} test pictures; "
          f"ResNet-{args.depth}, seed {args.seed}; paper schedule: drops at epochs {boundaries} "
          f"(the default {drops} x {args.epochs} / {DEFAULT_RUN_EPOCHS:.1f})", flush=True)

    runs: dict[str, Run] = {}
    for name in args.runs:
        if name == "paper":
            run = trainer_run("paper", args, data_dir, train_records, args.epochs,
                              ["--lr-boundary-epochs", boundaries])
        elif name == "fast":
            run = trainer_run("fast", args, data_dir, train_records, args.fast_epochs,
                              shlex.split(args.fast_flags))
        elif name == "tutorial":
            run = trainer_run("tutorial", args, data_dir, train_records, args.epochs, [])
        else:
            run = keras_run(args, data_dir, train_records, boundaries)
        print(f"\n{name}: batch {run.batch_size}, {run.steps_per_epoch} steps per epoch\n  "
              f"{shlex.join(run.command)}", flush=True)
        runs[name] = run_logged(run)

    print()
    summary = summarise(runs)
    if args.json:
        body = {"machine": machine, "data": {"dir": data_dir, "train": train_records,
                                             "eval": eval_records},
                "settings": {"epochs": args.epochs, "fast_epochs": args.fast_epochs,
                             "depth": args.depth, "seed": args.seed,
                             "per_class": args.per_class, "fast_flags": args.fast_flags,
                             "paper_lr_boundary_epochs": boundaries},
                "runs": {name: dataclasses.asdict(run) for name, run in runs.items()},
                "summary": summary}
        storage.write_bytes_atomic(args.json, (json.dumps(body, indent=1) + "\n").encode())
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "convergence.py"))
