"""SmolVLA from a LeRobot folder: actions match the real LeRobot 0.6.1 (fixtures written by it), missing cameras
are dropped as LeRobot drops them, the prefix runs once per chunk, and bad folders get clear errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from omni_ros.backends.factory import load_policy
from omni_ros.config import PolicyConfig
from omni_ros.observation import ObservationError
from omni_ros.policy import load
from omni_ros.policy.layouts import CheckpointError
from omni_ros.policy.smolvla.processing import resize_with_pad_left_top

pytestmark = pytest.mark.usefixtures("torch_one_thread")

TOL = 1e-4  # actions vs LeRobot's, robot units (measured: <= 2.5e-6, bench/lerobot_agreement.py)


def _fixture(root):
    reference = root / "test" / "fixtures" / "reference"
    manifest = json.loads((reference / "manifest.json").read_text())["fixtures"]["smolvla_3cam"]
    return reference, manifest


def _case(reference, case) -> tuple[dict, dict]:
    tensors = load_file(str(reference / case["file"]))
    images = {
        k.removeprefix("observation.images."): tensors[f"observation/{k}"].numpy() for k in case["present_cameras"]
    }
    obs = {"images": images, "state": tensors["observation/observation.state"].numpy(), "prompt": case["prompt"]}
    return obs, tensors


@pytest.fixture(scope="module")
def fixture(root):
    return _fixture(root)


@pytest.fixture(scope="module")
def policy(fixture):
    reference, manifest = fixture
    return load(reference / manifest["path"])


def test_fixture_covers_one_to_three_cameras_and_a_long_prompt(fixture):
    _, manifest = fixture
    counts = {len(c["present_cameras"]) for c in manifest["cases"].values()}
    assert counts == {1, 2, 3}
    assert any(c["num_valid_tokens"] == 48 and len(c["prompt"]) > 100 for c in manifest["cases"].values())


@pytest.mark.parametrize("case_name", ["all_cameras", "missing_left_wrist", "only_top", "long_prompt"])
def test_actions_match_lerobot(fixture, policy, case_name):
    reference, manifest = fixture
    case = manifest["cases"][case_name]
    obs, tensors = _case(reference, case)
    out = policy.infer(obs, noise=tensors["noise"][0].numpy())
    expected = tensors["actions"][0].numpy()
    assert out["actions"].shape == expected.shape == (manifest["chunk_size"], manifest["action_dim"])
    np.testing.assert_allclose(out["actions"], expected, rtol=0, atol=TOL)

    # The model saw LeRobot's inputs: its tiles of the present cameras, no BOS, the prompt cut on the left.
    inputs = policy.processor.inputs([policy.processor.parse(obs)])
    present = inputs.image_masks[0]
    assert present.tolist() == [n in case["present_cameras"] for n in manifest["cameras"]]
    torch.testing.assert_close(inputs.images[0][present], tensors["debug/images"][0], rtol=0, atol=1e-6)
    assert inputs.tokens[0][inputs.token_mask[0]].tolist() == case["token_ids"]
    torch.testing.assert_close(inputs.state[0], tensors["debug/state_padded"][0], rtol=0, atol=1e-6)


def test_missing_camera_is_dropped_not_a_blank_image(fixture, policy):
    """LeRobot's SmolVLA drops a missing camera; a blank image in its slot (pi0's convention) is another model."""
    reference, manifest = fixture
    obs, tensors = _case(reference, manifest["cases"]["missing_left_wrist"])
    noise = tensors["noise"][0].numpy()
    blank = dict(obs, images={**obs["images"], "left_wrist": np.zeros((40, 30, 3), np.uint8)})
    dropped, shown = policy.infer(obs, noise=noise)["actions"], policy.infer(blank, noise=noise)["actions"]
    np.testing.assert_allclose(dropped, tensors["actions"][0].numpy(), rtol=0, atol=TOL)
    assert np.abs(shown - dropped).max() > 1e-2


def test_batch_of_different_cameras_and_prompts_equals_one_by_one(fixture, policy):
    reference, manifest = fixture
    cases = [_case(reference, c) for c in manifest["cases"].values()]
    noise = np.stack([t["noise"][0].numpy() for _, t in cases])
    batched = policy.infer_batch([obs for obs, _ in cases], noise=noise)
    for (_, tensors), out in zip(cases, batched, strict=True):
        np.testing.assert_allclose(out["actions"], tensors["actions"][0].numpy(), rtol=0, atol=TOL)


def test_prefix_runs_once_per_chunk(fixture, policy, monkeypatch):
    reference, manifest = fixture
    obs, tensors = _case(reference, manifest["cases"]["all_cameras"])
    model, calls = policy.runner.model, []
    for stage in ("embed_prefix", "prefill", "denoise_step"):
        original = getattr(model, stage)
        monkeypatch.setattr(model, stage, lambda *a, _f=original, _s=stage, **k: calls.append(_s) or _f(*a, **k))
    policy.infer(obs, noise=tensors["noise"][0].numpy())
    assert calls == ["embed_prefix", "prefill"] + ["denoise_step"] * 10


def test_through_the_factory_like_node_bridge_and_evaluator(fixture):
    reference, manifest = fixture
    config = PolicyConfig(checkpoint=str(reference / manifest["path"]), seed=3)
    cameras = [c.removeprefix("observation.images.") for c in manifest["cameras"]]
    policy = load_policy(
        config, camera_names=cameras, state_dim=manifest["state_dim"], action_dim=manifest["action_dim"]
    )
    meta = policy.metadata
    assert (meta.noise_shape, meta.action_horizon, meta.image_size) == ((8, 32), 8, 32)
    obs, _ = _case(reference, manifest["cases"]["only_top"])
    first, again = policy.infer(obs)["actions"], policy.infer(obs)["actions"]
    np.testing.assert_array_equal(first, again)  # seeded noise
    with pytest.raises(ObservationError, match="state has length 5, expected 6"):
        policy.infer(dict(obs, state=np.zeros(5)))
    with pytest.raises(ObservationError, match="no camera images"):
        policy.infer(dict(obs, images={}))


def test_resize_pads_left_and_top():
    image = torch.rand(3, 20, 40)
    tile = resize_with_pad_left_top(image, 32)
    assert tile.shape == (3, 32, 32)
    assert torch.all(tile[:, :16] == 0) and torch.all(tile[:, 16:] > 0)  # landscape: the padding on top
    tall = resize_with_pad_left_top(torch.rand(3, 40, 20), 32)
    assert torch.all(tall[:, :, :16] == 0) and torch.all(tall[:, :, 16:] > 0)  # portrait: on the left


# -- bad folders ------------------------------------------------------------------------------------------------


@pytest.fixture
def folder(fixture, tmp_path):
    reference, manifest = fixture
    dst = tmp_path / "smolvla"
    shutil.copytree(reference / manifest["path"], dst)
    return dst


def _edit(path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        target = data
        *parents, leaf = key.split("__")
        for p in parents:
            target = target[p]
        target[leaf] = value
    path.write_text(json.dumps(data))


def test_unsupported_vlm_layout(folder):
    _edit(folder / "vlm" / "config.json", model_type="paligemma")
    with pytest.raises(CheckpointError, match=r"vlm_model_name layout 'paligemma'.*not supported"):
        load(folder)


def test_vlm_not_on_this_machine(folder):
    _edit(folder / "config.json", vlm_model_name="someone/SomeVLM-1B")
    with pytest.raises(CheckpointError, match=r"'someone/SomeVLM-1B' is neither a folder.*never downloads"):
        load(folder)


def test_missing_tokenizer_names_what_to_put_where(folder):
    (folder / "tokenizer.json").unlink()
    (folder / "vlm" / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"no tokenizer found; put the tokenizer.json .* of vlm"):
        load(folder)


def test_tokenizer_from_the_vlm_folder_or_given(folder, fixture):
    (folder / "tokenizer.json").unlink()
    assert load(folder).processor.tokenizer.path == folder / "vlm" / "tokenizer.json"
    reference, manifest = fixture
    given = reference / manifest["path"] / "tokenizer.json"
    assert load(folder, tokenizer=given).processor.tokenizer.path == given


def test_tokenizer_bigger_than_the_embedding_refused(folder):
    data = json.loads((folder / "tokenizer.json").read_text())
    for i in range(20):
        data["added_tokens"].append(
            {"id": 311 + i, "content": f"<extra_{i}>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
        )  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(
        CheckpointError, match=r"can emit ids up to 330, past the end of the token embedding \(311 rows\)"
    ):
        load(folder)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"max_state_dim": 16}, "max_state_dim is 16 in the config but 32 in the weights"),
        ({"expert_width_multiplier": 0.75}, "expert width .* is 24 in the config but 16 in the weights"),
        ({"num_vlm_layers": 6}, "num_vlm_layers is 6 in the config but 3 text layers in the weights"),
        ({"input_features__observation.state__shape": [7]}, "norm_stats.state_mean has 6 values, expected 7"),
        ({"add_image_special_tokens": True}, "add_image_special_tokens .* is not supported"),
        ({"resize_imgs_with_padding": [32, 24]}, "needs a square tile"),
    ],
)
def test_mismatched_config_refused(folder, change, message):
    _edit(folder / "config.json", **change)
    with pytest.raises((CheckpointError, ValueError), match=message):
        load(folder)


def test_mismatched_weights_refused(folder):
    from safetensors.torch import save_file

    weights = load_file(str(folder / "model.safetensors"))
    weights["model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight"] = torch.zeros(8, 16)
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"shape mismatches .*expert.layers.1.k_proj.weight"):
        load(folder)
    del weights["model.state_proj.bias"]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing 1 tensors .*state_proj.bias"):
        load(folder)


def test_policy_info_reads_the_folder_without_weights(fixture, capsys):
    from omni_ros.cli import main

    reference, manifest = fixture
    assert main(["policy", "info", "--checkpoint", str(reference / manifest["path"]), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "smolvla" and info["layout"] == "lerobot" and info["image_tokens_per_camera"] == 16
    # LeRobot's count less what never reaches an action: the VLM's lm_head (311 x 32) and final norm (32).
    assert info["parameters"]["total"] == manifest["param_count"] - 311 * 32 - 32
    assert info["prefix_tokens"] == 3 * 16 + 48 + 1
    # A LeRobot folder records no action rate: said, with the default it would play at.
    assert info["action_dt"] == 0.02 and info["action_dt_recorded"] is False
