"""Scripts written against openpi work unchanged: extra keys are skipped, float and CHW images converted as openpi's
transforms do (`_parse_image`: `(255 * image).astype(uint8)`, CHW -> HWC), and every refusal that protects the robot
stays."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from helpers.bridge_policies import expected_actions
from helpers.bridge_util import droid_obs, echo_server, libero_obs
from omni_ros.observation import ObservationError, ObservationSpec, make_observation
from omni_ros.serving.keymap import KeyMapError, load_keymap

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _openpi_parse_image(image: np.ndarray) -> np.ndarray:
    """openpi's rule, restated: floats become (255 * x) cast to uint8 (truncating), a leading 3 means CHW."""
    if np.issubdtype(image.dtype, np.floating):
        image = (255 * image).astype(np.uint8)
    if image.shape[0] == 3:
        image = np.transpose(image, (1, 2, 0))
    return image


def _lerobot_image(rng: np.random.Generator, dtype=np.float32) -> np.ndarray:
    """What a LeRobot dataset yields: float CHW in [0, 1], including both ends and values that truncate."""
    image = rng.uniform(0, 1, (3, 224, 224)).astype(dtype)
    image[0, 0, :4] = [0.0, 1.0, 0.5, 0.999]  # 0.5 -> 127 (truncated, not rounded to 128)
    return image


def test_float_chw_images_convert_exactly_as_openpi():
    keymap = load_keymap("libero")
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, np.float16):
        obs = libero_obs(rng)
        obs["observation/image"] = _lerobot_image(rng, dtype)
        obs["observation/wrist_image"] = rng.uniform(0, 1, (224, 224, 3)).astype(dtype)  # float HWC
        raw = keymap.to_raw(obs)
        for key, camera in (("observation/image", "base"), ("observation/wrist_image", "wrist")):
            got = raw["images"][camera]
            assert got.dtype == np.uint8 and got.shape == (224, 224, 3)
            np.testing.assert_array_equal(got, _openpi_parse_image(obs[key]))
        assert list(raw["images"]["base"][0, :4, 0]) == [0, 255, 127, 254]


def test_float_images_outside_what_openpi_can_cast_are_refused():
    keymap = load_keymap("droid")
    for bad, reason in [
        (np.full((224, 224, 3), 200.0, np.float32), r"must hold values in \[0, 1\].*send 0..255 pixels as uint8"),
        (np.full((224, 224, 3), -0.5, np.float32), r"must hold values in \[0, 1\]"),
        (np.where(np.eye(224)[..., None] > 0, np.nan, 0.5).repeat(3, 2).astype(np.float32), "NaN or inf"),
        (np.zeros((224, 224, 3), np.int64), r"must be uint8 \(or float in \[0, 1\]\)"),
        (np.zeros((224, 224, 3), bool), r"must be uint8"),
    ]:
        obs = droid_obs(np.random.default_rng(1))
        obs["observation/wrist_image_left"] = bad
        with pytest.raises(KeyMapError, match=reason):
            keymap.to_raw(obs)
    # Just past 1 by less than a 255th still casts to 255, as in openpi.
    obs = droid_obs(np.random.default_rng(1))
    obs["observation/wrist_image_left"] = np.full((224, 224, 3), 1.003, np.float32)
    assert keymap.to_raw(obs)["images"]["wrist_left"].min() == 255


def test_unknown_keys_are_skipped_unless_strict():
    keymap = load_keymap("aloha")
    obs = {
        "images": {"cam_high": np.zeros((3, 224, 224), np.uint8), "cam_top": np.zeros((3, 8, 8), np.uint8), 7: 1},
        "state": np.zeros(14, np.float32),
        "prompt": "fold",
        "observation/extra": {"anything": [1, 2]},
    }
    ignored: list[str] = []
    raw = keymap.to_raw(obs, strict=False, ignored=ignored)
    assert sorted(ignored) == ["images.7", "images.cam_top", "observation/extra"]
    assert list(raw["images"]) == ["cam_high"] and raw["prompt"] == "fold"
    with pytest.raises(KeyMapError, match=r"unknown observation key 'images\.cam_top'"):
        keymap.to_raw(obs)
    # A skipped key never excuses a bad known one.
    obs["state"] = np.full(14, np.inf)
    raw = keymap.to_raw(obs, strict=False)
    spec = ObservationSpec(camera_names=keymap.camera_names, state_dim=keymap.state_dim)
    with pytest.raises(ObservationError, match="non-finite"):
        make_observation(spec, raw)


def _droid_extended(rng: np.random.Generator) -> dict:
    """A DROID observation the way a dataset-driven openpi script sends it: a second exterior camera, extra
    proprioception, and LeRobot's float32 CHW images."""
    obs = droid_obs(rng)
    obs["observation/exterior_image_2_left"] = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    obs["observation/cartesian_position"] = rng.normal(size=6)
    obs["observation/exterior_image_1_left"] = obs["observation/exterior_image_1_left"].transpose(2, 0, 1) / 255.0
    obs["observation/wrist_image_left"] = (obs["observation/wrist_image_left"].transpose(2, 0, 1) / 255.0).astype(
        np.float32
    )
    return obs


def test_openpi_client_with_extra_keys_and_float_chw_images(caplog):
    server, policy, keymap = echo_server("droid")
    rng = np.random.default_rng(2)
    with server, caplog.at_level(logging.WARNING, logger="omni_ros.serve"):
        first, second = WebsocketClientPolicy(server.url), WebsocketClientPolicy(server.url)
        for client in (first, first, first, second):
            obs = _droid_extended(rng)
            result = client.infer(obs)
            parsed = {k: _openpi_parse_image(v) if "image" in k else v for k, v in obs.items()}
            expected = expected_actions(policy, make_observation(policy.spec, keymap.to_raw(parsed, strict=False)))
            np.testing.assert_array_equal(result["actions"], expected)
        # What the policy saw is openpi's conversion of the last request's images.
        seen = policy.observations[-1]
        assert seen.images["wrist_left"].shape == (policy.spec.image_size, policy.spec.image_size, 3)
    warnings = [r.getMessage() for r in caplog.records if "ignoring observation key" in r.getMessage()]
    # One warning per connection and unknown key; the DROID dataset's second camera is part of the layout.
    assert len(warnings) == 2, warnings
    assert all("'observation/cartesian_position'" in w and "strict_keys" in w for w in warnings)
    assert not any("exterior_image_2_left" in w for w in warnings)


def test_strict_keys_keeps_the_refusal_and_robot_protection_stays():
    server, policy, _keymap = echo_server("droid", strict_keys=True)
    rng = np.random.default_rng(3)
    with server:
        obs = _droid_extended(rng)
        with pytest.raises(RuntimeError, match="unknown observation key 'observation/cartesian_position'"):
            WebsocketClientPolicy(server.url).infer(obs)
        del obs["observation/cartesian_position"]
        assert WebsocketClientPolicy(server.url).infer(obs)["actions"].shape == (10, 8)
    server, policy, _keymap = echo_server("droid")
    with server:
        for key, value, reason in [
            ("observation/joint_position", np.full(7, np.nan), "non-finite"),
            ("observation/joint_position", np.zeros(6), "must hold 7 numbers"),
            ("observation/wrist_image_left", np.full((3, 224, 224), 255.0), r"must hold values in \[0, 1\]"),
            ("observation/wrist_image_left", np.full((3, 224, 224), np.inf, np.float32), "NaN or inf"),
        ]:
            bad = {**droid_obs(rng), "observation/extra": 1, key: value}
            with pytest.raises(RuntimeError, match=reason):
                WebsocketClientPolicy(server.url).infer(bad)
        assert policy.calls == 0  # nothing unsafe reached the policy
        assert WebsocketClientPolicy(server.url).infer(droid_obs(rng))["actions"].shape == (10, 8)
