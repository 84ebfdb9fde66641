from .convert import AlbertArchitecture

__all__ = ["AlbertArchitecture"]
