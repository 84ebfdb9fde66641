from spacy_accelerate.architectures.bert.convert import BertArchitecture

__all__ = ["BertArchitecture"]
