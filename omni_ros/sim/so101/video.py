"""A video of a policy driving the SO-101, filmed at a display size while the policy sees its own cameras.

    python -m omni_ros.sim.so101.video [--checkpoint checkpoints/so101] [--out docs/so101_demo.gif]
                                       [--episodes 3] [--size 160] [--seed 1000000]

The episodes are the closed-loop evaluation's (omni_ros.sim.evaluate: each layout with its own prompt,
then with a prompt naming another cube): the policy gets the configured camera images (96 px in
config/sim_so101.yaml), the video the same cameras rendered at `--size`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from omni_ros.sim.config import SimConfig
from omni_ros.sim.so101.env import So101Env, render_cameras
from omni_ros.sim.so101.model import mujoco


class DisplayEnv(So101Env):
    """`observe()` as configured (what the policy sees); `render()` at `width` x `height` (what the video shows)."""

    def __init__(self, config: SimConfig, width: int, height: int) -> None:
        super().__init__(config)
        self.model.vis.global_.offwidth = max(self.model.vis.global_.offwidth, width)
        self.model.vis.global_.offheight = max(self.model.vis.global_.offheight, height)
        self._display = mujoco.Renderer(self.model, height, width)

    def observe(self) -> dict[str, Any]:
        assert self.task is not None  # set by reset()
        return {"images": super().render(), "state": self.state, "prompt": self.task.prompt}

    def render(self) -> dict[str, np.ndarray]:
        return render_cameras(self._display, self.data, self.cameras)

    def close(self) -> None:
        self._display.close()
        super().close()


def main(argv: Sequence[str] | None = None) -> int:
    from omni_ros.backends.factory import load_policy
    from omni_ros.config import CONFIG_DIR, PolicyConfig, load_config
    from omni_ros.sim.evaluate import HELD_OUT_SEED, EvalOptions, evaluate, write_video

    parser = argparse.ArgumentParser(prog="python -m omni_ros.sim.so101.video", description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(CONFIG_DIR / "sim_so101.yaml"), help="config with the sim: section")
    parser.add_argument("--checkpoint", help="policy checkpoint (default: the config's policy)")
    parser.add_argument("--out", default="docs/so101_demo.gif", help=".gif/.webp/.mp4 to write")
    parser.add_argument("--episodes", type=int, default=3, help="layouts (each with two prompts)")
    parser.add_argument("--seed", type=int, default=HELD_OUT_SEED, help="first layout seed")
    parser.add_argument("--size", type=int, default=160, help="video frame size per camera, px")
    parser.add_argument("--every", type=int, default=4, help="keep every n-th 50 Hz control tick")
    parser.add_argument("--fps", type=float, default=12.5)
    args = parser.parse_args(argv)
    config = load_config(args.config)
    policy_config = config.policy if not args.checkpoint else PolicyConfig(checkpoint=args.checkpoint, seed=0)
    policy = load_policy(policy_config, camera_names=list(config.sim.cameras), state_dim=config.sim.n_joints)
    env = DisplayEnv(config.sim, args.size, args.size)
    try:
        options = EvalOptions(episodes=args.episodes, seed=args.seed, video_episodes=args.episodes)
        options.record_every = args.every
        score, clips = evaluate(
            policy.metadata.model,
            lambda obs: policy.infer(obs)["actions"],
            config.sim,
            options,
            action_dt=policy.metadata.action_dt,
            control=config.control,
            env=env,
        )
    finally:
        env.close()
    path = write_video(clips, args.out, fps=args.fps)
    print(
        f"{path}: {len(clips)} episodes, success {100 * score.success_rate:.0f}%, "
        f"prompt following {100 * (score.prompt_following_rate or 0):.0f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
