"""A short, deterministic slice of the fuzzing campaign (benchmarks/fuzz_campaign.py runs the
long one): for every kind of input the package reads (tests/fuzz/), the minimal cases of the
failures found so far, then generated and damaged cases, each of which must be read soundly,
refused in one line naming the input, or skipped by a documented rule (tests/fuzz/harness.py).

Hypothesis draws the cases with ``derandomize=True``, so every run tries the same ones."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from fuzz import all_kinds, harness

# Cases per kind in this slice: about a second or two per kind for most (the serving kind's
# requests go through a separate process).
SLICE_CASES = 60
KINDS = all_kinds()


@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    """Each kind's context (``Kind.start``), started when first needed and stopped at the end."""
    started: dict = {}

    def get(kind: harness.Kind):
        if kind.name not in started:
            started[kind.name] = kind.start(str(tmp_path_factory.mktemp(kind.name))) \
                if kind.start else None
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
