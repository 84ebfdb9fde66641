"""Stage 6a: the Hugging Face encoder traced to ONNX, and the cache key of what was exported."""
