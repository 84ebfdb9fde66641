"""Choosing a plan and timing it: PyTorch's references on the calibration texts and the
agreement gate, ``precision="auto"``'s search, the stage timings and the overlap plan."""
