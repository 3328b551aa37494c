"""`policy.precision`: what `auto` picks on each kind of CPU (features pretended), what it says and where, and the
settings refused at configure."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from omni_ros import cpu_features
from omni_ros.cpu_features import CpuFeatures
from omni_ros.policy.config import PolicyConfig
from omni_ros.policy.precision import PrecisionError, choose, program_choice
from omni_ros.policy.precision import choice as choice_module
from omni_ros.typed_config import ConfigError

# /proc/cpuinfo flags of real machines (the GEMM-relevant part).
SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}
CASCADE_LAKE = {"avx2", "avx512f", "avx512_vnni"}
COOPER_LAKE = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
ALDER_LAKE = {"avx2", "avx_vnni"}
ZEN1 = {"avx2", "fma"}
JETSON_ORIN = {"fp", "asimd", "asimddp", "crc32"}  # Cortex-A78AE: dotprod, no i8mm / bf16
GRAVITON3 = {"fp", "asimd", "asimddp", "i8mm", "bf16", "sve"}
CORTEX_A72 = {"fp", "asimd", "crc32"}  # Raspberry Pi 4: no dot product


def cpu(flags, arch="x86_64"):
    return CpuFeatures(arch, "test cpu", None if flags is None else frozenset(flags))


@pytest.mark.parametrize(
    ("flags", "arch", "expected"),
    [
        (SAPPHIRE_RAPIDS, "x86_64", ("bf16", "amx_bf16", "")),
        (COOPER_LAKE, "x86_64", ("int8", "avx512_vnni", "xnnpack")),
        (CASCADE_LAKE, "x86_64", ("int8", "avx512_vnni", "xnnpack")),
        (ALDER_LAKE, "x86_64", ("int8", "avx_vnni", "xnnpack")),
        (ZEN1, "x86_64", ("fp32", "no int8 dot product or native bf16 on this CPU", "")),
        (JETSON_ORIN, "aarch64", ("int8", "asimddp", "xnnpack")),
        (GRAVITON3, "aarch64", ("int8", "i8mm", "xnnpack")),
        (CORTEX_A72, "aarch64", ("fp32", "no int8 dot product or native bf16 on this CPU", "")),
        (None, "x86_64", ("fp32", "default", "")),  # flags unreadable: nothing assumed
    ],
)
def test_auto_picks_per_cpu(flags, arch, expected):
    picked = choose("auto", features=cpu(flags, arch))
    assert (picked.precision, picked.reason, picked.kernel) == expected
    assert picked.native


def test_an_amx_int8_cpu_runs_int8_on_onednn():
    picked = choose("int8", features=cpu(SAPPHIRE_RAPIDS))
    assert (picked.precision, picked.kernel, picked.native) == ("int8", "onednn", True)
    assert picked.describe() == "int8 (onednn): policy.precision int8, amx_int8"
    assert choose("int8", int8_kernel="xnnpack", features=cpu(SAPPHIRE_RAPIDS)).kernel == "xnnpack"


def test_explicit_precision_without_the_instructions_runs_and_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(choice_module, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="omni_ros.policy"):
        first = choose("int8", features=cpu(ZEN1))
        again = choose("int8", features=cpu(ZEN1))
        bf16 = choose("bf16", features=cpu(ZEN1))
    assert (first.precision, first.native, first.kernel) == ("int8", False, "onednn")
    assert first.describe() == "int8 (onednn): policy.precision int8, emulated: no AVX512_VNNI, AVX_VNNI or AMX_INT8"
    assert again == first and (bf16.precision, bf16.native) == ("bf16", False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # one for int8, one for bf16: not one per load
    assert "lacks AVX512_VNNI, AVX_VNNI or AMX_INT8" in warnings[0] and "lacks AVX512_BF16 or AMX_BF16" in warnings[1]


def test_fp32_and_gpu_and_whole_model_bf16():
    assert choose("fp32", features=cpu(SAPPHIRE_RAPIDS)).describe() == "fp32: policy.precision fp32"
    assert (
        choose("auto", device="cuda", features=cpu(SAPPHIRE_RAPIDS)).describe() == "fp32: policy.dtype float32 on cuda"
    )
    on_gpu_bf16 = choose("auto", device="cuda:0", dtype="bfloat16")
    assert on_gpu_bf16.describe() == "bf16: policy.dtype bfloat16 on cuda:0"
    assert choose("auto", dtype="bfloat16", features=cpu(ZEN1)).precision == "bf16"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"precision": "int4"}, r"int4.*auto.*fp32.*bf16.*int8|auto.*fp32.*bf16.*int8.*int4"),
        ({"backend": "remote", "remote": {"url": "ws://127.0.0.1:9"}, "precision": "int8"}, "remote server's"),
        ({"device": "cuda", "precision": "int8"}, "chooses CPU GEMM kernels"),
        ({"device": "cuda:1", "precision": "bf16"}, "chooses CPU GEMM kernels"),
        ({"dtype": "bfloat16", "precision": "int8"}, "needs dtype float32"),
        ({"backend": "executorch", "pte": "x.pte", "precision": "bf16"}, "no kernels in an exported program"),
        ({"backend": "onnxruntime", "onnx": "folder", "precision": "bf16"}, "no kernels in an exported program"),
        ({"int8_kernel": "fbgemm"}, "onednn"),
    ],
)
def test_refused_at_configure(kwargs, match):
    from omni_ros.typed_config import from_dict

    with pytest.raises(ConfigError, match=match):
        from_dict(PolicyConfig, kwargs)


def test_unknown_precision_in_a_yaml_names_the_choices(tmp_path, python):
    path = tmp_path / "robot.yaml"
    path.write_text("policy:\n  precision: int4\n")
    out = subprocess.run(
        [python, "-m", "omni_ros.cli", "config", "check", "--config", str(path)], capture_output=True, text=True
    )
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "precision" in text and "int4" in text
    assert all(name in text for name in ("'auto'", "'fp32'", "'bf16'", "'int8'")), text


def test_an_exported_program_keeps_its_precision():
    assert program_choice("int8-dynamic", "auto", "p.pte").describe() == "int8: exported program (int8-dynamic)"
    assert program_choice("none", "fp32", "p.pte").precision == "fp32"
    with pytest.raises(PrecisionError, match=r"exported as int8-dynamic \(int8\), policy.precision asks for fp32"):
        program_choice("int8-dynamic", "fp32", "p.pte")
    with pytest.raises(PrecisionError, match="--precision int8"):
        program_choice("none", "int8", "p.pte")


def test_flags_override_and_cpuinfo(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test Xeon\nflags\t\t: fpu avx2 avx512_vnni\n\nprocessor\t: 1\n")
    assert cpu_features.cpu_flags(cpuinfo) == frozenset({"fpu", "avx2", "avx512_vnni"})
    assert cpu_features.cpu_model(cpuinfo) == "Test Xeon"
    assert cpu_features.cpu_flags(tmp_path / "absent") is None
    monkeypatch.setenv(cpu_features.FLAGS_ENV, "avx2,avx512_vnni avx512_bf16")
    cpu_features._this_cpu.cache_clear()
    try:
        here = cpu_features.detect()
        assert here.int8_dot == ("avx512_vnni",) and here.bf16 == ("avx512_bf16",)
        assert here.model.endswith(f"(flags from ${cpu_features.FLAGS_ENV})")
    finally:
        cpu_features._this_cpu.cache_clear()


def test_policy_info_says_what_auto_picks_and_why(python, capsys, monkeypatch):
    env = {**os.environ, cpu_features.FLAGS_ENV: "avx2 avx512_vnni"}
    out = subprocess.run(
        [python, "-m", "omni_ros.cli", "policy", "info", "--preset", "tiny"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert "precision:    int8 (xnnpack): avx512_vnni" in out.stdout
    from omni_ros.cli import main

    monkeypatch.setattr(cpu_features, "detect", lambda: cpu(ZEN1))
    assert main(["policy", "info", "--preset", "tiny", "--precision", "bf16"]) == 0
    printed = capsys.readouterr().out
    assert "precision:    bf16: policy.precision bf16, emulated: no AVX512_BF16 or AMX_BF16" in printed, printed


def test_metadata_and_status_carry_the_choice(monkeypatch):
    from omni_ros.backends.factory import load_policy
    from omni_ros.nodes import messages

    monkeypatch.setattr(cpu_features, "detect", lambda: cpu(COOPER_LAKE))
    policy = load_policy(PolicyConfig(preset="tiny", int8_kernel="onednn"))
    assert policy.metadata.precision == "int8 (onednn): avx512_vnni"
    assert policy.metadata.to_dict()["precision"] == "int8 (onednn): avx512_vnni"
    counts = {"chunks": 0, "commands": 0, "dropped_frames": 0, "errors": 0}
    status = messages.policy_status(
        0.0,
        0,
        "",
        backend=policy.metadata.backend,
        model="tiny",
        last_inference_s=0.0,
        control_rate=50.0,
        achieved_rate=0.0,
        dry_run=True,
        counts=counts,
        precision=policy.metadata.precision,
    )
    assert status.precision == "int8 (onednn): avx512_vnni"
    diag = {kv.key: kv.value for kv in messages.diagnostics(status, "policy").status[0].values}
    assert diag["precision"] == "int8 (onednn): avx512_vnni"


def test_export_takes_the_same_words(monkeypatch):
    from argparse import Namespace

    from omni_ros.commands.export import _quantize_for

    def q(precision, target="xnnpack", quantize=None):
        return _quantize_for(Namespace(precision=precision, target=target, quantize=quantize))

    assert (q(None), q(None, quantize="8da4w"), q("int8"), q("fp32"), q("fp32", "onnx")) == (
        "none",
        "8da4w",
        "int8-dynamic",
        "none",
        "none",
    )
    monkeypatch.setattr(cpu_features, "detect", lambda: cpu(CASCADE_LAKE))
    assert q("auto") == "int8-dynamic" and q("auto", "onnx") == "none"
    monkeypatch.setattr(cpu_features, "detect", lambda: cpu(ZEN1))
    assert q("auto") == "none"
    for args, match in [
        (("bf16",), "no bf16 GEMMs"),
        (("int8", "onnx"), "exported for --target xnnpack"),
        (("int8", "xnnpack", "8da4w"), "means --quantize int8-dynamic, not 8da4w"),
    ]:
        with pytest.raises(ConfigError, match=match):
            q(*args)
