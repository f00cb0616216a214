"""What a configuration reload may not change (gateway.supervisor, routes/admin_config.py): where
the data lives and where the gateway listens. New workers on another store or Redis than the old
ones would split one deployment in two; the listen address, the worker count and the metrics
listener are the supervisor's, fixed at its start."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Final

from .config import (
    ACCEPTED_CONFIG_ENV,
    CONFIG_ENV,
    FLAGS_ENV,
    ConfigError,
    Settings,
    read_config_text,
    settings_from_text,
)

# Each as the file names it.
_DATA: Final = {
    "store_backend": "store.backend",
    "store_path": "store.path",
    "store_url": "store.url (or url_env)",
    "redis_url": "redis.url (or url_env)",
    "redis_prefix": "redis.prefix",
    "metrics_listen": "metrics.listen",
    # The management API's token is read at start (docs/admin.md): a reload naming another (or a
    # mistyped) variable would turn the API off, the reload endpoint with it (review).
    "admin_token_env": "admin.token_env",
}
# ... and those `gateway serve --host/--port/--workers` may override.
_LISTEN: Final = {"host": "server.host", "port": "server.port", "workers": "server.workers"}


def fixed_changes(running: Settings, new: Settings, flags: Collection[str] = ()) -> list[str]:
    """One sentence per setting the file `new` changes that a reload cannot (empty: it may go
    ahead). `running` is the configuration last accepted, as its file says; `flags`, which of host,
    port and workers the command line set (FLAGS_ENV): the file's value of those is not in use, so
    an edit of it is no reason to refuse."""
    problems = [
        f"{setting} differs from the running gateway's: a reload cannot change it, restart instead"
        for name, setting in _DATA.items()
        if _same(name, getattr(running, name)) != _same(name, getattr(new, name))
    ]
    for name, setting in _LISTEN.items():
        was, now = getattr(running, name), getattr(new, name)
        if was != now and name not in flags:
            problems.append(
                f"{setting} changed from {was} to {now}: a reload cannot change where the gateway"
                " listens or how many workers it runs, restart instead"
            )
    return problems


def _same(name: str, value: object) -> object:
    """A setting's value as compared: the store's path resolved (`./data/../data/a.db`, a link to
    the same file), as `gateway serve` compares stores (gateway.deployment)."""
    return Path(value).resolve() if name == "store_path" and isinstance(value, (str, Path)) else value


def accepted_settings(serving: Settings) -> Settings:
    """In a worker: the configuration the supervisor last accepted, as its file says (before any
    --host/--port/--workers); `serving` (this worker's own) when there is no such copy."""
    accepted, path = os.environ.get(ACCEPTED_CONFIG_ENV), os.environ.get(CONFIG_ENV)
    if not accepted or not path:
        return serving
    try:
        return settings_from_text(read_config_text(accepted), path)
    except ConfigError:
        return serving


def command_line_flags() -> frozenset[str]:
    """Which of host, port and workers `gateway serve` was given on its command line."""
    return frozenset(name for name in os.environ.get(FLAGS_ENV, "").split(",") if name)
