"""ObservationAssembler: latest inputs, staleness, reordering, out-of-order frames; message conversion."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from sensor_msgs.msg import CompressedImage, Image

from omni_ros.assembler import ObservationAssembler, StaleInput
from omni_ros.ros_convert import ImageError, compressed_to_rgb, image_to_rgb, rgb_to_image


def make(**kw) -> ObservationAssembler:
    a = ObservationAssembler(["base", "wrist"], ["j1", "j2"], camera_stale_s=0.5, state_stale_s=0.2, **kw)
    return a


def fill(a: ObservationAssembler, t: float) -> None:
    a.add_image("base", np.full((4, 4, 3), 1, np.uint8), t)
    a.add_image("wrist", np.full((4, 4, 3), 2, np.uint8), t - 0.1)
    a.add_joint_state(["j2", "x", "j1"], [2.0, 9.0, 1.0], t)
    a.add_prompt("reach", t)


def test_assembles_latest_inputs_reordered_with_oldest_stamp():
    a = make()
    fill(a, 10.0)
    out = a.assemble(10.05)
    assert out.obs["state"].tolist() == [1.0, 2.0]  # reordered by configured names, extra joint ignored
    assert out.obs["prompt"] == "reach"
    assert out.stamp == pytest.approx(9.9)
    assert out.obs["images"]["wrist"][0, 0, 0] == 2


@pytest.mark.parametrize(
    "now,message",
    [(10.45, "camera 'wrist' is stale"), (10.7, "camera 'base' is stale"), (10.35, "joint state is stale")],
)
def test_stale_inputs(now, message):
    a = make()
    fill(a, 10.0)
    with pytest.raises(StaleInput, match=message):
        a.assemble(now)


def test_missing_inputs_reported_in_order():
    a = make()
    assert a.check(0.0) == "no frame yet from camera 'base'"
    a.add_image("base", np.zeros((4, 4, 3), np.uint8), 0.0)
    a.add_image("wrist", np.zeros((4, 4, 3), np.uint8), 0.0)
    assert a.check(0.0) == "no joint state yet"
    a.add_joint_state(["j1", "j2"], [0.0, 0.0], 0.0)
    assert a.check(0.0) == "no prompt yet"
    a.add_prompt("go", 0.0)
    assert a.check(0.0) == ""


def test_missing_joint_and_nan_make_state_invalid_until_a_good_one():
    a = make()
    fill(a, 1.0)
    assert not a.add_joint_state(["j1"], [0.0], 1.01)
    assert "lacks joints ['j2']" in a.check(1.02)
    assert not a.add_joint_state(["j1", "j2"], [0.0, float("nan")], 1.03)
    assert "non-finite positions for ['j2']" in a.check(1.04)
    assert a.add_joint_state(["j1", "j2"], [0.5, 0.5], 1.05)
    assert a.check(1.06) == ""


def test_out_of_order_frames_dropped():
    a = make()
    fill(a, 5.0)
    assert not a.add_image("base", np.full((4, 4, 3), 7, np.uint8), 4.0)
    assert a.stats.dropped_out_of_order == 1
    assert a.assemble(5.01).obs["images"]["base"][0, 0, 0] == 1


def test_default_prompt_and_unknown_camera():
    a = make(default_prompt="wave")
    fill(a, 1.0)
    a.add_prompt("  ", 1.0)  # an empty prompt clears it
    assert a.check(1.0) == "no prompt yet"
    b = make(default_prompt="wave")
    b.add_image("base", np.zeros((4, 4, 3), np.uint8), 1.0)
    b.add_image("wrist", np.zeros((4, 4, 3), np.uint8), 1.0)
    b.add_joint_state(["j1", "j2"], [0.0, 0.0], 1.0)
    assert b.assemble(1.0).obs["prompt"] == "wave"
    assert not b.add_image("top", np.zeros((4, 4, 3), np.uint8), 1.0)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8", "mono8"])
def test_image_encodings_to_rgb(encoding):
    rgb = np.zeros((6, 5, 3), np.uint8)
    rgb[..., 0], rgb[..., 1], rgb[..., 2] = 200, 100, 50
    conv = {
        "rgb8": None,
        "bgr8": cv2.COLOR_RGB2BGR,
        "rgba8": cv2.COLOR_RGB2RGBA,
        "bgra8": cv2.COLOR_RGB2BGRA,
        "mono8": cv2.COLOR_RGB2GRAY,
    }[encoding]
    raw = rgb if conv is None else cv2.cvtColor(rgb, conv)
    msg = Image(
        height=6, width=5, encoding=encoding, step=5 * (1 if raw.ndim == 2 else raw.shape[2]), data=raw.tobytes()
    )
    out = image_to_rgb(msg)
    assert out.shape == (6, 5, 3)
    if encoding == "mono8":
        assert (out[..., 0] == out[..., 1]).all()
    else:
        assert out[0, 0].tolist() == [200, 100, 50]


def test_image_with_row_padding():
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    padded = np.zeros((2, 12), np.uint8)
    padded[:, :9] = rgb.reshape(2, 9)
    out = image_to_rgb(Image(height=2, width=3, encoding="rgb8", step=12, data=padded.tobytes()))
    assert np.array_equal(out, rgb)


@pytest.mark.parametrize(
    "msg,message",
    [
        (Image(height=2, width=2, encoding="16UC1", step=4, data=bytes(8)), "unsupported image encoding '16UC1'"),
        (Image(height=4, width=4, encoding="rgb8", step=12, data=bytes(10)), "expected 48"),
        (Image(height=0, width=4, encoding="rgb8", step=12, data=b""), "out of range"),
        (Image(height=2, width=4, encoding="rgb8", step=4, data=bytes(8)), "step 4"),
    ],
)
def test_bad_images_rejected(msg, message):
    with pytest.raises(ImageError, match=message):
        image_to_rgb(msg)


def test_compressed_jpeg_png_and_garbage():
    rgb = np.zeros((16, 16, 3), np.uint8)
    rgb[..., 0] = 255
    for fmt, ext in (("jpeg", ".jpg"), ("png", ".png")):
        _, buf = cv2.imencode(ext, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        out = compressed_to_rgb(CompressedImage(format=fmt, data=buf.tobytes()))
        assert out.shape == (16, 16, 3) and out[8, 8, 0] > 240 and out[8, 8, 2] < 15
    with pytest.raises(ImageError, match="cannot decode"):
        compressed_to_rgb(CompressedImage(format="jpeg", data=b"not a jpeg"))
    with pytest.raises(ImageError, match="unsupported compressed format"):
        compressed_to_rgb(CompressedImage(format="tiff", data=b""))


def test_rgb_to_image_round_trip():
    rgb = np.random.default_rng(0).integers(0, 255, (7, 9, 3), dtype=np.uint8)
    msg = rgb_to_image(rgb, Image(), stamp=12.25, frame_id="cam")
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (12, 250_000_000)
    assert np.array_equal(image_to_rgb(msg), rgb)
