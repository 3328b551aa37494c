"""`omni-ros policy infer`: one inference from the command line, and its verdict on whether the chunk keeps an arm
moving (half a chunk's motion, the rule the action executor's status applies live)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from omni_ros.cli import main
from omni_ros.commands.policy import realtime_verdict
from omni_ros.control.executor import pause_free_latency_s


def test_pause_free_latency_is_half_the_chunks_motion() -> None:
    # 50 actions 20 ms apart are 1 s of motion: the next chunk may take 0.5 s.
    assert pause_free_latency_s(50, 0.02) == pytest.approx(0.5)
    assert pause_free_latency_s(16, 0.05) == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("latency", "verdict"),
    [
        (0.5, "keeps an arm moving"),
        (0.83, "keeps an arm moving"),  # 50 actions at 30 Hz: 1.667 s of motion, half of it 0.833 s
        (0.84, "the arm pauses between chunks"),
        (1.6, "the arm pauses between chunks"),
        (1.7, "slower than the motion it plans"),
    ],
)
def test_verdict_per_latency(latency: float, verdict: str) -> None:
    text = realtime_verdict(latency, 50, 1 / 30)
    assert verdict in text
    assert text.startswith("50 actions x 0.03333 s = 1.67 s of motion")
    assert f"({latency / (50 / 30):.2f}x of it)" in text


def test_verdict_names_the_budget_and_what_to_try() -> None:
    text = realtime_verdict(1.2, 50, 1 / 30)
    assert "at most half its motion (0.83 s)" in text and "--precision" in text
    # (1.2 - 1.667 / 2) / 1.2 of the time held, resuming where it stopped; synchronous beyond the motion.
    assert "about 31% of the time" in text
    assert "about 55% of the time" in realtime_verdict(2.0, 50, 1 / 30)  # 2.0 / (2.0 + 1.667)
    assert "observation -> chunk 1.20 s" in text
    assert "observation -> chunk 12.0 ms" in realtime_verdict(0.012, 8, 0.05)


def test_infer_prints_the_chunk_and_the_verdict(tmp_path, capsys) -> None:
    out = tmp_path / "chunk.npy"
    args = ["policy", "infer", "--preset", "tiny", "--runs", "2", "--warmup", "0", "--action-dt", "0.05"]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    chunk = np.load(out)
    assert chunk.shape[0] == 8 and np.isfinite(chunk).all()  # the tiny preset's horizon
    line = next(line for line in printed.splitlines() if line.startswith("real time"))
    assert line.startswith("real time (median of 2 runs): 8 actions x 0.05 s = 0.40 s of motion")
    # The verdict follows from the latency it prints (the rule, not a speed, is what is checked here).
    value, unit = re.search(r"observation -> chunk ([0-9.]+) (ms|s)", line).groups()
    latency = float(value) / (1e3 if unit == "ms" else 1)
    if latency <= 0.2:
        assert "keeps an arm moving" in line
    elif latency <= 0.4:
        assert "pauses" in line
    else:
        assert "slower than the motion" in line


def test_infer_refuses_zero_runs(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["policy", "infer", "--preset", "tiny", "--runs", "0"])
    assert exit_.value.code == 2
    assert "--runs: must be at least 1, got 0" in capsys.readouterr().err


def test_infer_reports_an_unreadable_image(tmp_path, capsys) -> None:
    missing = tmp_path / "nope.png"
    assert main(["policy", "infer", "--preset", "tiny", "--image", str(missing)]) == 2
    assert f"cannot read image '{missing}'" in capsys.readouterr().err
