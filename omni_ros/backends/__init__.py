"""Policy backends besides the eager torch one in omni_ros/policy.

`executorch_backend.ExecuTorchPolicy` runs a `.pte` written by `omni-ros export`;
`remote.RemotePolicy` forwards observations to an OpenPI WebSocket server.
"""
