"""ObservationAssembler: latest inputs, staleness as data, reordering, out-of-order frames; message conversion and
the MessageFeed the node and the replay share."""

from __future__ import annotations

from collections import Counter

import cv2
import numpy as np
import pytest
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String

from omni_ros.assembler import ObservationAssembler, Problem, StaleInput
from omni_ros.feed import MessageFeed
from omni_ros.ros_convert import ImageError, compressed_to_rgb, image_to_rgb, message_stamp, rgb_to_image


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
    with pytest.raises(StaleInput, match=message) as raised:
        a.assemble(now)
    assert raised.value.problem == a.check(now) and raised.value.problem.kind == "stale"
    assert str(raised.value) == str(raised.value.problem)


def test_missing_inputs_reported_in_order():
    a = make()
    assert a.check(0.0) == Problem("no_frame", "camera/base")
    assert str(a.check(0.0)) == "no frame yet from camera 'base'"
    a.add_image("base", np.zeros((4, 4, 3), np.uint8), 0.0)
    a.add_image("wrist", np.zeros((4, 4, 3), np.uint8), 0.0)
    assert a.check(0.0) == Problem("no_state", "state")
    assert str(a.check(0.0)) == "no joint state yet"
    a.add_joint_state(["j1", "j2"], [0.0, 0.0], 0.0)
    assert a.check(0.0) == Problem("no_prompt", "prompt")
    assert str(a.check(0.0)) == "no prompt yet"
    a.add_prompt("go", 0.0)
    assert a.check(0.0) is None


def test_missing_joint_and_nan_make_state_invalid_until_a_good_one():
    a = make()
    fill(a, 1.0)
    assert not a.add_joint_state(["j1"], [0.0], 1.01)
    assert a.check(1.02) == Problem("invalid", "state", "lacks joints ['j2']")
    assert "lacks joints ['j2']" in str(a.check(1.02))
    assert a.stats.last_reject_reason == "joint state lacks joints ['j2']"
    assert not a.add_joint_state(["j1", "j2"], [0.0, float("nan")], 1.03)
    assert "non-finite positions for ['j2']" in str(a.check(1.04))
    assert a.check(1.04).kind == "invalid"
    assert a.add_joint_state(["j1", "j2"], [0.5, 0.5], 1.05)
    assert a.check(1.06) is None


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
    assert str(a.check(1.0)) == "no prompt yet"
    b = make(default_prompt="wave")
    b.add_image("base", np.zeros((4, 4, 3), np.uint8), 1.0)
    b.add_image("wrist", np.zeros((4, 4, 3), np.uint8), 1.0)
    b.add_joint_state(["j1", "j2"], [0.0, 0.0], 1.0)
    assert b.assemble(1.0).obs["prompt"] == "wave"
    assert not b.add_image("top", np.zeros((4, 4, 3), np.uint8), 1.0)


@pytest.mark.parametrize(
    "problem,text,summary",
    [
        (Problem("no_frame", "camera/base"), "no frame yet from camera 'base'", "no frame yet from camera 'base'"),
        (
            Problem("stale", "camera/wrist", "0.62 s old > 0.5 s"),
            "camera 'wrist' is stale (0.62 s old > 0.5 s)",
            "camera 'wrist' is stale",
        ),
        (
            Problem("stale", "state", "0.30 s old > 0.2 s"),
            "joint state is stale (0.30 s old > 0.2 s)",
            "joint state is stale",
        ),
        (Problem("stale", "prompt", "> 10.0 s old"), "prompt is stale (> 10.0 s old)", "prompt is stale"),
        (
            Problem("invalid", "state", "has 3 names but 2 positions"),
            "joint state has 3 names but 2 positions",
            "joint state has 3 names but 2 positions",  # what is wrong is the detail itself
        ),
        (Problem("no_state", "state"), "no joint state yet", "no joint state yet"),
        (Problem("no_prompt", "prompt"), "no prompt yet", "no prompt yet"),
    ],
)
def test_problem_reads_as_before_and_summarises_without_measurements(problem, text, summary):
    assert str(problem) == text
    assert problem.summary == summary


def test_problem_is_frozen_data_naming_its_camera():
    problem = Problem("stale", "camera/base", "1.00 s old > 0.5 s")
    assert problem.camera == "base" and Problem("stale", "state").camera is None
    assert problem == Problem("stale", "camera/base", "1.00 s old > 0.5 s") and hash(problem) == hash(problem)
    with pytest.raises(AttributeError):
        problem.kind = "invalid"  # type: ignore[misc]
    # Equal problems with different measurements group under one summary.
    assert problem.summary == Problem("stale", "camera/base", "2.00 s old > 0.5 s").summary


def test_stale_prompt_and_state_problems_carry_their_source():
    a = make(prompt_stale_s=1.0)
    fill(a, 10.0)
    assert a.check(10.35) == Problem("stale", "state", "0.35 s old > 0.2 s")
    a.add_joint_state(["j1", "j2"], [0.0, 0.0], 11.0)
    a.add_image("base", np.zeros((4, 4, 3), np.uint8), 11.0)
    a.add_image("wrist", np.zeros((4, 4, 3), np.uint8), 11.0)
    assert a.check(11.1) == Problem("stale", "prompt", "> 1.0 s old")


def _image(value: int = 3, encoding: str = "rgb8", stamp: float | None = 2.5) -> Image:
    msg = rgb_to_image(np.full((4, 4, 3), value, np.uint8), Image(), stamp=stamp)
    msg.encoding = encoding
    return msg


def test_feed_converts_stamps_and_counts_refused_frames():
    a = make()
    errors: Counter[str] = Counter()
    new_errors: list[tuple[str, str]] = []
    feed = MessageFeed(a, image_errors=errors, on_new_error=lambda cam, why: new_errors.append((cam, why)))
    assert feed.image("base", _image(stamp=2.5), received=9.0, compressed=False)
    why = "unsupported image encoding '16UC1'; supported: rgb8, bgr8, rgba8, bgra8, mono8"
    for _ in range(3):
        assert not feed.image("wrist", _image(encoding="16UC1"), received=9.0, compressed=False)
    assert errors == Counter({f"camera 'wrist': {why}": 3})
    assert new_errors == [("wrist", why)]  # told once per new reason, not per frame
    assert feed.last_error("wrist") == why
    assert feed.explain(a.check(3.0)) == f"no frame yet from camera 'wrist' (last frame rejected: {why})"
    # A good frame clears the camera's rejection; an unstamped one takes its arrival time.
    assert feed.image("wrist", _image(stamp=None), received=2.75, compressed=False)
    assert feed.last_error("wrist") == ""
    assert not feed.image("wrist", _image(stamp=1.0), received=3.0, compressed=False)  # out of order
    assert a.stats.dropped_out_of_order == 1
    assert not feed.image("top", _image(), received=3.0, compressed=False)  # not a configured camera
    assert feed.joint_state(JointState(name=["j1", "j2"], position=[1.0, 2.0]), received=2.8)
    feed.prompt(String(data="go"), received=2.9)
    stamps = a.assemble(2.9).input_stamps
    assert stamps == {"camera/base": 2.5, "camera/wrist": 2.75, "state": 2.8}


def test_feed_joint_state_prompt_and_compressed():
    a = make()
    feed = MessageFeed(a, use_header_stamps=False)
    _, buf = cv2.imencode(".png", np.zeros((4, 4, 3), np.uint8))
    assert feed.image("base", CompressedImage(format="png", data=buf.tobytes()), received=1.0, compressed=True)
    assert not feed.image("wrist", CompressedImage(format="jpeg", data=b"junk"), received=1.0, compressed=True)
    assert feed.image_errors is None  # no tally unless asked for (a node runs for days)
    assert feed.image("wrist", _image(stamp=50.0), received=1.0, compressed=False)  # header ignored: arrival
    assert feed.joint_state(JointState(name=["j2", "j1"], position=[2.0, 1.0]), received=1.0)
    assert not feed.joint_state(JointState(name=["j1"], position=[1.0]), received=1.1)
    assert feed.explain(a.check(1.1)) == "joint state lacks joints ['j2']"
    assert feed.joint_state(JointState(name=["j2", "j1"], position=[2.0, 1.0]), received=1.2)
    feed.prompt(String(data=" reach "), received=1.2)
    assert a.check(1.2) is None and feed.explain(None) == ""
    out = a.assemble(1.2)
    assert out.obs["prompt"] == "reach" and out.obs["state"].tolist() == [1.0, 2.0]
    assert out.input_stamps == {"camera/base": 1.0, "camera/wrist": 1.0, "state": 1.2}


def test_message_stamp_prefers_a_set_header():
    assert message_stamp(_image(stamp=4.25), 9.0) == 4.25
    assert message_stamp(_image(stamp=None), 9.0) == 9.0  # zero stamp: unstamped
    assert message_stamp(_image(stamp=4.25), 9.0, use_header=False) == 9.0
    assert message_stamp(String(data="x"), 9.0) == 9.0  # no header at all


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
