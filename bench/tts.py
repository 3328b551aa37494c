"""Voice feedback latency: time to first audio, real-time factor and playback gaps.

    .venv/bin/python bench/tts.py [--engines espeak piper] [--repeats 5] [--node-repeats 10] [--out FILE]

Three parts, printed as one JSON document:
  engines   in-process pipeline (engine -> resampler -> scheduler) for each
            engine, text (a 20-word sentence, a three-sentence paragraph) and
            chunk schedule: TTFA, RTF, underruns of a listener who starts at
            the first chunk; for piper also the whole-sentence baseline (text
            split only at sentence ends, as stock piper does) side by side.
  node      end to end through the TTS node in its own process over DDS:
            text published here -> first AudioChunk received here (one clock),
            and underruns measured on arrival times here.
  simulated schedules on a simulated clock with a synthesizer at 2x and
            12.5x real time (80 ms frames), no timing involved.
Medians over repeats; the machine is shared, so compare within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import emit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))

SENTENCE = "The robot has picked up the red cup from the table and is placing it carefully into the blue bin."
PARAGRAPH = (
    "I found the red cup on the left side of the table, next to the blue plate. "
    "I am picking it up now and will place it carefully in the bin by the window. "
    "After that I will return to my home position and wait for the next instruction."
)
TEXTS = {"sentence_20w": SENTENCE, "paragraph_3s": PARAGRAPH}


def schedules():
    from omni_ros.tts.config import TtsScheduleConfig

    return {
        # vLLM-Omni style: one 80 ms frame, then 25-frame (2 s) chunks.
        "fixed_1_25": TtsScheduleConfig(mode="fixed", first_chunk_ms=80, steady_chunk_ms=2000),
        "ramp": TtsScheduleConfig(mode="ramp", first_chunk_ms=40, ramp_ms=[40, 80, 160], steady_chunk_ms=320),
        "adaptive": TtsScheduleConfig(mode="adaptive"),
    }


def med(values: list[float], digits: int = 4) -> float:
    return round(statistics.median(values), digits)


def run_pipeline(engine, config, text: str, repeats: int) -> dict:
    from omni_ros.tts.pipeline import TtsPipeline, UtteranceStats

    pipeline = TtsPipeline(engine, config)
    list(pipeline.synthesize("Warm up."))
    rows = []
    for _ in range(repeats):
        stats = UtteranceStats()
        for _chunk in pipeline.synthesize(text, stats=stats):
            pass
        rows.append(stats)
    return {
        "ttfa_ms": med([1000 * s.ttfa_s for s in rows], 2),
        "rtf": med([s.rtf for s in rows]),
        "audio_s": med([s.audio_s for s in rows], 2),
        "chunks": med([s.chunks for s in rows], 1),
        "underruns_max": max(s.underruns for s in rows),
        "underrun_ms_max": round(1000 * max(s.underrun_s for s in rows), 1),
    }


def bench_engines(engines: list[str], repeats: int) -> dict:
    from omni_ros.tts.config import TtsConfig
    from omni_ros.tts.engine import create_engine

    out = {}
    for name in engines:
        base = TtsConfig(engine=name)
        engine = create_engine(base)
        result = {}
        for text_name, text in TEXTS.items():
            for sched_name, schedule in schedules().items():
                config = TtsConfig(engine=name, schedule=schedule)
                result[f"{text_name}/{sched_name}"] = run_pipeline(engine, config, text, repeats)
        if name == "piper":
            # Baseline: the whole sentence is synthesized before any audio (splitting at sentence ends only).
            whole = create_engine(TtsConfig(engine="piper", first_segment_words=10_000, max_segment_chars=10_000))
            for text_name, text in TEXTS.items():
                key = f"{text_name}/whole_sentence_first"
                result[key] = run_pipeline(whole, TtsConfig(engine="piper"), text, repeats)
                split = result[f"{text_name}/adaptive"]["ttfa_ms"]
                result[f"{text_name}/ttfa_speedup_vs_whole_sentence"] = round(result[key]["ttfa_ms"] / split, 2)
        result["sample_rate"] = engine.sample_rate
        out[name] = result
    return out


def bench_node(engine: str, repeats: int) -> dict:
    import rclpy

    from helpers.tts_client import TtsClient, start_tts_node, stop_process
    from omni_ros.tts.playback import PlaybackClock

    os.environ.setdefault("ROS_DOMAIN_ID", str(150 + os.getpid() % 50))
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    context = rclpy.Context()
    rclpy.init(context=context)
    node = rclpy.create_node("tts_bench", context=context)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        proc, section = start_tts_node(ROOT, Path(tmp), f"tts_bench_{engine}", engine=engine)
        try:
            client = TtsClient(node, section)
            client.wait_connected(proc)
            client.handshake(proc)
            for text_name, text in TEXTS.items():
                ttfa, underruns, rtf = [], [], []
                for _ in range(repeats):
                    n = len(client.order)
                    done = len(client.finished())
                    sent = time.monotonic()
                    client.say(text)
                    client.spin_until(lambda n=n: len(client.order) > n, 30, proc)
                    uid = client.order[n]
                    ttfa.append(1000 * (client.arrivals[-len(client.chunks[uid])][0] - sent))
                    client.spin_until(lambda d=done: len(client.finished()) > d, 60, proc)
                    listener = PlaybackClock(client.chunks[uid][0].sample_rate)
                    for arrival, msg in client.arrivals:
                        if msg.utterance_id == uid and len(msg.data):
                            listener.add(arrival, len(msg.data) // 2)
                    underruns.append(listener.report().underruns)
                    client.spin_until(lambda u=uid: any(r["utterance_id"] == u for r in client.utterance_reports()), 5)
                    rtf.extend(r["rtf"] for r in client.utterance_reports() if r["utterance_id"] == uid)
                    time.sleep(0.2)
                results[text_name] = {
                    "ttfa_ms_median": med(ttfa, 2),
                    "ttfa_ms_max": round(max(ttfa), 2),
                    "rtf_median": med(rtf) if rtf else None,
                    "underruns_max": max(underruns),
                }
        finally:
            stop_process(proc)
            node.destroy_node()
            context.try_shutdown()
    return results


def bench_simulated() -> dict:
    from helpers.tts_sim import SimClock, frames_at_speed
    from omni_ros.tts.playback import simulate
    from omni_ros.tts.scheduler import ChunkScheduler

    sr, frame = 24000, 1920
    out = {}
    for speed in (2.0, 12.48, 1.5):
        for name, schedule in schedules().items():
            clock = SimClock()
            chunks = list(ChunkScheduler(schedule, sr, clock).run(frames_at_speed(clock, 150, frame, sr, speed)))
            report = simulate([(c.time_s, len(c.samples)) for c in chunks if len(c.samples)], sr)
            out[f"{speed}x/{name}"] = {
                "first_chunk_ms": round(1000 * chunks[0].time_s, 1),
                "chunks": len(chunks),
                "underruns": report.underruns,
                "gap_ms": round(1000 * report.underrun_s, 1),
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["espeak", "piper"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--node-repeats", type=int, default=10)
    parser.add_argument("--skip-node", action="store_true")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    result = {
        "machine": {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)},
        "engines": bench_engines(args.engines, args.repeats),
        "simulated": bench_simulated(),
    }
    if not args.skip_node:
        # Each engine's node in its own process, measured one after the other.
        result["node"] = {e: bench_node(e, args.node_repeats) for e in args.engines}
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
