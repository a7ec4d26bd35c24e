"""A short, deterministic slice of the fuzzing campaign (benchmarks/fuzz_campaign.py runs the
long one): for every kind of input the package reads (tests/fuzz/), the minimal cases of the
failures found so far, then generated and damaged cases, each of which must be read soundly,
refused in one line naming the input, or skipped by a documented rule (tests/fuzz/harness.py).

Hypothesis draws the cases with ``derandomize=True``, so every run tries the same ones."""

import os
import shutil

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from fuzz import all_kinds, harness

# Cases per kind in this slice: about a second or two per kind for most (the serving kind's
# requests go through a separate process).
SLICE_CASES = 60
KINDS = all_kinds()


@pytest.fixture(scope="module")
def contexts(tmp_path_factory, tiny_export):
    """Each kind's context (``Kind.start``), started when first needed and stopped at the end.

    The kinds that read a tiny export (``fuzz.serving``'s, which train one of their own where
    their folder has none) find a copy of the suite's (``trainer_fixtures.tiny_export``, also
    a tiny ResNet trained 3 steps) where they look for theirs."""
    started: dict = {}

    def get(kind: harness.Kind):
        if kind.name not in started:
            folder = str(tmp_path_factory.mktemp(kind.name))
            if getattr(kind.start, "__module__", None) == "fuzz.serving":
                shutil.copytree(tiny_export, os.path.join(folder, "job", "export",
                                                          os.path.basename(tiny_export)))
            started[kind.name] = kind.start(folder) if kind.start else None
        return started[kind.name]

    yield get
    for kind in KINDS:
        if kind.name in started and kind.stop:
            kind.stop(started[kind.name])


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_every_case_is_read_refused_in_one_line_or_skipped(kind, contexts, tmp_path):
    context = contexts(kind)
    for case in kind.regressions:
        harness.run_case(kind, case, context, str(tmp_path))

    @settings(max_examples=SLICE_CASES, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(kind.strategy)
    def case(drawn):
        harness.run_case(kind, drawn, context, str(tmp_path))

    case()


def test_a_pipe_in_place_of_a_file_is_refused_instead_of_waited_on(tmp_path, capsys):
    # Reading a pipe that no one writes to would wait forever: a flag file, settings.json and
    # the records' metadata file are refused in one line naming them.
    import os

    from cifar10_estimator.config import flags
    from cifar10_estimator.data import metadata
    from cifar10_estimator.errors import UserError
    from cifar10_estimator.jobdir import settings_record

    pipe = tmp_path / "flags.txt"
    os.mkfifo(pipe)
    with pytest.raises(SystemExit) as stopped:
        flags.parse([f"@{pipe}"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(pipe) in err[0] and "not a regular file" in err[0], err
    os.mkfifo(tmp_path / settings_record.RECORD_FILE)
    with pytest.raises(UserError, match="settings.json cannot be read .*not a regular file"):
        settings_record.read(str(tmp_path))
    os.mkfifo(tmp_path / metadata.METADATA_FILENAME)
    with pytest.raises(UserError, match=metadata.METADATA_FILENAME):
        metadata.dataset_info(str(tmp_path))
