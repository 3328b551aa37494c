"""X-VLA from LeRobot 0.6.1 folders: LeRobot's own actions for the same observation, domain and noise.

The fixtures (test/fixtures/reference/xvla.json, `scripts/make_xvla_fixtures.py`) are tiny random `xvla` policies
built and saved by LeRobot 0.6.1 (a Florence-2 config given inline, in the remote-code form for xvla_1cam and the
native form for xvla_3cam; a tiny BART-shaped tokenizer); each case stores the raw observation, the domain LeRobot's
preprocessor was set to, the noise LeRobot drew inside `generate_actions` (its generator seeded, the draw
checked) and the final actions.

Tolerance: 1e-4 on the actions in float32 (measured: about 2e-7); bf16 / int8 GEMMs within 0.05 / 0.1 of fp32
on actions of magnitude ~0.3 (the tiny model's widths of 16-32 make their relative error larger than a real one's).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import omni_ros.policy
from omni_ros.errors import OmniRosError
from omni_ros.observation import ObservationError
from omni_ros.policy.layouts import CheckpointError

REFERENCE = Path(__file__).parent / "fixtures" / "reference"
MANIFEST = json.loads((REFERENCE / "xvla.json").read_text())
CASES = [(name, case) for name, f in MANIFEST["fixtures"].items() for case in f["cases"]]
TOL = 1e-4
pytestmark = pytest.mark.usefixtures("torch_one_thread")

_POLICIES: dict[str, object] = {}


def policy(fixture: str):
    if fixture not in _POLICIES:
        _POLICIES[fixture] = omni_ros.policy.load(REFERENCE / fixture)
    return _POLICIES[fixture]


def case(fixture: str, name: str) -> tuple[dict, dict[str, np.ndarray], dict]:
    info = MANIFEST["fixtures"][fixture]["cases"][name]
    data = load_file(REFERENCE / info["file"])
    prefix = "observation/observation.images."
    obs = {
        "images": {k.removeprefix(prefix): v for k, v in data.items() if k.startswith(prefix)},
        "state": data["observation/observation.state"],
        "prompt": info["prompt"],
        "domain_id": info["domain_id"],
    }
    return info, data, obs


def every_case(fixture: str) -> list[tuple[str, dict[str, np.ndarray], dict]]:
    """(name, tensors, observation) of each case of `fixture`, after checking its cases cover two domain ids (what
    an export's one-program-for-every-embodiment checks rely on)."""
    cases = [(name, *case(fixture, name)) for name in MANIFEST["fixtures"][fixture]["cases"]]
    assert len({info["domain_id"] for _, info, _, _ in cases}) == 2, fixture
    return [(name, data, obs) for name, _, data, obs in cases]


@pytest.mark.parametrize(("fixture", "name"), CASES)
def test_matches_lerobot(fixture, name):
    _, data, obs = case(fixture, name)
    out = policy(fixture).infer(obs, noise=data["noise"][0])
    assert out["actions"].shape == data["actions"][0].shape
    np.testing.assert_allclose(out["actions"], data["actions"][0], rtol=0, atol=TOL)


def test_the_cases_cover_domains_and_missing_cameras():
    domains = {c["domain_id"] for f in MANIFEST["fixtures"].values() for c in f["cases"].values()}
    assert len(domains) >= 2
    three = MANIFEST["fixtures"]["xvla_3cam"]
    assert any(len(c["present_cameras"]) < len(three["cameras"]) for c in three["cases"].values())


def test_domain_defaults_to_the_checkpoint_then_the_yaml():
    _, data, obs = case("xvla_1cam", "pick_domain1")  # the checkpoint's saved domain is 1
    del obs["domain_id"]
    out = policy("xvla_1cam").infer(obs, noise=data["noise"][0])
    np.testing.assert_allclose(out["actions"], data["actions"][0], rtol=0, atol=TOL)
    _, other, _ = case("xvla_1cam", "pick_domain2")
    two = omni_ros.policy.load(REFERENCE / "xvla_1cam", domain_id=2)
    np.testing.assert_allclose(two.infer(obs, noise=other["noise"][0])["actions"], other["actions"][0], atol=TOL)


def test_a_wrong_domain_changes_the_actions():
    _, data, obs = case("xvla_3cam", "all_domain0")
    obs["domain_id"] = 1
    out = policy("xvla_3cam").infer(obs, noise=data["noise"][0])
    assert np.abs(out["actions"] - data["actions"][0]).max() > 1e-2


def test_unknown_domain_is_one_clear_error_and_the_policy_keeps_serving():
    _, data, obs = case("xvla_1cam", "pick_domain1")
    for bad in (3, -1, "x", 1.5):
        with pytest.raises(ObservationError, match="domain_id"):
            policy("xvla_1cam").infer({**obs, "domain_id": bad}, noise=data["noise"][0])
    out = policy("xvla_1cam").infer(obs, noise=data["noise"][0])
    np.testing.assert_allclose(out["actions"], data["actions"][0], rtol=0, atol=TOL)
    with pytest.raises(CheckpointError, match="domain_id 7"):
        omni_ros.policy.load(REFERENCE / "xvla_1cam", domain_id=7)


def _edited(tmp_path: Path, fixture: str, edit) -> Path:
    folder = tmp_path / fixture
    shutil.copytree(REFERENCE / fixture, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_an_action_space_we_do_not_implement_is_refused(tmp_path):
    folder = _edited(tmp_path, "xvla_1cam", lambda c: c.update(action_mode="bimanual_quaternion"))
    with pytest.raises(CheckpointError, match="action_mode 'bimanual_quaternion' is not implemented"):
        omni_ros.policy.load(folder)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["florence_config"]["vision_config"].update(model_type="clip"), "vision backbone 'clip'"),
        (lambda c: c["florence_config"]["vision_config"].update(image_pos_embed={"type": "sine"}), "image_pos_embed"),
        (lambda c: c["florence_config"].pop("text_config"), "needs vision_config and text_config"),
        (lambda c: c["florence_config"]["vision_config"].update(num_heads=[3, 4]), "cannot be built"),
    ],
)
def test_a_florence_config_we_cannot_build_is_refused(tmp_path, edit, message):
    folder = _edited(tmp_path, "xvla_1cam", edit)
    with pytest.raises(CheckpointError, match=message):
        omni_ros.policy.load(folder)
    assert issubclass(CheckpointError, OmniRosError)


def test_vendored_florence_keys_load_through_the_remap(tmp_path):
    """An older checkpoint's vendored Florence-2 names (LeRobot remaps them on load): same actions."""
    from safetensors.torch import load_file as load_torch
    from safetensors.torch import save_file

    folder = tmp_path / "xvla_1cam"
    shutil.copytree(REFERENCE / "xvla_1cam", folder)
    tensors = load_torch(folder / "model.safetensors")
    old = {}
    for key, value in tensors.items():
        k = key.replace("model.vlm.language_model.", "model.vlm.language_model.model.")
        k = k.replace("multi_modal_projector.image_proj_norm.", "image_proj_norm.")
        k = k.replace("multi_modal_projector.image_position_embed.", "image_pos_embed.")
        k = k.replace("multi_modal_projector.visual_temporal_embed.", "visual_temporal_embed.")
        k = k.replace(".conv.", ".proj.") if ".convs." in k else k
        for half in ("spatial_block", "channel_block"):
            attn = "window_attn" if half == "spatial_block" else "channel_attn"
            k = k.replace(f"{half}.conv1.", f"{half}.conv1.fn.dw.").replace(f"{half}.conv2.", f"{half}.conv2.fn.dw.")
            k = k.replace(f"{half}.norm1.", f"{half}.{attn}.norm.").replace(f"{half}.{attn}.", f"{half}.{attn}.fn.", 1)
            k = k.replace(f"{half}.{attn}.fn.norm.", f"{half}.{attn}.norm.")
            k = k.replace(f"{half}.norm2.", f"{half}.ffn.norm.").replace(f"{half}.ffn.fc", f"{half}.ffn.fn.net.fc")
        if k.endswith("multi_modal_projector.image_projection.weight"):
            k, value = "model.vlm.image_projection", value.t().contiguous()
        old[k] = value
    assert any(".fn.dw." in k for k in old) and "model.vlm.image_projection" in old
    save_file(old, folder / "model.safetensors")
    _, data, obs = case("xvla_1cam", "stack_domain1")
    out = omni_ros.policy.load(folder).infer(obs, noise=data["noise"][0])
    np.testing.assert_allclose(out["actions"], data["actions"][0], rtol=0, atol=TOL)


@pytest.mark.parametrize(("precision", "tol"), [("bf16", 0.05), ("int8", 0.1)])
def test_precisions_stay_close_to_fp32(precision, tol):
    _, data, obs = case("xvla_3cam", "missing_wrist")
    pol = omni_ros.policy.load(REFERENCE / "xvla_3cam", precision=precision, int8_kernel="onednn")
    assert pol.runner.applied.linears > 0  # the model's linears were swapped
    out = pol.infer(obs, noise=data["noise"][0])
    err = np.abs(out["actions"] - data["actions"][0]).max()
    assert err < tol, f"{precision}: {err}"


def _native_bf16() -> bool:
    from omni_ros.policy.precision.attention import native_bf16

    return native_bf16()


def _mlps(model) -> list:
    return [m for m in model.modules() if hasattr(type(m), "mlp_kernel")]


def test_every_mlp_is_declared_for_the_precisions_mlp_kernels():
    """DaViT's, BART's and the head's MLPs declare their kernel and linears, so int8 on XNNPACK makes each one
    method (its specs: every MLP, the activation of each; the method's numbers are test_xnnpack_mlp.py's, and a
    full-size build takes minutes, bench/xvla.py)."""
    from omni_ros.policy.precision.xnnpack_mlp import mlp_specs

    model = policy("xvla_3cam").runner.model
    cfg = model.cfg
    linears = {name for name, m in model.named_modules() if hasattr(m, "in_features")}
    specs = mlp_specs(model, linears)
    assert len(_mlps(model)) == len(specs) == 2 * sum(cfg.vision.depths) + cfg.text.depth + cfg.head.depth
    activations = {spec.owner.split(".")[0]: spec.activation for spec in specs}
    assert activations == {"vlm": "gelu", "transformer": "gelu_tanh"}


@pytest.mark.skipif(not _native_bf16(), reason="the fused bf16 MLP needs native bf16 (AVX512_BF16 / AMX)")
def test_bf16_fuses_every_mlp_and_stays_within_its_bound():
    from omni_ros.policy.precision.fused_mlp import bf16_mlp

    _, data, obs = case("xvla_3cam", "missing_wrist")
    pol = omni_ros.policy.load(REFERENCE / "xvla_3cam", precision="bf16")
    mlps = _mlps(pol.runner.model)
    assert all(m.mlp_kernel is bf16_mlp for m in mlps) and pol.runner.applied.fused_mlps == len(mlps)
    err = np.abs(pol.infer(obs, noise=data["noise"][0])["actions"] - data["actions"][0]).max()
    assert err < 0.05, err


def test_the_products_see_only_the_rows_the_actions_need():
    """The padded tiles' pad tokens are not projected (their q / k / v is the qkv layer's answer for one zero
    row); the head's first block projects the step-invariant tokens once a chunk; its last block runs its
    projection and MLP on the action tokens alone. The actions are LeRobot's (test_matches_lerobot)."""
    import torch

    _, data, obs = case("xvla_3cam", "all_domain2")
    model = policy("xvla_3cam").runner.model
    seen: list[tuple[str, int, int]] = []  # (what, rows the product got, rows it needed)
    grids: list[tuple[int, int]] = []
    hooks = []
    window = model.cfg.vision.window_size
    for stage in model.vlm.vision_tower.blocks:
        for block in stage:
            attn = block.spatial_block.window_attn

            def grid(_m, args, grids=grids):
                b, h, w, _ = args[0].shape
                grids.append((b * h * w, h, w))

            def qkv(_m, args, _out, grids=grids):
                rows = args[0].shape[:-1].numel()
                seen.append(("qkv", rows, 1 if rows == 1 else grids[-1][0]))

            def proj(_m, args, _out, grids=grids):
                seen.append(("proj", args[0].shape[:-1].numel(), grids[-1][0]))

            hooks += [
                attn.register_forward_pre_hook(grid),
                attn.qkv.register_forward_hook(qkv),
                attn.proj.register_forward_hook(proj),
            ]
    last, first = model.transformer.blocks[-1], model.transformer.blocks[0]
    hooks.append(
        last.mlp.fc1.register_forward_hook(
            lambda _m, args, _out: seen.append(("head", args[0].shape[:-1].numel(), model.cfg.action_horizon))
        )
    )
    first_rows: list[int] = []
    hooks.append(first.attn.qkv.register_forward_hook(lambda _m, a, _o: first_rows.append(a[0].shape[1])))
    try:
        with torch.inference_mode():
            pol = policy("xvla_3cam")
            pol.infer(obs, noise=data["noise"][0])
    finally:
        for hook in hooks:
            hook.remove()
    assert any(h % window or w % window for _, h, w in grids), "no padded grid: the test would prove nothing"
    assert any(what == "qkv" and needed == 1 for what, _, needed in seen)  # the pad tokens' one zero row
    assert {what for what, _, _ in seen} == {"qkv", "proj", "head"}
    for what, rows, needed in seen:
        assert rows == needed, (what, rows, needed)
    # The first block projects the tokens after the actions once a chunk, then each step's action tokens only.
    steps, n = policy("xvla_3cam").num_steps, model.cfg.action_horizon
    assert sorted(first_rows)[:-1] == [n] * steps and first_rows[0] > n


@pytest.mark.parametrize(("h", "w"), [(7, 5), (6, 6), (2, 2), (3, 8)])
def test_window_attention_is_florences_padded_tiles(h, w):
    """Against Florence-2's formulation written out (zero-pad the normalized grid, project every tile, attend,
    crop), on grids with full windows, a partial last row and column, a corner, none padded, and one window
    smaller than a tile: the fixtures' grids pad rows only."""
    import torch
    import torch.nn.functional as F

    from omni_ros.policy.xvla.modeling import WindowAttention

    torch.manual_seed(0)
    s, c, heads = 3, 16, 2
    attn = WindowAttention(c, heads, s, qkv_bias=True).eval()
    x = torch.randn(2, h, w, c)
    with torch.no_grad():
        got = attn(x)
        padded = F.pad(x, (0, 0, 0, (s - w % s) % s, 0, (s - h % s) % s))
        hp, wp = padded.shape[1:3]
        tiles = padded.view(2, hp // s, s, wp // s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)
        q, k, v = attn.qkv(tiles).view(-1, s * s, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(-1, s * s, c)
        out = out.view(2, hp // s, wp // s, s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(2, hp, wp, c)
        want = attn.proj(out[:, :h, :w].reshape(2, h * w, c))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_seeded_noise():
    _, _, obs = case("xvla_1cam", "pick_domain1")
    pol = policy("xvla_1cam")
    a, b = pol.infer(obs)["actions"], pol.infer(obs)["actions"]
    np.testing.assert_array_equal(a, b)


# ----- real-time chunking: guided in the x0 form, inpainting (omni_ros.policy.rtc.guided_clean) ---------------
# Two action spaces: ee6d (sigmoid grippers 9 and 19, zeroed in x_t) and auto (7 real channels of 20).
RTC_CASES = [("xvla_1cam", "pick_domain1"), ("xvla_3cam", "all_domain2")]


def denoiser_like(model) -> None:
    """Rewire a fixture's head so that dx0_hat/dx_t is symmetric positive semi-definite, as a trained denoiser's
    is (Tweedie: dE[x0 | x_t]/dx_t is a scaled posterior covariance): blocks reduced to their residuals, x_t
    into the first channels of the stream (x3), the final LayerNorm (gain 1) out of them. Guidance moves the
    clean estimate along J^T W (Y - x0_hat), which approaches the plan only where J's symmetric part is
    positive; a random head's J is small (operator norm 0.15 here) and of either sign, so the random fixtures
    are no test of the pull (measured: 0.993 and 1.004 of the unguided distance)."""
    import torch

    head = model.transformer
    with torch.no_grad():
        for block in head.blocks:
            for linear in (block.attn.proj, block.mlp.fc2):
                linear.weight.zero_()
                linear.bias.zero_()
        enc, dec = head.action_encoder, head.action_decoder
        dim = dec.n_out
        w_in = enc.fc.weight.view(-1, enc.n_in, enc.n_out)
        w_in[:, :dim] = 0.0
        w_in[:, :dim, :dim] = 3.0 * torch.eye(dim)
        w_out = dec.fc.weight.view(-1, dec.n_in, dec.n_out)
        w_out.zero_()
        w_out[:, :dim, :dim] = torch.eye(dim)
        head.norm.weight.fill_(1.0)
        head.norm.bias.zero_()


def rtc_setup(fixture: str, name: str, denoiser: bool = False, **load):
    from omni_ros.policy.rtc import RtcRequest

    _, data, obs = case(fixture, name)
    pol = omni_ros.policy.load(REFERENCE / fixture, **load) if load or denoiser else policy(fixture)
    if denoiser:
        denoiser_like(pol.runner.model)
    plain = pol.infer(obs, noise=data["noise"][0])["actions"]
    plan = plain + 0.5 * plain.std()  # an old plan the new chunk must bend towards: its own chunk, moved
    if plan.shape[1] == 20:  # ee6d grippers: the plan's gripper is a sigmoid output, kept in [0, 1]
        plan[:, [9, 19]] = np.clip(plain[:, [9, 19]] + 0.3, 0.0, 1.0)

    def rtc(**request):
        return pol.infer(obs, noise=data["noise"][0], rtc=RtcRequest(**request))["actions"]

    return pol, plain, plan, rtc


@pytest.mark.parametrize(("fixture", "name"), RTC_CASES)
def test_rtc_zero_guidance_is_plain_sampling_exactly(fixture, name):
    pol, plain, plan, rtc = rtc_setup(fixture, name)
    assert pol.rtc_methods == ("guided", "inpaint")
    # beta 0, and a soft mask of zeros (no old plan left: s = H): the plain sampler's kernels under no_grad,
    # the same floats as under inference_mode (measured: equal bit for bit).
    np.testing.assert_array_equal(rtc(prev_actions=plan, inference_delay=4, max_guidance_weight=0.0), plain)
    np.testing.assert_array_equal(rtc(prev_actions=plan, inference_delay=0, execution_horizon=32), plain)


# Measured (d = 4, beta = 10 = the steps, the denoiser-like head): the prefix's mean distance to the plan falls
# to 0.68 (ee6d: its grippers are zeroed in x_t, so pulled only through the other channels) and 0.18 (auto)
# of the unguided one. Asserted: below 0.8 and 0.3; the correction's sign flipped, both grow.
@pytest.mark.parametrize(("fixture", "name", "bound"), [(*RTC_CASES[0], 0.8), (*RTC_CASES[1], 0.3)])
def test_rtc_guidance_moves_the_frozen_prefix_towards_the_plan(fixture, name, bound):
    _, plain, plan, rtc = rtc_setup(fixture, name, denoiser=True)
    d = 4
    guided = rtc(prev_actions=plan[: 2 * d + 2], inference_delay=d)
    before, after = np.abs(plain[:d] - plan[:d]).mean(), np.abs(guided[:d] - plan[:d]).mean()
    assert after < bound * before, (before, after)
    assert np.isfinite(guided).all()


@pytest.mark.parametrize("load", [{"cpu_linear": "packed"}, {"precision": "int8", "int8_kernel": "onednn"}])
def test_rtc_guidance_differentiates_through_the_cpu_kernels(load):
    # oneDNN-packed and int8 linears have no autograd formula: under a gradient they fall back to float
    # products (cpu_linear.py, precision/int8_linear.py), so the guided step still pulls (same bound as above).
    pol, plain, plan, rtc = rtc_setup("xvla_3cam", "all_domain2", denoiser=True, **load)
    assert pol.runner.applied.linears > 0
    d = 4
    guided = rtc(prev_actions=plan[: 2 * d + 2], inference_delay=d)
    assert np.abs(guided[:d] - plan[:d]).mean() < 0.3 * np.abs(plain[:d] - plan[:d]).mean()


@pytest.mark.parametrize(("fixture", "name"), RTC_CASES)
def test_rtc_inpainting_freezes_the_prefix_in_robot_units(fixture, name):
    _, plain, plan, rtc = rtc_setup(fixture, name)
    out = rtc(prev_actions=plan, inference_delay=3, method="inpaint")
    np.testing.assert_allclose(out[:3], plan[:3], rtol=0, atol=1e-6)  # measured: equal
    assert np.abs(out[3:] - plain[3:]).max() > 1e-6  # the rest of the chunk saw the frozen prefix


def test_rtc_blending_is_accepted_at_configure():
    from omni_ros.control.config import ControlConfig, RtcConfig
    from omni_ros.control.executor import check_rtc_support

    for method in ("guided", "inpaint"):
        check_rtc_support(ControlConfig(blending="rtc", rtc=RtcConfig(method=method)), policy("xvla_1cam"))


def test_rtc_guided_under_inference_mode_is_refused():
    import torch

    from omni_ros.policy.rtc import RtcError

    _, _, plan, rtc = rtc_setup("xvla_1cam", "pick_domain1")
    with torch.inference_mode(), pytest.raises(RtcError, match="autograd"):
        rtc(prev_actions=plan, inference_delay=3)


def test_the_rtc_target_inverts_the_action_space():
    import math

    import torch

    from omni_ros.policy.xvla.action_space import GRIPPER_EPS, build_action_space

    ee6d = build_action_space("ee6d", 20, 20)
    plan = torch.full((1, 2, 20), 0.25)
    plan[0, 0, 9], plan[0, 1, 9], plan[0, 1, 19] = 1.0, 0.0, 0.7
    low, high = ee6d.clean_target(plan, 20)
    # Ordinary channels: the plan itself. A gripper in (0, 1): its logit. Saturated: one-sided.
    assert torch.equal(low[..., :9], plan[..., :9]) and torch.equal(high[..., :9], plan[..., :9])
    assert low[0, 1, 19] == high[0, 1, 19] == pytest.approx(math.log(0.7 / 0.3), abs=1e-5)
    assert low[0, 0, 9] == pytest.approx(math.log((1 - GRIPPER_EPS) / GRIPPER_EPS), rel=1e-3)
    assert high[0, 0, 9] == math.inf and low[0, 1, 9] == -math.inf and high[0, 1, 9] < -9
    assert torch.equal(torch.sigmoid(low[0, 1, 19]), plan[0, 1, 19])  # round trip through postprocess
    # franka_joint7: 7 real channels, the other 13 trained on nothing: free.
    low, high = build_action_space("franka_joint7", 7, 20).clean_target(plan, 7)
    assert torch.equal(low[..., :7], plan[..., :7]) and (low[..., 7:] == -math.inf).all()
    assert (high[..., 7:] == math.inf).all()


def test_policy_info_and_infer_cli(root):
    import subprocess
    import sys

    folder = str(REFERENCE / "xvla_3cam")
    cmd = [sys.executable, "-m", "omni_ros.cli", "policy", "info", "--json", "--checkpoint", folder]
    info = json.loads(subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True, timeout=120).stdout)
    assert info["family"] == "xvla" and info["action_horizon"] == 32


def test_through_the_bridge_with_the_real_openpi_client():
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from omni_ros.serving.config import ServeConfig
    from omni_ros.serving.server import ServerThread

    _, data, obs = case("xvla_3cam", "all_domain2")
    with ServerThread(policy("xvla_3cam"), ServeConfig(port=0)) as server:
        client = WebsocketClientPolicy(server.url)
        assert tuple(client.get_server_metadata()["noise_shape"]) == (32, 20)
        result = client.infer({**obs, "noise": data["noise"][0]})
    np.testing.assert_allclose(result["actions"], data["actions"][0], rtol=0, atol=TOL)


ARM = REFERENCE / "xvla_1cam"  # one camera (top), 20 state values in, 20 action channels out (ee6d)
JOINTS = [f"joint_{i}" for i in range(1, 21)]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_policy_node_runs_an_xvla_checkpoint_over_dds(monkeypatch):
    from helpers.checkpoint_runs import one_camera_node
    from helpers.policy_harness import Harness
    from omni_ros.policy.xvla.runner import XVLATorchRunner

    # `control.blending: rtc` (guided, the default method): accepted at configure, and every chunk after the
    # first continues the one executing (the runner is handed its plan).
    plans: list = []
    sample = XVLATorchRunner.sample

    def spy(self, inputs, noise, num_steps, rtc=None):
        plans.append(rtc)
        return sample(self, inputs, noise, num_steps, rtc)

    monkeypatch.setattr(XVLATorchRunner, "sample", spy)
    # domain 2: the YAML's embodiment, not the checkpoint's saved 1
    node = one_camera_node(ARM, JOINTS, domain_id=2)

    def configure(cfg) -> None:
        node(cfg)
        cfg.control.blending = "rtc"

    harness = Harness(configure=configure).start(prompt="open the drawer")
    try:
        harness.wait_state("running", timeout=30)
        assert harness.wait_for(lambda: len(harness.chunks) >= 2, timeout=30)
        assert plans[0] is None and any(p is not None and p.request.method == "guided" for p in plans[1:])
        chunk = harness.chunks[-1]
        assert list(chunk.joint_names) == JOINTS and chunk.action_dim == 20 and chunk.horizon >= 1
        actions = np.asarray(chunk.actions).reshape(chunk.horizon, chunk.action_dim)
        assert np.isfinite(actions).all()
        # ee6d: the gripper channels (9 and 19) leave through a sigmoid, so they lie in (0, 1).
        assert ((actions[:, [9, 19]] > 0) & (actions[:, [9, 19]] < 1)).all()
        assert harness.wait_for(lambda: len(harness.commands) >= 5, timeout=30)
    finally:
        harness.close()


def test_eval_replays_a_bag_through_an_xvla_checkpoint(tmp_path):
    from helpers.checkpoint_runs import replay_metrics
    from omni_ros.eval.synthetic import SyntheticSpec

    rng = np.random.default_rng(3)
    spec = SyntheticSpec(
        duration_s=1.0,
        joint_names=list(JOINTS),
        cameras={"top": ("/cam/top", 10.0)},
        offset=list(rng.uniform(-0.5, 0.5, 20)),
        slope=list(rng.uniform(-0.2, 0.2, 20)),
        amplitude=list(rng.uniform(0.0, 0.3, 20)),
        omega=list(rng.uniform(0.0, 4.0, 20)),
    )
    metrics = replay_metrics(tmp_path, ARM, spec)
    assert metrics["policy"]["model"] == "xvla_1cam" and metrics["overall"]["evaluated"] >= 5
    assert np.isfinite(metrics["overall"]["mae"])


def test_the_head_steps_take_the_threads_their_timing_chose():
    """With two torch threads each head step runs on the torch threads its timing chose (cpu_threads.StepThreads:
    one and two timed, the faster kept, as for the other families' denoising steps), plain and guided RTC steps
    timed apart; torch's threads are back as set after each chunk, and the chunk is still LeRobot's (TOL: float
    sums in another order)."""
    import torch

    from omni_ros.cpu_threads import StepThreads
    from omni_ros.policy.rtc import RtcRequest

    torch.set_num_threads(2)  # torch_one_thread restores the thread count after the test
    pol = omni_ros.policy.load(REFERENCE / "xvla_1cam")
    runner = pol.runner
    assert runner.step_threads is not None and runner.step_threads.candidates == (1, 2)
    assert runner.guided_step_threads is not None and runner.guided_step_threads.candidates == (1, 2)
    seen: list[int] = []
    real = runner.model.transformer.step

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    runner.model.transformer.step = spy
    runner.step_threads = plain = StepThreads((1, 2), samples=2, warmup=0)
    _, data, obs = case("xvla_1cam", "pick_domain1")
    for _ in range(2):
        out = pol.infer(obs, noise=data["noise"][0])
        np.testing.assert_allclose(out["actions"], data["actions"][0], rtol=0, atol=TOL)
        assert torch.get_num_threads() == 2
    steps = len(seen) // 2
    assert steps >= 3 and sorted(seen[:4]) == [1, 1, 2, 2] and plain.chosen in (1, 2)
    assert seen[4:] == [plain.chosen] * (2 * steps - 4)

    runner.guided_step_threads = None  # the threads as set: the guided baseline
    request = RtcRequest(prev_actions=out["actions"] + 0.5 * out["actions"].std(), inference_delay=4)
    seen.clear()
    baseline = pol.infer(obs, noise=data["noise"][0], rtc=request)["actions"]
    assert seen == [2] * steps
    runner.guided_step_threads = guided = StepThreads((1, 2), samples=2, warmup=0)
    seen.clear()
    timings = {n: list(t) for n, t in plain.timings.items()}
    for _ in range(2):
        again = pol.infer(obs, noise=data["noise"][0], rtc=request)["actions"]
        np.testing.assert_allclose(again, baseline, rtol=0, atol=TOL)
    assert sorted(seen[:4]) == [1, 1, 2, 2] and guided.chosen in (1, 2)
    assert seen[4:] == [guided.chosen] * (2 * steps - 4)
    assert plain.timings == timings  # guided steps are not timed as plain ones
