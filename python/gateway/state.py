"""Everything a running gateway holds, built once per process by create_app (never module globals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import Settings
from .drain import Drain
from .funds import Funds
from .providers.http import UpstreamClient
from .ratelimits import RateLimiter
from .registry import ModelRegistry
from .routing import Router
from .store import Store
from .telemetry import Telemetry

if TYPE_CHECKING:
    from .redis_client import RedisClient


@dataclass
class GatewayState:
    settings: Settings
    registry: ModelRegistry
    store: Store
    upstream: UpstreamClient
    funds: Funds
    limiter: RateLimiter
    router: Router
    telemetry: Telemetry
    drain: Drain
    redis: RedisClient | None = None  # the process's Redis client, when one is configured
