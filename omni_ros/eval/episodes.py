"""Where a recording's episodes start: the one rule `omni-ros eval` and `omni-ros dataset export` share.

Each bag opens an episode with its first message; after that, a message on the episode marker topic, or a
silence longer than `gap_s` (> 0) between two messages, starts the next one. Sharing the rule means a
dataset exported from a bag holds exactly the episodes the evaluator scores in that bag.
"""

from __future__ import annotations


class EpisodeSplitter:
    """Feed every message's (topic, log time) in order; `starts_episode` says whether it opens a new episode."""

    def __init__(self, marker_topic: str = "", gap_s: float = 0.0) -> None:
        self.marker_topic = marker_topic
        self.gap_s = gap_s
        self._last_t: float | None = None
        self._open = False

    def starts_episode(self, topic: str, t: float) -> bool:
        """True for the first message of the bag and for each message that starts another episode."""
        if not self._open:
            split = True
        else:
            marked = bool(self.marker_topic) and topic == self.marker_topic
            silent = self.gap_s > 0 and self._last_t is not None and t - self._last_t > self.gap_s
            split = marked or silent
        self._open = True
        self._last_t = t
        return split
