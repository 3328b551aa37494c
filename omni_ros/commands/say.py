"""`omni-ros say`: speak a text with the configured TTS engine, without ROS."""

from __future__ import annotations

import argparse
import json
import sys


def run(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    from omni_ros.commands.common import config_from_args
    from omni_ros.tts.engine import TtsError, create_engine
    from omni_ros.tts.pipeline import TtsPipeline, UtteranceStats
    from omni_ros.tts.sinks import WavSink, open_playback
    from omni_ros.tts.text import clean_text

    config = config_from_args(args).tts
    overrides = {
        key: getattr(args, key) for key in ("engine", "voice", "rate", "pitch") if getattr(args, key) is not None
    }
    if args.sample_rate is not None:
        overrides["output_sample_rate"] = args.sample_rate
    text = sys.stdin.read() if args.text == "-" else args.text
    if not clean_text(text):
        print("omni-ros say: nothing to say (the text is empty)", file=sys.stderr)
        return 1
    try:
        # replace() re-runs the config's own checks on the values given on the command line.
        if args.schedule is not None:
            overrides["schedule"] = dataclasses.replace(config.schedule, mode=args.schedule)
        config = dataclasses.replace(config, **overrides)
        engine = create_engine(config)
        pipeline = TtsPipeline(engine, config)
    except (TtsError, ValueError) as exc:
        print(f"omni-ros say: {exc}", file=sys.stderr)
        return 2

    sinks = []
    wav = None
    if args.out:
        out = Path(args.out).expanduser()
        wav = WavSink(out.parent, out.name)
        sinks.append(wav)
    if args.play:
        # Without an audio device this logs why and returns None.
        playback = open_playback()
        if playback is not None:
            sinks.append(playback)
    stats = UtteranceStats(utterance_id="say")
    for sink in sinks:
        sink.begin(stats.utterance_id, pipeline.sample_rate)
    try:
        for chunk in pipeline.synthesize(text, stats=stats):
            for sink in sinks:
                sink.write(chunk.samples)
    except TtsError as exc:
        print(f"omni-ros say: {exc}", file=sys.stderr)
        return 2
    finally:
        for sink in sinks:
            sink.end(False)
            sink.close()
        engine.close()
    if args.json:
        print(json.dumps({"sample_rate": pipeline.sample_rate, **stats.to_dict()}))
    else:
        print(
            f"{engine.name}: TTFA {1000 * stats.ttfa_s:.1f} ms, RTF {stats.rtf:.3f} "
            f"({stats.audio_s:.2f} s of audio at {pipeline.sample_rate} Hz in {stats.synth_s:.2f} s, "
            f"{stats.chunks} chunks, {stats.underruns} underruns)"
        )
        if wav is not None:
            print(f"wrote {wav.path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from omni_ros.commands.common import add_config_args

    p = sub.add_parser("say", help="speak a text with the TTS engine (no ROS); prints time to first audio and RTF")
    p.add_argument("text", help="what to say ('-' reads standard input)")
    p.add_argument("--engine", help="TTS engine: espeak or piper (default: tts.engine of the config)")
    p.add_argument("--voice", help="espeak voice name, or piper .onnx voice file")
    p.add_argument("--rate", type=float, help="speaking speed multiplier (1.0 = normal)")
    p.add_argument("--pitch", type=int, help="espeak pitch 0-100")
    p.add_argument("--sample-rate", type=int, help="output sample rate in Hz (default: the engine's)")
    p.add_argument("--schedule", choices=["fixed", "ramp", "adaptive"], help="chunk schedule mode")
    p.add_argument("--out", help="write the audio to this WAV file")
    p.add_argument("--play", action="store_true", help="play on the local audio device if there is one")
    p.add_argument("--json", action="store_true", help="print the measurements as one JSON line")
    add_config_args(p, sim=False)
    p.set_defaults(func=run)
