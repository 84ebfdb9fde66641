from spacy_accelerate.architectures.huggingface.passthrough import (
    HF_FAMILIES,
    HuggingFaceArchitecture,
    HuggingFaceFamily,
)

__all__ = ["HF_FAMILIES", "HuggingFaceArchitecture", "HuggingFaceFamily"]
