"""Real checkpoint layouts: tiny random LeRobot / openpi pi0 and pi0.5 folders give LeRobot's own actions.

The fixtures (test/fixtures/reference, `make reference-fixtures`) were written by LeRobot 0.6.1's
`save_pretrained` and run through its full pipeline (pre-processor, `predict_action_chunk` with fixed noise,
post-processor); each case stores the robot's raw observation, the noise, LeRobot's actions and its
intermediate tensors. No LeRobot is installed here: these tests load the folders with `omni_ros.policy.load`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import omni_ros.policy
from omni_ros.policy.layouts import CheckpointError, detect

REFERENCE = Path(__file__).parent / "fixtures" / "reference"
MANIFEST = json.loads((REFERENCE / "manifest.json").read_text())
PI0_FIXTURES = [name for name, f in MANIFEST["fixtures"].items() if f["family"] == "pi0"]
TOKENIZER = REFERENCE / "pi0_3cam" / "tokenizer.json"  # openpi folders ship none
TOL = 1e-4
pytestmark = pytest.mark.usefixtures("torch_one_thread")


def cases(family: str = "pi0") -> list[tuple[str, str]]:
    return [(name, case) for name, f in MANIFEST["fixtures"].items() if f["family"] == family for case in f["cases"]]


def tensors(fixture: str, case: str) -> dict[str, np.ndarray]:
    return {
        k: v.numpy() for k, v in load_file(REFERENCE / MANIFEST["fixtures"][fixture]["cases"][case]["file"]).items()
    }


def observation(fixture: str, case: str) -> dict:
    """The case's raw robot observation under the policy's camera names (openpi's fixed ones for openpi)."""
    info, data = MANIFEST["fixtures"][fixture], tensors(fixture, case)
    to_openpi = {v: k for k, v in info.get("cameras_openpi_to_lerobot", {}).items()}
    images = {}
    for key, value in data.items():
        if key.startswith("observation/observation.images."):
            feature = key[len("observation/") :]
            images[to_openpi.get(feature, feature.removeprefix("observation.images."))] = value
    return {"images": images, "state": data["observation/observation.state"], "prompt": info["cases"][case]["prompt"]}


_POLICIES: dict[str, object] = {}


def policy(fixture: str):
    if fixture not in _POLICIES:
        tokenizer = TOKENIZER if MANIFEST["fixtures"][fixture]["layout"] == "openpi" else None
        _POLICIES[fixture] = omni_ros.policy.load(REFERENCE / fixture, tokenizer=tokenizer)
    return _POLICIES[fixture]


@pytest.mark.parametrize(("fixture", "case"), cases())
def test_actions_match_lerobot(fixture, case):
    data = tensors(fixture, case)
    out = policy(fixture).infer(observation(fixture, case), noise=data["noise"][0])["actions"]
    assert out.shape == data["actions"][0].shape
    np.testing.assert_allclose(out, data["actions"][0], rtol=0, atol=TOL)


@pytest.mark.parametrize(("fixture", "case"), [c for c in cases() if c[0].startswith(("pi0_", "pi05_"))])
def test_inputs_match_lerobot_step_for_step(fixture, case):
    """Tokens exactly, images and state to float precision: where a parity failure would come from."""
    data, pol = tensors(fixture, case), policy(fixture)
    parsed = pol.processor.parse(observation(fixture, case))
    inputs = pol.processor.inputs([parsed])
    np.testing.assert_array_equal(inputs.tokens[0].numpy()[inputs.token_mask[0].numpy()],
                                  data["debug/tokens"][0][data["debug/token_mask"][0]])  # fmt: skip
    np.testing.assert_array_equal(inputs.token_mask.numpy(), data["debug/token_mask"])
    # LeRobot puts present cameras first and appends blanks; ours keep the declared slots. Same set of images.
    present = inputs.image_masks[0].numpy()
    reference = data["debug/images"][0][data["debug/image_masks"][0]]
    np.testing.assert_allclose(inputs.images[0].numpy()[present], reference, rtol=0, atol=1e-6)
    assert np.all(inputs.images[0].numpy()[~present] == -1.0)
    if "debug/state_padded" in data:
        np.testing.assert_allclose(inputs.state.numpy(), data["debug/state_padded"], rtol=0, atol=1e-6)


def test_layouts_are_detected():
    assert detect(REFERENCE / "pi0_3cam") == "lerobot" and detect(REFERENCE / "pi05_2cam") == "lerobot"
    assert detect(REFERENCE / "openpi_pi0") == "openpi" and detect(REFERENCE / "openpi_pi05") == "openpi"
    assert detect(Path(__file__).parent.parent / "checkpoints" / "demo") == "omni_ros"


def test_metadata_and_noise_shape_of_a_lerobot_pi0():
    meta = policy("pi0_3cam").metadata
    assert meta.camera_names == ("top", "left_wrist", "right_wrist")
    assert (meta.state_dim, meta.action_dim, meta.action_horizon) == (8, 7, 10)
    assert meta.noise_shape == (10, 32)  # openpi's (action_horizon, model action dim)
    with pytest.raises(ValueError, match=r"noise has shape \(10, 7\), expected \(10, 32\)"):
        policy("pi0_3cam").infer(observation("pi0_3cam", "all_cameras"), noise=np.zeros((10, 7), np.float32))


def test_pre_0_4_key_paths_load_the_same(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(REFERENCE / "pi0_3cam", old)
    weights = load_file(old / "model.safetensors")
    renamed = {
        k.replace("paligemma.model.language_model.", "paligemma.language_model.model.")
        .replace("paligemma.model.vision_tower.", "paligemma.vision_tower.")
        .replace("paligemma.model.multi_modal_projector.", "paligemma.multi_modal_projector."): v
        for k, v in weights.items()
    }
    assert renamed.keys() != weights.keys()
    save_file(renamed, old / "model.safetensors")
    data = tensors("pi0_3cam", "all_cameras")
    out = omni_ros.policy.load(old).infer(observation("pi0_3cam", "all_cameras"), noise=data["noise"][0])
    np.testing.assert_allclose(out["actions"], data["actions"][0], rtol=0, atol=TOL)


def test_bf16_weights_load_in_either_dtype():
    # The openpi fixture is stored in bf16 (openpi's default): float32 computes with the cast weights, bfloat16
    # keeps the file's tensors as they are (memory-mapped, no copy).
    f32 = omni_ros.policy.load(REFERENCE / "openpi_pi0", tokenizer=TOKENIZER)
    assert next(f32.runner.model.parameters()).dtype == torch.float32
    bf16 = omni_ros.policy.load(REFERENCE / "openpi_pi0", tokenizer=TOKENIZER, dtype="bfloat16")
    assert {p.dtype for p in bf16.runner.model.parameters()} == {torch.bfloat16}
    obs = observation("openpi_pi0", "all_cameras")
    a, b = f32.infer(obs)["actions"], bf16.infer(obs)["actions"]
    # Same weights, bfloat16 arithmetic: the same chunk to bfloat16's precision (a random tiny model amplifies
    # rounding far more than a trained one).
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.95 and np.abs(a - b).mean() < 0.2 * a.std()


def test_policy_info_names_layout_family_and_tokenizer(root):
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "omni_ros.cli",
        "policy",
        "info",
        "--json",
        "--checkpoint",
        str(REFERENCE / "pi05_2cam"),
    ]
    info = json.loads(subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True, timeout=120).stdout)
    assert info["layout"] == "lerobot" and info["family"] == "pi0 (pi05)"
    assert info["cameras"] == ["top", "left_wrist"] and (info["state_dim"], info["action_dim"]) == (7, 6)
    assert info["normalization"] == {"state": "quantile", "action": "quantile", "epsilon": "lerobot"}
    assert info["tokenizer"]["source"].endswith("pi05_2cam/tokenizer.json") and info["tokenizer"]["max_tokens"] == 200


# -- bad input: one clear error each ------------------------------------------------------------------------------


def _copy(tmp_path, name="pi0_3cam") -> Path:
    return Path(shutil.copytree(REFERENCE / name, tmp_path / name))


def test_a_folder_of_no_known_layout(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hello": "world"}))
    with pytest.raises(CheckpointError, match="not a checkpoint folder omni_ros knows"):
        omni_ros.policy.load(tmp_path)


def test_an_unsupported_lerobot_policy_type(tmp_path):
    folder = _copy(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "type": "act"}))
    with pytest.raises(CheckpointError, match="LeRobot policy type 'act' is not supported; omni_ros runs pi0, pi05"):
        omni_ros.policy.load(folder)


def test_missing_processor_statistics(tmp_path):
    folder = _copy(tmp_path)
    next(folder.glob("policy_preprocessor_step_*_normalizer_processor.safetensors")).unlink()
    with pytest.raises(CheckpointError, match=r"normalization statistics file .* is missing"):
        omni_ros.policy.load(folder)
    (folder / "policy_preprocessor.json").unlink()
    with pytest.raises(CheckpointError, match=r"no policy_preprocessor\.json"):
        omni_ros.policy.load(folder)


def test_a_tokenizer_smaller_than_the_embedding_is_accepted(tmp_path):
    # Models pad the embedding past the tokenizer (Qwen2.5: 151,665 tokens, 151,936 rows): a smaller
    # tokenizer can never emit an id out of range. Dropping tokens from the end of the fixture's own tokenizer
    # leaves the prompt's ids unchanged, so the actions stay LeRobot's.
    data = json.loads(TOKENIZER.read_text())
    vocab = data["model"]["vocab"]
    used = set(tensors("pi0_3cam", "all_cameras")["debug/tokens"][0].tolist())
    top = max(vocab.values())
    dropped = [t for t, i in vocab.items() if i > top - 5 and i not in used]
    assert dropped, "the fixture tokenizer's last ids are all used by the prompt"
    for token in dropped:
        del vocab[token]
    data["model"]["merges"] = [
        m for m in data["model"]["merges"] if "".join(m if isinstance(m, list) else m.split(" ")) not in dropped
    ]
    small = tmp_path / "small" / "tokenizer.json"
    small.parent.mkdir()
    small.write_text(json.dumps(data))
    loaded = omni_ros.policy.load(REFERENCE / "pi0_3cam", tokenizer=small)
    assert loaded.processor.tokenizer.id_bound < 378
    data_case = tensors("pi0_3cam", "all_cameras")
    out = loaded.infer(observation("pi0_3cam", "all_cameras"), noise=data_case["noise"][0])["actions"]
    np.testing.assert_allclose(out, data_case["actions"][0], rtol=0, atol=TOL)


def test_a_tokenizer_with_ids_past_the_embedding_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    big = tmp_path / "big.json"
    Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1, "go": 400}, unk_token="<unk>")).save(str(big))
    with pytest.raises(
        CheckpointError, match=r"can emit ids up to 400, past the end of the token embedding \(378 rows\)"
    ):
        omni_ros.policy.load(REFERENCE / "pi0_3cam", tokenizer=big)


def test_a_tokenizer_folder_named_relative_to_the_checkpoint(tmp_path):
    # LeRobot's newer save_artifacts writes tokenizer_name "tokenizer": a folder inside the checkpoint.
    folder = _copy(tmp_path)
    (folder / "tokenizer").mkdir()
    shutil.move(folder / "tokenizer.json", folder / "tokenizer" / "tokenizer.json")
    pre = json.loads((folder / "policy_preprocessor.json").read_text())
    for step in pre["steps"]:
        if step.get("registry_name") == "tokenizer_processor":
            step["config"]["tokenizer_name"] = "tokenizer"
    (folder / "policy_preprocessor.json").write_text(json.dumps(pre))
    loaded = omni_ros.policy.load(folder)
    assert loaded.processor.tokenizer.path == folder / "tokenizer" / "tokenizer.json"


def test_no_tokenizer_says_which_file_to_put_where(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("OPENPI_DATA_HOME", str(tmp_path / "openpi"))
    with pytest.raises(CheckpointError, match=r"put the tokenizer\.json .* of google/paligemma-3b-pt-224 in"):
        omni_ros.policy.load(REFERENCE / "openpi_pi0")


def test_a_local_hf_cache_entry_is_found(tmp_path, monkeypatch):
    snapshot = tmp_path / "hf" / "hub" / "models--google--paligemma-3b-pt-224" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    shutil.copy(TOKENIZER, snapshot / "tokenizer.json")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    loaded = omni_ros.policy.load(REFERENCE / "openpi_pi0")
    data = tensors("openpi_pi0", "all_cameras")
    out = loaded.infer(observation("openpi_pi0", "all_cameras"), noise=data["noise"][0])["actions"]
    np.testing.assert_allclose(out, data["actions"][0], rtol=0, atol=TOL)


def test_truncated_weights(tmp_path):
    folder = _copy(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        omni_ros.policy.load(folder)


def test_weights_of_another_variant(tmp_path):
    folder = _copy(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "type": "pi05"}))
    with pytest.raises(CheckpointError, match="says 'pi05' but the weights are a pi0 model"):
        omni_ros.policy.load(folder)


def test_a_lerobot_pi0_exports_to_xnnpack_and_matches_eager(tmp_path):
    """Staged methods, fp32: the .pte (tanh GELU written out, float32 time embedding) within 1e-4 of eager."""
    from omni_ros.backends.executorch_runner import load_pte
    from omni_ros.export.exporter import export_checkpoint

    result = export_checkpoint(
        REFERENCE / "pi0_arm", tmp_path / "arm.pte", methods=("encode_images", "prefill", "denoise_step")
    )
    assert (tmp_path / "arm.pte.tokenizer.json").is_file()  # the tokenizer travels with the program
    program = load_pte(result.pte)
    assert program.metadata.noise_shape == (10, 32) and program.metadata.camera_names == ("top", "left_wrist")
    data = tensors("pi0_arm", "all_cameras")
    obs = observation("pi0_arm", "all_cameras")
    eager = policy("pi0_arm").infer(obs, noise=data["noise"][0])["actions"]
    exported = program.infer(obs, noise=data["noise"][0])["actions"]
    np.testing.assert_allclose(exported, eager, rtol=0, atol=TOL)
    np.testing.assert_allclose(exported, data["actions"][0], rtol=0, atol=TOL)


def test_a_lerobot_pi05_exports_to_onnx_and_matches_eager_on_the_cpu_ep(tmp_path):
    """Staged graphs on ONNX Runtime's CPU EP, every case of the pi0.5 fixture: within 1e-4 of eager and LeRobot."""
    from omni_ros.backends.onnx_runner import load_onnx
    from omni_ros.export.exporter import export_checkpoint

    result = export_checkpoint(
        REFERENCE / "pi05_2cam", tmp_path / "pi05", target="onnx", methods=("encode_images", "prefill", "denoise_step")
    )
    graphs = load_onnx(result.pte, num_threads=1)
    assert graphs.metadata.noise_shape == policy("pi05_2cam").metadata.noise_shape
    for case in MANIFEST["fixtures"]["pi05_2cam"]["cases"]:
        data, obs = tensors("pi05_2cam", case), observation("pi05_2cam", case)
        eager = policy("pi05_2cam").infer(obs, noise=data["noise"][0])["actions"]
        exported = graphs.infer(obs, noise=data["noise"][0])["actions"]
        np.testing.assert_allclose(exported, eager, rtol=0, atol=TOL, err_msg=case)
        np.testing.assert_allclose(exported, data["actions"][0], rtol=0, atol=TOL, err_msg=case)
