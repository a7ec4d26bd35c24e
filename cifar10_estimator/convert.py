"""The convert command: ``python -m cifar10_estimator.convert`` (``cifar10-convert``).

Turns an export into files for LiteRT and ONNX Runtime (``serving.conversion``), each checked as
``predict`` would check a foreign one (``serving.runtime_trust``), evaluated by its own runtime
beside the SavedModel on the eval records (``evaluation.gate``), and kept only within
``--max-accuracy-drop`` points of it. The kept files and their manifest go to
``EXPORT/<version>/converted/``, written whole (a temporary folder, then a rename; a folder
there before is replaced). A file the gate refuses is named with its loss, and the command
exits with status 2 after writing the others. See docs/serving.md, "LiteRT and ONNX Runtime".
"""

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from typing import Optional, Sequence

from cifar10_estimator import cli, logs, storage
from cifar10_estimator.errors import UserError, entry_point, run_cli
from cifar10_estimator.platform.process import prepare_process
from cifar10_estimator.serving import formats
from cifar10_estimator.serving.trust import TRUST_FLAG

MODULE = "cifar10_estimator.convert"
CPP_LOG_LEVEL = "3"  # TensorFlow's C++ log: none (the converters' notices bury the table)
# Pictures from the training records that calibrate the int8 files: TensorFlow's guide to
# post-training integer quantization finds about 100 to 500 samples enough for a
# representative dataset; the larger end, at a few seconds of calibration.
CALIBRATION_PICTURES = 500
# Points of eval accuracy a converted file may lose against its SavedModel (issue 66's default).
MAX_ACCURACY_DROP = 0.5
# The split calibration comes from, and the one the gate measures on; never the same.
CALIBRATION_SPLIT, GATE_SPLIT = "train", "eval"
# Packages whose versions the manifest records: what made and what runs each kind of file.
_TOOLS = ("tensorflow", "ai-edge-litert", "tf2onnx", "onnx", "onnxruntime")


def _parser() -> cli.Parser:
    prog = cli.invoked_as(MODULE)
    parser = cli.Parser(
        MODULE, examples=(f"{prog} cifar10-job/export --data-dir cifar10-data",
                          f"{prog} cifar10-job/export/1700000000 --data-dir cifar10-data "
                          f"--formats litert-int8,onnx-int8 --max-accuracy-drop 0.2"),
        description="Convert an export to LiteRT (.tflite) and ONNX (.onnx) files, float32 "
                    "and int8, each kept only if its own runtime's accuracy on the eval records "
                    "is within --max-accuracy-drop points of the SavedModel's; writes "
                    "EXPORT/<version>/converted/ with a manifest.")
    parser.add_argument("export", metavar="EXPORT",
                        help="a SavedModel folder written by the trainer (JOB_DIR/export/<n>), "
                             "or the export folder above the numbered ones (its newest)")
    parser.add_argument("--data-dir", required=True,
                        help="the records the model was trained on: the int8 files calibrate on "
                             "its train split, and every file is measured on its eval split")
    parser.add_argument("--formats", default="all",
                        help="comma-separated, from: all, " + ", ".join(formats.FORMATS))
    parser.add_argument("--calibration-pictures", type=int, default=CALIBRATION_PICTURES,
                        help="training pictures, spread over the train records, that calibrate "
                             "the int8 files' activation ranges")
    parser.add_argument("--max-accuracy-drop", type=float, default=MAX_ACCURACY_DROP,
                        metavar="POINTS",
                        help="the most eval accuracy, in percentage points, a file may lose "
                             "against the SavedModel and be kept")
    parser.add_argument("--batch-size", type=int, default=100,
                        help="pictures per evaluation batch")
    parser.add_argument(TRUST_FLAG, action="store_true",
                        help="convert the SavedModel without checking that it holds only what "
                             "this package's exports hold (docs/serving.md)")
    return parser


def _versions() -> dict:
    found = {}
    for name in _TOOLS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                      enumerate(zip(r, widths))).rstrip() for r in rows]


def _replace_dir(staged: str, final: str) -> None:
    """Puts the finished folder ``staged`` at ``final``, replacing what is there: the old
    folder is renamed away first, so a reader finds the old whole folder or the new one."""
    old = None
    if os.path.lexists(final):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(final)}.old.", suffix=".tmp",
                               dir=os.path.dirname(final))
        os.rename(final, os.path.join(old, "folder"))
    os.chmod(staged, storage.DIR_MODE)
    os.rename(staged, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def _checked_args(argv: Optional[Sequence[str]]):
    """The command line, parsed and checked: (args, the chosen formats)."""
    args = _parser().parse_args(argv)
    chosen = formats.parse_formats(args.formats)
    if args.calibration_pictures < 1:
        raise UserError(f"--calibration-pictures must be 1 or more, got "
                        f"{args.calibration_pictures}")
    if not 0 <= args.max_accuracy_drop <= 100:
        raise UserError(f"--max-accuracy-drop is in points, from 0 to 100; got "
                        f"{args.max_accuracy_drop:g}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be 1 or more, got {args.batch_size}")
    if storage.is_url(args.export):
        raise UserError(f"{args.export}: convert a local copy of the export (the converters "
                        f"read and write local files)")
    return args, chosen


@dataclasses.dataclass
class _Source:
    """The export being converted, loaded and checked against the records."""
    export: str  # its numbered folder's absolute path
    signature: object  # its serving signature, callable on images
    num_classes: int
    names: list[str]
    graph: object  # its float32 graph, which the converters read


def _load(args) -> _Source:
    """Stage 1: the newest export of ``args.export``, checked (``--trust-export`` aside) and
    matched against ``args.data_dir``'s classes."""
    from cifar10_estimator.data import metadata
    from cifar10_estimator.serving import client, conversion

    export = os.path.abspath(client.newest_export(args.export))
    info = metadata.dataset_info(args.data_dir)
    for split in (CALIBRATION_SPLIT, GATE_SPLIT):
        metadata.existing_record_path(args.data_dir, split)
    _, signature = client.load_model(export, trusted=args.trust_export)
    num_classes = int(signature.structured_outputs["probabilities"].shape[-1])
    if num_classes != info.num_classes:
        raise UserError(f"{export} has {num_classes} classes and the records in "
                        f"{args.data_dir} {info.num_classes}; pass the records it was trained "
                        f"on")
    return _Source(export, signature, num_classes, client.class_names(export, num_classes),
                   conversion.float32_graph(signature))


def _calibration(args, chosen):
    """Stage 2: the pictures the int8 files calibrate on (None when none is chosen)."""
    if not any(f.calibrated for f in chosen):
        return None
    from cifar10_estimator.data import metadata
    from cifar10_estimator.data.pipeline import Cifar10DataSet

    metadata.verify_split(args.data_dir, CALIBRATION_SPLIT)
    return next(iter(Cifar10DataSet(args.data_dir, CALIBRATION_SPLIT, use_distortion=False)
                     .spread_sample(args.calibration_pictures))).numpy()


def _convert(source: _Source, chosen, calibration, staged: str) -> dict:
    """Stage 3: each chosen format's file written into ``staged``, checked as ``predict``
    checks a foreign one, and loaded by its runtime; returns the loaded models by key."""
    from cifar10_estimator.serving import conversion, runtimes
    from cifar10_estimator.serving.runtime_trust import check_model_file

    loaded = {}
    for fmt in chosen:
        with logs.native_stderr_silenced():  # the converters' C++ notices
            data = conversion.convert(source.graph, fmt, calibration)
        path = os.path.join(staged, fmt.file_name)
        with open(path, "wb") as f:
            f.write(data)
        check_model_file(path, data)  # every file we write passes what predict checks
        loaded[fmt.key] = runtimes.load(path, threads=runtimes.default_threads(), trusted=True)
        print(f"{fmt.key}: {fmt.file_name}, {len(data):,} bytes")
    return loaded


def _gate(args, source: _Source, chosen, loaded: dict, staged: str):
    """Stage 4: every file measured beside the SavedModel on the gate split; a file more than
    ``--max-accuracy-drop`` points under it is removed. Returns (the SavedModel's accuracy,
    the pictures, the manifest's entries of the kept files, what was refused)."""
    from cifar10_estimator.evaluation import gate
    from cifar10_estimator.serving import conversion

    accuracy, pictures, readings = gate.side_by_side(
        lambda images: source.signature(images=images)["probabilities"],
        {k: m.probabilities for k, m in loaded.items()}, args.data_dir, GATE_SPLIT,
        args.batch_size)
    rows = [["format", "file", "bytes", "accuracy", "delta (points)", "agreement", "kept"],
            ["SavedModel", os.path.basename(source.export), "", f"{accuracy:.2%}", "", "", ""]]
    entries, refused = [], []
    for fmt in chosen:
        reading, path = readings[fmt.key], os.path.join(staged, fmt.file_name)
        kept = reading.kept(args.max_accuracy_drop)
        size = os.path.getsize(path)
        rows.append([fmt.key, fmt.file_name, f"{size:,}", f"{reading.accuracy:.2%}",
                     f"{reading.delta_points:+.2f}", f"{reading.agreement:.2%}",
                     "yes" if kept else "no"])
        if not kept:
            refused.append(f"{fmt.key} lost {-reading.delta_points:.2f} points")
            os.remove(path)
            continue
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        entries.append({"file": fmt.file_name, "format": fmt.key, "runtime": fmt.runtime,
                        "precision": fmt.precision, "sha256": digest, "bytes": size,
                        "input": formats.INPUT_SPEC,
                        "output": {"name": conversion.OUTPUT_NAME, "dtype": "float32",
                                   "shape": [None, source.num_classes]},
                        "class_names": list(source.names),
                        "accuracy": round(reading.accuracy, 6),
                        "delta_points": round(reading.delta_points, 4),
                        "agreement": round(reading.agreement, 6)})
    print(f"{GATE_SPLIT} split of {args.data_dir}, {pictures:,} pictures; a file is kept "
          f"within {args.max_accuracy_drop:g} points of the SavedModel:")
    for line in _table(rows):
        print("  " + line)
    return accuracy, pictures, entries, refused


def _stage(args, source: _Source, calibration, gated, staged: str, final: str) -> None:
    """Stage 5: the manifest written beside the kept files, and the folder put in place."""
    accuracy, pictures, entries, _ = gated
    manifest = {"export": source.export, "savedmodel_accuracy": round(accuracy, 6),
                "split": GATE_SPLIT, "pictures": pictures,
                "max_accuracy_drop_points": args.max_accuracy_drop,
                "calibration": ({"split": CALIBRATION_SPLIT, "pictures": len(calibration)}
                                if calibration is not None else None),
                "versions": _versions(), "files": entries}
    storage.write_bytes_atomic(os.path.join(staged, formats.MANIFEST_FILE),
                               (json.dumps(manifest, indent=1) + "\n").encode())
    _replace_dir(staged, final)


def _run(argv: Optional[Sequence[str]]) -> int:
    args, chosen = _checked_args(argv)
    prepare_process(os.environ, cpp_log_level=CPP_LOG_LEVEL)  # before TensorFlow loads
    logs.import_tensorflow_quietly()  # tf2onnx imports it too
    logs.setup_logging(verbose=False)  # TensorFlow's deprecation notices (record counting)
    for runtime in dict.fromkeys(f.runtime for f in chosen):  # what is missing, before work
        formats.require(runtime)
        if runtime == formats.ONNX:
            formats.require(runtime, "tf2onnx")
    source = _load(args)
    calibration = _calibration(args, chosen)
    final = formats.converted_dir(source.export)
    staged = tempfile.mkdtemp(prefix=f".{formats.CONVERTED_DIR}.", suffix=".tmp",
                              dir=source.export)
    try:
        loaded = _convert(source, chosen, calibration, staged)
        gated = _gate(args, source, chosen, loaded, staged)
        _stage(args, source, calibration, gated, staged, final)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    accuracy, _, entries, refused = gated
    if entries:
        print(f"written: {final} ({', '.join(e['file'] for e in entries)} and "
              f"{formats.MANIFEST_FILE})")
    if refused:
        raise UserError(f"not kept, more than --max-accuracy-drop {args.max_accuracy_drop:g} "
                        f"points under the SavedModel's {accuracy:.2%}: {'; '.join(refused)}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console-script entry point; returns the process exit status."""
    return run_cli(lambda: _run(argv), MODULE)


command = entry_point(main)  # the console script's and python -m's


if __name__ == "__main__":
    command()
