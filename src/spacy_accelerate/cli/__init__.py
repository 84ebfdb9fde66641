"""The spacy-accelerate command line."""
