"""`omni-ros train`: fit a policy to demonstrations (`omni-ros sim collect`) and write a checkpoint."""

from __future__ import annotations

import argparse

OVERRIDES = (
    "steps",
    "batch_size",
    "lr",
    "seed",
    "device",
    "threads",
    "checkpoint_every",
    "preset",
    "init_checkpoint",
    "state_noise",
)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from omni_ros.config import load_config
    from omni_ros.train.config import TrainConfig
    from omni_ros.train.loop import train

    cfg = load_config(args.config, TrainConfig) if args.config else TrainConfig()
    # replace() re-runs the recipe's own checks on the values given on the command line.
    cfg = dataclasses.replace(cfg, **{key: getattr(args, key) for key in OVERRIDES if getattr(args, key) is not None})
    result = train(cfg, args.data, args.out, resume=args.resume, stop_after=args.stop_after)
    loss = f"loss {result.first_loss:.4f} -> {result.last_loss:.4f}" if result.first_loss is not None else "no steps"
    print(f"omni-ros train: {result.steps} steps, {loss}, {result.seconds / 60:.1f} min; checkpoint {result.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a policy on demonstrations (flow matching) and write a checkpoint",
        description="Train with the policy's flow-matching step on datasets from `omni-ros sim collect`. The "
        "output folder is a checkpoint (policy.checkpoint can point at it) plus train_state.pt for --resume.",
    )
    p.add_argument("--config", help="training recipe YAML (e.g. config/train_demo.yaml; default: built-in)")
    p.add_argument("--data", nargs="+", required=True, metavar="DIR", help="dataset folder(s)")
    p.add_argument("--out", required=True, help="checkpoint folder to write")
    p.add_argument("--resume", action="store_true", help="continue the run in --out (same batches and noise)")
    p.add_argument("--steps", type=int, help="total optimisation steps")
    p.add_argument("--stop-after", type=int, metavar="STEP", help="end this run at STEP (continue with --resume)")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--seed", type=int)
    p.add_argument("--device", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=int, help="torch CPU threads (0: torch's default)")
    p.add_argument("--checkpoint-every", type=int)
    p.add_argument("--preset", help="architecture of a fresh model (default from the recipe: demo)")
    p.add_argument("--init-checkpoint", help="start from this checkpoint's weights (fine-tuning)")
    p.add_argument("--state-noise", type=float, help="max std of the noise added to training states (robot units)")
    p.set_defaults(func=run)
