"""Errors a user can act on. The CLI prints these as one line, without a traceback."""


class OmniRosError(Exception):
    """Base of every user-facing omni_ros error (bad config, checkpoint, observation, device)."""
