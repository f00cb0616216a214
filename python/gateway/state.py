"""Everything a running gateway holds, built once per process by create_app (never module globals)."""

from __future__ import annotations

from dataclasses import dataclass

from .config import Settings
from .funds import Funds
from .providers.http import UpstreamClient
from .ratelimits import RateLimiter
from .registry import ModelRegistry
from .routing import Router
from .store import Store


@dataclass
class GatewayState:
    settings: Settings
    registry: ModelRegistry
    store: Store
    upstream: UpstreamClient
    funds: Funds
    limiter: RateLimiter
    router: Router
