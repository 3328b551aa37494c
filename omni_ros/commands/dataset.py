"""`omni-ros dataset export`: rosbag2 episodes -> a LeRobotDataset v3.0 folder with the robot's own mapping."""

from __future__ import annotations

import argparse
import sys

from omni_ros.commands.common import add_config_args


def export(args: argparse.Namespace) -> int:
    from omni_ros.commands.eval import _config
    from omni_ros.dataset.export import export_dataset
    from omni_ros.dataset.video import VideoSettings

    config = _config(args, "omni-ros dataset export")
    summary = export_dataset(
        args.bags,
        config,
        args.out,
        fps=args.fps,
        overwrite=args.overwrite,
        progress=not args.quiet,
        settings=VideoSettings(threads=args.threads),
        robot_type=args.robot_type,
        repo_id=args.repo_id,
    )
    print(summary.text())
    sys.stdout.flush()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dataset", help="LeRobotDataset v3 folders from rosbag2 episodes")
    dsub = p.add_subparsers(dest="dataset_command", metavar="SUBCOMMAND", required=True)
    ex = dsub.add_parser(
        "export",
        help="write rosbag2 episodes as a LeRobotDataset v3.0 folder (what LeRobot fine-tunes on)",
        description="Read rosbag2 episodes (mcap or sqlite3) through the policy node's feed and assembler and write "
        "a LeRobotDataset v3.0 folder: observation.images.<camera> (AV1 video, as LeRobot 0.6.1 encodes), "
        "observation.state and action in robot.joint_names order, task = the prompt. Topics, episode split and the "
        "action source (eval.ground_truth: the command topic, or the next joint state) come from the config's "
        "eval: section, as for `omni-ros eval`; a bag recorded by `omni-ros bag record-sim` brings its own config. "
        "Frames are resampled to --fps on the trigger camera's clock.",
    )
    ex.add_argument("bags", nargs="+", metavar="BAG", help="rosbag2 directory, .mcap or .db3 file")
    add_config_args(ex)
    ex.add_argument("--out", required=True, help="dataset folder to create (must be absent or empty)")
    ex.add_argument("--fps", type=int, default=30, help="frames per second of the dataset (default 30)")
    ex.add_argument(
        "--repo-id",
        default="",
        help="the name to load it by in LeRobot (printed with the summary: LeRobot takes it at load time)",
    )
    ex.add_argument("--robot-type", default=None, help="info.json robot_type (default: null)")
    ex.add_argument("--overwrite", action="store_true", help="replace a non-empty --out folder")
    ex.add_argument("--threads", type=int, default=None, help="video encoder threads per camera (default: codec's)")
    ex.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    ex.set_defaults(func=export)
