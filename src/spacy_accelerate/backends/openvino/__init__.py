"""OpenVINO on the CPU: IR conversion, compiled blobs, bf16 and calibrated int8 under accuracy
control.
"""
