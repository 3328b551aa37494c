"""`policy.dtype: bfloat16` on a CPU that would only emulate bf16: float32 with one warning, or refused if strict."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from omni_ros import cpu_features
from omni_ros.backends import factory
from omni_ros.backends.factory import load_policy
from omni_ros.policy.config import PolicyConfig
from omni_ros.policy.torch_runner import DeviceError

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _observation(cfg) -> dict:
    rng = np.random.default_rng(0)
    images = {n: rng.integers(0, 255, (cfg.vision.image_size,) * 2 + (3,), dtype=np.uint8) for n in cfg.camera_names}
    return {"images": images, "state": rng.normal(size=cfg.state_dim), "prompt": "reach the red block"}


AVX2_ONLY = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi2"


@pytest.mark.parametrize(
    ("machine", "flags", "missing"),
    [
        ("x86_64", AVX2_ONLY, "AVX512_BF16 or AMX_BF16"),
        ("x86_64", AVX2_ONLY + " avx512f avx512_bf16", None),
        ("x86_64", AVX2_ONLY + " amx_bf16 amx_tile", None),
        ("aarch64", "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics", "BF16 (Armv8.6)"),
        ("aarch64", "fp asimd atomics i8mm bf16", None),
        ("riscv64", "", None),  # an architecture we cannot judge never blocks bf16
    ],
)
def test_missing_feature_per_architecture(machine, flags, missing):
    assert cpu_features.missing_bf16_feature(flags.split(), machine) == missing


def test_cpuinfo_flags_of_x86_and_arm(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text(f"processor\t: 0\nmodel name\t: EPYC\nflags\t\t: {AVX2_ONLY}\n\nprocessor\t: 1\nflags\t: other\n")
    assert cpu_features.cpu_flags(x86) == frozenset(AVX2_ONLY.split())
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 62.50\nFeatures\t: fp asimd bf16\nCPU implementer\t: 0x41\n")
    assert "bf16" in cpu_features.cpu_flags(arm)
    assert cpu_features.cpu_flags(tmp_path / "absent") is None


@pytest.fixture
def cpu_lacks_bf16(monkeypatch):
    monkeypatch.setattr(cpu_features, "missing_bf16_feature", lambda: "AVX512_BF16 or AMX_BF16")
    monkeypatch.setattr(factory, "_warned", set())


def test_bfloat16_falls_back_to_float32_with_one_warning(cpu_lacks_bf16, caplog):
    config = PolicyConfig(preset="tiny", dtype="bfloat16")
    with caplog.at_level(logging.WARNING, logger="omni_ros.policy"):
        policies = [load_policy(config) for _ in range(2)]
    assert all(p.runner.dtype == torch.float32 for p in policies)
    assert {p.dtype for p in policies[0].runner.model.parameters()} == {torch.float32}
    warnings = [r.getMessage() for r in caplog.records if "bfloat16" in r.getMessage()]
    assert len(warnings) == 1 and "lacks AVX512_BF16 or AMX_BF16" in warnings[0] and "float32" in warnings[0]
    # The float32 it runs is exactly what asking for float32 gives: same backend, bit-identical actions.
    reference = load_policy(PolicyConfig(preset="tiny", dtype="float32"))
    assert policies[0].metadata.backend == reference.metadata.backend == "torch-cpu"
    obs = _observation(policies[0].processor.cfg)
    np.testing.assert_array_equal(policies[0].infer(obs)["actions"], reference.infer(obs)["actions"])


def test_strict_dtype_refuses_naming_the_feature(cpu_lacks_bf16):
    with pytest.raises(DeviceError, match=r"bfloat16 but this CPU lacks AVX512_BF16 or AMX_BF16"):
        load_policy(PolicyConfig(preset="tiny", dtype="bfloat16", strict_dtype=True))


def test_native_bf16_and_float32_are_left_alone(monkeypatch):
    monkeypatch.setattr(cpu_features, "missing_bf16_feature", lambda: None)
    assert factory.runtime_dtype(PolicyConfig(dtype="bfloat16", strict_dtype=True)) == "bfloat16"
    monkeypatch.setattr(cpu_features, "missing_bf16_feature", lambda: "AVX512_BF16 or AMX_BF16")
    assert factory.runtime_dtype(PolicyConfig(dtype="float32", strict_dtype=True)) == "float32"
    # The GPU's bf16 is the GPU's business.
    assert factory.runtime_dtype(PolicyConfig(dtype="bfloat16", device="cuda", strict_dtype=True)) == "bfloat16"
