"""Observation validation and single-tile preprocessing shared by every entry point."""

from __future__ import annotations

import numpy as np
import pytest

from omni_ros.observation import ObservationError, ObservationSpec, make_observation, resize_with_pad

SPEC = ObservationSpec(camera_names=("base", "wrist"), state_dim=3, image_size=32, required_cameras=("base",))


def raw(**overrides):
    obs = {"images": {"base": np.zeros((48, 64, 3), np.uint8)}, "state": [0.1, 0.2, 0.3], "prompt": "pick"}
    obs.update(overrides)
    return obs


def test_resize_with_pad_keeps_aspect_and_centres():
    image = np.full((480, 640, 3), 200, np.uint8)
    tile = resize_with_pad(image, 224, 224)
    assert tile.shape == (224, 224, 3)
    # 640x480 -> 224x168: 28 black rows above and below, content in between.
    assert tile[:28].max() == 0 and tile[-28:].max() == 0
    assert (tile[28:196] == 200).all()


def test_resize_with_pad_portrait_pads_columns():
    tile = resize_with_pad(np.full((100, 50, 3), 9, np.uint8), 32, 32)
    assert tile[:, :8].max() == 0 and tile[:, -8:].max() == 0 and (tile[:, 8:24] == 9).all()


def test_one_tile_per_camera_and_missing_camera_masked():
    obs = make_observation(SPEC, raw())
    assert set(obs.images) == {"base", "wrist"}
    assert obs.images["base"].shape == (32, 32, 3) and obs.images["base"].dtype == np.uint8
    assert obs.image_masks == {"base": True, "wrist": False}
    assert not obs.images["wrist"].any()
    assert obs.state.dtype == np.float32


@pytest.mark.parametrize(
    "image",
    [
        np.zeros((3, 40, 30), np.uint8),
        np.zeros((40, 30, 3), np.uint8),
        np.zeros((40, 30, 4), np.uint8),
        np.zeros((40, 30), np.uint8),
        np.zeros((1, 40, 30), np.uint8),
    ],
)
def test_hwc_chw_gray_rgba_accepted(image):
    obs = make_observation(SPEC, raw(images={"base": image}))
    assert obs.images["base"].shape == (32, 32, 3)


def test_chw_and_hwc_give_the_same_tile():
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)
    a = make_observation(SPEC, raw(images={"base": hwc})).images["base"]
    b = make_observation(SPEC, raw(images={"base": np.transpose(hwc, (2, 0, 1))})).images["base"]
    assert np.array_equal(a, b)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"images": {"base": np.zeros((8, 8, 3), np.uint8), "top": np.zeros((8, 8, 3), np.uint8)}}, "unknown camera"),
        ({"images": {"wrist": np.zeros((8, 8, 3), np.uint8)}}, "missing required camera"),
        ({"images": {"base": np.zeros((8, 8, 3), np.float32)}}, "expected dtype uint8"),
        ({"images": {"base": np.zeros((2, 8, 8, 3), np.uint8)}}, "rank 3"),
        ({"images": {"base": np.zeros((8, 8, 5), np.uint8)}}, "channels"),
        ({"images": {"base": [[1, 2], [3, 4]]}}, "numpy array"),
        ({"images": "base"}, "must be a dict"),
        ({"state": [0.1, float("nan"), 0.3]}, "non-finite values (NaN/inf) at indices [1]"),
        ({"state": [0.1, 0.2, float("inf")]}, "non-finite"),
        ({"state": [0.1, 0.2]}, "state has length 2, expected 3"),
        ({"state": [[0.1, 0.2, 0.3]]}, "must be 1-D"),
        ({"state": ["a", "b", "c"]}, "numeric"),
        ({"prompt": "   "}, "prompt is empty"),
        ({"prompt": 5}, "prompt must be a string"),
        ({"extra": 1}, "unknown observation keys"),
    ],
)
def test_invalid_observations_rejected_with_reason(overrides, message):
    with pytest.raises(ObservationError) as err:
        make_observation(SPEC, raw(**overrides))
    assert message in str(err.value)


def test_missing_state_rejected():
    obs = raw()
    del obs["state"]
    with pytest.raises(ObservationError, match="missing observation\\['state'\\]"):
        make_observation(SPEC, obs)


def test_default_prompt_used_when_absent():
    spec = ObservationSpec(camera_names=("base",), state_dim=3, image_size=32, default_prompt="wave")
    obs = raw()
    del obs["prompt"]
    assert make_observation(spec, obs).prompt == "wave"
