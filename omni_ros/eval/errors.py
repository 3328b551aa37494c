"""Errors of the evaluator: each names the bag and, where one is at fault, the topic."""

from __future__ import annotations

from omni_ros.errors import OmniRosError


class EvalError(OmniRosError):
    """Evaluation cannot proceed (the CLI prints it and exits 2)."""


class BagError(EvalError):
    """A bag is missing, unreadable or corrupt."""


class TopicError(EvalError):
    """A configured topic is absent from a bag, or carries a type the evaluator cannot use."""


class NoSamplesError(EvalError):
    """Nothing could be scored: no prediction met recorded ground truth."""
