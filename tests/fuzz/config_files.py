"""Fuzzing kinds for what tells the trainer how to run: the job folder's ``settings.json``, flag
files (``@FILE`` on any command line) and the ``TF_CONFIG`` cluster description.

- ``settings-json``: ``jobdir.settings_record`` reads the record a first run wrote, on every
  rerun, by every worker and evaluator and by ``evaluate``; a chief may rewrite it. Damaged
  bytes, hostile JSON and things that are not files in its place (folders, links that lead
  nowhere, pipes, sockets, devices: refused at once, never waited on).
- ``flag-file``: ``config.flags.parse`` (the trainer's command line, through ``cli.Parser``)
  expands ``@FILE`` arguments: generated and damaged flag lines, files that include each other,
  and a pipe, socket or device named as a flag file.
- ``tf-config``: ``task.tf_config.parse`` checks the variable's value and makes the role,
  then Estimator's ``RunConfig`` reads it (it must take it and see the same role; it reads the
  environment itself: set here for the case, in this process, and restored).

Each check returns what became of the case (``harness``): read soundly, or refused in one line
naming the input; anything else escaping is a bug found.
"""

import contextlib
import functools
import io
import json
import math
import os

from hypothesis import strategies as st

from cifar10_estimator.config.settings import RUN_FIELDS, Settings
from cifar10_estimator.jobdir import settings_record
from fuzz import harness
from fuzz.data_files import SPECIALS, special_file

# JSON values of every type, the hostile ones included: they replace a field's value.
_HOSTILE_NUMBERS = st.sampled_from([float("nan"), float("inf"), -float("inf"), 10 ** 400,
                                    -(10 ** 30), 1e308, -0.0, 2 ** 63, 0, -1])
_JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), _HOSTILE_NUMBERS,
                         st.floats(allow_nan=True, allow_infinity=True),
                         st.text(max_size=30))
_JSON = st.recursive(_JSON_LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12)


def _deep(depth: int, opener: str = "[", closer: str = "]") -> str:
    return opener * depth + closer * depth


def _deep_json(depth: int):
    """A list nested ``depth`` deep, built without recursion."""
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


# ---------------------------------------------------------------------------------------------
# settings-json


@functools.cache
def _current() -> dict:
    """What a run of the default settings records (``task.run_settings`` for 10 classes and a
    schedule of fixed shape, plus the spans of a cosine one)."""
    return settings_record.run_settings(Settings().flat(), "cifar10", 10, schedule_steps=1000)


@functools.cache
def _valid_record() -> bytes:
    """A record exactly as ``settings_record.write`` makes it."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = settings_record.write(folder, _current())
        with open(path, "rb") as f:
            return f.read()


_FIELD_NAMES = sorted(_current()) + ["written_by", "settings", "unknown_setting"]


@st.composite
def _json_record(draw) -> bytes:
    """A record whose JSON is altered: values of another type, keys missing or added."""
    settings = dict(_current())
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(("retype", "drop", "add", "deep")))
        name = draw(st.sampled_from(_FIELD_NAMES))
        if how == "retype":
            settings[name] = draw(_JSON)
        elif how == "drop":
            settings.pop(name, None)
        elif how == "add":
            settings[draw(st.text(max_size=12))] = draw(_JSON)
        else:
            settings[name] = _deep_json(draw(st.sampled_from((2, 50, 900, 3000))))
    body = {"written_by": "cifar10_estimator", "settings": settings}
    outer = draw(st.sampled_from(("record", "record", "record", "bare", "list", "settings-list")))
    if outer == "bare":
        body = settings
    elif outer == "list":
        body = [body]
    elif outer == "settings-list":
        body = {"settings": list(settings.items())}
    try:
        text = json.dumps(body, indent=draw(st.sampled_from((None, 2))))
    except (RecursionError, ValueError):  # too deep for json.dumps itself: write it by hand
        text = '{"settings": {"model": ' + _deep(3000) + "}}"
    return text.encode()


_RAW_RECORDS = st.sampled_from([
    b"", b" ", b"null", b"[]", b"{}", b'{"settings": null}', b'{"settings": []}',
    b'{"settings": {}}', b'{"settings": {"momentum": NaN}}',
    b'{"settings": {"num_layers": Infinity}}', b'{"settings": {"num_layers": -Infinity}}',
    b'{"settings": {"num_layers": 1' + b"0" * 5000 + b"}}",
    b'{"settings": {"learning_rate": 1e999999}}',
    b'{"settings": {"model": "resnet", "model": "tutorial-cnn"}}',
    b'{"settings": {"model": "resnet"}, "settings": 5}',
    b"\xef\xbb\xbf" + b'{"settings": {"model": "resnet"}}',
    b'{"settings": {"model": "\xff\xfe"}}', b"\xff\xfe{\x00}\x00",
    ('{"settings": ' + _deep(100000) + "}").encode(),
    ('{"settings": ' + _deep(100000, "{\"a\":", "}") + "}").encode(),
    b'{"settings": {"model": "res\\ud800net"}}', b'{"settings": {"\\u0000": 1}}',
])

# Things other than a file in the record's place.
_SHAPES = ("file", "file", "file", "folder", "symlink-loop", "dangling-symlink",
           "missing") + SPECIALS


def _settings_cases():
    contents = st.one_of(harness.mutated(_valid_record()), _json_record(), _RAW_RECORDS,
                         st.binary(max_size=200))
    return st.tuples(st.sampled_from(_SHAPES), contents, st.booleans(), st.booleans())


def _sound(recorded: dict) -> None:
    """An accepted record's values have the types the readers use them as."""
    defaults = Settings()
    for name in RUN_FIELDS:
        if name not in recorded:
            continue
        value, default = recorded[name], defaults.value(name)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, (int, float)):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
                isinstance(value, int) or not isinstance(default, int)) and math.isfinite(value)
        elif isinstance(default, tuple):
            ok = isinstance(value, list)
        else:
            ok = isinstance(value, str)
        if not ok:
            raise harness.Violation(f"settings.json accepted {name} = {value!r}")


def _check_settings(case, scratch: str, context) -> str:
    shape, content, is_chief, change = case
    job = os.path.join(scratch, "job")
    os.mkdir(job)
    path = os.path.join(job, settings_record.RECORD_FILE)
    if shape == "file":
        with open(path, "wb") as f:
            f.write(content)
    elif shape == "folder":
        os.mkdir(path)
    elif shape == "symlink-loop":
        os.symlink(path, path)
    elif shape == "dangling-symlink":
        os.symlink(os.path.join(job, "gone"), path)
    elif shape in SPECIALS:
        special_file(path, shape)
    outcome, recorded = harness.refused(lambda: settings_record.read(job), path)
    if outcome != harness.ACCEPTED or recorded is None:
        return outcome
    if not isinstance(recorded, dict):
        raise harness.Violation(f"settings_record.read returned {type(recorded).__name__}")
    _sound(recorded)
    settings_record.differences(recorded, _current())
    # Every task compares; a chief (re)writes the record: what it leaves must read back.
    outcome, _ = harness.refused(lambda: settings_record.check(
        job, _current(), is_chief=is_chief, change=change), settings_record.RECORD_FILE)

    def whole(p):
        try:
            return isinstance(settings_record.read(job), dict)
        except Exception:  # noqa: BLE001  (unreadable: half-written)
            return False

    if shape == "file":
        harness.assert_absent_or_whole(path, whole)
    return outcome


# ---------------------------------------------------------------------------------------------
# flag-file


@functools.cache
def _trainer_flags() -> tuple:
    from cifar10_estimator.config import flags

    return tuple(sorted(o for o in flags.build_parser()._option_string_actions
                        if o.startswith("--") and o not in ("--help", "--version")))


_FLAG_VALUES = st.sampled_from(["20", "44", "0", "-1", "1e9", "nan", "inf", "true", "false",
                                "maybe", "resnet", "tutorial-cnn", "cosine", "fp32", "auto",
                                "82,123", "1,,2", ",", "0.1", "'a b'", '"x', "''", "x" * 300,
                                "data", "/tmp/x", "s3://b/k", "\x00", "--", "-", "="])


@st.composite
def _flag_line(draw) -> bytes:
    how = draw(st.sampled_from(("flag", "flag", "flag", "flag=", "unknown", "bare", "comment",
                                "blank", "nul", "latin1", "long", "text")))
    name = draw(st.sampled_from(_trainer_flags()))
    if how == "flag":
        return f"{name} {draw(_FLAG_VALUES)}".encode()
    if how == "flag=":
        return f"{name}={draw(_FLAG_VALUES)}".encode()
    if how == "unknown":
        return f"--{draw(st.text('abcdefghijklmnopqrstuvwxyz-', min_size=1, max_size=12))} 1" \
            .encode()
    if how == "bare":
        return name.encode()
    if how == "comment":
        return f"# {name} 1".encode()
    if how == "blank":
        return b""
    if how == "nul":
        return f"{name} a\x00b".encode()
    if how == "latin1":
        return f"{name} caf\xe9".encode("latin-1")
    if how == "long":
        return f"{name} ".encode() + b"y" * draw(st.sampled_from((1000, 20000)))
    return draw(st.text(max_size=40)).encode("utf-8", "surrogatepass")


_INCLUDES = ("none", "self", "cycle", "missing", "folder", "chain", "fan-out",
             "nul-name") + SPECIALS


def _flag_file_cases():
    generated = st.lists(_flag_line(), max_size=8).map(lambda lines: b"\n".join(lines))
    valid = b"--num-layers 20\n--train-epochs 3  # short\n--data-dir 'my data'\n--recipe fast\n"
    contents = st.one_of(generated, harness.mutated(valid), st.binary(max_size=200))
    return st.tuples(contents, st.sampled_from(_INCLUDES), st.booleans())


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _check_flag_file(case, scratch: str, context) -> str:
    from cifar10_estimator.config import flags

    content, include, at_end = case
    main = os.path.join(scratch, "job.flags")
    other = os.path.join(scratch, "other.flags")
    line = {"none": None, "self": f"@{main}", "cycle": f"@{other}",
            "missing": f"@{os.path.join(scratch, 'nothing.flags')}",
            "folder": f"@{scratch}", "chain": f"@{other}", "fan-out": f"@{other}",
            "nul-name": "@a\x00b"}.get(include, f"@{other}")
    if include in SPECIALS:  # refused at once: argparse's own open() waits on a pipe
        special_file(other, include)
    if line:
        content = (content + b"\n" + line.encode()) if at_end else (line.encode() + b"\n" +
                                                                     content)
    _write(main, content)
    if include == "cycle":
        _write(other, f"--num-layers 20\n@{main}\n".encode())
    elif include == "chain":
        _write(other, b"--train-epochs 2\n")
    elif include == "fan-out":
        # Files that each include the next one twice: 2^20 readings of the last.
        for i in range(20):
            name = other if i == 0 else os.path.join(scratch, f"f{i}.flags")
            _write(name, f"@{scratch}/f{i + 1}.flags @{scratch}/f{i + 1}.flags\n".encode())
        _write(os.path.join(scratch, "f20.flags"), b"--num-layers 20\n")
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            flags.parse([f"@{main}"])
        return harness.ACCEPTED
    except harness.UserError as e:  # a flag given for another model
        return harness.one_line(e, "--")
    except SystemExit as e:
        text = err.getvalue()
        if e.code == 0 and any(h in out.getvalue() for h in ("usage:", "cifar10_estimator ")):
            return harness.ACCEPTED  # --help or --version in the file: printed, as asked
        lines = text.strip().splitlines()
        if e.code != 2 or len(lines) != 1:
            raise harness.Violation(f"a bad flag file must end in one line and exit 2, got "
                                    f"exit {e.code} and {text!r}")
        message = lines[0]
        if not message.startswith("cifar10_estimator: error: "):
            raise harness.Violation(f"the error line does not name the command: {message!r}")
        # The flag (--x, or argparse's "argument -x"), the unknown token, or the file.
        if not any(w in message for w in ("--", "argument ", "unrecognized arguments",
                                           "flag file", ".flags", "[Errno")):
            raise harness.Violation(f"the error names neither the flag nor the file: "
                                    f"{message!r}")
        return harness.REFUSED


# ---------------------------------------------------------------------------------------------
# tf-config


@st.composite
def _cluster_spec(draw) -> dict:
    """A cluster and a task as kubeflow or docs/distributed.md write them."""
    port = iter(range(2222, 70000))
    host = draw(st.sampled_from(("127.0.0.1", "localhost", "10.0.0.1", "[::1]", "node-0.svc")))
    chief = draw(st.sampled_from(("chief", "chief", "master", None)))
    cluster = {}
    if chief:
        cluster[chief] = [f"{host}:{next(port)}"]
    for job, most in (("worker", 6), ("ps", 3)):
        n = draw(st.integers(0, most))
        if n:
            cluster[job] = [f"{host}:{next(port)}" for _ in range(n)]
    if draw(st.booleans()) and draw(st.booleans()):
        cluster["worker"] = [f"{host}:{p}" for p in range(3000, 3000 + draw(
            st.sampled_from((1000, 10000))))]
    types = sorted(cluster) + ["evaluator"]
    task_type = draw(st.sampled_from(types))
    index = draw(st.integers(0, max(0, len(cluster.get(task_type, [0])) - 1)))
    value = {"cluster": cluster, "task": {"type": task_type, "index": index}}
    if draw(st.booleans()):
        value["environment"] = "cloud"
    return value


@st.composite
def _mutated_spec(draw) -> str:
    """A valid spec with parts replaced, removed or made wrong."""
    value = draw(_cluster_spec())
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(("task", "index", "type", "address", "job", "drop",
                                    "extra", "deep", "cluster")))
        if how == "task":
            value["task"] = draw(_JSON)
        elif how == "index" and isinstance(value.get("task"), dict):
            value["task"]["index"] = draw(st.one_of(st.integers(-5, 20), _JSON))
        elif how == "type" and isinstance(value.get("task"), dict):
            value["task"]["type"] = draw(st.one_of(st.sampled_from(
                ("chief", "worker", "ps", "evaluator", "master", "", "Worker")), _JSON))
        elif how == "address" and isinstance(value.get("cluster"), dict) and value["cluster"]:
            job = draw(st.sampled_from(sorted(value["cluster"])))
            tasks = value["cluster"][job]
            if isinstance(tasks, list) and tasks:
                tasks[draw(st.integers(0, len(tasks) - 1))] = draw(st.one_of(st.sampled_from((
                    "127.0.0.1", "127.0.0.1:", ":2222", "127.0.0.1:0", "127.0.0.1:65536",
                    "127.0.0.1:99999999999999999999", "h\u00f6st:2222", "\u0665:\u0662",
                    "a b:1", "host:22\n22", "[::1]:2222", "host:-1", "host:\u00b2", "",
                    "h\ud800:1")), _JSON))
        elif how == "job" and isinstance(value.get("cluster"), dict):
            value["cluster"][draw(st.one_of(st.sampled_from(
                ("chief", "master", "ps", "evaluator", "", "job:x", "1w", "w\u00f6rker")),
                st.text(max_size=8)))] = draw(st.one_of(st.just(["127.0.0.1:4000"]), _JSON))
        elif how == "drop":
            value.pop(draw(st.sampled_from(("cluster", "task"))), None)
        elif how == "extra":
            value[draw(st.sampled_from(("model_dir", "session_master", "eval_session_master",
                                        "service", "environment", "rpc_layer")))] = draw(_JSON)
        elif how == "deep":
            value["task"] = _deep_json(draw(st.sampled_from((10, 400))))
        elif how == "cluster":
            value["cluster"] = draw(_JSON)
    return json.dumps(value)


def _text_of(data: bytes) -> str:
    """Bytes as an environment variable's value reaches Python (no NUL can be in one)."""
    return os.fsdecode(data.replace(b"\x00", b""))


_RAW_TF_CONFIGS = st.sampled_from(["", " ", "null", "[]", "{}", "0", '"x"', "{", "NaN",
                                   '{"cluster": {}}', '{"task": {}}', '{"cluster": null}',
                                   '{"task": {"type": "ps"}}', _deep(100000),
                                   '{"cluster": ' + _deep(5000, '{"a":', "}") + "}",
                                   '{"task": {"type": "worker", "index": 1e999}}',
                                   '{"task": {"type": "worker", "index": 0.5}}'])


def _tf_config_cases():
    valid = st.builds(json.dumps, _cluster_spec())
    as_text = _cluster_spec().flatmap(lambda v: harness.mutated(json.dumps(v).encode())) \
        .map(_text_of)
    return st.one_of(valid, _mutated_spec(), as_text, _RAW_TF_CONFIGS,
                     st.binary(max_size=80).map(_text_of), st.text(max_size=80))


@contextlib.contextmanager
def _tf_config(value: str):
    before = os.environ.get("TF_CONFIG")
    os.environ["TF_CONFIG"] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ["TF_CONFIG"]
        else:
            os.environ["TF_CONFIG"] = before


def _check_tf_config(case: str, scratch: str, context) -> str:
    import tensorflow as tf

    from cifar10_estimator.config import checks
    from cifar10_estimator.task import tf_config

    outcome, role = harness.refused(lambda: tf_config.parse(case), "TF_CONFIG")
    if outcome != harness.ACCEPTED:
        return outcome
    # Accepted: the strategy's checks answer in one line, and Estimator, which reads the
    # variable itself, must take what the trainer sets it to (the case, or the shape parse
    # mapped) and see the same role.
    config = Settings.of(job_dir=os.path.join(scratch, "job"))
    outcome, _ = harness.refused(
        lambda: checks.check_cluster(config.cluster.distribution_strategy, role), "TF_CONFIG")
    if outcome != harness.ACCEPTED:
        return outcome
    with _tf_config(tf_config.estimator_tf_config(case, role) or "{}"):
        try:
            rc = tf.estimator.RunConfig(model_dir=config.output.job_dir)
        except ValueError as e:
            raise harness.Violation(f"TF_CONFIG {case[:80]!r} was accepted, and Estimator "
                                    f"refuses it: {' '.join(str(e).split())[:200]}") from None
    if (rc.task_type, rc.task_id) != (role.task_type, role.task_id) or (
            role.task_type != "evaluator" and rc.is_chief != role.is_chief):
        raise harness.Violation(f"TF_CONFIG {case[:80]!r}: the role {role} differs from "
                                f"Estimator's ({rc.task_type} {rc.task_id}, chief "
                                f"{rc.is_chief})")
    return outcome


KINDS = [
    harness.Kind(
        name="settings-json",
        reader="jobdir.settings_record.read, check",
        tried="a record written by settings_record.write, damaged as bytes; its JSON with "
              "values of every type (NaN, Infinity, huge numbers, nesting 3000 deep), keys "
              "missing, added or repeated; BOM, not UTF-8, empty; a folder, a symlink loop, "
              "a dangling symlink, a pipe, a socket, /dev/zero or /dev/null in its place; "
              "checked by a chief or a worker, with and without --change-settings",
        strategy=_settings_cases(),
        check=_check_settings,
        regressions=(
            ("file", b'{"settings": ' + _deep(100000).encode() + b"}", True, False),
            ("file", b'{"settings": {"num_layers": "44"}}', True, False),
            ("file", b'{"settings": {"momentum": NaN}}', False, False),
            # Found by the campaign: math.isfinite of an int past float's range overflowed.
            ("file", b'{"settings": {"momentum": 1' + b"0" * 400 + b"}}", False, False),
            # Equal to the run's 44, so it was accepted, and evaluate built a network of
            # 44.0 layers (a TypeError in range()).
            ("file", b'{"settings": {"num_layers": 44.0}}', False, False),
        ),
    ),
    harness.Kind(
        name="flag-file",
        reader="config.flags.parse (cli.Parser's @FILE)",
        tried="generated flag lines (valid flags, unknown ones, bad values, bare flags, NUL "
              "bytes, Latin-1, lines of 20,000 characters) and a valid flag file damaged as "
              "bytes; an @FILE that includes itself, a cycle of two, one missing, a folder, a "
              "NUL in its name, 20 levels each including the next twice, a pipe, a socket, "
              "/dev/zero or /dev/null",
        strategy=_flag_file_cases(),
        check=_check_flag_file,
        regressions=(
            (b"--num-layers 20", "self", True),
            (b"--num-layers 20", "cycle", False),
            (b"--num-layers caf\xe9", "none", True),
            (b"--num-layers 20", "fan-out", True),
        ),
    ),
    harness.Kind(
        name="tf-config",
        reader="task.tf_config.parse, Estimator's RunConfig",
        tried="clusters of chief or master, workers (up to 10,000), ps and an evaluator with "
              "each role; the same with the task, index, type, addresses (no port, port 0 or "
              "65536, Unicode hosts, spaces), job names, cluster or extra keys replaced by "
              "JSON of every type or nested 5,000 deep; damaged as text; not JSON at all",
        strategy=_tf_config_cases(),
        check=_check_tf_config,
        regressions=(
            "[]",
            '{"cluster": {"chief": ["127.0.0.1:2222"]}, "task": {"type": "worker", "index": 0}}',
            ('{"cluster": {"chief": ["127.0.0.1:2222"]}, "task": {"type": "chief", '
             '"index": "x"}}'),
            '{"cluster": {"chief": [5]}, "task": {"type": "chief", "index": 0}}',
            '{"cluster": {"chief": ["127.0.0.1"]}, "task": {"type": "chief", "index": 0}}',
            '{"service": 5}',
            _deep(100000),
        ),
    ),
]
