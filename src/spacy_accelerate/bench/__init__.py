"""Side-by-side benchmarks of PyTorch and accelerated pipelines (words per second and agreement)."""
