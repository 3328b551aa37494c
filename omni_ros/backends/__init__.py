"""Runners besides the eager torch one in omni_ros/policy, and the factory that picks one from config.

executorch_runner.py  a `.pte` written by `omni-ros export` (XNNPACK, QNN, CUDA)
onnx_runner.py        an ONNX export folder on ONNX Runtime (CPU, Qualcomm HTP emulator or device, CUDA)
remote.py             an OpenPI WebSocket server (ours, openpi's)
factory.py            `policy:` config -> a Policy, whatever the backend
"""
