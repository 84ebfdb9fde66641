from .convert import RobertaArchitecture

__all__ = ["RobertaArchitecture"]
