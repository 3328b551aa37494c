"""bench/realtime.py's live accounting: the executor's counts over the window (the README's held figures) and the
replay of the chunk timeline under each rule (their cross-check)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
realtime = pytest.importorskip("realtime")


def test_chunks_that_arrive_in_time_never_starve():
    # (observation stamp, arrival, seconds of motion): each arrives 1 s after its observation and covers 3 s, the
    # next observed 1.5 s later.
    chunks = [(t, t + 1.0, 3.0) for t in (0.0, 1.5, 3.0, 4.5)]
    assert realtime.starvation(chunks) == {"starvations": 0, "held_s": 0.0}


def test_a_late_chunk_runs_from_its_arrival_and_held_time_never_overlaps():
    # Inference takes 3 s and a chunk covers 1 s: the robot runs each chunk on arrival (run_late_chunks), the first
    # one too, and, the policy slower than a chunk, the next observation is taken when the plan has ended.
    chunks = [(0.0, 3.0, 1.0), (4.0, 7.0, 1.0), (8.0, 11.0, 1.0), (12.0, 15.0, 1.0)]
    result = realtime.starvation(chunks)
    assert result["starvations"] == 3
    # Held from 4 to 7, 8 to 11, 12 to 15; the run lasted 15 s.
    assert result["held_s"] == pytest.approx(9.0, abs=1e-9)


def test_a_chunk_after_the_plan_ran_out_plays_on_from_where_the_robot_stopped():
    # 0.7 s a chunk of 1 s of motion, each observed as the one before arrives. The second arrives at 1.4 s, 0.4 s
    # after the first plan ended: it plays its 0.7 s after that end from 1.4 s (resume_where_held), so the third,
    # at 2.1 s, is in time; the fourth again comes 0.4 s after the plan's end. Skipping the held actions instead
    # would leave each chunk 0.3 s of motion and starve at every arrival.
    chunks = [(0.7 * k, 0.7 * (k + 1), 1.0) for k in range(4)]
    result = realtime.starvation(chunks)
    assert result["starvations"] == 2
    assert result["held_s"] == pytest.approx(0.8, abs=1e-9)
    # Skipping (resume_where_held off): each arrives 0.4 s after the plan before it ended, with 0.3 s left.
    skipped = realtime.starvation(chunks, resume=False)
    assert skipped["starvations"] == 3 and skipped["held_s"] == pytest.approx(1.2, abs=1e-9)


def test_a_chunk_whose_actions_all_fell_due_while_the_robot_moved_is_refused_and_the_hold_counted_once():
    # The second, observed at 0.2 s and covering 0.8 s, ends when the first plan does (1.0 s) and arrives at 2.0 s:
    # refused. The third, observed at 1.9 s while the robot held, ends the hold at 2.5 s.
    chunks = [(0.0, 0.0, 1.0), (0.2, 2.0, 0.8), (1.9, 2.5, 1.0)]
    assert realtime.starvation(chunks) == {"starvations": 1, "held_s": 1.5}


def test_the_executors_counts_over_the_window_are_the_last_report_minus_the_one_before_it():
    def report(ran_out: int, held: float) -> dict[str, str]:
        return {k: "0" for k in realtime.MOTION_KEYS} | {"plan_ran_out": str(ran_out), "held_s": str(held)}

    reports = [(1.0, report(1, 0.5)), (2.0, report(2, 1.0)), (3.0, report(5, 2.5)), (4.0, report(7, 4.0))]
    window = realtime.motion_in_window(reports, start=2.5)
    assert window is not None and window["plan_ran_out"] == 5 and window["held_s"] == pytest.approx(3.0)
    assert realtime.motion_in_window(reports, start=0.5)["held_s"] == pytest.approx(4.0)  # nothing before: from 0
    assert realtime.motion_in_window(reports, start=4.5) is None  # no report in the window


def test_commanded_still_time_sums_the_intervals_between_repeated_commands():
    hold, step = (0.1, 0.2), (0.1, 0.21)
    positions = [(0.0, (0.0, 0.0)), (0.02, hold), (0.04, hold), (0.06, hold), (0.08, step), (0.1, step)]
    # 0.02 -> 0.04 -> 0.06 repeat (0.04 s), 0.08 -> 0.1 repeats (0.02 s); a move in between is not still.
    assert realtime.commanded_still(positions) == pytest.approx(0.06)
    assert realtime.commanded_still([]) == 0.0


def test_a_row_beside_the_simulator_starts_once_it_renders_and_counts_only_the_simulators_cores():
    # The real SO-101 node in its own process; the "row" only waits, so the cores counted are the simulator's
    # (two cameras rendered at 30 Hz, joint states at 50 Hz: a few percent of a core at least, never both cores).
    import time

    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image

    frames: list[object] = []

    def row() -> dict[str, float]:
        # While the row runs the simulator publishes: a listener of our own sees its frames.
        context, node, _, _ = realtime.ros_listener("test_beside_sim_row")
        node.create_subscription(Image, "/camera/wrist/image_raw", frames.append, 10)
        spinner = SingleThreadedExecutor(context=context)
        spinner.add_node(node)
        end = time.monotonic() + 3.0
        try:
            while time.monotonic() < end:
                spinner.spin_once(timeout_sec=0.05)
        finally:
            realtime.stop(spinner, node, context, [])
        return {"chunk_ms": 12.5}

    result = realtime.beside_sim(row)
    assert result["chunk_ms"] == 12.5  # the row's own result, kept
    assert len(frames) >= 10, "the simulator was not rendering while the row ran"
    assert 0.02 <= result["sim_cores_busy"] <= 1.5


def test_a_simulator_that_cannot_start_is_an_error_with_its_output(monkeypatch, tmp_path):
    broken = tmp_path / "sim.yaml"
    broken.write_text("sim:\n  engine: no_such_engine\n")
    monkeypatch.setattr(realtime, "SIM_CONFIG", broken)
    ran: list[bool] = []
    with pytest.raises(RuntimeError, match="published no camera frame before it exited") as err:
        realtime.beside_sim(lambda: ran.append(True) or {})
    assert "no_such_engine" in str(err.value)  # the simulator's own words, not only ours
    assert not ran


def test_the_gemm_floor_counts_each_stage_as_often_as_an_inference_runs_it():
    # The real gemm_kernels workers (a fresh process per stage) at the tiny pi0 preset's shapes, float32 packed.
    import argparse

    gemm_kernels = pytest.importorskip("gemm_kernels")
    args = argparse.Namespace(gemm_floor="tiny", runs=1)
    row = {"precision": "fp32: policy.precision fp32", "chunk_ms": 40.0}
    floor = realtime.gemm_floor(args, row, threads=2)
    shapes, steps = gemm_kernels.stage_shapes("tiny")
    assert set(floor["stages_ms"]) == set(shapes) and floor["steps"] == steps > 1
    stages = floor["stages_ms"]
    expected = stages["vision"] + stages["prefill"] + steps * stages["denoise_step"]
    assert floor["inference_gemm_ms"] == pytest.approx(expected, abs=0.1)
    assert floor["chunk_over_floor"] == pytest.approx(40.0 / floor["inference_gemm_ms"], rel=1e-2)
    assert floor["kernel"] == "eager_packed" and floor["image_threads"]
    # An XNNPACK row has no eager kernel to time: said, not guessed.
    skipped = realtime.gemm_floor(args, {"precision": "int8 (program): auto", "chunk_ms": 1.0}, threads=2)
    assert "XNNPACK" in skipped["skipped"]


def test_gemm_kernels_on_image_threads_computes_every_part_of_the_rows():
    import torch

    gemm_kernels = pytest.importorskip("gemm_kernels")
    model = gemm_kernels.build([(8, 4), (8, 6), (4, 3)])
    xs = model.example(10)
    split = gemm_kernels.on_image_threads(model, 2)
    with torch.inference_mode():
        out = split(*xs)
        # One row per part, one element per product: the first row of each half through every linear.
        halves = [model(*(x[i : i + 5] for x in xs)) for i in (0, 5)]
    expected = torch.stack([torch.stack([y[0, 0] for y in half]) for half in halves])
    assert out.shape == (2, 3)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
