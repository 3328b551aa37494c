"""bench/realtime.py's starvation count: what the README's never-starve figure is computed from."""

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
    # one too, then holds 2 s until the next, which was observed as the previous one arrived.
    chunks = [(0.0, 3.0, 1.0), (3.0, 6.0, 1.0), (6.0, 9.0, 1.0), (9.0, 12.0, 1.0)]
    result = realtime.starvation(chunks)
    assert result["starvations"] == 3
    # Held from 4 to 6, 7 to 9, 10 to 12; the run lasted 12 s.
    assert result["held_s"] == pytest.approx(6.0, abs=1e-9)
    assert result["held_s"] <= 12.0
