"""The built-in upstream simulator (`gateway sim`): real HTTP, real provider wire formats."""

from .app import application, run, serve
from .state import Simulator

__all__ = ["Simulator", "application", "run", "serve"]
