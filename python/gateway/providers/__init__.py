"""Upstream adapters, one module per provider kind; `PROVIDERS` maps a channel's kind to its adapter.

An adapter module has PARAMS (model type -> the parameters it forwards by default, spec 1.3; a
model's `supported_params` overrides them), PATHS (model type -> upstream path), url(channel, type)
and headers(channel, client_headers). Sending and error mapping are shared (base.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType
from typing import Final

from . import anthropic, cohere, openai

PROVIDERS: Final[Mapping[str, ModuleType]] = {"openai": openai, "anthropic": anthropic, "cohere": cohere}

__all__ = ["PROVIDERS", "anthropic", "cohere", "openai"]
