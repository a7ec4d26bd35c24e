"""The evaluate command: ``python -m cifar10_estimator.evaluate`` (``cifar10-evaluate``).

Evaluates a SavedModel export, or a job dir's latest (or named) checkpoint, once on a split of a
records folder; prints the accuracy, the per-class table and the most confused pairs, and writes
the report JSON (``evaluation.offline`` and ``evaluation.report`` do the work). An export is
checked before it is loaded (``serving.trust``), unless ``--trust-export``.
"""

import os
from typing import Optional, Sequence

from cifar10_estimator import cli, logs
from cifar10_estimator.data import schema
from cifar10_estimator.errors import UserError, entry_point, run_cli
from cifar10_estimator.platform import cpu
from cifar10_estimator.platform.process import prepare_process
from cifar10_estimator.serving.trust import TRUST_FLAG, TRUST_HELP

MODULE = "cifar10_estimator.evaluate"
# TensorFlow's C++ log while this command runs: none (its output is the report; errors
# reach the user as one-line errors).
CPP_LOG_LEVEL = "3"


def _parser() -> cli.Parser:
    prog = cli.invoked_as(MODULE)
    parser = cli.Parser(
        MODULE, examples=(f"{prog} cifar10-job --data-dir cifar10-data",
                          f"{prog} cifar10-job --data-dir cifar10-data --checkpoint 40000 "
                          f"--split validation",
                          f"{prog} cifar10-job/export --data-dir cifar10-data"),
        description="Evaluate a SavedModel export or a job dir's checkpoint once on a split of "
                    "a records folder: accuracy, per-class table, most confused pairs, report "
                    "JSON.")
    parser.add_argument("model", metavar="MODEL",
                        help="a job dir (its latest checkpoint, with the settings it recorded), "
                             "a SavedModel folder (JOB_DIR/export/<version>) or an export "
                             "folder (its newest version)")
    parser.add_argument("--data-dir", required=True,
                        help="records folder (CIFAR-10, CIFAR-100 or an image folder's)")
    parser.add_argument("--split", default="eval", choices=sorted(schema.SPLITS),
                        help="which records to evaluate on")
    parser.add_argument("--checkpoint", metavar="STEP_OR_PATH",
                        help="a job dir's checkpoint: a global step or a checkpoint path "
                             "(default: the latest)")
    parser.add_argument("--batch-size", type=int, default=100,
                        help="pictures per evaluation batch")
    parser.add_argument("--report", metavar="PATH",
                        help="where the report JSON goes (default: JOB_DIR/eval_report_<split>_"
                             "step<N>.json for a job dir, EXPORT_FOLDER/eval_report_<split>_"
                             "<version>.json for an export)")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    return parser


def _run(argv: Optional[Sequence[str]]) -> int:
    args = _parser().parse_args(argv)
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be 1 or more, got {args.batch_size}")
    prepare_process(os.environ, cpp_log_level=CPP_LOG_LEVEL)  # before TensorFlow loads
    logs.import_tensorflow_quietly()
    import tensorflow as tf

    from cifar10_estimator.data import metadata
    from cifar10_estimator.evaluation import offline
    from cifar10_estimator.config.plan import DTYPES
    from cifar10_estimator.platform import precision_cache, precision_probe
    from cifar10_estimator.evaluation import report

    info = metadata.dataset_info(args.data_dir)
    metadata.existing_record_path(args.data_dir, args.split)  # a missing split: one line
    cpu_info = cpu.read_cpu_info().as_seen_by_onednn(os.environ.get(cpu.ONEDNN_CAP_ENV))
    cache = precision_cache.PrecisionCache(
        precision_cache.cache_folder(os.environ, os.path.expanduser("~")), tf.__version__)

    def compute_dtype(settings, trained: str) -> str:
        # A checkpoint computes as the job's export would (--serving-precision auto); the
        # result line names a dtype other than float32.
        choice = precision_probe.serving_choice("auto", trained, settings, cpu_info,
                                                cpu.onednn_enabled(), cache)
        return DTYPES[choice.precision]

    model = offline.load(args.model, args.checkpoint, info.class_names, compute_dtype,
                         trusted=args.trust_export)
    metrics = offline.evaluate(model, args.data_dir, args.split, args.batch_size)
    content = report.build(metrics, model.class_names, info.dataset)
    content.update(split=args.split, evaluated=model.what, examples=metrics["examples"])
    print(f"{model.what} on the {args.split} split of {args.data_dir} "
          f"({metrics['examples']:,} pictures): accuracy = {metrics['accuracy']:.4g}, "
          f"cross_entropy = {metrics['cross_entropy']:.4g}")
    for line in report.log_lines(content):
        print(line)
    path = args.report or offline.default_report_path(model, args.split)
    print(f"report: {report.write_file(path, content)}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    return run_cli(lambda: _run(argv), MODULE)


command = entry_point(main)  # the console script's and python -m's


if __name__ == "__main__":
    command()
