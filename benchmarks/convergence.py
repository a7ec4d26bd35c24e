"""Time to accuracy on real pictures, as medians of several seeds: the paper recipe, the fast
recipe (and candidate changes to it), and the same network in Keras; on the test split, or on a
validation split held out for choosing a recipe's values.

Rows (``--rows``, each run once per seed, the rows of a seed one after the other so that a
drifting machine affects them alike; each in its own process):

- ``he``: the fair baseline: our trainer, ``--recipe paper --train-epochs E`` (``--epochs``,
  default 15), which follows He et al.'s proportions of a run of a given length (drops to 0.1
  and 0.01 at 50 % and 75 % of it), ``--precision auto`` as the fast recipe.
- ``cosine``: the same with ``--lr-schedule cosine``.
- ``paper``: the tutorial-proportioned schedule: our trainer, ``--recipe paper --train-epochs
  E`` with the tutorial's drops scaled to the run, fp32. The default boundaries (82, 123, 300
  epochs) belong to the default run of 80,000 steps at batch 128 over the tutorial's 45,000
  training images, 227.6 epochs; each is multiplied by E / 227.6 (drops at 36 % and 54 % of
  the run).
- ``fast``: our trainer, ``--recipe fast`` with the recipe's own run length (config/overlays.py
  ``RUN_LENGTHS``), or ``--fast-epochs``.
- ``fast+NAME[+NAME...]``: the fast recipe with candidate changes (``CANDIDATES``: warm-up,
  weight averaging, no label smoothing, the peak rate, test-time mirroring, the batch, the run
  length, the whitening layer, batch-norm rates, Lookahead, alternating flips, multi-crop
  test-time views, progressive resizing; the candidates' flags come last, in order, and win).
- ``paper+NAME``: the paper recipe with one suspect of its gap to Keras changed
  (``SUSPECTS``).
- ``keras``: our ResNet built in Keras (``keras_resnet.build_resnet``) with the paper recipe:
  SGD with momentum 0.9, weight decay 2e-4, the same scaled piecewise schedule, batch 128,
  ``model.fit`` on the same records through the package's own input pipeline (same
  augmentation). ``keras+he`` drops the rate at He et al.'s proportions of the run instead, as
  ``he`` does: the peer of the fair baseline; ``+bf16`` trains it under Keras'
  ``mixed_bfloat16`` policy (refused where our trainer refuses bf16), the peer of an ``he``
  row whose ``--precision auto`` chose bf16 (its log's first lines say which).
- ``tutorial``: the original tutorial's CNN, ``--model tutorial-cnn``, with its own defaults.

A row followed by ``@AVX2`` runs with ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's AVX2 kernels, a
stand-in on an AVX-512 machine for a CPU without native bf16 (``--precision auto`` then trains
in fp32, as on such a CPU).

Every run evaluates as a user's run with default flags does (the trainer: every 10 minutes and
at the end; Keras: at the end), on the whole evaluation split; ``--every-epoch`` evaluates after
every epoch instead, for curves. A run's time is from the start of its process to its final
evaluation's result line, as a user waits for it.

Data: Zalando's Fashion-MNIST from Debian's ``dataset-fashion-mnist`` (60,000 training and
10,000 test pictures, 28x28 grey, 10 classes), written as an image folder and converted by the
package's own generator (``precise_bn_bench.make_records``), kept in ``--work-dir`` for the
next run. ``--per-class`` takes the first N training pictures of each class (1,000: a
10,000-picture training set). ``--split validation`` evaluates on the last 1,000 training
pictures of each class instead of the test pictures, and trains on at most the 5,000 before
them: the split to choose values on; ``--split test`` (the default) is for reporting.
``--split holdout`` (``--per-class`` at most 5,000) evaluates on as many training pictures of
each class after the first ``--per-class``: pictures that neither the validation runs choose on
nor the test split's readings have seen, to read a choice once more after the test split has
been read many times. Above 4,000 per class, fewer than 2,000 of a class's 6,000 are left, and
each of the two splits holds half of those, at least 500 (``precise_bn_bench.held_out``; 50,000
training pictures: 5,000 validation and 5,000 holdout pictures).

Each run's job dir and log are kept in ``--work-dir``'s ``runs/KEY/ROW/seed-N``, where KEY names
the pictures (size and split), the depth and the lengths (``runs_key``): an invocation on
other pictures or settings starts its own runs beside them.

``--report`` runs nothing: it prints the table of the runs of ``--rows`` and ``--seeds`` that
earlier invocations left in ``--work-dir`` (their logs), for a planned round whose seeds ran in
several sessions or whose launch stopped; a run missing or unfinished is named. Its machine line
is the machine it runs on; the runs' own are at the top of their logs. ``--reread SPLIT[,...]``
is ``--report`` with each run's final checkpoint evaluated once more, by the package's evaluate
command, on each SPLIT's pictures (kept as ``reread-SPLIT.json`` in the run's folder): runs
that trained on the same pictures read on the other splits without training again, each in a
column of its own, and in an ``all`` column the accuracy over every split's pictures (a
median over the seeds of each run's), which a gap narrower than one split's noise needs. A
Keras run keeps its final weights (``model.weights.h5``), which ``--reread`` evaluates in a
Keras process of the Python that runs it: reread Keras rows with the Python that trained them.

Printed: the machine, a line per run as it ends, then one table: per row the median final
accuracy with its lowest and highest over the seeds (with ``--reread``, then the other splits'
medians and ``all``), the median epochs and wall minutes, and the
row's median time as a share of the ``he`` row's (else the ``paper`` row's) under the same
oneDNN setting.

    python benchmarks/convergence.py --per-class 1000 --split validation \\
        --rows fast,fast+no-smoothing,fast+ema,fast+peak-0.3,fast+cosine-warmup,fast+mirror
    python benchmarks/convergence.py --per-class 1000 \\
        --rows paper,keras,fast,paper@AVX2,fast@AVX2 --json /tmp/convergence.json
    python benchmarks/convergence.py --per-class 4000 --rows he,fast --reread validation,holdout
    python benchmarks/convergence.py --per-class 30 --depth 8 --epochs 1 --fast-epochs 1 \\
        --seeds 1 --work-dir /tmp/convergence-try           # a quick try of the plumbing

On the full training set (no ``--per-class``) a paper or Keras run of ResNet-20 takes about
20 minutes on a 2-core CPU, a fast one 5 to 8; on the 10,000-picture subset about a sixth.
"""

import argparse
import collections
import dataclasses
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Optional, Sequence

import keras_resnet
import precise_bn_bench as fashion_mnist
from machine import machine_line

from cifar10_estimator import storage
from cifar10_estimator.config import plan
from cifar10_estimator.config import flags as trainer_flags
from cifar10_estimator.config.overlays import MODELS as MODEL_OVERLAYS
from cifar10_estimator.config.settings import FIELDS, HE_FACTORS, RESNET
from cifar10_estimator.data import metadata, schema
from cifar10_estimator.errors import UserError, run_cli
from cifar10_estimator.logs import CPP_LOG_LEVEL_ENV, import_tensorflow_quietly
from cifar10_estimator.platform import cpu
from cifar10_estimator.platform.process import prepare_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASES = ("paper", "he", "cosine", "fast", "keras", "tutorial")
# The rows the others' time is a share of, strongest first: the fair baseline (He et al.'s
# proportions of the same run), else the tutorial-proportioned one.
REFERENCES = ("he", "paper")
# Candidate changes to the fast recipe, chosen between on the validation split.
CANDIDATES = {
    # Weight averaging (Polyak and Juditsky 1992); 0.99 spans about 100 steps, a third to a
    # half of a fast run on 10,000 pictures at batch 256 (39 steps per epoch).
    "ema": ["--moving-average-decay", "0.99"],
    "no-smoothing": ["--label-smoothing", "0"],
    # The peak at batch 128 (the recipe's reference batch): 0.3 instead of the recipe's; the
    # rate a run uses follows its batch (--lr-reference-batch).
    "peak-0.3": ["--learning-rate", "0.3"],
    # Linear warm-up for one epoch, then cosine decay to 0 (Goyal et al. 2017; Loshchilov and
    # Hutter 2017), in place of the one-cycle's longer rise.
    "cosine-warmup": ["--lr-schedule", "cosine", "--warmup-epochs", "1"],
    # Test-time augmentation: the logits of each picture and its mirror, averaged.
    "mirror": ["--test-time-mirror", "true"],
    # Short-run regularisation and momentum, as in fast CIFAR-10 training: weight decay 5e-4
    # (Zagoruyko and Komodakis 2016, arXiv:1605.07146), label smoothing 0.2 (Page 2019, "How to
    # train your ResNet"), Nesterov momentum (Sutskever et al. 2013; the recipe's since the
    # third round), a peak of 0.4 at batch 128 (the recipe's since then).
    "wd-5e-4": ["--weight-decay", "5e-4"],
    "smoothing-0.2": ["--label-smoothing", "0.2"],
    "nesterov": ["--nesterov", "true"],
    "peak-0.4": ["--learning-rate", "0.4"],
    # The recipe's values before the third round (classic momentum, a peak of 0.2), to rerun
    # its rows: fast+classic+peak-0.2+epochs-4.
    "classic": ["--nesterov", "false"],
    "peak-0.2": ["--learning-rate", "0.2"],
    # Each residual block starting as the identity (Goyal et al. 2017, section 5.1), and no
    # decay on batch-norm scales and shifts or biases (He et al. 2019, section 3.1).
    "zero-gamma": ["--zero-init-residual", "true"],
    "no-bias-decay": ["--no-bias-decay", "true"],
    # The weight decay on every variable, as before the fourth round (to rerun its rows).
    "bias-decay": ["--no-bias-decay", "false"],
    # Batches: a smaller one runs more steps per epoch, which a small training set runs short
    # of, at fewer images/s; the peak follows the batch (0.4 at 256, 0.05 at 32).
    **{f"batch-{b}": ["--train-batch-size", str(b)] for b in (32, 64, 128, 256)},
    # The one-cycle's rise, in epochs, in place of 30 % of the run (Smith and Topin 2017 rose
    # for about half of it; Page 2019 for about a fifth).
    **{f"rise-{e:g}": ["--warmup-epochs", f"{e:g}"] for e in (0.5, 1, 2)},
    # The field's fastest trainers' levers (airbench, Jordan 2024, arXiv:2404.00498): a
    # frozen whitening layer over 2x2 patches; batch-norm scales and shifts trained 4 times
    # faster (airbench trains its shifts 64 times faster, with its scales frozen and a
    # different rate scale; 4 is this recipe's trial); Lookahead every 5 steps at 0.5 (Zhang et
    # al. 2019's defaults); alternating flips; 6 test-time views (mirror, 1-pixel shifts).
    "whiten": ["--whitening-patch", "2"],
    "whiten-3": ["--whitening-patch", "3"],
    "bn-lr-4": ["--batch-norm-lr-multiplier", "4"],
    "lookahead": ["--lookahead-steps", "5"],
    "alt-flip": ["--alternating-flips", "true"],
    "tta": ["--test-time-mirror", "true", "--test-time-shift", "1"],
    # airbench's levers not yet tried, at its settings (Jordan 2024; cifar10-zoo's
    # airbench_ablations, each added to the last, epochs to 94 % on CIFAR-10): identity (dirac)
    # initialisation of the convolutions after the first (21 -> 18 epochs); the batch norms'
    # shifts at 64 times the rate (18 -> 13.5; ours scales shifts and scales together);
    # Lookahead only with a fast batch-norm momentum, PyTorch's 0.6, which is a decay of 0.4
    # (its README: each helps only with the other); label smoothing 0.2; Nesterov momentum
    # 0.85 at batch 1024 under its triangular schedule (main2_dirac.py's hyperparameters).
    "dirac": ["--dirac-init", "true"],
    "bn-lr-64": ["--batch-norm-lr-multiplier", "64"],
    "lookahead-fast-bn": ["--lookahead-steps", "5", "--batch-norm-decay", "0.4"],
    "triangular": ["--lr-schedule", "triangular"],
    "airbench-opt": ["--lr-schedule", "triangular", "--momentum", "0.85", "--nesterov", "true",
                     "--train-batch-size", "1024"],
    # airbench-opt keeps the recipe's peak, 0.4 at batch 128, which the rate's linear scaling
    # makes 3.2 at 1024: it did not train (63 and 77 % on 40,000 pictures, docs/experiments.md,
    # "The sixth round"). airbench's own peak: main2_dirac.py's lr of 10 per 1024 examples,
    # divided by 1024 x (1 + 1 / (1 - 0.85)) and applied to the summed loss of a batch of 1024,
    # is 10 / 7.667 = 1.30 on the mean loss at 1024, which is 0.163 at batch 128
    # (fast+airbench-opt+airbench-rate).
    "airbench-rate": ["--learning-rate", "0.163"],
    # Progressive resizing (Hoffer et al. 2019, arXiv:1908.08986): the first F of the run on
    # pictures scaled down to 24 pixels a side, where a step costs about 0.62 of a full-size
    # one with oneDNN at AVX2 (docs/experiments.md, "The sixth round"). The round's rows ran
    # as low-res-E, the first E epochs, with the flag's first form (--low-res-epochs, commit
    # ac5f5c6): low-res-1 and low-res-2 of 5 epochs are 0.2 and 0.4, low-res-3 of 5.5 is 0.545.
    # The round's sixth session's rows: 4 of 6 epochs (0.667), 5 of 7 (0.714), 7 of 9 (0.778),
    # the longer ones at smaller sizes (size-N: --low-res-size), whose step speeds at AVX2 are
    # in docs/experiments.md, "The sixth round". low-res-0: the recipe all at full size.
    **{f"low-res-{f:g}": ["--low-res-fraction", f"{f:g}"]
       for f in (0, 0.2, 0.4, 0.5, 0.545, 0.667, 0.714, 0.778)},
    **{f"size-{s}": ["--low-res-size", str(s)] for s in (16, 20)},
    # Run lengths, in place of the recipe's own (or --fast-epochs).
    **{f"epochs-{e:g}": ["--train-epochs", f"{e:g}"]
       for e in (3, 3.5, 4, 4.5, 5, 5.5, 6, 7, 8, 9, 10, 12)},
}
# Suspects of the paper recipe's gap to Keras, each changed alone in our trainer.
SUSPECTS = {
    # Keras reads moving statistics as training left them; ours recomputes them per checkpoint.
    "no-precise-bn": ["--precise-bn-batches", "0"],
    # Where the weight decay falls: ours and keras_resnet.py's decay every trainable variable
    # (batch-norm scales and shifts and the dense bias too); this row shows what moving it
    # off those changes.
    "no-bias-decay": ["--no-bias-decay", "true"],
}
# The changes a row of each base may name.
# The Keras peer's changes, read by its own process (train_keras).
KERAS_CHANGES = {
    "he": ["--keras-schedule", "he"],
    "bf16": ["--keras-precision", "bf16"],
}
CHANGES = {"fast": CANDIDATES, "paper": SUSPECTS, "keras": KERAS_CHANGES}
DEFAULTS = {f.name: f.default for f in FIELDS}
# The training images the tutorial's 80,000 steps were counted against: its hard-coded 45,000
# (config/overlays.py's comment on the ResNet's train_steps; docs/training.md, "The learning-rate
# schedule"). The package counts the records of the training file instead.
TUTORIAL_TRAIN_IMAGES = 45_000
# The default run in epochs: 80,000 x 128 / 45,000 = 227.6. The default boundaries
# (ScheduleSection.lr_boundary_epochs) are placed within a run of this length.
DEFAULT_RUN_EPOCHS = (MODEL_OVERLAYS[RESNET]["train_steps"] * DEFAULTS["train_batch_size"]
                      / TUTORIAL_TRAIN_IMAGES)
# Fashion-MNIST (Xiao et al. 2017, arXiv:1708.07747): 1,000 test pictures per class.
TEST_PER_CLASS = 1_000
EVAL_BATCH_SIZE = 100  # the trainer's --eval-batch-size default; 10,000 test pictures divide it
# The trainer's evaluation lines (evaluation/report.py evaluation_line; train.py logs the last
# one again as "final evaluation at step N: ..."). 4 significant digits (0.8712, 1, 0.1).
EVALUATION = re.compile(r"\bevaluation at step (\d+): accuracy = ([0-9.]+(?:e-?\d+)?)")
# The trainer's line about the data (training/start.py): "... 60000 train records, 468 steps
# per epoch, ..."; the Keras run prints the same words.
STEPS_PER_EPOCH = re.compile(r"\b(\d+) train records, (\d+) steps per epoch")
# The same lines' length of the run: "..., 2750 steps in all".
TOTAL_STEPS = re.compile(r"\b(\d+) steps in all")
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
    seed: int
    command: list[str]
    env: dict
    log: str
    steps_per_epoch: int
    evaluations: list[Evaluation] = dataclasses.field(default_factory=list)
    minutes: float = 0.0  # the whole process, start to exit
    # --reread: the final checkpoint's accuracy on other splits: split -> (accuracy, pictures).
    rereads: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict)

    def pooled(self, own_pictures: int) -> float:
        """The final accuracy over the pictures of its own split and of every reread one."""
        readings = [(self.final.accuracy, own_pictures), *self.rereads.values()]
        return sum(a * n for a, n in readings) / sum(n for _, n in readings)

    @property
    def final(self) -> Evaluation:
        return self.evaluations[-1]

    def read(self, line: str, seconds: float) -> None:
        """Takes in one line of the run's output, ``seconds`` after its start."""
        sizes = STEPS_PER_EPOCH.search(line)
        if sizes:
            self.steps_per_epoch = int(sizes.group(2))
        match = EVALUATION.search(line)
        # The final evaluation is logged twice (as it happens and in the summary).
        if match and int(match.group(1)) not in {e.step for e in self.evaluations}:
            step = int(match.group(1))
            self.evaluations.append(Evaluation(step, step / self.steps_per_epoch,
                                               seconds / 60, float(match.group(2))))


@dataclasses.dataclass(frozen=True)
class Row:
    """``base[+change...][@CAP]``: which run, which changes to it, which oneDNN cap."""

    spec: str
    base: str
    changes: tuple[str, ...]
    cap: Optional[str]

    @property
    def flags(self) -> list[str]:
        return [flag for change in self.changes for flag in CHANGES[self.base][change]]


def parse_row(spec: str) -> Row:
    name, _, cap = spec.partition("@")
    base, *changes = name.split("+")
    known = CHANGES.get(base, {})
    if (base not in BASES or any(c not in known for c in changes)
            or (cap and cap != "AVX2")):
        raise UserError(f"--rows: unknown row {spec!r}; rows are {', '.join(BASES)}, "
                        f"fast+{{{','.join(CANDIDATES)}}}, paper+{{{','.join(SUSPECTS)}}}, "
                        f"keras+{{{','.join(KERAS_CHANGES)}}} "
                        f"(changes joined by +), each optionally followed by @AVX2")
    return Row(spec, base, tuple(changes), cap or None)


# ---------------------------------------------------------------------------------------------
# Data


def prepare_data(work_dir: str, per_class: Optional[int], split: str) -> str:
    """The Fashion-MNIST records folder in ``work_dir`` whose eval file is ``split``'s pictures,
    generated unless already there."""
    size = "all" if per_class is None else f"{per_class}-per-class"
    data_dir = os.path.join(work_dir, f"fashion-mnist-{size}-{split}")
    ready = all(os.path.isfile(os.path.join(data_dir, f)) for f in (
        "train.tfrecords", "eval.tfrecords", metadata.METADATA_FILENAME))
    if ready:
        print(f"data: {data_dir} (already generated)", flush=True)
        return data_dir
    shutil.rmtree(data_dir, ignore_errors=True)  # incomplete (a file removed since)
    started = time.monotonic()
    # Made in a temporary folder and renamed, so an interrupted run leaves no half cache.
    with storage.atomic_dir(data_dir) as tmp:
        fashion_mnist.make_records(tmp, per_class, None, split=split)
    print(f"data: {data_dir} (generated in {time.monotonic() - started:.0f} s)", flush=True)
    return data_dir


# ---------------------------------------------------------------------------------------------
# Schedules and batches


def scaled_boundaries(epochs: float) -> str:
    """The default boundaries scaled from the default run's length to ``epochs``: "a,b,c"."""
    return ",".join(f"{b * epochs / DEFAULT_RUN_EPOCHS:.6g}"
                    for b in DEFAULTS["lr_boundary_epochs"])


def epoch_steps(train_records: int, batch: int) -> int:
    """Steps per epoch as the trainer counts them (docs/training.md): train records // batch."""
    if train_records < batch:
        raise UserError(f"{train_records} training pictures make no batch of {batch}; use a "
                        f"larger --per-class")
    return train_records // batch


def run_batch(flags: list[str]) -> int:
    """The training batch of a trainer run with these flags, as the trainer resolves it (a
    flag given, else the recipe's, else the model's, else the default)."""
    return trainer_flags.parse(flags)[0].schedule.train_batch_size


# ---------------------------------------------------------------------------------------------
# Running and reading a run


def run_logged(run: Run) -> Run:
    """Runs ``run.command``, stamps every line of its output with the seconds since it started
    (into ``run.log``) and collects its evaluations; exits on failure."""
    os.makedirs(os.path.dirname(run.log), exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=400)
    started = time.monotonic()
    proc = subprocess.Popen(run.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, cwd=REPO, env=run.env)
    with open(run.log, "w") as log:
        for line in proc.stdout:
            seconds = time.monotonic() - started
            log.write(f"{seconds:9.2f} {line}")
            log.flush()
            tail.append(line)
            run.read(line, seconds)
    status = proc.wait()
    run.minutes = (time.monotonic() - started) / 60
    if status or not run.evaluations:
        sys.stderr.write("".join(tail)[-FAILED_OUTPUT_CHARS:])
        problem = f"exited with status {status}" if status else "logged no evaluation"
        raise SystemExit(f"the {run.name} run (seed {run.seed}) {problem}; its whole log: "
                         f"{run.log}")
    print(f"  {run.name}, seed {run.seed}: {100 * run.final.accuracy:.2f} % at epoch "
          f"{run.final.epoch:.2f} after {run.final.minutes:.2f} min (log: {run.log})",
          flush=True)
    return run


def read_logged(run: Run) -> Run:
    """``run`` as its log (``run_logged``'s, each line stamped) tells it: for ``--report``."""
    try:
        with open(run.log) as log:
            lines = log.readlines()
    except OSError:
        raise UserError(f"--report: no log of the {run.name} run (seed {run.seed}) at "
                        f"{run.log}; run that row and seed first") from None
    for stamped in lines:
        seconds, _, line = stamped.lstrip().partition(" ")
        run.read(line, float(seconds))
    total = TOTAL_STEPS.search("".join(lines[:60]))
    if not run.evaluations or not total or run.final.step < int(total.group(1)):
        raise UserError(f"--report: the {run.name} run (seed {run.seed}) did not finish "
                        f"(its log: {run.log}); run that row and seed again")
    run.minutes = float(lines[-1].lstrip().partition(" ")[0]) / 60
    return run


def reread(run: Run, row: Row, depth: int, data_dir: str, split: str, pictures: int) -> Run:
    """``run`` (finished, as ``read_logged`` tells it) with its final checkpoint read again
    (``run.rereads[split]``): evaluated once on ``data_dir``'s eval file (``split``'s
    ``pictures`` pictures) by the package's evaluate command, or a Keras row's weights by a
    Keras process building the ResNet of ``depth``, under the row's oneDNN setting. The report
    is kept in the run's folder, so a second --reread reads it instead of evaluating again."""
    folder = os.path.dirname(run.log)
    report = os.path.join(folder, f"reread-{split}.json")
    if not os.path.isfile(report):
        if row.base == "keras":
            # The Keras peer's final weights, read by a process like the one that trained them
            # (the same Python: its Keras must read what it wrote).
            command = [sys.executable, os.path.abspath(__file__), "--_keras-reread",
                       "--data-dir", data_dir, "--depth", str(depth),
                       "--keras-weights", keras_weights(folder), "--keras-report", report,
                       "--keras-step", str(run.final.step), *row.flags]
        else:
            command = [sys.executable, "-m", "cifar10_estimator.evaluate",
                       os.path.join(folder, "job"), "--data-dir", data_dir, "--report", report]
        proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                              env=run_env(row), stdin=subprocess.DEVNULL)
        if proc.returncode:
            sys.stderr.write((proc.stdout + proc.stderr)[-FAILED_OUTPUT_CHARS:])
            raise SystemExit(f"--reread: evaluating the {run.name} run (seed {run.seed}) on "
                             f"{data_dir} failed: {' '.join(command)}")
    with open(report) as f:
        body = json.load(f)
    if body["global_step"] != run.final.step:
        raise UserError(f"--reread: {report} is of step {body['global_step']}, the run ended at "
                        f"{run.final.step}; remove it and reread")
    run.rereads[split] = (body["accuracy"], pictures)
    print(f"  {run.name}, seed {run.seed}: {100 * body['accuracy']:.2f} % on {split} "
          f"(report: {report})", flush=True)
    return run


def keras_weights(folder: str) -> str:
    """Where a Keras run in ``folder`` keeps its final weights (Keras 3 wants the suffix)."""
    return os.path.join(folder, "model.weights.h5")


def training_pictures(folder: str) -> str:
    """A digest of the pictures and labels of ``folder``'s training file, in order: its bytes
    can differ for the same pictures (generators before 9d97518 wrote a record's features in
    an order that varied by process)."""
    # TensorFlow's C++ log at errors only, as the trainer's (its record reader logs its buffer
    # at INFO); only --reread loads TensorFlow in this process.
    os.environ.setdefault(CPP_LOG_LEVEL_ENV, "2")
    import_tensorflow_quietly()
    import tensorflow as tf

    digest = hashlib.sha256()
    for batch in tf.data.TFRecordDataset(schema.record_path(folder, "train")).batch(1000):
        parsed = tf.io.parse_example(batch, schema.FEATURE_SPEC)
        digest.update(b"".join(parsed["image"].numpy()))
        digest.update(parsed["label"].numpy().astype("<i8").tobytes())
    return digest.hexdigest()


def run_env(row: Row) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", cpu.ONEDNN_CAP_ENV)}
    env["PYTHONUNBUFFERED"] = "1"
    if row.cap:
        env[cpu.ONEDNN_CAP_ENV] = row.cap
    return env


def runs_key(args, data_dir: str) -> str:
    """The folder, under the work dir's ``runs``, of the runs of one set of pictures and
    settings: a row of another split, size, depth or length never replaces a run of this one
    (nor does --report read it)."""
    key = f"{os.path.basename(data_dir)}-resnet{args.depth}-epochs{args.epochs}"
    if args.fast_epochs is not None:
        key += f"-fast{args.fast_epochs:g}"
    return key + ("-every-epoch" if args.every_epoch else "")


def make_run(row: Row, seed: int, args, data_dir: str, train_records: int) -> Run:
    """The command of one run of ``row``."""
    folder = os.path.join(args.work_dir, "runs", runs_key(args, data_dir),
                          row.spec.replace("@", "-at-"), f"seed-{seed}")
    if not args.report:
        shutil.rmtree(folder, ignore_errors=True)  # a fresh job folder: no resuming
    log = os.path.join(folder, "log.txt")
    boundaries = scaled_boundaries(args.epochs)
    if row.base == "keras":
        command = [sys.executable, os.path.abspath(__file__), "--_keras-run",
                   "--data-dir", data_dir, "--depth", str(args.depth), "--epochs",
                   str(args.epochs), "--seeds", str(seed), "--lr-boundary-epochs", boundaries,
                   "--keras-weights", keras_weights(folder)]
        if args.every_epoch:
            command.append("--every-epoch")
        command += row.flags
        return Run(row.spec, seed, command, run_env(row), log,
                   epoch_steps(train_records, keras_resnet.BATCH_SIZE))
    if row.base == "tutorial":
        flags = ["--model", "tutorial-cnn", "--recipe", "paper", "--train-epochs",
                 f"{args.epochs:g}"]
    elif row.base == "paper":
        flags = ["--num-layers", str(args.depth), "--recipe", "paper", "--train-epochs",
                 f"{args.epochs:g}", "--lr-boundary-epochs", boundaries]
    elif row.base in ("he", "cosine"):
        # The paper recipe with a length given follows He et al.'s proportions; cosine
        # replaces them. The precision as the fast recipe chooses it: bf16 where faster.
        flags = ["--num-layers", str(args.depth), "--recipe", "paper", "--train-epochs",
                 f"{args.epochs:g}", "--precision", "auto"]
        if row.base == "cosine":
            flags += ["--lr-schedule", "cosine"]
    else:
        flags = ["--num-layers", str(args.depth), "--recipe", "fast"]
        if args.fast_epochs is not None:
            flags += ["--train-epochs", f"{args.fast_epochs:g}"]
    flags += row.flags
    steps_per_epoch = epoch_steps(train_records, run_batch(flags))
    if args.every_epoch:
        # A checkpoint per epoch, each evaluated as soon as it is written.
        flags += ["--save-checkpoints-steps", str(steps_per_epoch), "--eval-throttle-secs", "1"]
    command = [sys.executable, "-m", "cifar10_estimator", "--data-dir", data_dir,
               "--job-dir", os.path.join(folder, "job"), "--seed", str(seed), *flags]
    return Run(row.spec, seed, command, run_env(row), log, steps_per_epoch)


# ---------------------------------------------------------------------------------------------
# The Keras run (in its own process: --_keras-run)


def keras_peer(args, learning_rate):
    """Our ResNet built in Keras at ``args``' depth and precision, compiled as the peer trains
    it (SGD with momentum at ``learning_rate``, a rate or a schedule)."""
    import tensorflow as tf

    expected = keras_resnet.expected_params(args.depth)
    model = keras_resnet.build_resnet(args.depth, precision=args.keras_precision,
                                      input_dtype="float32",
                                      weight_decay=keras_resnet.WEIGHT_DECAY)
    params = keras_resnet.trainable_params(model)
    if params != expected:
        raise SystemExit(f"the Keras model has drifted from ours: {params:,} trainable "
                         f"parameters, ours has {expected:,}")
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate,
                                                    momentum=keras_resnet.MOMENTUM),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  # weighted_metrics: Keras weighs only these by the sample weights, which
                  # leave out the eval batches' padding rows (weight 0).
                  weighted_metrics=[tf.keras.metrics.SparseCategoricalAccuracy("accuracy")])
    return model


def keras_evaluation(data_dir: str):
    """``data_dir``'s eval file as the Keras peer reads it: (images, labels, weights)."""
    from cifar10_estimator.data.pipeline import Cifar10DataSet

    return Cifar10DataSet(data_dir, "eval").make_batch(EVAL_BATCH_SIZE).map(
        lambda features, labels: (features["image"], labels, features["weight"]))


def start_keras_process(args) -> None:
    """A Keras peer's process, as the trainer's commands start: TensorFlow loaded quietly."""
    keras_resnet.check_precision(args.keras_precision, onednn=True)  # as the trainer's commands
    prepare_process(os.environ)  # before TensorFlow loads, as our command lines do
    import_tensorflow_quietly()  # without its load-time C++ lines, as the trainer


def reread_keras(args) -> int:
    """Evaluates a Keras run's final weights (``--keras-weights``) on ``--data-dir``'s eval
    file; writes the accuracy to ``--keras-report`` as the evaluate command's report names it."""
    start_keras_process(args)
    model = keras_peer(args, 0.0)
    model.load_weights(args.keras_weights)
    figures = model.evaluate(keras_evaluation(args.data_dir), verbose=0, return_dict=True)
    body = {"global_step": args.keras_step, "accuracy": figures["accuracy"],
            "loss": figures["loss"]}
    storage.write_bytes_atomic(args.keras_report, (json.dumps(body) + "\n").encode())
    return 0


def train_keras(args) -> int:
    """Trains our ResNet with Keras' ``model.fit`` and the paper recipe; prints the trainer's
    data line and a trainer-style evaluation line per evaluation, which the parent reads; keeps
    the final weights in ``--keras-weights`` for --reread."""
    start_keras_process(args)
    import tensorflow as tf

    from cifar10_estimator.data.pipeline import Cifar10DataSet

    seed = int(args.seeds)
    tf.keras.utils.set_random_seed(seed)
    train = Cifar10DataSet(args.data_dir, "train")
    train_records = train.num_examples()
    steps_per_epoch = epoch_steps(train_records, keras_resnet.BATCH_SIZE)
    if args.keras_schedule == "he":
        # The trainer's he schedule (config/plan.py): its drops, the rate times HE_FACTORS.
        boundaries = list(plan.he_boundaries(args.epochs * steps_per_epoch))
        values = [keras_resnet.LEARNING_RATE * f for f in HE_FACTORS]
    else:
        boundary_epochs = [float(e) for e in args.lr_boundary_epochs.split(",")]
        # As the trainer's piecewise schedule (model/schedules.py): int(steps per epoch x
        # epoch), the rate times one factor per phase (ScheduleSection.lr_decay_factors: 1,
        # 0.1, 0.01, 0.002).
        boundaries = [int(steps_per_epoch * e) for e in boundary_epochs]
        values = [keras_resnet.LEARNING_RATE * f for f in DEFAULTS["lr_decay_factors"]]
    schedule = tf.keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values)
    print(f"Keras ResNet-{args.depth}; {train_records} train records, {steps_per_epoch} steps "
          f"per epoch, {args.epochs * steps_per_epoch} steps in all; learning rate "
          f"{', '.join(f'{v:g}' for v in values)} changing at steps {boundaries}; "
          f"{args.keras_precision}", flush=True)

    model = keras_peer(args, schedule)
    images = train.make_batch(keras_resnet.BATCH_SIZE, seed=seed).map(
        lambda features, labels: (features["image"], labels))
    evaluation = keras_evaluation(args.data_dir)

    class EvaluationLine(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if "val_accuracy" not in logs:
                return
            # After the epoch's validation pass; the same words as the trainer's line, then
            # the epoch's training figures (batch statistics, augmented images) for the log.
            print(f"evaluation at step {(epoch + 1) * steps_per_epoch}: accuracy = "
                  f"{logs['val_accuracy']:.4g}, loss = {logs['val_loss']:.4g}", flush=True)
            print(f"epoch {epoch + 1} training: accuracy = {logs['accuracy']:.4g}, loss = "
                  f"{logs['loss']:.4g}", flush=True)

    model.fit(images, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
              validation_data=evaluation, validation_freq=1 if args.every_epoch else args.epochs,
              verbose=0, callbacks=[EvaluationLine()])
    # After the last line the parent reads (a run's time ends there), written whole or not
    # at all.
    partial = os.path.join(os.path.dirname(args.keras_weights), "partial.weights.h5")
    model.save_weights(partial)
    os.replace(partial, args.keras_weights)
    return 0


# ---------------------------------------------------------------------------------------------
# The table


def table(rows: list[Row], runs: dict[str, list[Run]], split: str, pictures: int,
          rereads: Sequence[str] = ()) -> list[dict]:
    """Prints one line per row (medians over its seeds), the accuracy on ``split`` (of
    ``pictures``) and, with ``rereads``, on each of them and over all of their pictures;
    returns the same figures."""
    figures = []
    reference = next((base for base in REFERENCES
                      if any(r.base == base and not r.changes for r in rows)), None)
    paper_minutes = {row.cap: statistics.median(r.final.minutes for r in runs[row.spec])
                     for row in rows if row.base == reference and not row.changes}
    width = max(len("row"), *(len(row.spec) for row in rows))
    more = "".join(f" {name:>10}" for name in (*rereads, "all") if rereads)
    print(f"{'row':<{width}} {'oneDNN':<7} {'seeds':>5} {split + ' % (low-high)':>22}{more} "
          f"{'epochs':>7} {'minutes':>8} {'/ ' + (reference or 'paper'):>8}")
    for row in rows:
        done = runs[row.spec]
        accuracy = [100 * r.final.accuracy for r in done]
        minutes = statistics.median(r.final.minutes for r in done)
        ratio = minutes / paper_minutes[row.cap] if row.cap in paper_minutes else None
        figure = {"row": row.spec, "cap": row.cap, "seeds": [r.seed for r in done],
                  "accuracy": statistics.median(accuracy), "low": min(accuracy),
                  "high": max(accuracy), "epochs": statistics.median(r.final.epoch for r in done),
                  "minutes": minutes, "reference": reference, "time_vs_reference": ratio}
        if rereads:
            figure["rereads"] = {name: statistics.median(100 * r.rereads[name][0] for r in done)
                                 for name in rereads}
            figure["all"] = statistics.median(100 * r.pooled(pictures) for r in done)
        figures.append(figure)
        spread = f"{figure['accuracy']:.2f} ({figure['low']:.2f}-{figure['high']:.2f})"
        more = "".join(f" {value:>10.2f}" for value in (*figure.get("rereads", {}).values(),
                                                         figure.get("all")) if value is not None)
        print(f"{row.spec:<{width}} {row.cap or 'native':<7} {len(done):>5} {spread:>22}{more} "
              f"{figure['epochs']:>7.2f} {minutes:>8.2f} "
              f"{'' if ratio is None else f'{ratio:.2f}':>8}", flush=True)
    return figures


# ---------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="paper,keras,fast,paper@AVX2,fast@AVX2",
                        help="the rows, comma-separated (default paper,keras,fast,paper@AVX2,"
                             "fast@AVX2); see the module's help")
    parser.add_argument("--seeds", default="1,2,3", help="seeds, comma-separated (default 1,2,3)")
    parser.add_argument("--split", default="test", choices=fashion_mnist.EVAL_SPLITS,
                        help="evaluate on the test pictures (default), on the last training "
                             "pictures of each class, for choosing (validation), or on training "
                             "pictures after --per-class's that nothing chose on (holdout)")
    parser.add_argument("--epochs", type=int, default=15,
                        help="epochs of the paper, Keras and tutorial runs (default 15)")
    parser.add_argument("--fast-epochs", type=float, default=None,
                        help="epochs of the fast runs (default: the recipe's own length)")
    parser.add_argument("--depth", type=int, default=20, help="ResNet depth, 6n+2 (default 20)")
    parser.add_argument("--per-class", type=int, default=None,
                        help="training pictures per class (default: all)")
    parser.add_argument("--every-epoch", action="store_true",
                        help="evaluate after every epoch (default: as a default run does)")
    parser.add_argument("--work-dir", default="/tmp/convergence-bench",
                        help="records (kept for reruns), job folders and logs")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write every figure to PATH as JSON")
    parser.add_argument("--report", action="store_true",
                        help="run nothing: the table of the runs of these rows and seeds that "
                             "earlier invocations left in --work-dir (a round whose seeds ran "
                             "in several sessions)")
    parser.add_argument("--reread", default="", metavar="SPLIT[,SPLIT]",
                        help="run nothing: as --report, with each run's final checkpoint "
                             "evaluated once more on each SPLIT's pictures (the runs of "
                             "--split, which must have trained on the same pictures); the "
                             "table adds a column per SPLIT and one over all the splits' "
                             "pictures")
    # The Keras run's own process (train_keras).
    parser.add_argument("--_keras-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_keras-reread", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keras-weights", help=argparse.SUPPRESS)
    parser.add_argument("--keras-report", help=argparse.SUPPRESS)
    parser.add_argument("--keras-step", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--lr-boundary-epochs", help=argparse.SUPPRESS)
    parser.add_argument("--keras-schedule", choices=("paper", "he"), default="paper",
                        help=argparse.SUPPRESS)
    parser.add_argument("--keras-precision", choices=tuple(keras_resnet.POLICIES),
                        default="fp32", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._keras_run or args._keras_reread:
        return args
    args.rows = [parse_row(r.strip()) for r in args.rows.split(",") if r.strip()]
    if not args.rows or len({r.spec for r in args.rows}) != len(args.rows):
        parser.error("--rows: one or more rows, without repeats")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds: whole numbers, comma-separated, got {args.seeds!r}")
    if args.epochs < 1 or (args.fast_epochs is not None and args.fast_epochs <= 0):
        parser.error("--epochs must be 1 or more and --fast-epochs above 0")
    if args.per_class is not None and args.per_class < 1:
        parser.error("--per-class must be 1 or more")
    args.reread = [split.strip() for split in args.reread.split(",") if split.strip()]
    for split in args.reread:
        if split not in fashion_mnist.EVAL_SPLITS or split == args.split:
            parser.error(f"--reread {split}: name other splits than --split's "
                         f"({args.split}), of {', '.join(fashion_mnist.EVAL_SPLITS)}")
    if "holdout" in (args.split, *args.reread) and (
            args.per_class is None or args.per_class > fashion_mnist.MAX_HOLDOUT_PER_CLASS):
        parser.error(f"--split/--reread holdout: --per-class at most "
                     f"{fashion_mnist.MAX_HOLDOUT_PER_CLASS:,}, so that "
                     f"{fashion_mnist.MIN_HELD_OUT:,} pictures of each class or more are left "
                     f"before the validation split's")
    for row in args.rows:
        if row.base == "keras" and "bf16" in row.changes and row.cap:
            parser.error(f"--rows {row.spec}: bf16 under oneDNN's {row.cap} cap has no native "
                         f"kernels (our trainer refuses it too); drop +bf16 or @{row.cap}")
    if args.reread:
        args.report = True
    keras_resnet.expected_params(args.depth)  # UserError naming --depth unless it is 6n+2
    args.work_dir = os.path.abspath(args.work_dir)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args._keras_run:
        return train_keras(args)
    if args._keras_reread:
        return reread_keras(args)
    fashion_mnist.check_source()
    machine = machine_line()
    print(machine, flush=True)
    data_dir = prepare_data(args.work_dir, args.per_class, args.split)
    train_records = metadata.split_size(data_dir, "train")
    eval_records = metadata.split_size(data_dir, "eval")
    print(f"Fashion-MNIST: {train_records:,} training pictures, {eval_records:,} {args.split} "
          f"pictures; ResNet-{args.depth}; seeds {args.seeds}; paper schedule: drops at epochs "
          f"{scaled_boundaries(args.epochs)} (the defaults x {args.epochs} / "
          f"{DEFAULT_RUN_EPOCHS:.1f})", flush=True)
    reread_dirs, reread_pictures = {}, {}
    trained_on = training_pictures(data_dir) if args.reread else None
    for split in args.reread:
        folder = reread_dirs[split] = prepare_data(args.work_dir, args.per_class, split)
        # A reread reads models trained on data_dir's pictures on folder's eval pictures.
        if training_pictures(folder) != trained_on:
            raise UserError(f"--reread: {folder}'s training pictures differ from {data_dir}'s: "
                            f"its runs trained on other pictures; train them on --split's")
        reread_pictures[split] = metadata.split_size(folder, "eval")
        print(f"reread: each run's final checkpoint on {reread_pictures[split]:,} {split} "
              f"pictures", flush=True)
    runs: dict[str, list[Run]] = {row.spec: [] for row in args.rows}
    for seed in args.seeds:
        for row in args.rows:
            run = make_run(row, seed, args, data_dir, train_records)
            if args.report:
                run = read_logged(run)
                for split, folder in reread_dirs.items():
                    run = reread(run, row, args.depth, folder, split,
                                 reread_pictures[split])
            else:
                run = run_logged(run)
            runs[row.spec].append(run)
    print()
    print(machine)
    figures = table(args.rows, runs, args.split, eval_records, args.reread)
    if args.json:
        body = {"machine": machine, "data": {"dir": data_dir, "train": train_records,
                                             args.split: eval_records,
                                             "reread": reread_dirs},
                "settings": {k: v for k, v in vars(args).items() if k != "rows"},
                "table": figures,
                "runs": {spec: [dataclasses.asdict(r) for r in done]
                         for spec, done in runs.items()}}
        storage.write_bytes_atomic(args.json, (json.dumps(body, indent=1, default=str)
                                               + "\n").encode())
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main, "convergence.py"))
