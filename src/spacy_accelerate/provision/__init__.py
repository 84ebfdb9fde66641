"""Stage 6: get a verified model from the cache, or export, build and store it."""
