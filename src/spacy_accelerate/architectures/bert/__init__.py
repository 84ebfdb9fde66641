from .convert import BertArchitecture

__all__ = ["BertArchitecture"]
