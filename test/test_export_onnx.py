"""tiny exported to ONNX and run on ONNX Runtime's CPU EP: per-graph and end-to-end parity with eager, the sidecar and
its guards, providers that are not here, the config switch and a missing extra."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from helpers.pte_cache import ARM, exported_tiny
from helpers.tiny_models import eager_tiny, raw_obs, reference
from omni_ros.backends.factory import load_policy
from omni_ros.backends.onnx_runner import OnnxRunner, load_onnx
from omni_ros.config import ConfigError, load_config
from omni_ros.export.onnx_export import OPSET
from omni_ros.export.ort_session import ExtraMissing, ProviderUnavailable, open_session
from omni_ros.export.sidecar import ONNX_SIDECAR, OnnxModelError, file_sha256, read_onnx_sidecar
from omni_ros.policy.config import PolicyConfig
from omni_ros.policy.families import method_module, signatures
from omni_ros.policy.methods import example_inputs
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.pi0.stages import METHODS

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]
TOL = 1e-4


@pytest.fixture(scope="session")
def onnx_dir(tmp_path_factory):
    return exported_tiny(tmp_path_factory.getbasetemp(), "onnx")


def _copy(onnx_dir, tmp_path):
    dst = tmp_path / "policy_onnx"
    shutil.copytree(onnx_dir, dst)
    return dst


def test_every_graph_matches_eager(onnx_dir):
    model, cfg = eager_tiny(), preset("tiny", **ARM)
    sigs = signatures(cfg)
    for method in METHODS:
        session = open_session(onnx_dir / f"{method}.onnx", ["cpu"], num_threads=1)
        names = [i.name for i in session.get_inputs()]
        for seed in (0, 1):
            inputs = example_inputs(sigs[method], cfg, seed=seed)
            with torch.no_grad():
                expected = method_module(model, method)(*inputs)
            expected = expected if isinstance(expected, tuple) else (expected,)
            feeds = {s.name: x.numpy() for s, x in zip(sigs[method].inputs, inputs, strict=True) if s.name in names}
            got = session.run(None, feeds)
            assert len(got) == len(expected) == len(sigs[method].outputs)
            for g, e, spec in zip(got, expected, sigs[method].outputs, strict=True):
                assert g.shape == spec.shape
                diff = float(np.abs(g - e.numpy()).max())
                assert diff <= TOL, f"{method}/{spec.name}: max abs diff {diff}"


@pytest.mark.parametrize("mode", ["staged", "fused"])
def test_policy_matches_torch_policy(onnx_dir, mode):
    policy = load_onnx(onnx_dir, mode=mode, seed=7, num_threads=1)
    torch_policy = reference(seed=7)
    assert (policy.metadata.backend, policy.runner.mode) == ("onnxruntime-cpu", mode)
    expected = {**torch_policy.metadata.to_dict(), "backend": "onnxruntime-cpu"}
    assert policy.metadata.to_dict() == {**expected, "precision": "fp32: exported program (none)"}
    chunks = [(policy.infer(o), torch_policy.infer(o)) for o in (raw_obs(0), raw_obs(1, wrist=False))]
    for got, want in chunks:
        assert got["actions"].dtype == np.float32 and got["actions"].shape == (8, 3)
        np.testing.assert_allclose(got["actions"], want["actions"], rtol=0, atol=TOL)
        assert got["policy_timing"].keys() == want["policy_timing"].keys()
    # The noise seed reaches the graphs: seed 8 samples another chunk.
    reseeded = load_onnx(onnx_dir, mode=mode, seed=8).infer(raw_obs(0))["actions"]
    assert np.abs(reseeded - chunks[0][0]["actions"]).max() > 1e-3


class _Counting:
    def __init__(self, session, calls, name):
        self.session, self.calls, self.name = session, calls, name

    def run(self, outputs, feeds):
        self.calls.append(self.name)
        return self.session.run(outputs, feeds)

    def get_inputs(self):
        return self.session.get_inputs()


def test_staged_keeps_the_prefix_kv_cache_across_steps(onnx_dir):
    policy = load_onnx(onnx_dir, num_steps=3)
    calls: list[str] = []
    runner = policy.runner
    runner._sessions = {n: _Counting(s, calls, n) for n, s in runner._sessions.items()}
    out = policy.infer(raw_obs(2))
    assert calls == ["encode_images", "prefill"] + ["denoise_step"] * 3
    np.testing.assert_allclose(out["actions"], reference(num_steps=3).infer(raw_obs(2))["actions"], rtol=0, atol=TOL)


def test_fused_refuses_another_step_count(onnx_dir):
    with pytest.raises(OnnxModelError, match="runs 4 Euler steps, configured num_steps is 6"):
        load_onnx(onnx_dir, mode="fused", num_steps=6)


def test_sidecar_static_shapes_and_ops_report(onnx_dir):
    sidecar = read_onnx_sidecar(onnx_dir)
    cfg = preset("tiny", **ARM)
    assert sidecar.format == "omni_ros.onnx.v1" and sidecar.target == "onnx" and sidecar.quantize == "none"
    assert sidecar.model.to_dict() == cfg.to_dict() and sidecar.num_steps == cfg.num_steps
    assert sidecar.norm_stats.state_std == [1.0] * 3
    assert {n: s.to_dict() for n, s in sidecar.methods.items()} == {n: s.to_dict() for n, s in signatures(cfg).items()}
    import onnxruntime

    assert sidecar.versions["onnxruntime"] == onnxruntime.__version__ and sidecar.versions["torch"] == torch.__version__
    assert set(sidecar.files) == {f"{m}.onnx" for m in METHODS}
    for name, digest in sidecar.files.items():
        assert digest == {"sha256": file_sha256(onnx_dir / name), "bytes": (onnx_dir / name).stat().st_size}
    for method, sig in signatures(cfg).items():
        graph = onnx.load(onnx_dir / f"{method}.onnx").graph
        # Static shapes: every graph input has the fixed dims of its signature (what the HTP requires).
        shapes = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in graph.input}
        assert shapes == {s.name: s.shape for s in sig.inputs if s.name in shapes}, method
        report = sidecar.delegation[method]
        assert report["opset"] == OPSET and report["nodes"] == len(graph.node) > 10
        assert report["ops"]["MatMul"] >= 2 and "Softmax" in report["ops"]
        assert report["outputs"] == [s.name for s in sig.outputs]
    # The fused loop holds the unrolled steps over one copy of the weights.
    ops = sidecar.delegation
    assert (
        ops["sample"]["ops"]["Softmax"]
        == ops["encode_images"]["ops"]["Softmax"]
        + ops["prefill"]["ops"]["Softmax"]
        + cfg.num_steps * ops["denoise_step"]["ops"]["Softmax"]
    )
    weights = {m: sum(np.prod(i.dims) for i in onnx.load(onnx_dir / f"{m}.onnx").graph.initializer) for m in METHODS}
    assert weights["sample"] <= 1.05 * (weights["encode_images"] + weights["prefill"] + weights["denoise_step"])


# -- guards ------------------------------------------------------------------------------------------------------


def test_corrupt_truncated_or_missing_files_refused(onnx_dir, tmp_path):
    folder = _copy(onnx_dir, tmp_path)
    graph = folder / "prefill.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    with pytest.raises(OnnxModelError, match=re.escape("prefill.onnx: SHA-256 does not match its sidecar")):
        load_onnx(folder)
    graph.write_bytes(data[:1000])
    with pytest.raises(OnnxModelError, match="1000 bytes but its sidecar describes"):
        load_onnx(folder)
    graph.unlink()
    with pytest.raises(OnnxModelError, match=re.escape("prefill.onnx is missing")):
        load_onnx(folder)


def test_missing_or_broken_sidecar_refused(onnx_dir, tmp_path):
    folder = _copy(onnx_dir, tmp_path)
    meta = json.loads((folder / ONNX_SIDECAR).read_text())
    (folder / ONNX_SIDECAR).write_text(json.dumps({**meta, "format": "omni_ros.pte.v1"}))
    with pytest.raises(OnnxModelError, match=re.escape("sidecar format 'omni_ros.pte.v1', this omni_ros reads")):
        load_onnx(folder)
    (folder / ONNX_SIDECAR).write_text("{not json")
    with pytest.raises(OnnxModelError, match="not valid JSON"):
        load_onnx(folder)
    (folder / ONNX_SIDECAR).unlink()
    with pytest.raises(OnnxModelError, match=re.escape("sidecar omni_ros.json is missing")):
        load_onnx(folder)
    with pytest.raises(OnnxModelError, match="ONNX export not found"):
        load_onnx(tmp_path / "absent")


def test_sidecar_that_does_not_match_the_config_refused(onnx_dir):
    with pytest.raises(OnnxModelError, match=r"cameras: program \['base', 'wrist'\], configured \['front', 'wrist'\]"):
        load_onnx(onnx_dir, camera_names=["front", "wrist"])
    with pytest.raises(OnnxModelError, match="state_dim: program 3, configured 7; action_dim: program 3, configured 7"):
        load_onnx(onnx_dir, state_dim=7, action_dim=7)
    with pytest.raises(OnnxModelError, match="providers qnn-htp runs a --target qnn-onnx export"):
        OnnxRunner(onnx_dir, providers=["qnn-htp"])


@pytest.mark.parametrize("provider", ["cuda", "tensorrt"])
def test_gpu_providers_fail_clearly_where_absent(onnx_dir, provider):
    import onnxruntime

    if {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}[provider] in (
        onnxruntime.get_available_providers()
    ):
        pytest.skip(f"{provider} is available here")
    with pytest.raises(ProviderUnavailable, match=f"providers: {provider} needs .*onnxruntime-gpu") as info:
        load_onnx(onnx_dir, providers=[provider, "cpu"])
    assert "CPUExecutionProvider" in str(info.value)  # says what this runtime has
    with pytest.raises(ProviderUnavailable, match="unknown providers"):
        load_onnx(onnx_dir, providers=["npu"])
    with pytest.raises(ProviderUnavailable, match="qnn-htp comes first"):
        load_onnx(onnx_dir, providers=["cpu", "qnn-htp"])


def test_config_switch_loads_the_onnx_folder(onnx_dir, tmp_path):
    _copy(onnx_dir, tmp_path)
    config_file = tmp_path / "robot.yaml"
    config_file.write_text("policy: {backend: onnxruntime, onnx: policy_onnx, providers: [cpu], num_threads: 1}\n")
    config = load_config(config_file)
    assert config.policy.onnx == str((tmp_path / "policy_onnx").resolve()) and config.policy.providers == ["cpu"]
    policy = load_policy(config.policy, camera_names=["base", "wrist"], state_dim=3, action_dim=3)
    assert isinstance(policy.runner, OnnxRunner)
    np.testing.assert_allclose(policy.infer(raw_obs(5))["actions"], reference().infer(raw_obs(5))["actions"], atol=TOL)
    with pytest.raises(OnnxModelError, match="cameras: program"):
        load_policy(config.policy, camera_names=["base"])
    with pytest.raises(ConfigError, match=re.escape("needs policy.onnx")):
        load_policy(PolicyConfig(backend="onnxruntime"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: {backend: onnx}\n")
    with pytest.raises(ConfigError, match=r"policy\.backend: expected one of .*'onnxruntime'"):
        load_config(bad)


def test_missing_extras_say_what_to_install(onnx_dir, monkeypatch):
    # A module set to None in sys.modules cannot be imported: exactly what a venv without the extra gives.
    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)
    with pytest.raises(ExtraMissing, match=re.escape("pip install 'omni_ros[qnn]'")):
        load_policy(PolicyConfig(backend="onnxruntime", onnx=str(onnx_dir), providers=["qnn-htp"]))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ExtraMissing, match=re.escape("pip install 'omni_ros[onnx]'")):
        load_policy(PolicyConfig(backend="onnxruntime", onnx=str(onnx_dir)))


def test_cli_without_the_qnn_extra_prints_one_line(root, tmp_path):
    code = (
        "import sys; sys.modules['onnxruntime_qnn'] = None; from omni_ros.cli import main; "
        f"sys.exit(main(['export', '--preset', 'tiny', '--target', 'qnn-onnx', '--out', '{tmp_path / 'x'}']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "pip install 'omni_ros[qnn]'" in lines[0], proc.stderr
    assert not (tmp_path / "x").exists()  # refused before tracing anything


def test_cli_exports_one_graph_and_reports_its_ops(root, tmp_path):
    out = tmp_path / "vision_onnx"
    args = f"export --target onnx --preset tiny --state-dim 3 --action-dim 3 --methods encode_images --json --out {out}"
    proc = subprocess.run(
        [sys.executable, "-m", "omni_ros.cli", *args.split()], cwd=root, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["pte"] == str(out) and summary["sidecar"] == str(out / ONNX_SIDECAR)
    report = summary["delegation"]["encode_images"]
    assert report["ops"]["Conv"] == 1 and report["inputs"] == ["images"]
    assert "tracing encode_images to ONNX" in proc.stderr  # progress on stderr, JSON alone on stdout
    # Only the vision encoder: no policy can run from it, and it says why.
    with pytest.raises(OnnxModelError, match=re.escape("fused mode needs methods ['sample']")):
        load_onnx(out)


def test_an_onnx_export_serves_hard_inpainting(tmp_path_factory):
    """Real-time chunking on ONNX Runtime: hard inpainting (no guidance graph), as the eager policy does it."""
    from helpers.rtc_util import two_observations
    from omni_ros.backends.onnx_runner import load_onnx
    from omni_ros.policy.loading import from_preset
    from omni_ros.policy.rtc import RtcError, RtcRequest

    first, second = two_observations(1_000_003, np.array([0.3, -0.2, 0.1]), 15)
    # The session's shared ONNX folder of the tiny model (staged and fused graphs) and its eager twin.
    policy = load_onnx(exported_tiny(tmp_path_factory.getbasetemp(), "onnx"), num_threads=1)
    demo = from_preset("tiny", camera_names=["base", "wrist"], **ARM)
    assert policy.rtc_methods == ("inpaint",)
    plan = demo.infer(first)["actions"][3:]
    with pytest.raises(RtcError, match="it serves: inpaint"):
        policy.infer(second, rtc=RtcRequest(plan, inference_delay=3))
    request = RtcRequest(plan, inference_delay=3, method="inpaint")
    out = policy.infer(second, rtc=request)["actions"]
    np.testing.assert_allclose(out, demo.infer(second, rtc=request)["actions"], atol=1e-4)
    np.testing.assert_allclose(out[:3], plan[:3], atol=1e-5)
