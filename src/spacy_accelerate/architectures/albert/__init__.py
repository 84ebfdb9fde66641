from spacy_accelerate.architectures.albert.convert import AlbertArchitecture

__all__ = ["AlbertArchitecture"]
