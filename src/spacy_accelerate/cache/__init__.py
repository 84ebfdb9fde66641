"""The atomic on-disk model cache: entries, locks, ownership, where a saved pipeline finds its
cache, listings.
"""
