"""Real-time chunking on ExecuTorch: the traced guided step as a .pte method, and hard inpainting without it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from helpers.pte_cache import ARM, exported_tiny
from helpers.rtc_util import two_observations
from omni_ros.backends.executorch_runner import load_pte
from omni_ros.config import ConfigError
from omni_ros.control.config import ControlConfig, RtcConfig
from omni_ros.control.executor import check_rtc_support
from omni_ros.export.exporter import export_policy
from omni_ros.policy.loading import from_model, from_preset
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.pi0.stages import STAGED
from omni_ros.policy.rtc import RtcError, RtcRequest

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("torch_one_thread")]


@pytest.fixture(scope="module")
def observations():
    return two_observations(1_000_003, np.array([0.3, -0.2, 0.1]), 15)


@pytest.fixture(scope="module")
def rtc_program(tmp_path_factory):
    """A tiny model trained-for-RTC style (per-token times) with the guided step: one export serves every
    path (plain, guided through the traced VJP, clean-prefix inpainting)."""
    cfg = dataclasses.replace(preset("tiny", camera_names=["base", "wrist"], **ARM), rtc_max_delay=3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Pi0Model(cfg).eval()
    stats = NormStats.identity(3, 3)
    out = tmp_path_factory.mktemp("rtc") / "tiny_rtc.pte"
    export_policy(model, stats, out, methods=(*STAGED, "guided_step"))
    return load_pte(out, num_threads=1), from_model(model, stats)


@pytest.mark.slow
def test_the_guided_step_runs_in_the_program_and_matches_eager(rtc_program, observations):
    program, eager = rtc_program
    first, second = observations
    assert program.runner.per_token and program.rtc_methods == ("guided", "inpaint")
    np.testing.assert_allclose(program.infer(second)["actions"], eager.infer(second)["actions"], atol=1e-4)
    plan = eager.infer(first)["actions"][3:] + 0.5  # an old plan the new chunk must bend towards
    request = RtcRequest(plan, inference_delay=3, max_guidance_weight=4.0)
    guided = program.infer(second, rtc=request)["actions"]
    np.testing.assert_allclose(guided, eager.infer(second, rtc=request)["actions"], atol=1e-4)
    plain = program.infer(second)["actions"]
    assert np.abs(guided[:3] - plan[:3]).mean() < 0.5 * np.abs(plain[:3] - plan[:3]).mean()


@pytest.mark.slow
def test_a_training_time_rtc_program_inpaints_with_a_clean_prefix(rtc_program, observations):
    program, eager = rtc_program
    _, second = observations
    request = RtcRequest(np.random.default_rng(0).normal(size=(6, 3)), inference_delay=2, method="inpaint")
    out = program.infer(second, rtc=request)["actions"]
    np.testing.assert_allclose(out, eager.infer(second, rtc=request)["actions"], atol=1e-4)
    np.testing.assert_allclose(out[:2], request.actions[:2], atol=1e-5)


def test_without_the_guided_step_a_program_offers_inpainting_only(tmp_path_factory, observations):
    first, second = observations
    # The session's shared tiny program (staged and fused methods, no guided step) and its eager twin.
    pte = exported_tiny(tmp_path_factory.getbasetemp(), "fp32")
    policy = load_pte(pte, num_threads=1)
    demo = from_preset("tiny", camera_names=["base", "wrist"], **ARM)
    assert policy.rtc_methods == ("inpaint",)
    fused = load_pte(pte, mode="fused", num_threads=1)
    assert fused.rtc_methods == ()
    plan = demo.infer(first)["actions"][3:]
    with pytest.raises(RtcError, match="cannot serve rtc method 'inpaint'"):
        fused.infer(second, rtc=RtcRequest(plan, inference_delay=3, method="inpaint"))
    with pytest.raises(RtcError, match="it serves: inpaint"):
        policy.infer(second, rtc=RtcRequest(plan, inference_delay=3))
    with pytest.raises(ConfigError, match="it supports: inpaint"):
        check_rtc_support(ControlConfig(blending="rtc"), policy)
    check_rtc_support(ControlConfig(blending="rtc", rtc=RtcConfig(method="inpaint")), policy)
    request = RtcRequest(plan, inference_delay=3, method="inpaint")
    out = policy.infer(second, rtc=request)["actions"]
    np.testing.assert_allclose(out, demo.infer(second, rtc=request)["actions"], atol=1e-4)
    np.testing.assert_allclose(out[:3], plan[:3], atol=1e-5)


def test_int4_and_onnx_programs_refuse_the_guided_step(tmp_path):
    # (int8-dynamic holds it: test_stage_program.py and test_export_smolvla.py run it)
    for target, quantize in (("xnnpack", "8da4w"), ("onnx", "none")):
        with pytest.raises(ValueError, match="xnnpack \\(float32 or int8-dynamic\\) and cuda"):
            export_policy(
                Pi0Model(preset("tiny")),
                NormStats.identity(8, 8),
                tmp_path / "x.pte",
                target=target,
                quantize=quantize,
                methods=(*STAGED, "guided_step"),
            )
