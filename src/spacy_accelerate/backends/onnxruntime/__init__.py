"""ONNX Runtime: CPU, CUDA and TensorRT sessions, provider options, graph fusion and dynamic
int8.
"""
