"""The pi0-style VLA policy: model parts, sampler, checkpoints, and the Policy contract (policy/base.py).

Kept import-light: `omni_ros.config` imports `omni_ros.policy.config`, and the CLI must start without
loading OpenCV or torch, so import the submodules you need.
"""
