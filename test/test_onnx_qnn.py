"""tiny exported for Qualcomm's HTP (--target qnn-onnx, 16a8w QDQ) and run on the HTP emulator of onnxruntime-qnn with
CPU fallback disabled: placement, quantized accuracy, the compiled context cache, operators the HTP lacks, bad input."""

from __future__ import annotations

import json
import logging
import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from helpers.pte_cache import ARM, STAGED, exported_tiny
from helpers.tiny_models import reference as tiny_reference
from omni_ros.backends.onnx_runner import OnnxRunner, load_onnx
from omni_ros.export.calibration import CalibrationError, calibration_observations, resolve_source, sim_observations
from omni_ros.export.htp_rewrite import HTP_MASK_VALUE
from omni_ros.export.ort_session import CACHE_MANIFEST, HtpTarget, compile_htp, context_file, open_session
from omni_ros.export.qnn import QnnOptions
from omni_ros.export.sidecar import OnnxModelError, file_sha256, read_onnx_sidecar
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.presets import preset

# 16a8w QDQ graphs on the HTP emulator vs eager float32, max abs of the chunk (normalized units, ~2 at most), on
# simulator observations the calibration did not see: measured 2.4e-3 staged / 4.7e-3 fused on tiny.
HTP_16A8W_TOLERANCE = 0.02
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]


@pytest.fixture(scope="session")
def qnn_dir(tmp_path_factory):
    return exported_tiny(tmp_path_factory.getbasetemp(), "qnn16")


@pytest.fixture
def qnn_copy(qnn_dir, tmp_path):
    dst = tmp_path / "policy_htp"
    shutil.copytree(qnn_dir, dst)
    return dst


def _sim_obs(count: int, seed: int) -> list[dict]:
    # Observations the calibration did not see (other seeds), of the kind it did: what the robot will show.
    return sim_observations(preset("tiny", **ARM), count, seed=seed)


def test_whole_graph_is_placed_on_the_htp(qnn_dir):
    sidecar = read_onnx_sidecar(qnn_dir)
    assert sidecar.target == "qnn-onnx" and sidecar.quantize == "16a8w" and set(sidecar.methods) == set(STAGED)
    options = sidecar.target_options
    assert (options["soc"], options["soc_model"], options["htp_arch"]) == ("SM8650", 57, "V75")
    assert options["calibration"] == "sim" and options["mask_value"] == HTP_MASK_VALUE
    assert options["rewrites"]["reciprocal_to_div"] > 0 and options["rewrites"]["mask_constants"] > 0
    for method in STAGED:
        report = sidecar.delegation[method]
        # One QNN graph per method, nothing left to the CPU: what the compiled cache holds is all there is.
        assert report["placement"] == {"qnn_partitions": 1, "cpu_ops": {}}, (method, report["placement"])
        ops = {n.op_type for n in onnx.load(qnn_dir / context_file(method)).graph.node}
        assert ops == {"EPContext"}
        # The graph itself is QDQ: 16-bit activations around integer kernels.
        assert report["ops"]["QuantizeLinear"] > 10 and report["ops"]["DequantizeLinear"] > 10
        assert "Reciprocal" not in report["ops"]
    # And the QDQ graphs load on the HTP with CPU fallback disabled (the runner compiles nothing: see below).
    runner = OnnxRunner(qnn_dir, providers=["qnn-htp"])
    assert runner.backend == "onnxruntime-qnn-htp-16a8w"


def test_quantized_actions_within_tolerance_of_eager(qnn_dir):
    reference = tiny_reference()
    htp = load_onnx(qnn_dir, providers=["qnn-htp"])
    cpu = load_onnx(qnn_dir, providers=["cpu"])  # the same QDQ graphs on ONNX Runtime's CPU kernels
    scale, worst, emulator_vs_cpu = 0.0, 0.0, 0.0
    for obs in _sim_obs(3, seed=100):
        expected = reference.infer(obs)["actions"]
        got = htp.infer(obs)
        assert got["actions"].shape == (8, 3) and np.all(np.isfinite(got["actions"]))
        assert got["policy_timing"]["denoise_ms"] > 0
        scale = max(scale, float(np.abs(expected).max()))
        worst = max(worst, float(np.abs(got["actions"] - expected).max()))
        emulator_vs_cpu = max(emulator_vs_cpu, float(np.abs(got["actions"] - cpu.infer(obs)["actions"]).max()))
    assert 0 < worst <= HTP_16A8W_TOLERANCE, (worst, scale)  # quantized (not bit-identical), yet close
    # The emulator computes what ONNX Runtime's reference kernels compute for the same integer graph.
    assert emulator_vs_cpu <= HTP_16A8W_TOLERANCE / 2, emulator_vs_cpu


def test_context_cache_reloads_without_recompiling(qnn_copy):
    manifest = json.loads((qnn_copy / CACHE_MANIFEST).read_text())
    stamps = {
        m: ((qnn_copy / context_file(m)).stat().st_mtime_ns, file_sha256(qnn_copy / context_file(m))) for m in STAGED
    }
    assert set(manifest["methods"]) == set(STAGED) and manifest["soc"] == "SM8650"
    runner = OnnxRunner(qnn_copy, providers=["qnn-htp"])
    assert runner.cache_status == dict.fromkeys(STAGED, "loaded")
    assert stamps == {
        m: ((qnn_copy / context_file(m)).stat().st_mtime_ns, file_sha256(qnn_copy / context_file(m))) for m in STAGED
    }
    # Without its compiled graph a method is compiled once, cached, and loaded from the cache from then on.
    (qnn_copy / context_file("prefill")).unlink()
    assert OnnxRunner(qnn_copy, providers=["qnn-htp"]).cache_status == {
        "encode_images": "loaded",
        "prefill": "compiled",
        "denoise_step": "loaded",
    }
    assert OnnxRunner(qnn_copy, providers=["qnn-htp"]).cache_status == dict.fromkeys(STAGED, "loaded")
    # A cache of another QNN release is stale, not wrong: recompiled.
    manifest = json.loads((qnn_copy / CACHE_MANIFEST).read_text())
    (qnn_copy / CACHE_MANIFEST).write_text(json.dumps({**manifest, "onnxruntime_qnn": "2.0.0"}))
    assert OnnxRunner(qnn_copy, providers=["qnn-htp"]).cache_status == dict.fromkeys(STAGED, "compiled")


def test_corrupt_cache_refused_clearly(qnn_copy):
    ctx = qnn_copy / context_file("denoise_step")
    data = bytearray(ctx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    ctx.write_bytes(bytes(data))
    with pytest.raises(OnnxModelError, match=r"corrupt QNN cache: .*denoise_step\.qnn_ctx\.onnx: SHA-256") as info:
        load_onnx(qnn_copy, providers=["qnn-htp"])
    assert "delete denoise_step.qnn_ctx.onnx to recompile it" in str(info.value)
    (qnn_copy / CACHE_MANIFEST).write_text("{half a manifest")
    with pytest.raises(OnnxModelError, match="corrupt QNN cache manifest"):
        load_onnx(qnn_copy, providers=["qnn-htp"])


def test_an_operator_the_htp_lacks_is_named(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Hardmax", ["r"], ["h"]),
        helper.make_node("Add", ["h", "r"], ["y"]),
    ]
    path = tmp_path / "hardmax.onnx"
    onnx.save(
        helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 21)]), path
    )
    htp = HtpTarget("SM8650", "fp16")
    with pytest.raises(
        OnnxModelError, match=re.escape("not every operator runs on the HTP (SM8650); on the CPU would be: Hardmax x1")
    ):
        open_session(path, ["qnn-htp"], htp=htp)
    with pytest.raises(OnnxModelError, match="on the CPU would be: Hardmax x1"):
        compile_htp(path, tmp_path / "hardmax_ctx.onnx", htp)
    # Allowed to fall back, it runs: the HTP around the Hardmax, the CPU for it.
    session = open_session(path, ["qnn-htp", "cpu"], htp=htp)
    out = session.run(None, {"x": np.arange(8, dtype=np.float32)[None]})[0]
    np.testing.assert_allclose(out[0, :7], np.arange(7), atol=1e-2)
    assert abs(out[0, 7] - 8.0) < 1e-2


def test_another_soc_compiles_its_own_graph(qnn_dir, tmp_path):
    # The cache is for the export's SoC; another SoC is another compile of the same QDQ graph.
    seconds = compile_htp(qnn_dir / "encode_images.onnx", tmp_path / "sm8550.onnx", HtpTarget("SM8550", "16a8w"))
    assert seconds > 0 and {n.op_type for n in onnx.load(tmp_path / "sm8550.onnx").graph.node} == {"EPContext"}
    assert file_sha256(tmp_path / "sm8550.onnx") != file_sha256(qnn_dir / context_file("encode_images"))
    with pytest.raises(ValueError, match=r"SM8450 .HTP V69. has no fp16 HTP"):
        HtpTarget.from_options(QnnOptions(soc="SM8450", precision="fp16"))


def test_calibration_sources_refuse_what_does_not_fit(tmp_path):
    from omni_ros.sim.dataset import DatasetMeta, DatasetWriter, Sample

    cfg = preset("tiny", **ARM)
    with pytest.raises(CalibrationError, match=r"the simulator has cameras .* the model needs"):
        calibration_observations("sim", preset("tiny"), 2)  # 8 joints: not the simulated arm
    with pytest.raises(CalibrationError, match="not auto, sim, spec, random or a dataset folder"):
        calibration_observations(str(tmp_path / "nowhere"), cfg, 2)
    meta = DatasetMeta(cameras=["base", "wrist"], state_dim=3, action_dim=3, horizon=8, action_dt=0.02)
    writer = DatasetWriter(tmp_path / "demos", meta)
    rng = np.random.default_rng(0)
    for i in range(5):
        images = {c: rng.integers(0, 256, (40, 40, 3), dtype=np.uint8) for c in meta.cameras}
        writer.add(Sample(images, rng.normal(size=3), "reach the red block", np.zeros((8, 3)), i, "red", 0.0))
    writer.close()
    observations = calibration_observations(str(tmp_path / "demos"), cfg, 3)
    assert len(observations) == 3 and set(observations[0]["images"]) == {"base", "wrist"}
    with pytest.raises(CalibrationError, match=r"the dataset has cameras .* state_dim 3, the model needs"):
        calibration_observations(str(tmp_path / "demos"), preset("tiny"), 3)


def test_auto_calibration_draws_from_the_models_spec_when_the_simulator_does_not_fit():
    eight = preset("tiny")  # 8 joints: not the simulated arm
    assert resolve_source("auto", preset("tiny", **ARM)) == ("sim", "")
    source, why = resolve_source("auto", eight)
    assert source == "spec" and "state_dim 8" in why and "model's own spec" in why
    stats = NormStats([1.0] * 8, [0.5] * 8, [0.0] * 8, [1.0] * 8)
    observations = calibration_observations("auto", eight, 4, norm_stats=stats)
    assert len(observations) == 4 and all(set(o["images"]) == set(eight.camera_names) for o in observations)
    states = np.stack([o["state"] for o in observations])
    assert states.shape == (4, 8) and np.all(np.abs(stats.normalize_state(states)) <= 1.0 + 1e-6)
    assert len({o["prompt"] for o in observations}) > 1 and np.std(states) > 0.1  # varied, not one frame


def test_bare_qnn_onnx_export_of_a_model_the_simulator_does_not_fit(tmp_path, caplog):
    # `omni-ros export --target qnn-onnx --out DIR` on the built-in default (8 joints): spec calibration, said so.
    from omni_ros.export.exporter import export_preset

    qnn = QnnOptions(precision="16a8w", calibration_samples=2)
    with caplog.at_level(logging.WARNING, logger="omni_ros.export"):
        export_preset("tiny", tmp_path / "htp", target="qnn-onnx", methods=("encode_images",), qnn=qnn)
    assert any("observations drawn from the model's own spec" in r.getMessage() for r in caplog.records)
    assert read_onnx_sidecar(tmp_path / "htp").target_options["calibration"] == "spec"
