"""The `serve:` section of the omni_ros config (the OpenPI WebSocket server)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omni_ros.typed_config import FieldError

# Four raw 1280x720 RGB frames are 11 MB; four 224x224 tiles 0.6 MB.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass
class BatchingConfig:
    """Dynamic batching of concurrent requests into one `policy.infer_batch` call."""

    enabled: bool = False
    # Most observations in one batch.
    max_batch: int = 8
    # How long the first request of a batch waits for company, in milliseconds.
    max_wait_ms: float = 5.0

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise FieldError("max_batch", f"must be >= 1, got {self.max_batch}")
        if self.max_wait_ms < 0:
            raise FieldError("max_wait_ms", f"must be >= 0, got {self.max_wait_ms}")


@dataclass
class ServeConfig:
    """Where and how `omni-ros serve` listens."""

    # Loopback by default: exposing a robot policy is an explicit choice.
    host: str = "127.0.0.1"
    port: int = 8000
    # Largest accepted WebSocket message; bigger ones are refused with close code 1009.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    # Clients must send `Authorization: Api-Key <key>` when set (or when the
    # environment variable named by api_key_env is set). /healthz stays open.
    api_key: str | None = None
    api_key_env: str = "OMNI_ROS_API_KEY"
    # Key map from openpi observation keys to ours: a name in config/keymaps/
    # (droid, libero, aloha) or a path to a YAML file.
    keymap: str = "droid"
    # Threads running inference; 1 serialises calls into the policy.
    workers: int = 1
    # Keepalive pings; a client that does not answer within the timeout is dropped.
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0
    # On shutdown, in-flight requests get this long to finish before connections close.
    drain_timeout_s: float = 10.0
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise FieldError("workers", f"must be >= 1, got {self.workers}")
        if self.max_message_bytes < 1024:
            raise FieldError("max_message_bytes", f"must be >= 1024, got {self.max_message_bytes}")
