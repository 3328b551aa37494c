"""Checkpoints LeRobot <= 0.3 saved (statistics inside the weights, no processor files) give LeRobot 0.3.3's own
actions, and `omni-ros checkpoint migrate` turns them into folders LeRobot >= 0.4 loads.

The fixtures (test/fixtures/legacy, `make reference-fixtures`) were written by the real LeRobot 0.3.3: tiny random
pi0 and SmolVLA policies (MIN_MAX state, MEAN_STD actions, a camera named `wrist_cam`) saved by its
`save_pretrained`, the actions computed by its own inference code (pi0: the same code with its bf16 casts as
float32; the native bf16 actions are stored beside them), and, for the migrated folders, the actions LeRobot
0.6.1's `from_pretrained` + `make_pre_post_processors` compute on them. No LeRobot is installed here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import omni_ros.policy
from omni_ros.policy.layouts import CheckpointError
from omni_ros.policy.layouts.migrate import migrate

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
MANIFEST = json.loads((LEGACY / "manifest.json").read_text())
# Measured on these fixtures: omni_ros in float32 is within 2e-6 of 0.3.3's float32 code. 1e-4 fails 0.6's image
# padding (1.3) and prompt truncation (1.4); the sampler's time rule (3e-5..1.5e-4) has its own, tighter test.
TOL = 1e-4
TIGHT = 1e-5
CASES = [(name, case) for name, f in MANIFEST["fixtures"].items() for case in f["cases"]]
MIGRATED = [(name, case) for name, cases in MANIFEST["migrated"]["fixtures"].items() for case in cases]
pytestmark = pytest.mark.usefixtures("torch_one_thread")

_POLICIES: dict[str, object] = {}


def policy(folder: str):
    if folder not in _POLICIES:
        _POLICIES[folder] = omni_ros.policy.load(LEGACY / folder)
    return _POLICIES[folder]


def case_data(name: str, case: str) -> tuple[dict, dict[str, np.ndarray]]:
    info = MANIFEST["fixtures"][name]["cases"][case]
    data = {k: v.numpy() for k, v in load_file(LEGACY / info["file"]).items()}
    images = {
        k.removeprefix("observation/observation.images."): v
        for k, v in data.items()
        if k.startswith("observation/observation.images.")
    }
    return {"images": images, "state": data["observation/observation.state"], "prompt": info["prompt"]}, data


@pytest.mark.parametrize(("name", "case"), CASES)
def test_legacy_folder_gives_lerobot_03_actions(name, case):
    obs, data = case_data(name, case)
    assert sorted(obs["images"]) == sorted(MANIFEST["fixtures"][name]["cases"][case]["present_cameras"])
    out = policy(name).infer(obs, noise=data["noise"][0])["actions"]
    assert out.shape == data["actions"].shape[1:]
    np.testing.assert_allclose(out, data["actions"][0], rtol=0, atol=TOL)


def test_lerobot_03_stepped_time_in_float32():
    # 0.3 kept t in float32 and added dt each step; t = 1 + k * dt differs by ~1e-7, which the time embedding's
    # 4e-3 period turns into ~1e-4 in the actions.
    worst = {}
    for name, case in [("pi0_legacy", "missing_wrist_cam"), ("smolvla_legacy", "long_prompt")]:
        obs, data = case_data(name, case)
        loaded = omni_ros.policy.load(LEGACY / name)
        assert loaded.processor.cfg.euler_time == "float32_accumulated"
        out = loaded.infer(obs, noise=data["noise"][0])["actions"]
        np.testing.assert_allclose(out, data["actions"][0], rtol=0, atol=TIGHT)
        loaded.processor.cfg.euler_time = "exact"
        worst[name] = np.abs(loaded.infer(obs, noise=data["noise"][0])["actions"] - data["actions"][0]).max()
    assert all(err > 2 * TIGHT for err in worst.values()), worst


def test_pi0_serves_n_action_steps_and_the_bf16_reference_is_near():
    entry = MANIFEST["fixtures"]["pi0_legacy"]
    obs, data = case_data("pi0_legacy", "all_cameras")
    loaded = policy("pi0_legacy")
    assert loaded.metadata.action_horizon == entry["n_action_steps"] != entry["chunk_size"]
    out = loaded.infer(obs, noise=data["noise"][0])["actions"]
    # 0.3.3 runs pi0 in bf16 natively: close to, not equal to, its own float32 code.
    assert 1e-3 < np.abs(data["actions_bf16"][0] - data["actions"][0]).max() < 0.1
    assert np.abs(out - data["actions_bf16"][0]).max() < 0.1


def test_policy_info_says_layout_and_era():
    from omni_ros.commands.policy import describe
    from omni_ros.policy import layouts

    old = describe(layouts.read(LEGACY / "pi0_legacy"))
    assert (old["layout"], old["lerobot_era"]) == ("lerobot", "<=0.3")
    assert old["normalization"] == {"state": "min_max", "action": "mean_std", "epsilon": "lerobot"}
    assert describe(layouts.read(LEGACY / "smolvla_legacy_migrated"))["lerobot_era"] == ">=0.4"
    out = subprocess.run(
        [sys.executable, "-m", "omni_ros.cli", "policy", "info", "--checkpoint", str(LEGACY / "smolvla_legacy")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert "layout:       lerobot saved by LeRobot <=0.3, family smolvla" in out


@pytest.mark.parametrize(("name", "case"), MIGRATED)
def test_migrated_folder_gives_lerobot_061_and_03_actions(name, case):
    obs, data = case_data(name, case)
    lerobot_061 = load_file(LEGACY / MANIFEST["migrated"]["fixtures"][name][case]["file"])["actions"].numpy()
    out = policy(f"{name}_migrated").infer(obs, noise=data["noise"][0])["actions"]
    np.testing.assert_allclose(out, lerobot_061[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(out, data["actions"][0], rtol=0, atol=TOL)


def test_migrate_writes_what_the_committed_folders_hold(tmp_path):
    for name in MANIFEST["fixtures"]:
        report = migrate(LEGACY / name, tmp_path / name)
        committed = LEGACY / f"{name}_migrated"
        files = sorted(p.relative_to(committed) for p in committed.rglob("*") if p.is_file())
        assert sorted(p.relative_to(tmp_path / name) for p in (tmp_path / name).rglob("*") if p.is_file()) == files
        for rel in files:
            if rel.suffix == ".safetensors":
                a, b = load_file(committed / rel), load_file(tmp_path / name / rel)
                assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            else:
                assert (committed / rel).read_bytes() == (tmp_path / name / rel).read_bytes(), rel
        assert not any(k.startswith(("normalize_", "unnormalize_")) for k in load_file(committed / "model.safetensors"))
        assert report["to"] == str(tmp_path / name)
    # Feature names keep their underscores (LeRobot's own migration script recovers them from buffer names).
    pre = json.loads((LEGACY / "pi0_legacy_migrated" / "policy_preprocessor.json").read_text())
    normalizer = next(s for s in pre["steps"] if s["registry_name"] == "normalizer_processor")
    assert "observation.images.wrist_cam" in normalizer["config"]["features"]
    stats = load_file(LEGACY / "pi0_legacy_migrated" / normalizer["state_file"])
    assert {"observation.state.min", "observation.state.max", "action.mean", "action.std"} <= set(stats)


def test_migrate_refuses_an_existing_folder_and_a_new_layout(tmp_path):
    with pytest.raises(CheckpointError, match="exists"):
        migrate(LEGACY / "pi0_legacy", LEGACY / "pi0_legacy_migrated")
    with pytest.raises(CheckpointError, match=r"already in LeRobot >= 0\.4's layout"):
        migrate(LEGACY / "pi0_legacy_migrated", tmp_path / "again")
    assert not (tmp_path / "again").exists() and not (tmp_path / "again.partial").exists()


# --- bad input: one clear error each ------------------------------------------------------------------------------


def _copy(tmp_path: Path, name: str = "pi0_legacy") -> Path:
    folder = tmp_path / name
    shutil.copytree(LEGACY / name, folder)
    return folder


def _edit_weights(folder: Path, change) -> None:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def _edit_config(folder: Path, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


def test_untrained_statistics_are_refused(tmp_path):
    folder = _copy(tmp_path)

    def untrained(t):
        t["normalize_inputs.buffer_observation_state.min"] = torch.full_like(
            t["normalize_inputs.buffer_observation_state.min"], torch.inf
        )

    _edit_weights(folder, untrained)
    with pytest.raises(CheckpointError, match=r"'normalize_inputs\.buffer_observation_state\.min' are still \+inf"):
        omni_ros.policy.load(folder)


def test_statistics_of_an_undeclared_feature_are_refused(tmp_path):
    folder = _copy(tmp_path)

    def extra(t):
        t["normalize_inputs.buffer_observation_images_wrist_cam.mean"] = torch.zeros(3, 1, 1)
        t["normalize_inputs.buffer_observation_environment_state.mean"] = torch.zeros(4)

    _edit_weights(folder, extra)
    with pytest.raises(CheckpointError, match=r"'normalize_inputs\.buffer_observation_environment_state\.mean' "
                       r"belong to no feature config\.json declares"):  # fmt: skip
        omni_ros.policy.load(folder)


def test_an_unknown_normalization_mode_is_refused(tmp_path):
    folder = _copy(tmp_path, "smolvla_legacy")
    _edit_config(folder, normalization_mapping={"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "MEAN_STD"})
    with pytest.raises(
        CheckpointError, match=r"normalization_mapping STATE is 'QUANTILES', not a mode LeRobot 0\.3 knows"
    ):
        omni_ros.policy.load(folder)


def test_missing_statistics_and_aloha_are_refused(tmp_path):
    folder = _copy(tmp_path)
    _edit_config(folder, adapt_to_pi_aloha=True)
    with pytest.raises(CheckpointError, match=r"adapt_to_pi_aloha \(the pi-internal ALOHA joint space"):
        omni_ros.policy.load(folder)
    _edit_config(folder, adapt_to_pi_aloha=False)
    _edit_weights(folder, lambda t: t.pop("unnormalize_outputs.buffer_action.std"))
    with pytest.raises(CheckpointError, match=r"no 'unnormalize_outputs\.buffer_action\.std' for the MEAN_STD"):
        omni_ros.policy.load(folder)


def test_a_tokenizer_with_ids_past_the_embedding_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    rows = load_file(LEGACY / "pi0_legacy" / "model.safetensors")[
        "model.paligemma_with_expert.paligemma.lm_head.weight"
    ]
    big = tmp_path / "big.json"
    Tokenizer(models.WordLevel({"<unk>": 0, "go": rows.shape[0]}, unk_token="<unk>")).save(str(big))
    with pytest.raises(CheckpointError, match=rf"up to {rows.shape[0]}, past the end of the token embedding "
                       rf"\({rows.shape[0]} rows\)"):  # fmt: skip
        omni_ros.policy.load(LEGACY / "pi0_legacy", tokenizer=big)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openpi-client's websockets call
def test_a_bad_checkpoint_leaves_the_bridge_serving(tmp_path):
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    from omni_ros.serving.config import ServeConfig
    from omni_ros.serving.server import ServerThread

    obs, data = case_data("pi0_legacy", "missing_wrist_cam")
    served = policy("pi0_legacy")
    bad = _copy(tmp_path)
    _edit_config(bad, normalization_mapping={"STATE": "ROBUST"})
    with ServerThread(served, ServeConfig(port=0)) as server:
        client = WebsocketClientPolicy(server.url)
        assert client.get_server_metadata()["camera_names"] == ["top", "wrist_cam"]
        before = client.infer({**obs, "noise": data["noise"][0]})["actions"]
        with pytest.raises(CheckpointError, match="'ROBUST'"):
            omni_ros.policy.load(bad)
        after = client.infer({**obs, "noise": data["noise"][0]})["actions"]
    np.testing.assert_allclose(before, data["actions"][0], rtol=0, atol=TOL)
    np.testing.assert_array_equal(before, after)


def test_checkpoint_migrate_command(tmp_path, capsys):
    from omni_ros.cli import main

    assert main(["checkpoint", "migrate", str(LEGACY / "smolvla_legacy"), "--out", str(tmp_path / "new")]) == 0
    out = capsys.readouterr().out
    assert "migrated smolvla" in out and "policy_postprocessor_step_0_unnormalizer_processor.safetensors" in out
    assert main(["checkpoint", "migrate", str(LEGACY / "smolvla_legacy"), "--out", str(tmp_path / "new")]) == 2
    assert "exists (--force replaces it)" in capsys.readouterr().err
