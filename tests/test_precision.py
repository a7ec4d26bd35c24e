"""``--precision auto`` decided by measurement: the choice with injected timings, the probes'
cache, the probe itself on real graphs, and real trainer runs.

The choice logic gets its timings injected (faster, slower, equal, a failed probe); the probes
time real graphs; the trainer runs are real and hold on every CPU: where this CPU has no native
bf16 (or oneDNN is off) the tests that need a probe inject the CPU's flags, and the probe then
times oneDNN's emulated bf16, which only makes bf16 the slower choice.
"""

import json
import re

import pytest
import tensorflow as tf

from cifar10_estimator import train
from cifar10_estimator.errors import UserError
from cifar10_estimator.training.estimator.model_fn import make_train_step
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.config.settings import ModelSection
from cifar10_estimator.platform import cpu, precision, precision_cache, precision_probe
from cifar10_estimator.platform.precision import Measured, ProbeFailed
from trainer_fixtures import trainer_args

ZEN3 = cpu.CpuInfo("AMD EPYC 7B13", frozenset({"avx2", "fma"}))
XEON_NO_AMX = cpu.CpuInfo("Intel(R) Xeon(R) Gold 6348",
                          frozenset({"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"}))
TF = tf.__version__


def timings(fp32: float, bf16: float, source: str = "measured now") -> Measured:
    return Measured({"fp32": fp32, "bf16": bf16}, source)


def never():
    raise AssertionError("this choice must not measure")


def auto(measure, **kwargs) -> precision.Choice:
    return precision.resolve_precision("auto", XEON_NO_AMX, onednn=True, measure=measure,
                                       **kwargs)


# --- the choice, with injected timings --------------------------------------------------------

def test_auto_takes_bf16_where_it_measured_clearly_faster_and_says_both_figures():
    choice = auto(lambda: timings(590, 914))
    assert choice.precision == "bf16" and choice.warning is None
    assert choice.reason.startswith("bf16 (914 images/s) over fp32 (590): 1.55x; measured now")


def test_auto_keeps_fp32_where_bf16_measured_slower():
    # The Xeon without AMX: 723 images/s in fp32, 496 in bf16.
    choice = auto(lambda: timings(723, 496))
    assert choice.precision == "fp32" and choice.warning is None
    assert choice.reason.startswith("fp32 (723 images/s) over bf16 (496)")


@pytest.mark.parametrize("bf16", [700.0, 723.0, 790.0])
def test_auto_keeps_fp32_where_bf16_is_not_clearly_faster(bf16):
    # Equal, and up to 1.09x: within a probe's noise, so not worth bf16's rounding.
    choice = auto(lambda: timings(723, bf16))
    assert choice.precision == "fp32"
    assert f"bf16 is taken at {precision.BF16_MIN_SPEEDUP:g}x or more" in choice.reason


def test_auto_takes_bf16_at_exactly_the_threshold():
    assert auto(lambda: timings(100, 100 * precision.BF16_MIN_SPEEDUP)).precision == "bf16"


def test_a_failed_probe_gives_fp32_and_the_reason():
    def broken():
        raise ProbeFailed("InternalError: no bf16 kernel")
    choice = auto(broken)
    assert choice.precision == "fp32"
    assert choice.reason == "fp32: the probe of bf16 failed (InternalError: no bf16 kernel)"


def test_explicit_bf16_that_measured_slower_trains_as_asked_with_one_warning():
    choice = precision.resolve_precision("bf16", XEON_NO_AMX, onednn=True,
                                         measure=lambda: timings(723, 496, "measured now"))
    assert choice.precision == "bf16"
    assert choice.warning == (
        "--precision bf16 trains in bf16, which measured slower than fp32 on this CPU: fp32 "
        "(723 images/s) over bf16 (496) (measured now); --precision fp32 would train 1.46x as "
        "fast")
    assert "\n" not in choice.warning


def test_explicit_bf16_that_measured_faster_has_no_warning():
    choice = precision.resolve_precision("bf16", XEON_NO_AMX, onednn=True,
                                         measure=lambda: timings(590, 914))
    assert choice.precision == "bf16" and choice.warning is None


def test_where_bf16_is_not_native_nothing_is_measured_and_explicit_bf16_is_refused():
    assert precision.resolve_precision("auto", ZEN3, onednn=True,
                                       measure=never).precision == "fp32"
    with pytest.raises(UserError, match=r"^--precision bf16: this CPU \(AMD EPYC 7B13\)"):
        precision.resolve_precision("bf16", ZEN3, onednn=True, measure=never)


def test_fp32_never_measures_but_says_when_the_cache_knows_bf16_is_faster():
    plain = precision.resolve_precision("fp32", XEON_NO_AMX, onednn=True, measure=never)
    assert plain.reason == "fp32, as asked"
    hinted = precision.resolve_precision("fp32", XEON_NO_AMX, onednn=True, measure=never,
                                         cached=timings(590, 914, "cached"))
    assert hinted.precision == "fp32" and hinted.warning is None
    assert "bf16 measured 1.55x as fast on this CPU (cached)" in hinted.reason


def test_auto_follows_the_jobs_recorded_precision_without_measuring():
    assert auto(never, recorded="fp32").reason == "fp32, the job's recorded precision"
    assert auto(never, recorded="bf16").precision == "bf16"
    # Resumed on a CPU where the recorded bf16 measured slower: it keeps bf16, and warns.
    slower = auto(never, recorded="bf16", cached=timings(723, 496, "cached"))
    assert slower.precision == "bf16"
    assert "--precision fp32 --change-settings would train 1.46x as fast" in slower.warning


def test_a_recorded_bf16_on_a_cpu_without_native_bf16_is_refused_with_the_way_out():
    with pytest.raises(UserError, match=r"this job trains in bf16 \(its recorded precision\), "
                                        r"but: this CPU \(AMD EPYC 7B13\) has no native"
                                        r".*--precision fp32 --change-settings"):
        precision.resolve_precision("auto", ZEN3, onednn=True, measure=never, recorded="bf16")


def test_serving_stays_fp32_unless_the_model_trained_in_bf16_and_bf16_serves_faster():
    serving = precision.resolve_serving_precision
    assert serving("auto", "fp32", XEON_NO_AMX, onednn=True, measure=never).precision == "fp32"
    assert serving("auto", "bf16", XEON_NO_AMX, onednn=True,
                   measure=lambda: timings(1854, 2688)).precision == "bf16"
    assert serving("auto", "bf16", XEON_NO_AMX, onednn=True,
                   measure=lambda: timings(1854, 1700)).precision == "fp32"
    assert serving("fp32", "bf16", XEON_NO_AMX, onednn=True, measure=never).precision == "fp32"
    with pytest.raises(UserError, match="--serving-precision bf16: this CPU"):
        serving("bf16", "bf16", ZEN3, onednn=True, measure=never)


# --- the cache ----------------------------------------------------------------------------------

def test_a_cached_measurement_is_used_without_probing(tmp_path):
    cache = precision_cache.PrecisionCache(str(tmp_path), TF)
    first = precision_cache.measured(cache, "cpu A", "training X", lambda: timings(1, 2))
    assert first.source == "measured now"
    again = precision_cache.measured(cache, "cpu A", "training X", never)
    assert again.images_per_sec == {"fp32": 1.0, "bf16": 2.0}
    assert again.source.startswith("measured ") and str(tmp_path) in again.source
    # Another CPU or other work is another key.
    assert precision_cache.cached(cache, "cpu B", "training X") is None
    assert precision_cache.cached(cache, "cpu A", "training Y") is None


def test_an_entry_of_another_tensorflow_version_is_stale_and_dropped(tmp_path):
    old = precision_cache.PrecisionCache(str(tmp_path), "2.14.1")
    old.put(old.key("cpu A", "training X"), {"fp32": 5.0, "bf16": 1.0})
    new = precision_cache.PrecisionCache(str(tmp_path), TF)
    assert precision_cache.cached(new, "cpu A", "training X") is None
    precision_cache.measured(new, "cpu A", "training X", lambda: timings(1, 2))
    with open(tmp_path / precision_cache.CACHE_FILE) as f:
        keys = list(json.load(f)["entries"])
    assert keys == [new.key("cpu A", "training X")]


@pytest.mark.parametrize("damage", [
    b"", b"{", b"\x00\xff garbage", b"[1, 2]", b'{"format": 1, "entries": []}',
    b'{"format": 99, "entries": {}}',
    b'{"format": 1, "entries": {"KEY": {"images_per_sec": {"fp32": "x"}, "measured": 1}}}',
    b'{"format": 1, "entries": {"KEY": {"images_per_sec": {"fp32": 0, "bf16": 1}, '
    b'"measured": "2026-01-01"}}}',
])
def test_a_damaged_cache_file_is_ignored_and_written_anew(tmp_path, damage):
    cache = precision_cache.PrecisionCache(str(tmp_path), TF)
    key = cache.key("cpu A", "training X")
    (tmp_path / precision_cache.CACHE_FILE).write_bytes(damage.replace(b"KEY", key.encode()))
    probed = []
    result = precision_cache.measured(cache, "cpu A", "training X",
                                      lambda: probed.append(1) or timings(3, 4))
    assert probed == [1] and result.images_per_sec == {"fp32": 3, "bf16": 4}
    assert precision_cache.cached(cache, "cpu A", "training X").images_per_sec == {
        "fp32": 3.0, "bf16": 4.0}


def test_a_cache_that_cannot_be_written_costs_only_the_next_probe(tmp_path):
    (tmp_path / "file").write_text("a file where the folder should be")
    cache = precision_cache.PrecisionCache(str(tmp_path / "file" / "sub"), TF)
    assert precision_cache.measured(cache, "cpu", "work", lambda: timings(1, 2)).source == (
        "measured now")
    assert precision_cache.cached(cache, "cpu", "work") is None


def test_a_probe_that_raises_is_a_failed_probe_with_its_first_line(tmp_path):
    cache = precision_cache.PrecisionCache(str(tmp_path), TF)

    def broken():
        raise tf.errors.InternalError(None, None, "no kernel\nlong details")
    with pytest.raises(ProbeFailed, match=r"^InternalError: no kernel$"):
        precision_cache.measured(cache, "cpu", "work", broken)
    assert precision_cache.cached(cache, "cpu", "work") is None  # a failure is not cached


def test_the_cache_lives_in_the_xdg_cache_folder():
    folder = precision_cache.cache_folder
    assert folder({"XDG_CACHE_HOME": "/var/cache/me"}, "/home/u") == (
        "/var/cache/me/cifar10_estimator")
    assert folder({}, "/home/u") == "/home/u/.cache/cifar10_estimator"
    # The XDG Base Directory specification: a relative path is invalid and ignored.
    assert folder({"XDG_CACHE_HOME": "rel"}, "/home/u") == "/home/u/.cache/cifar10_estimator"


# --- the probes, timing real graphs --------------------------------------------------------------

def test_calls_are_timed_alternately_after_a_warm_up_within_the_budget():
    order, now = [], [0.0]

    def clock():
        return now[0]

    def call(name, secs):
        def run():
            order.append(name)
            now[0] += secs
        return run
    per_sec, rounds = precision_probe.time_alternately(
        {"fp32": call("fp32", 0.5), "bf16": call("bf16", 0.25)}, images_per_call=10,
        budget_secs=3.0, max_rounds=100, clock=clock)
    assert order[:2] == ["fp32", "bf16"]  # the warm-up calls, untimed
    assert order[2:] == ["fp32", "bf16"] * rounds
    assert rounds == 4  # 0.75 s a round: the budget of 3 s is spent after 4
    assert per_sec == {"fp32": 20.0, "bf16": 40.0}
    _, rounds = precision_probe.time_alternately(
        {"a": call("a", 10.0)}, images_per_call=1, budget_secs=1.0, max_rounds=100,
        clock=clock)
    assert rounds == precision_probe.MIN_ROUNDS  # even when one call spends the budget


@pytest.mark.slow
def test_the_training_probe_times_the_real_step_of_the_network_in_both_precisions():
    settings = ModelSettings(model=ModelSection(num_layers=8), devices=("/cpu:0", "/cpu:1"))
    config = tf.compat.v1.ConfigProto()
    config.device_count["CPU"] = 2
    measured = precision_probe.measure_training(make_train_step, settings, 8, config,
                                                budget_secs=0.2)
    assert set(measured.images_per_sec) == {"fp32", "bf16"}
    assert all(rate > 0 for rate in measured.images_per_sec.values())
    assert re.fullmatch(r"measured now: medians of \d+ alternating runs, [\d.]+ s",
                        measured.source)


def test_the_serving_probe_times_the_exports_network_with_random_weights():
    settings = ModelSettings(model=ModelSection(num_layers=8))
    measured = precision_probe.measure_serving(settings, 4, budget_secs=0.1)
    assert all(rate > 0 for rate in measured.images_per_sec.values())


# --- real trainer runs ---------------------------------------------------------------------------

_AUTO_LINE = re.compile(r"precision auto: (fp32|bf16) \(([\d,]+) images/s\) over (fp32|bf16) "
                        r"\(([\d,]+)\): .*; (measured now|measured \d{4}-\d\d-\d\d, cached in "
                        r"(\S+))")


def _bf16_cpu(monkeypatch) -> cpu.CpuInfo:
    """This machine's CPU, with native bf16 claimed where it has none (its bf16 is then
    oneDNN's emulation, and simply measures slow)."""
    real = cpu.read_cpu_info()
    injected = cpu.CpuInfo(real.model, real.flags | {"avx512_bf16"})
    monkeypatch.setattr(cpu, "read_cpu_info", lambda: injected)
    return injected


@pytest.mark.slow
@pytest.mark.skipif(not cpu.onednn_enabled(), reason="bf16 on a CPU needs oneDNN")
def test_a_real_auto_run_measures_records_and_a_rerun_follows_the_record(
        tiny_records, tmp_path, capsys, monkeypatch):
    _bf16_cpu(monkeypatch)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    flags = trainer_args(data_dir, job_dir, "--precision", "auto", "--eval-throttle-secs", "1",
                         "--precise-bn-batches", "0")
    assert train.main([*flags, "--train-steps", "2"]) == 0
    err = capsys.readouterr().err
    line = _AUTO_LINE.search(err)
    assert line and line.group(5) == "measured now", err[-3000:]
    chosen, other = line.group(1), line.group(3)
    assert {chosen, other} == {"fp32", "bf16"}
    rate = {chosen: float(line.group(2).replace(",", "")),
            other: float(line.group(4).replace(",", ""))}
    assert (chosen == "bf16") == (rate["bf16"] >= precision.BF16_MIN_SPEEDUP * rate["fp32"])
    with open(job_dir / "settings.json") as f:
        assert json.load(f)["settings"]["precision"] == chosen
    cache_file = tmp_path / "cache" / "cifar10_estimator" / precision_cache.CACHE_FILE
    assert any(key.endswith("training ResNet-8 v1, batch 8 on /cpu:0, channels_last, "
                            "threads 0/0") for key in json.loads(cache_file.read_text())[
        "entries"])
    # The same job again: the job's recorded choice, no probe.
    assert train.main([*flags, "--train-steps", "3"]) == 0
    err = capsys.readouterr().err
    assert f"precision auto: {chosen}, the job's recorded precision" in err
    # Another job with the same network and batch: the cache answers.
    flags[3] = str(tmp_path / "job2")
    assert train.main([*flags, "--train-steps", "1"]) == 0
    line = _AUTO_LINE.search(capsys.readouterr().err)
    assert line and line.group(1) == chosen and line.group(6) == str(cache_file)


@pytest.mark.slow
@pytest.mark.skipif(not cpu.onednn_enabled(), reason="bf16 on a CPU needs oneDNN")
def test_explicit_bf16_measured_slower_warns_once_with_both_figures(tiny_records, tmp_path,
                                                                    capsys, monkeypatch):
    injected = _bf16_cpu(monkeypatch)
    # A cache that says bf16 is slower here, as it measured on the Xeon without AMX.
    cache = precision_cache.PrecisionCache(str(tmp_path / "cache" / "cifar10_estimator"), TF)
    cache.put(cache.key(injected.describe(), "training ResNet-8 v1, batch 8 on /cpu:0, "
                                             "channels_last, threads 0/0"),
              {"fp32": 723.0, "bf16": 496.0})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data_dir, _ = tiny_records
    assert train.main(trainer_args(data_dir, tmp_path / "job", "--precision", "bf16",
                                   "--train-steps", "1", "--precise-bn-batches", "0",
                                   "--eval-throttle-secs", "1")) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "measured slower than fp32" in line]
    assert len(warnings) == 1
    assert (" warning: --precision bf16 trains in bf16, which measured slower than fp32 on this "
            "CPU: fp32 (723 images/s) over bf16 (496) (measured ") in warnings[0]
    assert "--precision fp32 would train 1.46x as fast" in warnings[0]
    assert "precision bf16: bf16, as asked: bf16 (496 images/s) over fp32 (723)" in err


# The export records what it computes in (fp32 training, an fp32 export): checked on the fp32
# run of tests/test_cpu.py's precision auto on an AVX2 CPU, which trains and exports anyway.
