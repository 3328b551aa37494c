"""X-VLA exported: encode + denoise_step (staged, X-VLA's own clean-estimate loop in the runner) and the fused `sample`,
to ExecuTorch XNNPACK fp32 and ONNX, on the LeRobot 0.6.1 fixtures (test_reference_xvla.py checks eager against
LeRobot): xvla_1cam (ee6d: sigmoid grippers, domains 1 and 2) and xvla_3cam (auto: the real width cut, domains 0 and
2, missing cameras). xvla_1cam goes to a .pte (staged methods, guided RTC step) and to ONNX (staged), xvla_3cam to
ONNX, staged (a .pte lowers the same graphs, minutes more of CPU). The fused `sample` is checked as ONNX of xvla_1cam
only, its loop unrolled over FUSED_STEPS steps against eager's loop of as many: it traces the very graphs of the
staged methods (test_fused_and_staged_forms_trace_to_eager, on xvla_3cam's missing camera and both its domains),
whose XNNPACK lowering the staged .pte checks; lowering its unrolled loop took 42 s of this module's CPU, converting
xvla_3cam's to ONNX 26 s, and converting xvla_1cam's ten steps to ONNX 50 s.

Tolerance: 1e-4 abs on the actions in float32, against eager and against LeRobot's fixture actions (the same
arithmetic in other kernels; eager itself is within about 2e-7 of LeRobot, test_reference_xvla.py).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_reference_xvla import MANIFEST, REFERENCE, case, every_case, policy

import omni_ros.policy
from omni_ros.backends.executorch_runner import load_pte
from omni_ros.backends.factory import load_policy
from omni_ros.backends.onnx_runner import load_onnx
from omni_ros.control.config import ControlConfig, RtcConfig
from omni_ros.control.executor import check_rtc_support
from omni_ros.export.forms import use_export_forms
from omni_ros.export.sidecar import read_onnx_sidecar, read_sidecar
from omni_ros.observation import ObservationError
from omni_ros.policy.config import PolicyConfig
from omni_ros.policy.families import stage_plan
from omni_ros.policy.pipeline import StageClock
from omni_ros.policy.rtc import RtcPlan
from omni_ros.policy.rtc_request import RtcError, RtcRequest
from omni_ros.policy.xvla.configuration import XVLAConfig
from omni_ros.typed_config import ConfigError

pytestmark = [
    pytest.mark.usefixtures("torch_one_thread"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.timeout(900),
]
TOL = 1e-4
METHODS = ["encode", "denoise_step", "sample"]


def _cli_export(root: Path, fixture: str, out: Path, *extra: str) -> None:
    cmd = [sys.executable, "-m", "omni_ros.cli", "export", "--checkpoint", str(REFERENCE / fixture), "--out", str(out)]
    run = subprocess.run([*cmd, *extra], cwd=root, capture_output=True, text=True, timeout=800)
    assert run.returncode == 0, run.stderr[-3000:]


STAGED = ["encode", "denoise_step"]
# The fused ONNX program's steps (each repeats the same traced graph; the checkpoint's ten cost 50 s to convert).
FUSED_STEPS = 3


@pytest.fixture(scope="module")
def exports(tmp_path_factory, root) -> dict[str, Path]:
    """xvla_1cam as a .pte (XNNPACK fp32, the staged methods and the guided RTC step) and an ONNX folder, with the
    command line; xvla_3cam
    as an ONNX folder of the staged methods (its .pte is lowered the same way, minutes more on this machine)."""
    from omni_ros.export.exporter import export_checkpoint

    base = tmp_path_factory.mktemp("xvla")
    out = {
        "xvla_1cam.pte": base / "1cam.pte",
        "xvla_1cam.onnx": base / "1cam_onnx",
        "xvla_1cam.fused": base / "1cam_fused",
        "xvla_3cam.onnx": base / "3cam",
    }
    _cli_export(root, "xvla_1cam", out["xvla_1cam.pte"], "--methods", *STAGED, "--rtc")
    _cli_export(root, "xvla_1cam", out["xvla_1cam.onnx"], "--target", "onnx", "--methods", *STAGED)
    fused = {"target": "onnx", "methods": ["sample"], "num_steps": FUSED_STEPS}
    export_checkpoint(REFERENCE / "xvla_1cam", out["xvla_1cam.fused"], **fused)
    export_checkpoint(REFERENCE / "xvla_3cam", out["xvla_3cam.onnx"], target="onnx", methods=STAGED)
    return out


def _policies(exports: dict[str, Path], fixture: str) -> dict[str, object]:
    """label -> exported policy, each running the checkpoint's ten steps (the fused program: _fused)."""
    out: dict[str, object] = {}
    if f"{fixture}.pte" in exports:
        out["pte staged"] = load_pte(exports[f"{fixture}.pte"], mode="staged")
    out["onnx staged"] = load_onnx(exports[f"{fixture}.onnx"], mode="staged")
    return out


def _fused(exports: dict[str, Path]):
    """xvla_1cam's fused ONNX program (FUSED_STEPS steps) and eager with as many steps."""
    fused = load_onnx(exports["xvla_1cam.fused"], mode="fused")
    return fused, omni_ros.policy.load(REFERENCE / "xvla_1cam", num_steps=FUSED_STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", list(MANIFEST["fixtures"]))
def test_programs_give_eagers_and_lerobots_actions(exports, fixture):
    """Staged and fused, .pte and ONNX, every case (both domain ids in one program, missing cameras)."""
    eager = policy(fixture)
    for name, data, obs in every_case(fixture):
        noise = data["noise"][0]
        want = eager.infer(obs, noise=noise)["actions"]
        for label, exported in _policies(exports, fixture).items():
            got = exported.infer(obs, noise=noise)["actions"]
            assert got.shape == want.shape, (label, name)
            np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=f"{label} {name} vs eager")
            np.testing.assert_allclose(got, data["actions"][0], rtol=0, atol=TOL, err_msg=f"{label} {name} vs LeRobot")


@pytest.mark.slow
def test_the_fused_program_runs_eagers_loop(exports):
    """The fused `sample` (X-VLA's clean-estimate loop unrolled into the graph) gives eager's chunk, every case
    (both domain ids in the one program), with eager's loop of as many steps; it holds no step to continue a chunk
    from, so RTC is refused, and an unknown domain as eager refuses it."""
    fused, eager = _fused(exports)
    assert read_onnx_sidecar(exports["xvla_1cam.fused"]).num_steps == FUSED_STEPS
    for name, data, obs in every_case("xvla_1cam"):
        noise = data["noise"][0]
        got, want = fused.infer(obs, noise=noise)["actions"], eager.infer(obs, noise=noise)["actions"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=name)
    assert fused.rtc_methods == ()
    with pytest.raises(ConfigError, match="does not support real-time chunking"):
        check_rtc_support(ControlConfig(blending="rtc"), fused)
    with pytest.raises(RtcError, match="cannot serve rtc method 'inpaint'"):
        fused.infer(obs, noise=noise, rtc=RtcRequest(want[3:], inference_delay=3, method="inpaint"))
    with pytest.raises(ObservationError) as eager_error:
        eager.infer({**obs, "domain_id": 99}, noise=noise)
    with pytest.raises(ObservationError) as error:
        fused.infer({**obs, "domain_id": 99}, noise=noise)
    assert str(error.value) == str(eager_error.value)


@pytest.mark.slow
def test_sidecars_and_the_backend_factory(exports):
    fixture = "xvla_1cam"
    sidecar = read_sidecar(exports[f"{fixture}.pte"])
    assert sidecar.family == "xvla" and list(sidecar.methods) == [*STAGED, "guided_step"]
    onnx, fused = read_onnx_sidecar(exports[f"{fixture}.onnx"]), read_onnx_sidecar(exports["xvla_1cam.fused"])
    assert list(onnx.methods) == STAGED and list(fused.methods) == ["sample"]
    # One program for every embodiment: the domain is an input of each method.
    for method in [*sidecar.methods.values(), *onnx.methods.values(), *fused.methods.values()]:
        (domain,) = [s for s in method.inputs if s.name == "domain_id"]
        assert domain.dtype == "int64" and domain.shape == (1,)
    for method, report in sidecar.delegation.items():
        for heavy in ("linear", "mm", "addmm", "bmm", "convolution"):  # (the guided step's traced products too)
            assert heavy not in report["portable"], (method, report["portable"])
        # The export forms keep norms and attention inside XNNPACK (torch's LayerNorm and SDPA export as ops it
        # leaves to the portable kernels: a LayerNorm, and a softmax's all-masked-row guard).
        assert not {"native_layer_norm", "logical_not"} & set(report["portable"]), (method, report["portable"])
    # The guided step's backward too (export/backward_ops.py): before the rewrite its sums, slice_scatters, pows,
    # expands and aliases stayed portable and cut it into 32 XNNPACK calls against the plain step's 5.
    guided = sidecar.delegation["guided_step"]
    assert not {"sum", "slice_scatter", "pow", "expand_copy", "alias_copy", "mul", "div"} & set(guided["portable"])
    assert guided["delegated_subgraphs"] <= sidecar.delegation["denoise_step"]["delegated_subgraphs"], guided
    # The checkpoint's saved domain (1) when an observation has none; policy.domain_id overrides it.
    _, data1, obs = case(fixture, "pick_domain1")
    _, data2, _ = case(fixture, "pick_domain2")
    del obs["domain_id"]
    for config in (
        PolicyConfig(backend="executorch", pte=str(exports[f"{fixture}.pte"])),
        PolicyConfig(backend="onnxruntime", onnx=str(exports[f"{fixture}.onnx"])),
    ):
        saved = load_policy(config)
        got = saved.infer(obs, noise=data1["noise"][0])["actions"]
        np.testing.assert_allclose(got, data1["actions"][0], rtol=0, atol=TOL)
        config.domain_id = 2
        two = load_policy(config)
        np.testing.assert_allclose(two.infer(obs, noise=data2["noise"][0])["actions"], data2["actions"][0], atol=TOL)


@pytest.mark.slow
def test_staged_encodes_once_and_steps_num_steps_times(exports):
    from helpers.pte_cache import CountingMethod

    exported = load_pte(exports["xvla_1cam.pte"], num_steps=3)
    calls: list[str] = []
    exported.runner._methods = {n: CountingMethod(m, calls, n) for n, m in exported.runner._methods.items()}
    _, _, obs = case("xvla_1cam", "stack_domain1")
    out = exported.infer(obs)
    assert calls == ["encode"] + ["denoise_step"] * 3
    assert set(out["policy_timing"]) >= {"embed_prefix_ms", "prefill_ms", "denoise_ms"}


@pytest.mark.slow
def test_unknown_domain_refused_as_eager_refuses_it(exports):
    _, data, obs = case("xvla_1cam", "pick_domain1")
    bad = {**obs, "domain_id": 99}
    with pytest.raises(ObservationError) as eager_error:
        policy("xvla_1cam").infer(bad, noise=data["noise"][0])
    for exported in _policies(exports, "xvla_1cam").values():
        with pytest.raises(ObservationError) as error:
            exported.infer(bad, noise=data["noise"][0])
        assert str(error.value) == str(eager_error.value)
    with pytest.raises(ConfigError, match=r"domain_id 99 is not one of its domains 0\.\.2"):
        load_policy(PolicyConfig(backend="executorch", pte=str(exports["xvla_1cam.pte"]), domain_id=99))
    with pytest.raises(ConfigError, match=r"domain_id 99 is not one of its domains 0\.\.2"):
        load_policy(PolicyConfig(backend="onnxruntime", onnx=str(exports["xvla_1cam.onnx"]), domain_id=99))


# The .pte's traced guided step against eager's autograd: measured 2.5e-7 (the plain chunk: 3e-7). Before
# omni_ros/lowering.py wrote the head's tanh GELU out, XNNPACK computed it as the exact GELU: 5.7e-5 off.
GUIDED_TOL = 1e-5


@pytest.mark.slow
def test_staged_programs_continue_chunks_as_eager_does(exports):
    """RTC on X-VLA programs: the staged runners run X-VLA's own loop (clean estimates, x_t re-noised from them)
    with the prefix's estimates inpainted, eager's arithmetic; guided RTC through the .pte's traced guided step
    (`--rtc`), eager's too; an ONNX program (no guided step) is refused what it cannot serve at configure, with
    what is served instead (the fused program: test_the_fused_program_runs_eagers_loop)."""
    eager = policy("xvla_1cam")
    check_rtc_support(ControlConfig(blending="rtc"), eager)  # the torch backend serves both methods
    for name in ("pick_domain1", "pick_domain2"):
        _, data, obs = case("xvla_1cam", name)
        noise = data["noise"][0]
        # An old plan the new chunk must continue: grippers (sigmoid outputs) kept inside (0, 1).
        plan = np.clip(eager.infer(obs, noise=noise)["actions"][3:] + 0.2, 0.05, 0.95)
        request = RtcRequest(plan, inference_delay=3, method="inpaint")
        want = eager.infer(obs, noise=noise, rtc=request)["actions"]
        plain = eager.infer(obs, noise=noise)["actions"]
        np.testing.assert_allclose(want[:3], plan[:3], atol=1e-6)  # the frozen actions are the old plan
        assert np.abs(want[3:] - plain[3:]).max() > 1e-3  # and the rest of the chunk follows them
        guided_request = RtcRequest(plan, inference_delay=3, max_guidance_weight=10.0)
        guided_want = eager.infer(obs, noise=noise, rtc=guided_request)["actions"]
        assert np.abs(guided_want - plain).max() > 1e-2  # the guidance moved the chunk
        for label, exported in _policies(exports, "xvla_1cam").items():
            got = exported.infer(obs, noise=noise, rtc=request)["actions"]
            np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=f"{label} {name}")
            if label == "pte staged":
                assert exported.rtc_methods == ("guided", "inpaint")
                guided = exported.infer(obs, noise=noise, rtc=guided_request)["actions"]
                np.testing.assert_allclose(guided, guided_want, rtol=0, atol=GUIDED_TOL, err_msg=f"guided {name}")
            else:
                assert exported.rtc_methods == ("inpaint",), label
    pte = _policies(exports, "xvla_1cam")["pte staged"]
    check_rtc_support(ControlConfig(blending="rtc", rtc=RtcConfig(method="guided")), pte)
    onnx = _policies(exports, "xvla_1cam")["onnx staged"]
    check_rtc_support(ControlConfig(blending="rtc", rtc=RtcConfig(method="inpaint")), onnx)
    with pytest.raises(ConfigError, match="it supports: inpaint"):
        check_rtc_support(ControlConfig(blending="rtc", rtc=RtcConfig(method="guided")), onnx)
    guided = RtcRequest(plan, inference_delay=3, method="guided")
    noise, target = torch.from_numpy(data["noise"][:1]), torch.zeros(1, 32, 20)
    with pytest.raises(RtcError, match="it serves: inpaint"):  # the runner too, whoever calls it
        inputs = onnx.processor.inputs([onnx.processor.parse(obs)])
        onnx.runner.sample(inputs, noise, 2, rtc=RtcPlan(guided, target))


def test_fused_and_staged_forms_trace_to_eager():
    """The methods as torch.export traces them (without lowering), in the export forms the exporters switch on
    (norms spelled out, bmm attention), give eager's chunk, both domains of a case."""
    eager = policy("xvla_3cam")
    model, processor = use_export_forms(copy.deepcopy(eager.runner.model)), eager.processor
    cfg, plan = model.cfg, stage_plan("xvla")
    sigs = plan.signatures(cfg)
    with torch.no_grad():
        programs = {
            m: torch.export.export(plan.module(model, m, 2), plan.example_inputs(sigs[m], cfg)).module()
            for m in METHODS
        }
        _, data, obs = case("xvla_3cam", "missing_top")
        for domain in (0, 2):
            inputs = processor.inputs([processor.parse({**obs, "domain_id": domain})])
            noise = torch.from_numpy(data["noise"][:1])
            want = eager.runner.model.sample(inputs, noise, inputs.domain_id, 2)
            fused = plan.fused_inputs(cfg, inputs)
            assert [tuple(x.shape) for x in (*fused, noise)] == [s.shape for s in sigs["sample"].inputs]
            np.testing.assert_allclose(programs["sample"](*fused, noise), want, rtol=0, atol=TOL)
            staged = plan.run_staged(cfg, lambda m, xs: [programs[m](*xs)], inputs, noise, 2, StageClock())
            np.testing.assert_allclose(staged, want, rtol=0, atol=TOL)


def test_a_checkpoint_without_a_fixed_image_size_has_no_program_form():
    with pytest.raises(ValueError, match="no resize_imgs_with_padding: a program needs one image size"):
        stage_plan("xvla").signatures(XVLAConfig(resize=None))
