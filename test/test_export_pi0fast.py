"""pi0-FAST exported: prefill + one static-KV decode step per program, the greedy loop and the FAST detokenizer in
the runner, on the LeRobot 0.6.1 fixture pi0fast_1cam (test_reference_pi0fast.py checks eager against LeRobot).

Tolerances: the exported decode (and the runners' token-only `generate`) must emit eager's very tokens at every
step of every case (the fixture's cases have no near-tie between the exported and eager logits: their top-2
margins are far above float32 rounding); with the same tokens the FAST decode is the same arithmetic, so actions
agree to 1e-6.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from test_reference_pi0fast import MANIFEST, REFERENCE, observation, policy

from omni_ros.backends.factory import load_policy
from omni_ros.control.config import ControlConfig
from omni_ros.control.executor import check_rtc_support
from omni_ros.export.sidecar import read_onnx_sidecar, read_sidecar
from omni_ros.policy.config import PolicyConfig
from omni_ros.typed_config import ConfigError

pytestmark = [pytest.mark.usefixtures("torch_one_thread"), pytest.mark.filterwarnings("ignore::DeprecationWarning")]
FIXTURE = "pi0fast_1cam"
CHECKPOINT = REFERENCE / FIXTURE
ACTION_TOL = 1e-6


def _same_as_eager(exported) -> None:
    eager = policy(FIXTURE)
    for case in MANIFEST["fixtures"][FIXTURE]["cases"]:
        obs = observation(FIXTURE, case)
        ours, ref = exported.infer(obs), eager.infer(obs)
        assert ours["action_tokens"].tolist() == ref["action_tokens"].tolist(), case
        np.testing.assert_allclose(ours["actions"], ref["actions"], rtol=0, atol=ACTION_TOL)
        timing = ours["policy_timing"]
        assert timing["decode_steps"] == len(ours["action_tokens"]) and timing["tokens_per_s"] > 0
        _token_only_path_gives(exported, obs, ours["action_tokens"].tolist())


def _token_only_path_gives(exported, obs: dict, tokens: list[int]) -> None:
    """The token-only path (bench/pi0_fast.py times it): the same loop, the same tokens, not detokenized."""
    runner = exported.runner
    inputs = exported.processor.inputs([exported.processor.parse(obs)], runner.device, runner.dtype)
    generated = runner.generate(inputs)
    assert generated.tokens[0].tolist() == tokens
    assert generated.prefill_ms > 0 and generated.logits is None


def _refuses_rtc(exported) -> None:
    with pytest.raises(ConfigError, match="discrete tokens"):
        check_rtc_support(ControlConfig(blending="rtc"), exported)


def test_onnx_export_decodes_eagers_tokens(tmp_path):
    from omni_ros.export.exporter import export_checkpoint

    out = tmp_path / "onnx"
    export_checkpoint(CHECKPOINT, out, target="onnx")
    assert list(read_onnx_sidecar(out).methods) == ["prefill", "decode_step"]
    exported = load_policy(PolicyConfig(backend="onnxruntime", onnx=str(out)))
    try:
        _same_as_eager(exported)
        _refuses_rtc(exported)
    finally:
        exported.close()


def test_an_int8_program_from_the_cli_decodes_lerobots_tokens_where_its_choice_is_clear(tmp_path, root):
    """`omni-ros export --quantize int8-dynamic`: an int8 `.pte` computes other logits than float32, so its tokens
    must be LeRobot's wherever the reference's top-2 margin is clear (test_reference_pi0fast.py's rule for eager
    int8); the program says it is int8-dynamic, and so does the policy's precision. (The float32 export's very
    tokens are checked through ONNX above: the same traced methods; one XNNPACK lowering of the decoder here, about
    45 s of CPU each.)"""
    from test_reference_pi0fast import DECISIVE_MARGIN, case_data

    pte = tmp_path / "p.pte"
    cmd = [sys.executable, "-m", "omni_ros.cli", "export", "--checkpoint", str(CHECKPOINT), "--out", str(pte)]
    run = subprocess.run([*cmd, "--quantize", "int8-dynamic"], cwd=root, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    sidecar = read_sidecar(pte)
    assert sidecar.family == "pi0_fast" and list(sidecar.methods) == ["prefill", "decode_step"]
    assert sidecar.quantize == "int8-dynamic"
    # The FAST tokenizer travels with the program (relative to it): the checkpoint folder is not needed to serve.
    assert sidecar.model.fast.path == "p.pte.fast_tokenizer" and (tmp_path / "p.pte.fast_tokenizer").is_dir()
    exported = load_policy(PolicyConfig(backend="executorch", pte=str(pte)))
    try:
        assert exported.metadata.backend == "executorch-xnnpack-int8-dynamic" and exported.metadata.noise_shape is None
        assert exported.metadata.precision.startswith("int8")
        for case in MANIFEST["fixtures"][FIXTURE]["cases"]:
            _, data = case_data(FIXTURE, case)
            obs = observation(FIXTURE, case)
            out = exported.infer(obs)
            ours = out["action_tokens"].tolist()
            ref, margins = data["action_tokens"][0].tolist(), data["top2_margin"][0]
            unclear = [t for t, m in enumerate(margins[: len(ref)]) if m < DECISIVE_MARGIN]
            clear = unclear[0] if unclear else len(ref)
            assert ours[:clear] == ref[:clear], (case, ours, ref)
            assert out["policy_timing"]["decode_steps"] == len(ours)
            _token_only_path_gives(exported, obs, ours)
        _refuses_rtc(exported)
    finally:
        exported.close()


def test_qnn_onnx_is_refused_for_a_token_decoder(tmp_path):
    from omni_ros.export.onnx_export import export_onnx
    from omni_ros.policy.normalize import NormStats

    model = policy(FIXTURE).runner.model
    cfg = model.cfg
    with pytest.raises(ValueError, match="qnn-onnx calibrates a flow-matching denoiser"):
        export_onnx(
            model,
            NormStats.identity(cfg.state_dim, cfg.action_dim),
            tmp_path / "x",
            target="qnn-onnx",
            methods=("prefill", "decode_step"),
            num_steps=1,
            name="x",
        )


def test_the_qnn_pte_target_is_refused_for_a_token_decoder(tmp_path, monkeypatch):
    from omni_ros.export.exporter import export_checkpoint

    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)  # refused for the family, before the SDK is looked for
    with pytest.raises(ValueError, match=r"export a pi0_fast model with --target onnx$"):
        export_checkpoint(REFERENCE / FIXTURE, tmp_path / "x.pte", target="qnn")
