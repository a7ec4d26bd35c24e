"""The local-cluster command: ``python -m cifar10_estimator.cluster`` (``cifar10-cluster``).

    python -m cifar10_estimator.cluster --num-workers 2 --num-ps 1 --evaluator -- \\
        --data-dir DATA --job-dir JOB --train-steps 1000

starts a whole TensorFlow cluster on this host (``launch.layout`` lays it out,
``launch.loop`` runs it, as processes of this host: ``launch.host_processes``; with ``--ray``, as Ray
actors: ``launch.ray_actors``): every task runs the trainer with everything after ``--`` and
its own ``TF_CONFIG``, in a network namespace of their own where it can (``--network``). Exits 0 when training finished, 1 when a task failed, 130 when interrupted
(Ctrl-C or SIGTERM).
"""

import os
import signal
import sys
from typing import Optional, Sequence, TextIO

from cifar10_estimator import cli
from cifar10_estimator.errors import UserError, run_cli
from cifar10_estimator.config import flags
from cifar10_estimator.config.settings import MIRRORED, MULTI_WORKER_MIRRORED
from cifar10_estimator.launch import layout
from cifar10_estimator.launch.host_processes import HostProcesses
from cifar10_estimator.launch.loop import LaunchLoop

MODULE = "cifar10_estimator.cluster"


def build_parser() -> cli.Parser:
    prog = cli.invoked_as(MODULE)
    parser = cli.Parser(
        MODULE,
        usage="%(prog)s [--num-workers N] [--num-ps M] [--evaluator] "
              "[--network auto|private|host] [@FLAGFILE] -- TRAINER_FLAGS...",
        examples=(f"{prog} --num-workers 2 -- --data-dir cifar10-data --job-dir cluster-job "
                  f"--num-layers 20",
                  f"{prog} --num-workers 3 --evaluator -- @job.flags --sync",
                  f"{prog} --num-workers 2 --evaluator -- @job.flags "
                  f"--distribution-strategy multi-worker-mirrored"),
        description="Start a TensorFlow training cluster on this host: every task runs "
                    "`python -m cifar10_estimator TRAINER_FLAGS` with its own TF_CONFIG. "
                    "TensorFlow's gRPC server listens on every interface and has no "
                    "authentication, so the tasks run in a network namespace of their own "
                    "where they can (--network); the first line says where they listen. "
                    "Exits 0 when training finished, 1 when a task failed.")
    parser.add_argument("--num-workers", type=int, default=2,
                        help="training tasks in all: the chief plus N-1 workers")
    parser.add_argument("--num-ps", type=int, default=None,
                        help="parameter-server tasks (default: 1 with the trainer's "
                             "--distribution-strategy towers, none with multi-worker-mirrored)")
    parser.add_argument("--evaluator", action="store_true",
                        help="add an evaluator task that evaluates each new checkpoint")
    parser.add_argument(
        "--network", choices=layout.NETWORKS, default=layout.AUTO,
        help="where the tasks' ports are. private: a network namespace of the tasks' own "
             "(Linux: as root, or as a user where unprivileged user namespaces are enabled), "
             "which other hosts and this host's other processes cannot reach; it fails if "
             "the system refuses one or a path is a URL. host: this host's network, where "
             "the tasks listen on every interface (0.0.0.0), unauthenticated. auto: private, "
             "except with an s3://, gs:// or other URL in --data-dir, --job-dir or "
             "--export-dir (the tasks must reach it), a --host that is no loopback address, "
             "or where the system refuses a namespace; then host, and the first line warns")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address the tasks reach each other at, in TF_CONFIG (they "
                             "listen on every interface of their network whatever it says); "
                             "in a private namespace a loopback address")
    parser.add_argument(
        "--ray", metavar="ADDRESS", default=None,
        help="run the tasks as actors on the Ray cluster at ADDRESS (the address `ray start "
             "--head` prints, or auto for the one this host belongs to), spread over its "
             "nodes; every path must be a bucket or a folder the nodes share "
             "(docs/distributed.md, 'Ray')")
    parser.add_argument("--cpus-per-task", type=float, default=1.0,
                        help="with --ray: CPUs each chief, worker and evaluator asks Ray for")
    parser.add_argument("--gpus-per-task", type=float, default=0.0,
                        help="with --ray: GPUs each chief, worker and evaluator asks Ray for")
    parser.add_argument(
        "--max-failures", type=int, default=None,
        help="with --ray: how many times a job that lost a task's node is placed again on the "
             "nodes that are alive (new actors, ports and TF_CONFIG; it resumes from the "
             "latest checkpoint) before it fails (default: 3; 0: fail at the first loss)")
    parser.add_argument(
        "--placement-timeout-secs", type=float, default=None,
        help="with --ray: how long to wait for the Ray cluster to have room for every task, "
             "at the start and after a lost node, before failing with what it lacks "
             "(default: 120)")
    parser.add_argument("--timeout-secs", type=float, default=None,
                        help="stop every task and fail after this long (default: no limit)")
    return parser


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run(argv: Optional[Sequence[str]] = None, out: TextIO = sys.stdout) -> int:
    """Parses the launcher's flags and runs the cluster; returns the exit status."""
    own, trainer_args = cli.split_at_dashes(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if not trainer_args:
        raise UserError("give the trainer's flags after --, e.g. -- --data-dir DATA "
                        "--job-dir JOB")
    # Catch a mistyped trainer flag once, here, rather than in every task.
    parsed = flags.handed_on_parser(MODULE).parse_args(trainer_args)
    if not parsed.job_dir:
        raise UserError("the trainer needs --job-dir (shared by every task)")
    if not parsed.data_dir:
        raise UserError("the trainer needs --data-dir")
    all_reduce = parsed.distribution_strategy == MULTI_WORKER_MIRRORED
    if parsed.distribution_strategy == MIRRORED:
        raise UserError("the trainer's --distribution-strategy mirrored runs on one machine "
                        "without a cluster: run the trainer itself, or use "
                        "multi-worker-mirrored here")
    num_ps = args.num_ps if args.num_ps is not None else (0 if all_reduce else 1)
    if all_reduce and num_ps:
        raise UserError(f"--num-ps {num_ps}: a multi-worker-mirrored cluster all-reduces among "
                        f"the chief and workers, without parameter servers; leave --num-ps out")
    if not all_reduce and num_ps < 1:
        raise UserError(f"--num-ps must be 1 or more (workers share variables through "
                        f"parameter servers), got {num_ps}")
    paths = {"--data-dir": parsed.data_dir, "--job-dir": parsed.job_dir,
             "--export-dir": parsed.export_dir}
    if args.ray is not None:
        return _run_on_ray(args, num_ps, trainer_args, paths, out, parsed.num_gpus)
    for flag, value in (("--max-failures", args.max_failures),
                        ("--placement-timeout-secs", args.placement_timeout_secs)):
        if value is not None:
            raise UserError(f"{flag} applies with --ray only (a local task that fails fails "
                            f"the job; rerun the command to resume)")
    network = layout.choose_network(args.network, paths, args.host, os.geteuid(),
                                    os.getegid())
    placement = HostProcesses(network)
    try:
        tasks = layout.lay_out(args.num_workers, num_ps, args.evaluator, args.host, network)
        cluster = LaunchLoop(tasks, placement, trainer_args, os.environ, out=out)
        # SIGTERM (e.g. from a test or a job scheduler) stops the tasks like Ctrl-C does.
        signal.signal(signal.SIGTERM, _interrupt)
        return cluster.run(args.timeout_secs)
    finally:
        placement.close()  # the namespace ends once its last task has exited


def _run_on_ray(args, num_ps: int, trainer_args: list[str], paths: dict, out: TextIO,
                num_gpus: int) -> int:
    from cifar10_estimator.launch import ray_actors
    from cifar10_estimator.launch.ray_node import TaskRunner

    if args.network == layout.PRIVATE:
        raise UserError("--network private: the tasks of --ray run on the Ray nodes' own "
                        "networks; leave --network out")
    if args.cpus_per_task < 0 or args.gpus_per_task < 0:
        raise UserError("--cpus-per-task and --gpus-per-task must be 0 or more")
    max_failures = (ray_actors.MAX_FAILURES if args.max_failures is None
                    else args.max_failures)
    timeout = (ray_actors.PLACEMENT_TIMEOUT_SECS if args.placement_timeout_secs is None
               else args.placement_timeout_secs)
    if max_failures < 0:
        raise UserError(f"--max-failures must be 0 or more, got {max_failures}")
    if timeout <= 0:
        raise UserError(f"--placement-timeout-secs must be more than 0, got {timeout:g}")
    trainer_args = ray_actors.with_gpus(trainer_args, args.gpus_per_task, num_gpus)
    ray_actors.connect(args.ray)

    def place():
        tasks, placed = ray_actors.place(TaskRunner, args.num_workers, num_ps,
                                           args.evaluator, args.cpus_per_task,
                                           args.gpus_per_task, timeout)
        try:
            ray_actors.check_shared(paths, placed)  # a node that joined since, too
        except UserError:
            for p in placed.values():
                ray_actors.kill_actor(p)
            raise
        return tasks, placed

    tasks, placed = place()
    placement = ray_actors.RayActors(placed, place)
    # Every task gets the launcher's storage, TensorFlow, CUDA and NCCL variables on top of
    # its node's environment (ray_actors.FORWARDED_PREFIXES).
    cluster = LaunchLoop(tasks, placement, trainer_args, ray_actors.forwarded(os.environ), out,
                      max_failures)
    try:
        cluster.say(placement.summary())
        signal.signal(signal.SIGTERM, _interrupt)
        return cluster.run(args.timeout_secs)
    finally:
        placement.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_cli(lambda: run(argv), MODULE)


if __name__ == "__main__":
    sys.exit(main())
