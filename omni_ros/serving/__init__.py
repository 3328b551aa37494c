"""OpenPI-compatible serving: wire codec, key maps, dynamic batching, the WebSocket server.

Kept import-light: `omni_ros.config` imports `ServeConfig` from here, and the
CLI must start without loading websockets or msgpack.
"""

from omni_ros.serving.config import BatchingConfig, ServeConfig

__all__ = ["BatchingConfig", "ServeConfig"]
