"""The built-in upstream simulator (`gateway sim`): real HTTP, real provider wire formats."""

from .server import Simulator, run, serve

__all__ = ["Simulator", "run", "serve"]
