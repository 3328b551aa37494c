"""Export the policy to ExecuTorch `.pte` programs (XNNPACK on CPU, QNN on Qualcomm, CUDA) with a sidecar JSON.

Heavy imports (torch.export, executorch) stay inside functions, so importing this package is cheap.
"""
