"""Policy backends besides the eager torch one in omni_ros/policy.

`executorch_backend.ExecuTorchPolicy` runs a `.pte` written by `omni-ros export`;
`onnx_backend.OnnxRunner` / `OnnxPolicy` run an ONNX export folder on ONNX Runtime (CPU, Qualcomm HTP, CUDA);
`remote.RemotePolicy` forwards observations to an OpenPI WebSocket server.
"""
