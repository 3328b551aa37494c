"""Export the policy to ExecuTorch `.pte` programs (XNNPACK on CPU, QNN on Qualcomm, CUDA) with a sidecar JSON,
or to a folder of ONNX graphs for ONNX Runtime and Qualcomm's HTP through its QNN EP (onnx_export, qnn_onnx).

Heavy imports (torch.export, executorch) stay inside functions, so importing this package is cheap.
"""
