"""One folder per backend (onnxruntime/, openvino/) behind one interface (base.Backend);
registry.py maps providers to them.
"""
