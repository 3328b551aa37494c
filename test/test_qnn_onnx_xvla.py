"""X-VLA on Qualcomm's HTP: `--target qnn-onnx` of the LeRobot 0.6.1 fixtures (their staged methods, 16a8w QDQ),
compiled for the default SoC and run on onnxruntime-qnn's HTP emulator with CPU fallback disabled: every graph
wholly on the HTP (xvla_3cam's three images in one batch made the window attention's tiles 6-D, past the HTP's
rank 5, before its export form folded them), both domains of one program within the asserted quantized tolerance
of eager, the compiled cache reused at load, and calibration spread across the checkpoint's domains."""

from __future__ import annotations

import numpy as np
import pytest
from test_reference_xvla import REFERENCE, every_case, policy

from omni_ros.backends.onnx_runner import load_onnx
from omni_ros.export.calibration import calibration_observations, observation_inputs
from omni_ros.export.exporter import export_checkpoint
from omni_ros.export.qnn import QnnOptions
from omni_ros.policy.layouts import read
from omni_ros.policy.tokenizer import make_tokenizer

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]
FIXTURE = "xvla_1cam"
STAGED = ("encode", "denoise_step")
# 16a8w QDQ on the HTP emulator against eager float32: relative L2 of the chunk. Measured 1.7-2.9% (xvla_1cam)
# and 2.9-6.3% (xvla_3cam, whose auto action space's chunks are smaller), max 0.037 absolute, random calibration
# of 8 samples; XNNPACK's per-channel int8 program is 0.9-1.3% from eager int8 on xvla_1cam.
HTP_RELATIVE_L2 = 0.10


@pytest.fixture(scope="module", params=["xvla_1cam", "xvla_3cam"])
def htp_export(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("xvla_htp") / request.param
    # The simulator has other cameras than the fixture: random calibration (a robot would pass its recordings).
    qnn = QnnOptions(precision="16a8w", calibration_samples=8)
    result = export_checkpoint(
        REFERENCE / request.param, out, target="qnn-onnx", methods=STAGED, qnn=qnn, calibration="random"
    )
    return request.param, out, result


def test_every_graph_runs_wholly_on_the_htp_within_the_quantized_tolerance(htp_export):
    fixture, out, result = htp_export
    for method in STAGED:
        assert result.report[method]["placement"] == {"qnn_partitions": 1, "cpu_ops": {}}, method
    htp = load_onnx(out, providers=["qnn-htp"])
    assert htp.runner.cache_status == dict.fromkeys(STAGED, "loaded")  # compiled at export, not again
    assert htp.metadata.backend.startswith("onnxruntime-qnn-htp")
    eager = policy(fixture)
    for name, data, obs in every_case(fixture):  # both domains of the one program
        noise = data["noise"][0]
        got, want = htp.infer(obs, noise=noise)["actions"], eager.infer(obs, noise=noise)["actions"]
        assert got.shape == want.shape and np.isfinite(got).all()
        relative = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        assert 0 < relative < HTP_RELATIVE_L2, (name, relative)


def test_the_htp_program_inpaints_for_real_time_chunking(htp_export):
    fixture, out, _ = htp_export
    htp = load_onnx(out, providers=["qnn-htp"])
    assert htp.rtc_methods == ("inpaint",)
    from omni_ros.policy.rtc_request import RtcRequest

    _, data, obs = every_case(fixture)[1]
    plan = np.clip(policy(fixture).infer(obs, noise=data["noise"][0])["actions"][3:] + 0.2, 0.05, 0.95)
    got = htp.infer(obs, noise=data["noise"][0], rtc=RtcRequest(plan, inference_delay=3, method="inpaint"))["actions"]
    np.testing.assert_allclose(got[:3], plan[:3], atol=1e-6)  # the frozen actions are the old plan, exactly


def test_calibration_covers_every_domain_of_the_checkpoint():
    checkpoint = read(REFERENCE / FIXTURE)
    cfg = checkpoint.config
    tokenizer = make_tokenizer(cfg.tokenizer)
    observations = calibration_observations("random", cfg, 7, norm_stats=checkpoint.norm_stats)
    inputs = observation_inputs(cfg, tokenizer, checkpoint.norm_stats, observations)
    domains = [int(x.domain_id) for x in inputs]
    assert cfg.head.num_domains == 3 and domains == [0, 1, 2, 0, 1, 2, 0]
    assert len({x.tokens.numpy().tobytes() for x in inputs}) > 1  # prompts differ


def test_the_qnn_pte_target_points_to_qnn_onnx(tmp_path, monkeypatch):
    # Refused before any SDK check or tracing (its calibration draws pi0-layout inputs), whether or not an SDK is set.
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    with pytest.raises(ValueError, match=r"export a xvla model with --target qnn-onnx \(the HTP through"):
        export_checkpoint(REFERENCE / FIXTURE, tmp_path / "x.pte", target="qnn")
    assert not any(tmp_path.iterdir())
