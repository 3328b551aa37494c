"""The pi0-style policy: shapes, KV-cache equivalence, determinism, checkpoints, training."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_ros.backends.factory import load_policy
from omni_ros.config import ConfigError, PolicyConfig
from omni_ros.observation import ObservationError, make_observation
from omni_ros.policy.inputs import ModelInputs
from omni_ros.policy.layouts.omni import CheckpointError, load_checkpoint, save_checkpoint
from omni_ros.policy.loading import from_model, from_preset, load
from omni_ros.policy.normalize import NormStats
from omni_ros.policy.pi0.modeling import Pi0Model, count_parameters
from omni_ros.policy.pi0.presets import PRESETS, preset
from omni_ros.policy.torch_runner import resolve_device
from omni_ros.policy.train import Trainer

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def observation(cfg, seed=0, prompt="reach the red block", cameras=None):
    rng = np.random.default_rng(seed)
    cameras = cameras or cfg.camera_names
    return {
        "images": {n: rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for n in cameras},
        "state": rng.normal(size=cfg.state_dim),
        "prompt": prompt,
    }


def model_batch(cfg, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    s, c, t = cfg.vision.image_size, len(cfg.camera_names), cfg.tokenizer.max_tokens
    token_mask = torch.zeros(batch, t, dtype=torch.bool)
    token_mask[:, : t // 2] = True
    return ModelInputs(
        images=torch.rand(batch, c, 3, s, s, generator=g) * 2 - 1,
        image_masks=torch.tensor([[True] + [i % 2 == 0] * (c - 1) for i in range(batch)]),
        tokens=torch.randint(0, 256, (batch, t), generator=g),
        token_mask=token_mask,
        state=torch.randn(batch, cfg.state_dim, generator=g),
    )


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_stage_shapes(name):
    cfg = preset(name)
    model = Pi0Model(cfg).eval()
    b = model_batch(cfg)
    with torch.inference_mode():
        prefix, mask = model.embed_prefix(b)
        assert prefix.shape == (2, cfg.prefix_len, cfg.backbone.width) and mask.shape == (2, cfg.prefix_len)
        cache = model.prefill(prefix, mask)
        assert len(cache) == cfg.backbone.depth
        assert cache[0][0].shape == (2, cfg.backbone.num_kv_heads, cfg.prefix_len, cfg.backbone.head_dim)
        x = torch.randn(2, cfg.action_horizon, cfg.action_dim)
        v = model.denoise_step(cache, mask, b.state, x, torch.full((2,), 0.5))
        assert v.shape == x.shape and torch.isfinite(v).all()


def test_small_preset_size_and_pi0_on_meta_device():
    small = count_parameters(Pi0Model(preset("small")))["total"]
    assert 30e6 < small < 50e6
    with torch.device("meta"):
        pi0 = Pi0Model(preset("pi0"))
    cfg = pi0.cfg
    assert cfg.backbone.width == 2048 and cfg.expert.width == 1024 and cfg.backbone.depth == cfg.expert.depth == 18
    assert cfg.vision.num_tokens == 256
    assert 2.5e9 < count_parameters(pi0)["total"] < 4e9
    assert set(PRESETS) >= {"tiny", "small", "pi0"}


def test_prefix_cache_sampling_equals_recompute():
    cfg = preset("tiny", action_horizon=10)
    torch.manual_seed(0)
    model = Pi0Model(cfg).eval()
    b = model_batch(cfg)
    noise = torch.randn(2, cfg.action_horizon, cfg.action_dim)
    with torch.inference_mode():
        cached = model.sample(b, noise, num_steps=10, use_cache=True)
        recomputed = model.sample(b, noise, num_steps=10, use_cache=False)
    assert (cached - recomputed).abs().max().item() < 1e-4
    # And it is a real integration: the result differs from the starting noise.
    assert (cached - noise).abs().max().item() > 1e-3


def test_prefix_does_not_see_suffix_and_padding_is_ignored():
    cfg = preset("tiny")
    model = Pi0Model(cfg).eval()
    b = model_batch(cfg, batch=1)
    with torch.inference_mode():
        prefix, mask = model.embed_prefix(b)
        cache = model.prefill(prefix, mask)
        # Changing a padded prompt token must not change the cache of valid tokens.
        tokens = b.tokens.clone()
        tokens[0, -1] = (tokens[0, -1] + 7) % 256
        prefix2, mask2 = model.embed_prefix(dataclasses.replace(b, tokens=tokens))
        cache2 = model.prefill(prefix2, mask2)
    valid = mask[0]
    for (k1, v1), (k2, v2) in zip(cache, cache2, strict=True):
        assert torch.allclose(k1[..., valid, :], k2[..., valid, :], atol=1e-6)
        assert torch.allclose(v1[..., valid, :], v2[..., valid, :], atol=1e-6)


def test_same_seed_same_actions_different_seed_different_actions():
    cfg = preset("tiny")
    obs = observation(cfg)
    a = from_preset("tiny", seed=3).infer(obs)["actions"]
    b = from_preset("tiny", seed=3).infer(obs)["actions"]
    c = from_preset("tiny", seed=4).infer(obs)["actions"]
    assert a.shape == (cfg.action_horizon, cfg.action_dim) and a.dtype == np.float32
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


def test_actions_depend_on_image_state_and_prompt():
    policy = from_preset("tiny", seed=0)
    cfg = policy.processor.cfg
    base = policy.infer(observation(cfg))["actions"]
    for changed in (observation(cfg, seed=1), observation(cfg, prompt="touch the blue block")):
        assert not np.allclose(base, policy.infer(changed)["actions"])


def test_batch_equals_single_requests():
    policy = from_preset("tiny", seed=0)
    obs = [observation(policy.processor.cfg, seed=i) for i in range(3)]
    batched = policy.infer_batch(obs)
    for o, r in zip(obs, batched, strict=True):
        assert np.allclose(policy.infer(o)["actions"], r["actions"], atol=1e-5)


def test_timing_reported(monkeypatch):
    # Where the time goes, not how much there is (speed is bench/'s): the pipeline's clock is replaced by one that
    # only moves when a stage says so, each stage advances it by its own known amount, and the timing dict must
    # put every millisecond in the stage that spent it and add up to infer_ms exactly.
    import types

    from omni_ros.policy import pipeline

    now = [100.0]
    monkeypatch.setattr(pipeline, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    policy = from_preset("tiny")
    model, steps = policy.runner.model, policy.num_steps

    def spending(fn, ms):
        def run(*args, **kwargs):
            now[0] += ms / 1e3
            return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(policy.processor, "parse", spending(policy.processor.parse, 3.0))
    model.embed_prefix = spending(model.embed_prefix, 5.0)
    model.prefill = spending(model.prefill, 80.0)
    model.denoise_step = spending(model.denoise_step, 30.0)
    timing = policy.infer(observation(preset("tiny")))["policy_timing"]
    assert set(timing) == {"preprocess_ms", "embed_prefix_ms", "prefill_ms", "denoise_ms", "infer_ms", "batch_size"}
    expected = {"preprocess_ms": 3.0, "embed_prefix_ms": 5.0, "prefill_ms": 80.0, "denoise_ms": 30.0 * steps}
    for key, ms in expected.items():
        assert timing[key] == pytest.approx(ms, abs=1e-6), key
    assert timing["infer_ms"] == pytest.approx(sum(expected.values()), abs=1e-6)
    assert timing["batch_size"] == 1


def test_norm_stats_unnormalize_outputs(tmp_path):
    cfg = preset("tiny")
    torch.manual_seed(0)
    model = Pi0Model(cfg)
    identity = from_model(model, NormStats.identity(cfg.state_dim, cfg.action_dim))
    stats = NormStats([0.0] * 8, [1.0] * 8, [float(i) for i in range(8)], [2.0] * 8)
    shifted = from_model(model, stats)
    obs = observation(cfg)
    a, b = identity.infer(obs)["actions"], shifted.infer(obs)["actions"]
    assert np.allclose(b, a * 2.0 + np.arange(8), atol=1e-5)


def test_invalid_observation_rejected_by_policy():
    policy = from_preset("tiny")
    obs = observation(policy.processor.cfg)
    obs["state"][2] = np.nan
    with pytest.raises(ObservationError, match="NaN"):
        policy.infer(obs)


def test_checkpoint_round_trip_gives_identical_actions(tmp_path):
    cfg = preset("tiny", camera_names=["top"], state_dim=5, action_dim=4)
    torch.manual_seed(1)
    model = Pi0Model(cfg)
    stats = NormStats([0.5] * 5, [2.0] * 5, [0.1] * 4, [3.0] * 4)
    save_checkpoint(tmp_path / "ckpt", model, stats, extra={"note": "test"})
    meta = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert meta["model"]["camera_names"] == ["top"] and meta["norm_stats"]["action_std"] == [3.0] * 4

    obs = observation(cfg)
    original = from_model(model, stats).infer(obs)["actions"]
    restored = load(tmp_path / "ckpt").infer(obs)["actions"]
    assert np.array_equal(original, restored)
    dense = load_policy(PolicyConfig(checkpoint=str(tmp_path / "ckpt"), cpu_linear="dense")).infer(obs)["actions"]
    assert np.array_equal(original, dense)
    # The config's default runs the linears oneDNN-packed: the same products, summed in another order.
    packed = load_policy(PolicyConfig(checkpoint=str(tmp_path / "ckpt"))).infer(obs)["actions"]
    np.testing.assert_allclose(packed, original, rtol=0, atol=1e-5)


def test_checkpoint_errors(tmp_path):
    cfg = preset("tiny")
    save_checkpoint(tmp_path / "good", Pi0Model(cfg), NormStats.identity(8, 8))
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing")

    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_checkpoint(tmp_path / "empty")

    truncated = tmp_path / "truncated"
    truncated.mkdir()
    (truncated / "config.json").write_text((tmp_path / "good" / "config.json").read_text())
    data = (tmp_path / "good" / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(truncated)

    mismatched = tmp_path / "mismatched"
    save_checkpoint(mismatched, Pi0Model(preset("tiny", action_dim=6)), NormStats.identity(8, 6))
    meta = json.loads((mismatched / "config.json").read_text())
    meta["model"]["action_dim"] = 8
    meta["norm_stats"] = json.loads((tmp_path / "good" / "config.json").read_text())["norm_stats"]
    (mismatched / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="shape mismatches"):
        load_checkpoint(mismatched)

    with pytest.raises(ConfigError, match="state_dim"):
        load_policy(PolicyConfig(checkpoint=str(tmp_path / "good")), state_dim=3)


def test_cuda_requested_without_cuda_fails_clearly():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        load_policy(PolicyConfig(device="cuda:0"))


def test_bfloat16_cpu_runs_close_to_float32():
    obs = observation(preset("tiny"))
    f32 = from_preset("tiny").infer(obs)["actions"]
    bf16 = from_preset("tiny", dtype="bfloat16")
    assert bf16.metadata.backend == "torch-cpu-bf16"
    out = bf16.infer(obs)["actions"]
    assert out.dtype == np.float32 and np.abs(out - f32).max() < 0.25


def test_training_step_reduces_loss():
    cfg = preset("tiny", action_horizon=4)
    torch.manual_seed(0)
    model = Pi0Model(cfg)
    trainer = Trainer(model, NormStats.identity(cfg.state_dim, cfg.action_dim), lr=3e-3, seed=0)
    spec = from_model(Pi0Model(cfg), NormStats.identity(8, 8)).spec
    rng = np.random.default_rng(0)
    obs = [make_observation(spec, observation(cfg, seed=i)) for i in range(8)]
    # A learnable target: each chunk is the state's first action_dim entries, repeated over the horizon.
    actions = np.stack([np.repeat(o.state[None, : cfg.action_dim], cfg.action_horizon, 0) for o in obs])
    actions = actions + 0.01 * rng.normal(size=actions.shape)
    batch = trainer.batch(obs, actions.astype(np.float32))

    def eval_loss() -> float:
        # Same noise and times every time, so the comparison is not at the mercy of the draw.
        with torch.no_grad():
            return float(model.loss(**batch, generator=torch.Generator().manual_seed(123)))

    before = eval_loss()
    losses = [trainer.step(batch) for _ in range(60)]
    after = eval_loss()
    assert after < 0.6 * before, (before, after, losses)


def test_spatial_keypoints_find_where_a_feature_fires():
    from omni_ros.policy.pi0.vision import SpatialKeypoints

    side, width = 6, 8
    kp = SpatialKeypoints(width, side, keypoints=2, out_width=4)
    with torch.no_grad():
        kp.logits.weight.zero_()
        kp.logits.bias.zero_()
        kp.logits.weight[0, 0] = 50.0  # keypoint 0 follows feature 0; keypoint 1 sees nothing (uniform)
    x = torch.zeros(1, side * side, width)
    row, col = 1, 4
    x[0, row * side + col, 0] = 1.0
    weights = torch.softmax(kp.logits(x), dim=1)
    points = weights.transpose(1, 2) @ kp.grid
    axis = torch.linspace(-1, 1, side)
    torch.testing.assert_close(points[0, 0], torch.stack([axis[col], axis[row]]), atol=1e-4, rtol=0)
    torch.testing.assert_close(points[0, 1], torch.zeros(2), atol=1e-5, rtol=0)
    assert kp(x).shape == (1, 2, 4)


def test_keypoint_tokens_extend_each_camera():
    cfg = preset("demo")
    assert cfg.vision.keypoints > 0
    model = Pi0Model(cfg).eval()
    images = torch.rand(2, len(cfg.camera_names), 3, cfg.vision.image_size, cfg.vision.image_size) * 2 - 1
    prompt = torch.randint(0, cfg.vocab_size, (2, cfg.tokenizer.max_tokens))
    mask = torch.ones_like(prompt, dtype=torch.bool)
    with torch.no_grad():
        tokens = model.encode_images(images, prompt, mask)
        assert tokens.shape[1] == len(cfg.camera_names) * cfg.vision.num_tokens
        assert cfg.vision.num_tokens == cfg.vision.keypoints, "the demo's cameras are keypoints only"
        assert cfg.prefix_len == tokens.shape[1] + cfg.tokenizer.max_tokens
        # FiLM: the prompt changes the image tokens; without one a prompt-conditioned encoder refuses to run.
        other = model.encode_images(images, (prompt + 1) % cfg.vocab_size, mask)
        assert (other - tokens).abs().max() > 1e-4
        with pytest.raises(ValueError, match="prompt tokens"):
            model.encode_images(images)
    both = dataclasses.replace(cfg.vision, keypoints_only=False)
    assert both.num_tokens == both.grid_tokens + both.keypoints


def test_masked_cameras_and_padding_are_left_out_without_changing_actions():
    from omni_ros.policy.torch_runner import compact

    policy = from_preset("tiny", seed=0)
    cfg = policy.processor.cfg
    obs = observation(cfg, cameras=["base"], prompt="go")  # the wrist camera is declared but absent
    inputs = policy.processor.inputs([policy.processor.parse(obs)])
    small = compact(inputs)
    assert (
        small.images.shape[1] == 1 and small.tokens.shape[1] == int(inputs.token_mask.sum()) < cfg.tokenizer.max_tokens
    )
    compacted = policy.infer(obs)["actions"]
    policy.runner.compact = False
    np.testing.assert_allclose(policy.infer(obs)["actions"], compacted, rtol=0, atol=1e-5)


def test_a_lerobot_checkpoint_plays_at_the_configured_action_period_and_warns_without_one(caplog):
    # LeRobot checkpoints record no fps: without policy.action_dt the chunk plays 0.02 s apart, said once per
    # folder; with it, every reader of the metadata (executor, bridge, evaluator) gets the dataset's period.
    from omni_ros.policy import loading

    folder = Path(__file__).parent / "fixtures" / "reference" / "pi0_1cam"
    loading._rate_warned.discard(str(folder))
    with caplog.at_level(logging.WARNING, logger="omni_ros.policy"):
        default = load_policy(PolicyConfig(checkpoint=str(folder), precision="fp32"))
    assert default.metadata.action_dt == pytest.approx(0.02)
    assert [r for r in caplog.records if "records no action rate" in r.getMessage()], caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="omni_ros.policy"):
        thirty = load_policy(PolicyConfig(checkpoint=str(folder), precision="fp32", action_dt=1 / 30))
    assert thirty.metadata.action_dt == pytest.approx(1 / 30, abs=1e-12)
    assert thirty.metadata.to_dict()["action_dt"] == pytest.approx(1 / 30, abs=1e-12)
    assert not [r for r in caplog.records if "records no action rate" in r.getMessage()]
    # The period changes when the actions play, not what they are.
    obs = observation(thirty.spec)
    np.testing.assert_allclose(thirty.infer(obs)["actions"], default.infer(obs)["actions"], rtol=0, atol=1e-6)


def test_an_omni_ros_checkpoint_keeps_its_recorded_period_unless_the_config_sets_one(tmp_path, caplog):
    cfg = dataclasses.replace(preset("tiny"), action_dt=0.05)
    save_checkpoint(tmp_path / "ckpt", Pi0Model(cfg), NormStats.identity(cfg.state_dim, cfg.action_dim))
    with caplog.at_level(logging.WARNING, logger="omni_ros.policy"):
        own = load_policy(PolicyConfig(checkpoint=str(tmp_path / "ckpt")))
    assert own.metadata.action_dt == pytest.approx(0.05)
    assert "records no action rate" not in caplog.text
    assert load_policy(PolicyConfig(checkpoint=str(tmp_path / "ckpt"), action_dt=0.1)).metadata.action_dt == 0.1
