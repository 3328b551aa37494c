"""Policy backends that are not a model in this process (see omni_ros/policy for the torch one).

`remote.RemotePolicy` forwards observations to an OpenPI WebSocket server.
"""
