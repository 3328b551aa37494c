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
    # Refuse observations carrying keys the key map does not name. Off by default: like openpi's
    # transforms, unknown keys are skipped (one warning per connection and key).
    strict_keys: bool = False
    # Serve wss:// (TLS) with this PEM certificate chain and private key; both or neither. Relative
    # paths are resolved against the config file's directory.
    tls_cert: str | None = None
    tls_key: str | None = None
    # Threads running inference; 1 serialises calls into the policy.
    workers: int = 1
    # A policy whose last few calls each took less than this (ms) is called on the event loop: handing a call to
    # a worker thread and back costs two thread wake-ups, more than such a policy takes. A slower call sends the
    # next ones back to the threads, so a real model never blocks the loop. 0: always on the threads.
    inline_below_ms: float = 1.0
    # Keepalive pings; a client that does not answer within the timeout is dropped.
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0
    # On shutdown, in-flight requests get this long to finish before connections close.
    drain_timeout_s: float = 10.0
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise FieldError("workers", f"must be >= 1, got {self.workers}")
        if self.inline_below_ms < 0:
            raise FieldError("inline_below_ms", f"must be >= 0, got {self.inline_below_ms}")
        if self.max_message_bytes < 1024:
            raise FieldError("max_message_bytes", f"must be >= 1024, got {self.max_message_bytes}")
        if bool(self.tls_cert) != bool(self.tls_key):
            missing = "tls_key" if self.tls_cert else "tls_cert"
            raise FieldError(missing, "is needed too: wss:// takes both tls_cert and tls_key (PEM files), or neither")
