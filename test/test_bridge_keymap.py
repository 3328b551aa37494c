"""Key maps turn openpi DROID / LIBERO / ALOHA observations into our raw observation and back."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.bridge_util import aloha_obs, droid_obs, libero_obs
from omni_ros.config import ConfigError
from omni_ros.observation import ObservationError, ObservationSpec, make_observation
from omni_ros.serving.keymap import KeyMap, KeyMapError, available_keymaps, load_keymap


def test_shipped_keymaps():
    assert {"droid", "libero", "aloha"} <= set(available_keymaps())
    droid, libero, aloha = load_keymap("droid"), load_keymap("libero"), load_keymap("aloha")
    assert (droid.state_dim, droid.action_dim, len(droid.camera_names)) == (8, 8, 2)
    assert (libero.state_dim, libero.action_dim, len(libero.camera_names)) == (8, 7, 2)
    assert (aloha.state_dim, aloha.action_dim, len(aloha.camera_names)) == (14, 14, 4)
    assert aloha.required_cameras == ("cam_high",)


def test_droid_state_is_joints_then_gripper():
    obs = droid_obs(np.random.default_rng(0))
    raw = load_keymap("droid").to_raw(obs)
    expected = np.concatenate([obs["observation/joint_position"], obs["observation/gripper_position"]])
    np.testing.assert_array_equal(raw["state"], expected.astype(np.float32))
    assert raw["state"].dtype == np.float32
    assert raw["images"]["exterior_1_left"] is obs["observation/exterior_image_1_left"]
    assert raw["images"]["wrist_left"] is obs["observation/wrist_image_left"]
    assert raw["prompt"] == "pick up the cup"


def test_libero_maps_images_and_state():
    obs = libero_obs(np.random.default_rng(1))
    raw = load_keymap("libero").to_raw(obs)
    np.testing.assert_array_equal(raw["images"]["base"], obs["observation/image"])
    np.testing.assert_array_equal(raw["images"]["wrist"], obs["observation/wrist_image"])
    np.testing.assert_array_equal(raw["state"], obs["observation/state"])


def test_aloha_chw_images_become_hwc_and_optional_cameras_may_be_absent():
    obs = aloha_obs(np.random.default_rng(2), cameras=("cam_high",))
    raw = load_keymap("aloha").to_raw(obs)
    assert list(raw["images"]) == ["cam_high"]
    np.testing.assert_array_equal(raw["images"]["cam_high"], np.transpose(obs["images"]["cam_high"], (1, 2, 0)))
    # And the result feeds make_observation: absent cameras are masked.
    spec = ObservationSpec(camera_names=load_keymap("aloha").camera_names, state_dim=14)
    observation = make_observation(spec, raw)
    assert observation.image_masks == {"cam_high": True, "cam_low": False, "cam_left_wrist": False,
                                       "cam_right_wrist": False}  # fmt: skip


def test_hwc_images_accepted_by_a_chw_keymap():
    obs = aloha_obs(np.random.default_rng(3), cameras=("cam_high",))
    hwc = np.ascontiguousarray(np.transpose(obs["images"]["cam_high"], (1, 2, 0)))
    obs["images"]["cam_high"] = hwc
    np.testing.assert_array_equal(load_keymap("aloha").to_raw(obs)["images"]["cam_high"], hwc)


def test_scalar_gripper_and_lists_are_accepted():
    obs = droid_obs(np.random.default_rng(4))
    obs["observation/gripper_position"] = 0.25
    obs["observation/joint_position"] = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    raw = load_keymap("droid").to_raw(obs)
    np.testing.assert_array_equal(raw["state"], np.array([0, 1, 2, 3, 4, 5, 6, 0.25], np.float32))


def test_missing_prompt_is_left_to_the_policy():
    obs = libero_obs(np.random.default_rng(5))
    del obs["prompt"]
    assert "prompt" not in load_keymap("libero").to_raw(obs)


def _bad(name: str, mutate) -> str:
    maker = {"droid": droid_obs, "libero": libero_obs, "aloha": aloha_obs}[name]
    obs = maker(np.random.default_rng(6))
    obs = mutate(obs)
    with pytest.raises(KeyMapError) as info:
        load_keymap(name).to_raw(obs)
    assert isinstance(info.value, ObservationError)
    return str(info.value)


def test_errors_name_the_openpi_key():
    def extra(o):
        o["observation/cartesian_position"] = np.zeros(6)
        return o

    message = _bad("droid", extra)
    assert "unknown observation key 'observation/cartesian_position'" in message
    assert "observation/joint_position" in message  # lists what is expected

    def no_wrist(o):
        del o["observation/wrist_image_left"]
        return o

    assert "missing image 'observation/wrist_image_left'" in _bad("droid", no_wrist)

    def short_joints(o):
        o["observation/joint_position"] = np.zeros(6)
        return o

    assert "'observation/joint_position' must hold 7 numbers" in _bad("droid", short_joints)

    def text_state(o):
        o["observation/state"] = np.array(["a"] * 8)
        return o

    assert "must be numeric" in _bad("libero", text_state)

    def int_image(o):
        o["observation/image"] = o["observation/image"].astype(np.int64)
        return o

    assert "image 'observation/image' must be uint8 (or float in [0, 1])" in _bad("libero", int_image)

    def seven_channels(o):
        o["observation/image"] = np.zeros((224, 224, 7), np.uint8)
        return o

    assert "no channel axis" in _bad("libero", seven_channels)

    def batched_image(o):
        o["observation/image"] = np.zeros((1, 224, 224, 3), np.uint8)
        return o

    assert "rank 3" in _bad("libero", batched_image)

    def flat_images(o):
        o["images"] = np.zeros((3, 224, 224), np.uint8)
        return o

    assert "'images' must be a dict" in _bad("aloha", flat_images)

    def unknown_camera(o):
        o["images"]["cam_top"] = o["images"]["cam_high"]
        return o

    assert "unknown observation key 'images.cam_top'" in _bad("aloha", unknown_camera)

    def number_prompt(o):
        o["prompt"] = 3
        return o

    assert "'prompt' must be a string" in _bad("aloha", number_prompt)

    assert "must be a dict" in _bad("droid", lambda o: [o])


def test_inverse_mapping_round_trips():
    for name, maker in [("droid", droid_obs), ("libero", libero_obs), ("aloha", aloha_obs)]:
        keymap = load_keymap(name)
        obs = maker(np.random.default_rng(7))
        raw = keymap.to_raw(obs)
        back = keymap.to_openpi(raw)
        again = keymap.to_raw(back)
        np.testing.assert_array_equal(again["state"], raw["state"])
        for camera in raw["images"]:
            np.testing.assert_array_equal(again["images"][camera], raw["images"][camera])
    # The ALOHA layout is sent as CHW, like openpi's ALOHA clients.
    back = load_keymap("aloha").to_openpi({"images": {"cam_high": np.zeros((224, 224, 3), np.uint8)},
                                            "state": np.zeros(14), "prompt": "x"})  # fmt: skip
    assert back["images"]["cam_high"].shape == (3, 224, 224)


def test_canonical_and_description_round_trip():
    spec = ObservationSpec(camera_names=("a", "b"), state_dim=3, required_cameras=("a",))
    canonical = KeyMap.canonical(spec)
    raw = {"images": {"a": np.zeros((8, 8, 3), np.uint8)}, "state": np.ones(3), "prompt": "p"}
    assert canonical.to_raw(raw)["images"]["a"] is raw["images"]["a"]
    for keymap in (canonical, load_keymap("droid"), load_keymap("aloha")):
        rebuilt = KeyMap.from_description(keymap.describe())
        assert rebuilt.describe() == keymap.describe()


def test_bad_keymap_files(tmp_path):
    with pytest.raises(ConfigError, match=r"known key maps: aloha, droid, libero.*canonical"):
        load_keymap("nope")
    with pytest.raises(ConfigError, match="built from the policy"):
        load_keymap("canonical")
    path = tmp_path / "bad.yaml"
    path.write_text("images: {a: x}\nstate: [{key: s, dim: 0}]\n")
    with pytest.raises(ConfigError, match=r"state\[0\].dim: must be >= 1"):
        load_keymap(str(path))
    path.write_text("images: {a: x}\nstate: [{key: x, dim: 2}]\n")
    with pytest.raises(ConfigError, match="used twice"):
        load_keymap(str(path))
    path.write_text("images: {a: x.y}\nstate: [{key: x, dim: 2}]\n")
    with pytest.raises(ConfigError, match="'x' is also the parent of other keys"):
        load_keymap(str(path))
    path.write_text("images: {a: x, b: x.y}\nstate: [{key: s, dim: 2}]\n")
    with pytest.raises(ConfigError, match=r"'x\.y' nests under a key that is itself a value"):
        load_keymap(str(path))
    path.write_text("images: {a: x}\nstate: [{key: s, dims: 2}]\n")
    with pytest.raises(ConfigError, match=r"did you mean 'state\[0\]\.dim'"):
        load_keymap(str(path))
