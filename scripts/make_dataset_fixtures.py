#!/usr/bin/env python3
"""The LeRobot 0.6.1 side of `omni-ros dataset export`: what LeRobot reads from our export, and a dataset it wrote.

Runs in the LeRobot venv (`make reference-fixtures`); the omni_ros half runs as subprocesses in the product venv
(.venv or $OMNI_ROS_VENV), so nothing here imports omni_ros:

1. `omni-ros bag record-sim` writes 3 episodes of the planar sim (test/fixtures/dataset/sim_small.yaml: 96x64
   cameras) and `omni-ros dataset export` turns them into a LeRobotDataset folder;
   scripts/dataset_frames.py dumps the raw frames that export took from the bag (before video encoding).
2. LeRobot's `LeRobotDataset(repo_id, root=...)` loads the export: frame and episode counts, features (dtype,
   shape, names), tasks, every frame's state and action, and a few decoded video frames are stored as the
   expectations the product suite checks without LeRobot (test/test_dataset_export.py).
3. LeRobot's own writer (`LeRobotDataset.create`, `add_frame`, `save_episode`, `finalize`) saves the same raw
   frames: its meta/stats.json is the reference for ours (compared here and stored), and the folder itself is
   committed as `lerobot_tiny/`, a dataset LeRobot wrote, for `omni-ros eval --dataset` in the suite.

    .venv-lerobot/bin/python scripts/make_dataset_fixtures.py --out test/fixtures/dataset
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("SVT_LOG", "1")

try:
    import lerobot
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
except ImportError as exc:  # pragma: no cover - only outside the LeRobot venv
    sys.exit(f"make_dataset_fixtures.py needs the LeRobot venv with the dataset extra ({exc})")

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "test" / "fixtures" / "dataset" / "sim_small.yaml"
EPISODES, DURATION_S, FPS = 3, 2.0, 30
REPO_ID = "omni_ros/sim_small"
# Frames whose decoded pixels are stored (first, middle, last of the dataset).
DECODED = (0, 90, 179)


def product_bin() -> Path:
    venv = Path(os.environ.get("OMNI_ROS_VENV") or ROOT / ".venv")
    return venv / "bin"


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "SVT_LOG": "1"})


def features_of(meta_features: dict) -> dict:
    return {
        k: {"dtype": v["dtype"], "shape": list(v["shape"]), "names": v.get("names")} for k, v in meta_features.items()
    }


def lerobot_writes(frames: dict, features: dict, root: Path) -> None:
    """The raw frames through LeRobot's own writer."""
    user = {
        k: dict(v)
        for k, v in features.items()
        if k not in ("timestamp", "frame_index", "episode_index", "index", "task_index")
    }
    for value in user.values():
        value["shape"] = tuple(value["shape"])
    ds = LeRobotDataset.create(REPO_ID, fps=FPS, root=root, features=user, use_videos=True)
    prompts = json.loads(str(frames["meta"]))["prompts"]
    episode = frames["episode"]
    cameras = [k.removeprefix("image.") for k in frames.files if k.startswith("image.")]
    for i in range(len(episode)):
        frame = {f"observation.images.{c}": frames[f"image.{c}"][i] for c in cameras}
        frame["observation.state"] = frames["state"][i]
        frame["action"] = frames["action"][i]
        frame["task"] = prompts[i]
        ds.add_frame(frame)
        if i + 1 == len(episode) or episode[i + 1] != episode[i]:
            ds.save_episode()
    ds.finalize()


def stats_case_inputs(length: int = 150, height: int = 240, width: int = 320) -> tuple[np.ndarray, np.ndarray]:
    """An episode longer than 100 frames with frames >= 300 px wide (the sampling and striding branches of LeRobot's
    image stats, which the sim fixture's 60-frame, 96x64 episodes do not reach), from formulas: no RNG to drift.
    The same formulas are in test/test_dataset_export.py."""
    i = np.arange(length)[:, None, None, None]
    y = np.arange(height)[None, :, None, None]
    x = np.arange(width)[None, None, :, None]
    c = np.arange(3)[None, None, None, :]
    images = ((i * 13 + y * 3 + x * 7 + c * 50 + (x * y) % 17) % 256).astype(np.uint8)
    t = np.arange(length)[:, None]
    vectors = (np.sin(0.1 * t * (np.arange(4)[None, :] + 1)) + 0.01 * np.arange(4)[None, :]).astype(np.float32)
    return images, vectors


def lerobot_stats_case(tmp: Path) -> dict:
    """LeRobot's compute_episode_stats on stats_case_inputs (frames as the PNG files its writer would leave)."""
    from lerobot.datasets.compute_stats import compute_episode_stats
    from PIL import Image

    images, vectors = stats_case_inputs()
    paths = []
    for k, image in enumerate(images):
        path = tmp / f"frame-{k:06d}.png"
        Image.fromarray(image).save(path)
        paths.append(str(path))
    features = {
        "observation.images.cam": {"dtype": "video", "shape": list(images.shape[1:]), "names": None},
        "observation.state": {"dtype": "float32", "shape": [vectors.shape[1]], "names": None},
    }
    stats = compute_episode_stats({"observation.images.cam": paths, "observation.state": vectors}, features)
    return {k: {s: np.asarray(v).tolist() for s, v in f.items()} for k, f in stats.items()}


def max_diff(ours: dict, theirs: dict) -> dict[str, float]:
    out = {}
    for key, stats in theirs.items():
        for stat, value in stats.items():
            a, b = np.asarray(ours[key][stat], dtype=np.float64), np.asarray(value, dtype=np.float64)
            out[f"{key}/{stat}"] = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "test" / "fixtures" / "dataset")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    bindir = product_bin()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        bag, export, lerobot_root = tmp / "bag", tmp / "export", tmp / "lerobot_tiny"
        run([str(bindir / "omni-ros"), "bag", "record-sim", "--episodes", str(EPISODES), "--duration",
             str(DURATION_S), "--config", str(CONFIG), "--out", str(bag), "-q"])  # fmt: skip
        run([str(bindir / "omni-ros"), "dataset", "export", str(bag), "--out", str(export), "--fps", str(FPS), "-q"])
        run([str(bindir / "python"), str(ROOT / "scripts" / "dataset_frames.py"), str(bag), "--fps", str(FPS),
             "--out", str(tmp / "frames.npz")])  # fmt: skip
        frames = np.load(tmp / "frames.npz")

        # 2. What LeRobot reads from our export.
        ds = LeRobotDataset(REPO_ID, root=export, download_videos=False)
        hf = ds.hf_dataset.with_format(None)
        state = np.array(hf["observation.state"], dtype=np.float32)
        action = np.array(hf["action"], dtype=np.float32)
        episodes = [
            {"length": int(e["length"]), "from": int(e["dataset_from_index"]), "to": int(e["dataset_to_index"])}
            for e in ds.meta.episodes
        ]
        tasks = [str(t) for t in ds.meta.tasks.sort_values("task_index").index]
        cameras = list(ds.meta.video_keys)
        decoded = {}
        errors = {}
        for key in cameras:
            raw = frames[f"image.{key.removeprefix('observation.images.')}"]
            picked = []
            for i in DECODED:
                image = (ds[i][key].numpy().transpose(1, 2, 0) * 255.0).round().astype(np.uint8)
                picked.append(image)
            decoded[key] = np.stack(picked)
            diff = np.abs(decoded[key].astype(np.int16) - raw[list(DECODED)].astype(np.int16))
            errors[key] = {"mean_abs": float(diff.mean()), "max_abs": int(diff.max())}
        state_ok = bool(np.array_equal(state, frames["state"])) and bool(np.array_equal(action, frames["action"]))
        # Every frame decodes within LeRobot's 1e-4 s timestamp tolerance, also as training reads them (history and
        # action chunks through delta_timestamps, across the episodes sharing one video file).
        for i in range(len(ds)):
            ds[i]
        chunked = LeRobotDataset(
            REPO_ID,
            root=export,
            download_videos=False,
            delta_timestamps={cameras[0]: [-2 / FPS, 0.0], "action": [k / FPS for k in range(10)]},
        )
        for i in range(len(chunked)):
            chunked[i]

        # 3. LeRobot's own writer on the same raw frames: its stats are the reference.
        lerobot_writes(frames, ds.meta.features, lerobot_root)
        theirs = json.loads((lerobot_root / "meta" / "stats.json").read_text())
        ours = json.loads((export / "meta" / "stats.json").read_text())
        diffs = max_diff(ours, theirs)
        (tmp / "stats_case").mkdir()
        worst = max(diffs.values())

        expected = {
            "lerobot_version": lerobot.__version__,
            "made_by": "scripts/make_dataset_fixtures.py (make reference-fixtures)",
            "recording": {"config": "sim_small.yaml", "episodes": EPISODES, "duration_s": DURATION_S, "fps": FPS},
            "total_frames": len(ds),
            "total_episodes": ds.num_episodes,
            "fps": ds.fps,
            "features": features_of(ds.meta.features),
            "tasks": tasks,
            "episodes": episodes,
            "episode_tasks": [ds[e["from"]]["task"] for e in episodes],
            "decoded_indices": list(DECODED),
            "decode_error_vs_raw": errors,
            "state_action_equal_raw": state_ok,
            "every_frame_decodes": True,
            "lerobot_stats": theirs,
            "stats_case": lerobot_stats_case(tmp / "stats_case"),
            "stats_max_abs_diff_ours_vs_lerobot": worst,
        }
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")
        np.savez_compressed(
            args.out / "expected_frames.npz",
            state=state,
            action=action,
            **{f"decoded.{k}": v for k, v in decoded.items()},
        )
        target = args.out / "lerobot_tiny"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(lerobot_root, target, ignore=shutil.ignore_patterns("images"))
        print(
            f"LeRobot {lerobot.__version__} loaded the export: {len(ds)} frames, {ds.num_episodes} episodes, "
            f"{len(tasks)} tasks; state/action equal to the raw frames: {state_ok}; decode error vs raw {errors}; "
            f"stats max |ours - LeRobot's| = {worst:.3g}",
            file=sys.stderr,
        )
        if not state_ok or worst > 1e-6:
            bad = {k: v for k, v in diffs.items() if v > 1e-6}
            sys.exit(f"our export disagrees with LeRobot: state/action equal {state_ok}; stats {bad}")


if __name__ == "__main__":
    main()
