"""The share of a sweep's epochs and trial-seconds that Ray Tune's ASHA leaves, by simulation:
the sweep's own scheduler (``sweeps.tuner.scheduler``, Ray Tune's AsyncHyperBandScheduler as the
sweep builds it) fed the reports of simulated trials, with no trainer behind them.

Why simulate: ``sweep_asha_bench.py`` measures real sweeps, three repetitions of 13 minutes
each, and its ratio moves by 0.15 between repetitions. This shows where ASHA's rule itself puts
the ratio at a given number of trials and epochs, with no overhead and with a trial's costs as
measured, so a measured ratio can be read against it.

The model. Each trial has a quality drawn from a normal distribution; its accuracy at each
epoch is that quality plus noise, the two mixed so that successive epochs' values correlate by
``--correlation`` (how well an early epoch ranks the trials; 1: perfectly). ``--concurrency``
trials run at once (the benchmark's two one-CPU Ray nodes: 2), each epoch taking one unit of
time with a little jitter so that reports arrive in a realistic, varying order; a trial the
scheduler stops frees its slot for the next. Ray Tune's ASHA decides each trial at a rung
against the trials that reached that rung before it (AsyncHyperBandScheduler's bracket: stop
if under the (1 - 1/factor) quantile of those already recorded; the first to arrive always
passes), which is where it keeps more than 1 in ``factor`` of a small sweep.

Trial-seconds: a trial run to its end costs ``fixed + epochs x epoch + eval`` (one evaluation,
the trainers' default), a trial under ASHA ``fixed + e x (epoch + eval)`` for the ``e`` epochs
it trained (it evaluates each epoch). The defaults are the per-trial medians of
``sweep_asha_bench.py --reps 3`` on a Zen 5 core (docs/performance.md, "Early stopping with
ASHA"): stopped at epoch 1 21.5 s, run to the end 68 s, kept to the end by ASHA 74 s, which
give an epoch of 15.5 s, an evaluation of 2 s and 4 s besides.

    .venv/bin/python benchmarks/asha_floor.py
    .venv/bin/python benchmarks/asha_floor.py --trials 27 --epochs 9 --sweeps 2000
"""

import argparse
import heapq
import os
import statistics
import sys
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
from ray.tune.schedulers import TrialScheduler  # noqa: E402

from cifar10_estimator.sweeps import tuner  # noqa: E402


def simulate(trials: int, epochs: int, grace: float, factor: float, concurrency: int,
             correlation: float, rng: np.random.Generator) -> list[int]:
    """One sweep: the epochs each trial trained before ASHA stopped it or it ended."""
    asha = tuner.scheduler("asha", "accuracy", "max", grace, factor, epochs)
    quality = rng.normal(size=trials)
    # Each epoch's value: the trial's quality plus fresh noise, weighted so that any two
    # epochs' values correlate by `correlation` across trials.
    noise_weight = np.sqrt(max(0.0, 1 - correlation) / max(correlation, 1e-9))
    trained = [0] * trials
    waiting = list(range(trials))
    events: list[tuple[float, int]] = []  # (time the trial's next epoch ends, trial)

    def start(now: float):
        if waiting:
            index = waiting.pop(0)
            asha.on_trial_add(None, SimpleNamespace(trial_id=str(index)))
            heapq.heappush(events, (now + 1 + rng.uniform(0, 0.1), index))

    for _ in range(concurrency):
        start(0.0)
    while events:
        now, index = heapq.heappop(events)
        trained[index] += 1
        accuracy = quality[index] + noise_weight * rng.normal()
        report = {"epoch": float(trained[index]), "accuracy": float(accuracy)}
        action = asha.on_trial_result(None, SimpleNamespace(trial_id=str(index)), report)
        if action == TrialScheduler.STOP or trained[index] >= epochs:
            asha.on_trial_remove(None, SimpleNamespace(trial_id=str(index)))
            start(now)
        else:
            heapq.heappush(events, (now + 1 + rng.uniform(0, 0.1), index))
    return trained


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=12, help="trials per sweep (default 12)")
    parser.add_argument("--epochs", type=int, default=4, help="a trial's epochs (default 4)")
    parser.add_argument("--grace-epochs", type=float, default=1.0)
    parser.add_argument("--reduction-factor", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=2,
                        help="trials at once (default 2, the benchmark's two nodes)")
    parser.add_argument("--correlation", type=float, default=0.9,
                        help="how two epochs' accuracies correlate across trials (default 0.9)")
    parser.add_argument("--sweeps", type=int, default=4000, help="sweeps simulated (default 4000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixed-seconds", type=float, default=4.0)
    parser.add_argument("--epoch-seconds", type=float, default=15.5)
    parser.add_argument("--eval-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    fixed, epoch, evaluation = args.fixed_seconds, args.epoch_seconds, args.eval_seconds
    to_the_end = args.trials * (fixed + args.epochs * epoch + evaluation)
    epoch_shares, second_shares, stopped = [], [], []
    for _ in range(args.sweeps):
        trained = simulate(args.trials, args.epochs, args.grace_epochs, args.reduction_factor,
                           args.concurrency, args.correlation, rng)
        epoch_shares.append(sum(trained) / (args.trials * args.epochs))
        second_shares.append(sum(fixed + e * (epoch + evaluation) for e in trained) / to_the_end)
        stopped.append(sum(e < args.epochs for e in trained))

    def quantiles(values):
        low, high = np.percentile(values, [10, 90])
        return (f"median {statistics.median(values):.3f}, mean {statistics.fmean(values):.3f}, "
                f"10th-90th percentile {low:.3f}-{high:.3f}")

    print(f"{args.trials} trials of {args.epochs} epochs, grace {args.grace_epochs:g}, reduction "
          f"factor {args.reduction_factor:g}, {args.concurrency} at once, epoch-to-epoch "
          f"correlation {args.correlation:g}; {args.sweeps} simulated sweeps")
    print(f"stopped early: median {statistics.median(stopped):g} of {args.trials}")
    print(f"share of the epochs:        {quantiles(epoch_shares)}")
    print(f"share of the trial-seconds: {quantiles(second_shares)} (a trial: {fixed:g} s + "
          f"{epoch:g} s an epoch + {evaluation:g} s an evaluation)")
    # The chance that a sweep of this size comes out at half or less, the mark.
    print(f"sweeps at half the trial-seconds or less: "
          f"{sum(s <= 0.5 for s in second_shares) / len(second_shares):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
