"""The pi0-style VLA policy: model parts, sampler, checkpoints, and the Policy contract."""

from omni_ros.policy.base import BasePolicy, Policy, PolicyMetadata

__all__ = ["BasePolicy", "Policy", "PolicyMetadata"]
