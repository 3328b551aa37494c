#!/usr/bin/env python3
"""The frames `omni-ros dataset export` takes from a bag, raw (before video encoding), as one .npz.

Runs in the product venv; `scripts/make_dataset_fixtures.py` (LeRobot venv) feeds these raw frames to LeRobot's
own `LeRobotDataset.create` / `add_frame` / `save_episode`, so LeRobot computes its stats from exactly the pixels
and values our export saw, and compares them with ours.

    .venv/bin/python scripts/dataset_frames.py BAG --fps 30 --out frames.npz
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from omni_ros.dataset.sampling import EpisodeEnd, EpisodeSampler, EpisodeStart, Frame
from omni_ros.eval.bag import Bag
from omni_ros.eval.recorded import read_recorded_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bag")
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    recorded = read_recorded_config(args.bag)
    assert recorded is not None, "a bag written by `omni-ros bag record-sim` (it carries its config)"
    sampler = EpisodeSampler(recorded.config, args.fps)
    images: dict[str, list[np.ndarray]] = defaultdict(list)
    state, action, stamps, episode, prompts = [], [], [], [], []
    with Bag(args.bag) as bag:
        index = -1
        for event in sampler.read(bag, sampler.topics.check(bag)):
            if isinstance(event, EpisodeStart):
                index += 1
            elif isinstance(event, Frame):
                for name, image in event.images.items():
                    images[name].append(image)
                state.append(event.state)
                action.append(event.action)
                stamps.append(event.stamp)
                episode.append(index)
                prompts.append(event.prompt)
            elif isinstance(event, EpisodeEnd):
                assert event.frames > 0
    arrays = {f"image.{name}": np.stack(frames) for name, frames in images.items()}
    np.savez(
        args.out,
        state=np.stack(state),
        action=np.stack(action),
        stamp=np.array(stamps),
        episode=np.array(episode),
        **arrays,
        meta=np.array(json.dumps({"prompts": prompts, "joint_names": sampler.topics.joint_names})),
    )


if __name__ == "__main__":
    main()
