"""The LeRobot SmolVLA fixture through ONNX: `--target onnx` on the CPU EP within 1e-4 of eager and of LeRobot
with 1-3 cameras, chained by SmolVLA's stage plan; `--target qnn-onnx` wholly on the HTP emulator (CPU fallback
disabled) within the asserted quantized tolerance, its compiled cache reloaded without recompiling."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.smolvla_fixture import assert_matches_eager_and_lerobot, assert_quantized_close, cases
from omni_ros.backends.onnx_runner import load_onnx
from omni_ros.export.exporter import export_checkpoint
from omni_ros.export.forms import use_export_forms
from omni_ros.export.qnn import QnnOptions
from omni_ros.export.sidecar import read_onnx_sidecar
from omni_ros.policy.layers import RotaryTable
from omni_ros.policy.smolvla.modules import rope_tables

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.usefixtures("torch_one_thread")]
TOL = 1e-4
STAGED = ("encode_image", "prefill", "denoise_step")
# 16a8w QDQ on the HTP emulator against eager float32, in normalized action units (robot units / the action std)
# and relative L2. Measured 0.10-0.22 max and 2.9-5.4 % (random calibration, 8 samples): the fixture's weights
# are drawn large on purpose (LeRobot-like magnitudes) and 8-bit per-tensor weights of 16-32-wide layers are
# coarse; XNNPACK's per-channel int8 on the same fixture is 0.06-0.10.
HTP_MAX_NORMALIZED, HTP_RELATIVE_L2 = 0.35, 0.12


def test_the_rotary_table_of_the_export_form_gives_the_same_numbers():
    """The export form looks cos/sin up by position (no sin/cos of a large angle in the graph): bit for bit the
    eager numbers, padded position -1 included, and after a rebuild from the meta device."""
    table = RotaryTable(rope_tables, 16, 10_000.0, 300)
    positions = torch.tensor([[-1, -1, 0, 1, 2, 57, 299], [0, 3, 9, 120, 121, 200, 250]])
    eager = table(positions, torch.float32)
    use_export_forms(table)
    exported = table(positions, torch.float32)
    for e, x in zip(eager, exported, strict=True):
        assert e.shape == x.shape == (2, 1, 7, 8)
        assert torch.equal(e, x)
    with torch.device("meta"):
        rebuilt = RotaryTable(rope_tables, 16, 10_000.0, 300)
    rebuilt.to_empty(device="cpu").init_buffers()
    use_export_forms(rebuilt)
    assert all(torch.equal(e, x) for e, x in zip(eager, rebuilt(positions, torch.float32), strict=True))


@pytest.fixture(scope="module")
def onnx_dir(smolvla_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("smolvla") / "smolvla_onnx"
    export_checkpoint(smolvla_checkpoint, out, target="onnx", methods=STAGED)
    return out


def test_staged_graphs_match_eager_and_lerobot_with_one_to_three_cameras(onnx_dir, smolvla_reference, smolvla_eager):
    policy = load_onnx(onnx_dir, num_threads=1)
    sidecar = read_onnx_sidecar(onnx_dir)
    assert sidecar.family == "smolvla" and policy.runner.mode == "staged"
    expected = smolvla_eager.processor.metadata(policy.metadata.model, policy.metadata.backend)
    assert policy.metadata == dataclasses.replace(expected, precision="fp32: exported program (none)")
    assert policy.metadata.backend == "onnxruntime-cpu"
    assert_matches_eager_and_lerobot(policy, smolvla_reference, smolvla_eager, TOL)


def test_the_runner_encodes_only_present_cameras_and_reuses_the_prefix_cache(onnx_dir, smolvla_reference):
    policy = load_onnx(onnx_dir, num_threads=1, num_steps=3)
    runner = policy.runner
    calls: list[str] = []
    run = runner._run

    def counting(method, feeds):
        calls.append(method)
        return run(method, feeds)

    runner._run = counting
    for obs, _ in cases(smolvla_reference):
        calls.clear()
        policy.infer(obs)
        assert calls == ["encode_image"] * len(obs["images"]) + ["prefill"] + ["denoise_step"] * 3


@pytest.fixture(scope="module")
def htp_dir(smolvla_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("smolvla") / "smolvla_htp"
    # The simulator has other cameras than the fixture: random calibration (a robot would pass its recordings).
    qnn = QnnOptions(precision="16a8w", calibration_samples=8)
    result = export_checkpoint(
        smolvla_checkpoint, out, target="qnn-onnx", methods=STAGED, qnn=qnn, calibration="random"
    )
    return out, result


def test_qnn_onnx_runs_wholly_on_the_htp_within_the_quantized_tolerance(htp_dir, smolvla_reference, smolvla_eager):
    out, result = htp_dir
    for method in STAGED:
        assert result.report[method]["placement"] == {"qnn_partitions": 1, "cpu_ops": {}}, method
    # SmolVLA's prefill splits and re-merges the heads of the keys it re-projects: the pair is cancelled.
    assert result.report["prefill"]["rewrites"]["inverse_transposes"] >= 1
    policy = load_onnx(out, providers=["qnn-htp"])
    assert policy.runner.cache_status == dict.fromkeys(STAGED, "loaded")  # compiled at export, not again
    assert_quantized_close(policy, smolvla_reference, smolvla_eager, HTP_MAX_NORMALIZED, HTP_RELATIVE_L2)
