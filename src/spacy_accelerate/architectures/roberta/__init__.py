from spacy_accelerate.architectures.roberta.convert import RobertaArchitecture

__all__ = ["RobertaArchitecture"]
