"""What a configuration reload may not change (gateway.supervisor, routes/admin_config.py): where
the data lives and the supervisor's own listeners. New workers on another store or Redis than the
old ones would split one deployment in two; the listen address is the supervisor's."""

from __future__ import annotations

from typing import Final

from .config import Settings

FIXED: Final = ("store_backend", "store_path", "store_url", "redis_url", "redis_prefix", "metrics_listen")


def fixed_changes(running: Settings, new: Settings) -> list[str]:
    """One sentence per setting `new` changes that a reload cannot (empty: it may go ahead)."""
    return [
        f"{name} differs from the running gateway's: a reload cannot change it, restart instead"
        for name in FIXED
        if getattr(running, name) != getattr(new, name)
    ]
