"""gateway: one API key and one base address in front of many AI models."""

__version__ = "0.1.0"
