"""tiny exported to XNNPACK: per-method and end-to-end parity with eager, int8 tolerance, sidecar and load guards."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import torch

from helpers.pte_cache import CountingMethod, exported_tiny
from helpers.tiny_models import eager_tiny, raw_obs, reference
from omni_ros.backends.executorch_runner import ExecuTorchRunner, installed_executorch_version, load_pte
from omni_ros.backends.factory import load_policy
from omni_ros.config import ConfigError, load_config
from omni_ros.export.sidecar import PteError, file_sha256, read_sidecar, sidecar_path
from omni_ros.policy.config import PolicyConfig
from omni_ros.policy.families import method_module, signatures
from omni_ros.policy.loading import from_model
from omni_ros.policy.methods import example_inputs
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.pi0.stages import METHODS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
TOL = 1e-4
# int8-dynamic `.pte` vs eager float32, max abs of the chunk (normalized units): quantization noise on random
# weights stays well inside this; a broken scale or a wrong layer quantized lands far outside it.
INT8_TOLERANCE = 0.05


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def fp32_pte(tmp_path_factory):
    return exported_tiny(tmp_path_factory.getbasetemp(), "fp32")


@pytest.fixture(scope="session")
def int8_pte(tmp_path_factory):
    return exported_tiny(tmp_path_factory.getbasetemp(), "int8")


ARM = {"state_dim": 3, "action_dim": 3}  # the exported tiny programs are shaped for the 3-joint simulated arm


def _tiny_cfg():
    return preset("tiny", **ARM)


def test_every_method_matches_eager(fp32_pte):
    from executorch.runtime import Runtime

    model, cfg = eager_tiny(), _tiny_cfg()
    program = Runtime.get().load_program(fp32_pte)
    sigs = signatures(cfg)
    for method in METHODS:
        loaded = program.load_method(method)
        for seed in (0, 1):
            inputs = example_inputs(sigs[method], cfg, seed=seed)
            with torch.no_grad():
                expected = method_module(model, method)(*inputs)
            expected = expected if isinstance(expected, tuple) else (expected,)
            got = loaded.execute(list(inputs))
            assert len(got) == len(expected) == len(sigs[method].outputs)
            for g, e, spec in zip(got, expected, sigs[method].outputs, strict=True):
                assert tuple(g.shape) == spec.shape
                diff = (g - e).abs().max().item()
                assert diff <= TOL, f"{method}/{spec.name}: max abs diff {diff}"


@pytest.mark.parametrize("mode", ["staged", "fused"])
def test_policy_matches_torch_policy(fp32_pte, mode):
    torch_policy = reference(seed=7)
    policy = load_pte(fp32_pte, mode=mode, seed=7)
    assert policy.metadata.backend == "executorch-xnnpack"
    assert policy.metadata.camera_names == torch_policy.metadata.camera_names
    for obs in (raw_obs(0), raw_obs(1, wrist=False)):
        out, ref = policy.infer(obs), torch_policy.infer(obs)
        assert out["actions"].shape == ref["actions"].shape == (8, 3)
        assert out["actions"].dtype == np.float32
        np.testing.assert_allclose(out["actions"], ref["actions"], rtol=0, atol=TOL)
        assert set(out["policy_timing"]) == set(ref["policy_timing"])
    # A different seed is different noise: the outputs really depend on it.
    other = load_pte(fp32_pte, mode=mode, seed=8).infer(raw_obs(0))["actions"]
    assert np.abs(other - policy.infer(raw_obs(0))["actions"]).max() > 1e-3


def test_staged_keeps_the_prefix_kv_cache_across_steps(fp32_pte):
    policy = load_pte(fp32_pte, num_steps=3)
    calls: list[str] = []
    policy.runner._methods = {n: CountingMethod(m, calls, n) for n, m in policy.runner._methods.items()}
    out = policy.infer(raw_obs(2))
    assert calls == ["encode_images", "prefill"] + ["denoise_step"] * 3
    # Three steps with the cached prefix give what eager gives with three steps.
    expected = reference(num_steps=3).infer(raw_obs(2))["actions"]
    np.testing.assert_allclose(out["actions"], expected, rtol=0, atol=TOL)


def test_fused_refuses_another_step_count(fp32_pte):
    with pytest.raises(PteError, match="runs 4 Euler steps, configured num_steps is 6"):
        load_pte(fp32_pte, mode="fused", num_steps=6)


def test_int8_dynamic_within_documented_tolerance(int8_pte, fp32_pte):
    sidecar = read_sidecar(int8_pte)
    assert sidecar.quantize == "int8-dynamic" and "sample" not in sidecar.methods
    assert "torchao.quantize_affine.default" in sidecar.delegation["denoise_step"]["delegated"]
    policy = load_pte(int8_pte)
    assert policy.runner.mode == "staged" and policy.metadata.backend == "executorch-xnnpack-int8-dynamic"
    torch_policy = reference()
    for seed in (3, 4):
        got, ref = policy.infer(raw_obs(seed))["actions"], torch_policy.infer(raw_obs(seed))["actions"]
        diff = np.abs(got - ref).max()
        assert 0 < diff <= INT8_TOLERANCE, diff  # quantized (not bit-identical), yet close
    with pytest.raises(PteError, match="fused mode needs the 'sample' method"):
        load_pte(int8_pte, mode="fused")


def test_delegation_report_and_sidecar(fp32_pte):
    sidecar = read_sidecar(fp32_pte)
    cfg = _tiny_cfg()
    assert sidecar.target == "xnnpack" and sidecar.quantize == "none" and sidecar.num_steps == cfg.num_steps
    assert sidecar.model.to_dict() == cfg.to_dict() and sidecar.norm_stats.state_std == [1.0] * 3
    assert sidecar.versions["executorch"] == installed_executorch_version()
    assert sidecar.versions["torch"] == torch.__version__
    assert {n: s.to_dict() for n, s in sidecar.methods.items()} == {n: s.to_dict() for n, s in signatures(cfg).items()}
    assert sidecar.pte_sha256 == file_sha256(fp32_pte)
    report = sidecar.delegation
    # The vision encoder lowers whole; the heavy ops of every method run inside XNNPACK.
    assert report["encode_images"]["delegated_subgraphs"] == 1 and report["encode_images"]["portable_ops"] == 0
    for method, r in report.items():
        assert r["backends"] == {"XnnpackBackend": r["delegated_subgraphs"]}
        for heavy in ("linear", "bmm", "native_layer_norm", "convolution", "mm"):
            assert heavy not in r["portable"], (method, r["portable"])
        assert r["largest_subgraph_ops"] >= 0.8 * r["delegated_ops"], (method, r)
        assert r["delegated_fraction"] > 0.75, (method, r)
    # The fused loop is not split per step: the Euler steps live in the same few subgraphs.
    assert report["sample"]["delegated_subgraphs"] <= report["denoise_step"]["delegated_subgraphs"]


# -- guards ------------------------------------------------------------------------------------------------------


def _copy(pte, tmp_path):
    dst = tmp_path / "policy.pte"
    shutil.copyfile(pte, dst)
    shutil.copyfile(sidecar_path(pte), sidecar_path(dst))
    return dst


def test_corrupt_truncated_or_foreign_pte_refused(fp32_pte, tmp_path):
    pte = _copy(fp32_pte, tmp_path)
    data = bytearray(pte.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pte.write_bytes(bytes(data))
    with pytest.raises(PteError, match="SHA-256 does not match"):
        load_pte(pte)
    pte.write_bytes(fp32_pte.read_bytes()[:1000])
    with pytest.raises(PteError, match="1000 bytes but its sidecar describes"):
        load_pte(pte)
    # Garbage with a sidecar that vouches for it: refused before the runtime (which would abort the process).
    garbage = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    pte.write_bytes(garbage)
    meta = json.loads(sidecar_path(pte).read_text())
    meta["pte"] = {"sha256": file_sha256(pte), "bytes": len(garbage)}
    sidecar_path(pte).write_text(json.dumps(meta))
    with pytest.raises(PteError, match="not an ExecuTorch program"):
        load_pte(pte)


def test_missing_or_broken_sidecar_refused(fp32_pte, tmp_path):
    pte = _copy(fp32_pte, tmp_path)
    sidecar_path(pte).write_text("{not json")
    with pytest.raises(PteError, match="not valid JSON"):
        load_pte(pte)
    sidecar_path(pte).unlink()
    with pytest.raises(PteError, match=re.escape("sidecar policy.pte.json is missing")):
        load_pte(pte)
    with pytest.raises(PteError, match="ExecuTorch program not found"):
        load_pte(tmp_path / "absent.pte")


def test_mismatched_configuration_refused(fp32_pte, tmp_path):
    with pytest.raises(PteError, match=r"cameras: program \['base', 'wrist'\], configured \['front', 'wrist'\]"):
        load_pte(fp32_pte, camera_names=["front", "wrist"])
    with pytest.raises(PteError, match="state_dim: program 3, configured 7; action_dim: program 3, configured 7"):
        load_pte(fp32_pte, state_dim=7, action_dim=7)
    pte = _copy(fp32_pte, tmp_path)
    meta = json.loads(sidecar_path(pte).read_text())
    meta["versions"]["executorch"] = "0.7.0"
    sidecar_path(pte).write_text(json.dumps(meta))
    with pytest.raises(PteError, match=re.escape("exported with executorch 0.7.0, this runtime is executorch")):
        load_pte(pte)
    meta["versions"]["executorch"] = installed_executorch_version()
    meta["format"] = "omni_ros.pte.v0"
    sidecar_path(pte).write_text(json.dumps(meta))
    with pytest.raises(PteError, match=re.escape("sidecar format 'omni_ros.pte.v0'")):
        load_pte(pte)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_cuda_program_refused_without_cuda(fp32_pte, tmp_path):
    from omni_ros.export.cuda import CudaUnavailableError

    pte = _copy(fp32_pte, tmp_path)
    meta = json.loads(sidecar_path(pte).read_text())
    meta["target"] = "cuda"
    sidecar_path(pte).write_text(json.dumps(meta))
    with pytest.raises(CudaUnavailableError, match="exported for CUDA but no CUDA GPU"):
        load_pte(pte)


def test_config_switch_loads_the_pte(fp32_pte, tmp_path):
    shutil.copyfile(fp32_pte, tmp_path / "tiny.pte")
    shutil.copyfile(sidecar_path(fp32_pte), tmp_path / "tiny.pte.json")
    config_file = tmp_path / "robot.yaml"
    config_file.write_text("policy: {backend: executorch, pte: tiny.pte, num_threads: 1}\n")
    config = load_config(config_file)
    assert config.policy.pte == str((tmp_path / "tiny.pte").resolve())
    policy = load_policy(config.policy, camera_names=["base", "wrist"], state_dim=3, action_dim=3)
    assert isinstance(policy.runner, ExecuTorchRunner)
    expected = reference().infer(raw_obs(5))["actions"]
    np.testing.assert_allclose(policy.infer(raw_obs(5))["actions"], expected, rtol=0, atol=TOL)
    with pytest.raises(PteError, match="cameras: program"):
        load_policy(config.policy, camera_names=["base"])
    with pytest.raises(ConfigError, match=re.escape("needs policy.pte")):
        load_policy(PolicyConfig(backend="executorch"))
    with pytest.raises(ConfigError, match="runs on cpu"):
        load_policy(PolicyConfig(backend="executorch", pte=config.policy.pte, device="cuda"))


def test_cli_exports_8da4w_and_reports_delegation(root, tmp_path):
    import subprocess
    import sys

    from executorch.runtime import Runtime

    out = tmp_path / "vision.pte"
    cmd = [sys.executable, "-m", "omni_ros.cli", "export", "--preset", "tiny", "--quantize", "8da4w"]
    cmd += ["--methods", "encode_images", "--state-dim", "3", "--action-dim", "3", "--out", str(out), "--json"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["pte"] == str(out) and summary["bytes"] == out.stat().st_size
    report = summary["delegation"]["encode_images"]
    assert report["delegated_subgraphs"] == 1 and report["portable_ops"] == 0
    assert "torchao.dequantize_affine.default" in report["delegated"]  # int4 groups of 32 on the 32-wide linears
    assert read_sidecar(out).quantize == "8da4w"
    # Only the vision encoder: no policy can run from it, and it says why.
    with pytest.raises(PteError, match="fused mode needs the 'sample' method"):
        load_pte(out)
    cfg = _tiny_cfg()
    images = example_inputs(signatures(cfg)["encode_images"], cfg, seed=5)
    with torch.no_grad():
        expected = eager_tiny().encode_images(*images)
    got = Runtime.get().load_program(out).load_method("encode_images").execute(list(images))[0]
    relative = ((got - expected).norm() / expected.norm()).item()
    assert 0 < relative < 0.1, relative  # 4-bit weights: visibly quantized, still the same features


def test_prompt_conditioned_encoder_with_keypoints_exports_and_matches(tmp_path):
    """vision.film + vision.keypoints (the demo's encoder): encode_images takes the prompt too, same outputs."""
    from omni_ros.export.exporter import export_policy
    from omni_ros.policy.normalize import NormStats
    from omni_ros.policy.pi0.configuration import VisionConfig

    vision = VisionConfig(image_size=32, patch_size=8, width=32, depth=1, num_heads=2, mlp_dim=64, keypoints=3)
    vision.film = True
    cfg = preset("tiny", **ARM)
    cfg.vision = vision
    cfg.tokenizer.kind, cfg.tokenizer.vocab = "words", ["pick", "up", "block"]
    torch.manual_seed(0)
    model = Pi0Model(cfg).eval()
    with torch.no_grad():  # a FiLM that really changes the features
        model.vision.film.weight.normal_(0, 0.5)
    stats = NormStats.identity(3, 3)
    pte = tmp_path / "film.pte"
    export_policy(model, stats, pte, methods=("encode_images", "prefill", "denoise_step"))
    sig = read_sidecar(pte).methods["encode_images"]
    assert [s.name for s in sig.inputs] == ["images", "tokens", "token_mask"]
    reference = from_model(model, stats, seed=3)
    policy = load_pte(pte, mode="staged", seed=3)
    obs = raw_obs(0)
    np.testing.assert_allclose(policy.infer(obs)["actions"], reference.infer(obs)["actions"], rtol=0, atol=TOL)
    # The prompt reaches the image tokens: another prompt, other actions.
    other = dict(obs, prompt="block")
    assert np.abs(policy.infer(other)["actions"] - policy.infer(obs)["actions"]).max() > 1e-3
