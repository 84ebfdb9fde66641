"""The accuracy checks: parity against PyTorch, the rows checked, spot checks, calibration data
and the shared int8 plan search.
"""
