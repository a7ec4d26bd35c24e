"""What the CPU offers: flag parsing, the oneDNN default, precision choice on both CPU kinds.

Both kinds of machine this project runs on are covered by injecting their ``/proc/cpuinfo``
flags; no test trains in bf16 on a CPU without native bf16 (it would be many times slower).
"""

import json
import os

import pytest

from cifar10_estimator import train
from cifar10_estimator.platform import cpu, precision
from cifar10_estimator.errors import UserError
from trainer_fixtures import run_module, trainer_args

# Abridged /proc/cpuinfo of the two kinds: an AVX2-only AMD Zen 3 and an AVX-512 Zen 5.
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni
"""
ZEN5 = """processor\t: 0
model name\t: AMD EPYC 9B45
flags\t\t: fpu sse2 fma avx avx2 avx512f avx512dq avx512_vnni avx512_bf16 avx512_vp2intersect
"""
SAPPHIRE_RAPIDS = """model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: avx avx2 fma avx512f avx512_vnni amx_bf16 amx_tile amx_int8
"""


def test_cpuinfo_gives_the_model_and_flags_of_the_first_processor():
    zen3 = cpu.parse_cpuinfo(ZEN3)
    assert zen3.model == "AMD EPYC 7B13"
    assert {"avx2", "fma"} <= zen3.flags and "avx512f" not in zen3.flags
    assert not zen3.native_bf16
    assert cpu.parse_cpuinfo(ZEN5).native_bf16  # avx512_bf16
    assert cpu.parse_cpuinfo(SAPPHIRE_RAPIDS).native_bf16  # amx_bf16 without avx512_bf16
    assert cpu.parse_cpuinfo("").model == "unknown CPU"


def test_describe_names_the_flags_a_figure_depends_on():
    line = cpu.parse_cpuinfo(ZEN3).describe()
    assert line == ("AMD EPYC 7B13 (avx2 fma; no avx512f avx512_vnni avx512_bf16 amx_bf16)")
    assert "avx512_bf16" in cpu.parse_cpuinfo(ZEN5).describe().split(";")[0]


def test_an_unreadable_cpuinfo_is_an_unknown_cpu_without_bf16(tmp_path):
    info = cpu.read_cpu_info(str(tmp_path / "missing"))
    assert info.model == "unknown CPU" and not info.native_bf16


def test_onednn_is_preferred_only_when_the_user_has_not_chosen():
    env = {}
    assert cpu.prefer_onednn(env) and env == {"TF_ENABLE_ONEDNN_OPTS": "1"}
    for chosen in ("0", "1", "false"):
        env = {"TF_ENABLE_ONEDNN_OPTS": chosen}
        assert not cpu.prefer_onednn(env) and env["TF_ENABLE_ONEDNN_OPTS"] == chosen


@pytest.mark.parametrize("text,onednn,because", [
    (ZEN3, True, "no native bfloat16"),
    (ZEN5, False, "oneDNN is off"),
])
def test_auto_keeps_fp32_without_measuring_where_bf16_is_not_native_or_onednn_is_off(
        text, onednn, because):
    # The default measure raises: these choices must not need one.
    choice = precision.resolve_precision("auto", cpu.parse_cpuinfo(text), onednn=onednn)
    assert choice.precision == "fp32" and because in choice.reason


def test_explicit_choices_are_kept_where_they_fit():
    zen5 = cpu.parse_cpuinfo(ZEN5)
    assert precision.resolve_precision("bf16", zen5, onednn=True).precision == "bf16"
    assert precision.resolve_precision("fp32", zen5, onednn=True).precision == "fp32"
    assert precision.resolve_precision("fp32", cpu.parse_cpuinfo(ZEN3),
                                       onednn=False).precision == "fp32"


def test_bf16_without_native_support_or_onednn_is_refused_with_the_reason():
    with pytest.raises(UserError, match=r"--precision bf16: this CPU \(AMD EPYC 7B13\) has no "
                                        r"native bfloat16 .* use --precision fp32 or auto"):
        precision.resolve_precision("bf16", cpu.parse_cpuinfo(ZEN3), onednn=True)
    with pytest.raises(UserError, match="oneDNN, which is off"):
        precision.resolve_precision("bf16", cpu.parse_cpuinfo(ZEN5), onednn=False)


def test_gpu_rules_bf16_needs_ampere_and_auto_stays_fp32():
    zen3 = cpu.parse_cpuinfo(ZEN3)  # the host CPU does not matter for GPU training
    assert precision.resolve_precision("auto", zen3, onednn=False,
                                       gpu_capabilities=[(8, 0)]).precision == "fp32"
    assert precision.resolve_precision("bf16", zen3, onednn=False,
                                       gpu_capabilities=[(8, 6), (9, 0)]).precision == "bf16"
    with pytest.raises(UserError, match="compute capability 8.0 or newer.*7.0"):
        precision.resolve_precision("bf16", zen3, onednn=False, gpu_capabilities=[(8, 0), (7, 0)])


def test_the_trainer_refuses_bf16_on_an_avx2_cpu_at_once(tiny_records, tmp_path, capsys,
                                                         monkeypatch):
    # The CPU is injected; the refusal comes before any graph is built.
    monkeypatch.setattr(cpu, "read_cpu_info", lambda: cpu.parse_cpuinfo(ZEN3))
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    status = train.main(trainer_args(data_dir, job_dir, "--train-steps", "2",
                                     "--precision", "bf16"))
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and "Traceback" not in "\n".join(err)
    assert err[-1].startswith("cifar10_estimator: error: --precision bf16: this CPU "
                              "(AMD EPYC 7B13) has no native bfloat16")
    assert not job_dir.exists()


@pytest.mark.slow
def test_auto_on_an_avx2_cpu_trains_in_fp32_and_says_why(tiny_records, tmp_path, capsys,
                                                         monkeypatch):
    monkeypatch.setattr(cpu, "read_cpu_info", lambda: cpu.parse_cpuinfo(ZEN3))
    data_dir, _ = tiny_records
    job_dir = tmp_path / "job"
    status = train.main(trainer_args(data_dir, job_dir, "--train-steps", "2",
                                     "--precision", "auto", "--eval-throttle-secs", "1"))
    err = capsys.readouterr().err
    assert status == 0
    assert "CPU: AMD EPYC 7B13 (avx2 fma; no avx512f" in err
    assert "precision auto: fp32: this CPU has no native bfloat16" in err
    # The export records what it computes in (tests/test_precision.py): fp32 training exports
    # an fp32 network (auto serving follows the training precision).
    assert "serving precision auto: fp32, as the model trained" in err
    (version,) = os.listdir(job_dir / "export")
    info = json.loads((job_dir / "export" / version / "assets.extra" / "export.json").read_text())
    assert info == {"checkpoint": "model.ckpt-2", "global_step": 2, "compute_dtype": "float32"}


@pytest.mark.slow
def test_channels_first_with_onednn_switched_off_is_one_line_not_a_trace(tiny_records, tmp_path):
    data_dir, _ = tiny_records
    proc = run_module("cifar10_estimator", *trainer_args(
        data_dir, tmp_path / "job", "--data-format", "channels_first"),
        env_extra={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "cifar10_estimator: error: --data-format channels_first on a CPU needs TensorFlow's "
        "oneDNN kernels, which are off in this process; set TF_ENABLE_ONEDNN_OPTS=1 (or unset "
        "it) or use --data-format channels_last")
    assert not os.path.exists(tmp_path / "job")


# The command line turns oneDNN on when the user has not chosen: checked on the trainer run
# of tests/test_progress.py's command-line test, started with TF_ENABLE_ONEDNN_OPTS unset.


def test_a_onednn_isa_cap_below_bf16_takes_native_bf16_away():
    zen5 = cpu.parse_cpuinfo(ZEN5)
    assert zen5.as_seen_by_onednn(None) is zen5
    assert zen5.as_seen_by_onednn("avx512_core_amx").native_bf16
    capped = zen5.as_seen_by_onednn("AVX2")
    assert not capped.native_bf16 and "[oneDNN capped at AVX2]" in capped.model
    assert precision.resolve_precision("auto", capped, onednn=True).precision == "fp32"
