"""QNN up to the SDK boundary: options, compile plan with static shapes, calibration; no SDK -> clear error, no network.

Also the CUDA target's refusal on a machine without CUDA.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

from omni_ros.export.exporter import check_export_target, export_preset
from omni_ros.export.qnn import QnnOptions, QnnSdkError, calibration_inputs, find_qnn_sdk, qnn_plan
from omni_ros.policy.families import signatures
from omni_ros.policy.pi0.modeling import Pi0Model
from omni_ros.policy.pi0.presets import preset
from omni_ros.policy.pi0.stages import METHODS

pytestmark = pytest.mark.usefixtures("torch_one_thread")

QNN_MODULES = "executorch.backends.qualcomm"


@pytest.fixture
def no_network(monkeypatch):
    """Any outgoing connection fails the test (the SDK download is what must never happen)."""
    attempts = []

    def refuse(self, address):
        attempts.append(address)
        raise AssertionError(f"network access attempted: {address}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", lambda address, *a, **k: refuse(None, address))
    return attempts


@pytest.fixture
def no_sdk(monkeypatch):
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)


def test_export_without_sdk_fails_clearly_before_any_qnn_code(no_sdk, no_network, tmp_path):
    already = {m for m in sys.modules if m.startswith(QNN_MODULES)}
    with pytest.raises(QnnSdkError, match="QNN_SDK_ROOT is not set") as info:
        export_preset("tiny", tmp_path / "tiny_qnn.pte", target="qnn")
    assert "install the Qualcomm AI Engine Direct (QNN) SDK" in str(info.value)
    assert "never downloads" in str(info.value)
    assert no_network == []
    assert {m for m in sys.modules if m.startswith(QNN_MODULES)} == already  # nothing of ExecuTorch's QNN was loaded
    assert not (tmp_path / "tiny_qnn.pte").exists()


def test_incomplete_sdk_is_named(monkeypatch, no_network, tmp_path):
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path / "absent"))
    with pytest.raises(QnnSdkError, match="is not a directory"):
        find_qnn_sdk()
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))
    with pytest.raises(QnnSdkError, match=r"has no lib/x86_64-linux-clang/libQnnHtp\.so"):
        check_export_target("qnn", "none")
    library = tmp_path / "lib" / "x86_64-linux-clang" / "libQnnHtp.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    assert find_qnn_sdk().htp_library == library
    assert no_network == []


def test_cli_reports_the_missing_sdk(root, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "QNN_SDK_ROOT"}
    proc = subprocess.run(
        [sys.executable, "-m", "omni_ros.cli", "export", "--preset", "tiny", "--target", "qnn", "--out", "x.pte"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "omni-ros: error: QNN lowering needs the Qualcomm SDK but QNN_SDK_ROOT is not set" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "x.pte").exists()


def test_compile_plan_has_static_shapes_for_the_soc():
    cfg = preset("small")
    plan = qnn_plan(cfg, QnnOptions(soc="SM8550", precision="16a8w"), METHODS)
    assert (plan["soc"], plan["htp_arch"], plan["backend"]) == ("SM8550", "V73", "HTP")
    assert plan["quantization"] == "PT2E 16a8w" and plan["calibration_samples"] == 4
    sigs = signatures(cfg)
    for method in METHODS:
        specs = plan["methods"][method]
        assert specs == sigs[method].to_dict()
        assert all(isinstance(d, int) and d > 0 for s in specs["inputs"] + specs["outputs"] for d in s["shape"])
    assert plan["methods"]["denoise_step"]["inputs"][0]["shape"] == [1, cfg.prefix_len]
    fp16 = qnn_plan(cfg, QnnOptions(soc="SM8650", precision="fp16"), ["sample"])
    assert fp16["quantization"] == "none (fp16 HTP)" and list(fp16["methods"]) == ["sample"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (QnnOptions(soc="SM9999"), "unknown QNN SoC 'SM9999'"),
        (QnnOptions(precision="4a4w"), "unknown QNN precision '4a4w'"),
        (QnnOptions(soc="SM8450", precision="fp16"), "SM8450 .HTP V69. has no fp16 HTP"),
        (QnnOptions(calibration_samples=0), "calibration_samples must be at least 1"),
    ],
)
def test_bad_qnn_options_refused(no_sdk, no_network, options, message):
    with pytest.raises(ValueError, match=message):
        check_export_target("qnn", "none", options)


def test_quantize_flag_is_not_the_qnn_recipe(no_sdk):
    with pytest.raises(ValueError, match="use --qnn-precision"):
        check_export_target("qnn", "int8-dynamic")


def test_calibration_follows_the_real_pipeline():
    cfg = preset("tiny")
    model = Pi0Model(cfg).eval()
    data = calibration_inputs(model, METHODS, samples=2)
    sigs = signatures(cfg)
    assert [len(data[m]) for m in METHODS] == [2, 2, 2 * cfg.num_steps, 2]
    for method in METHODS:
        for batch in data[method]:
            assert [tuple(x.shape) for x in batch] == [s.shape for s in sigs[method].inputs]
    # The steps of one sample share its KV cache and walk t down from 1.
    steps = data["denoise_step"][: cfg.num_steps]
    assert all(torch.equal(s[4], steps[0][4]) for s in steps)
    assert [round(float(s[3]), 4) for s in steps] == [1.0, 0.75, 0.5, 0.25]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_cuda_export_fails_clearly_without_cuda(tmp_path):
    from omni_ros.export.cuda import CudaUnavailableError

    with pytest.raises(CudaUnavailableError, match="--target cuda needs a CUDA GPU"):
        export_preset("tiny", tmp_path / "tiny_cuda.pte", target="cuda")
    with pytest.raises(ValueError, match="float32 only"):
        check_export_target("cuda", "8da4w")
    assert not (tmp_path / "tiny_cuda.pte").exists()
