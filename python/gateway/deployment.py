"""Which gateway listens where, so that a second `gateway serve` on a port in use can tell a
handover from a mistake.

Granian's workers listen with SO_REUSEPORT, so a second gateway started on the same port (same
user) binds beside the first and the kernel splits connections between the two. On the same store
that is a handover (start the new one, stop the old); on another store it splits one address over
two deployments, and a valid key is refused by whichever worker's store lacks it. Each running
supervisor therefore writes where it listens and what data it serves from into its run directory
(gateway.supervisor); a new start reads those of live supervisors (their run directory's lock is
held) and refuses to join anything but the same deployment. Stdlib only: the supervisor imports
this before Granian.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# A supervisor's run directory (gateway.supervisor): tempfile's directory, this prefix, its pid.
RUN_DIR_PREFIX: Final = "gateway-run-"
# ... the file it holds locked while it or any of its workers lives,
RUN_LOCK: Final = "lock"
# ... and the one that says where it listens and on what data.
LISTENING: Final = "listening.json"
_WILDCARD: Final = frozenset({"0.0.0.0", "::", ""})
# The query parameters of a URL that say which server and database it is (libpq's and Redis's);
# the rest (sslmode, application_name, timeouts) say how to connect, not to what.
_WHERE: Final = frozenset({"host", "hostaddr", "port", "dbname", "db"})
_DEFAULT_PORTS: Final = {"postgres": 5432, "postgresql": 5432, "redis": 6379, "rediss": 6379}


@dataclass(frozen=True)
class Listener:
    """A live gateway on a port: its supervisor's pid and its deployment's identity."""

    pid: int
    host: str
    port: int
    data: dict[str, str]


def identity(settings: Any) -> dict[str, str]:
    """What makes two gateways one deployment: the same store and the same Redis (rate limits and
    shared channels). Addresses without their credentials: the file is readable by the user only,
    but a password has no business in it."""
    if settings.store_backend == "sqlite":
        store = f"sqlite:{Path(settings.store_path).resolve()}"
    else:
        store = f"postgres:{shown_url(settings.store_url or '', _WHERE)}"
    data = {"store": store}
    if settings.redis_url:
        data["redis"] = f"{shown_url(settings.redis_url, _WHERE)} prefix {settings.redis_prefix}"
    return data


def describe(data: dict[str, str]) -> str:
    """An identity as a message shows it."""
    return ", ".join(f"{name} {value}" for name, value in sorted(data.items()))


def write_listening(run_dir: str, host: str, port: int, data: dict[str, str]) -> None:
    """Say, in this supervisor's run directory, where it listens and on what (replaced in one step)."""
    record = {"pid": os.getpid(), "host": host, "port": port, "data": data}  # live_gateways reads it
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=run_dir, delete=False) as f:
        json.dump(record, f)
    os.replace(f.name, os.path.join(run_dir, LISTENING))


def bind_error(host: str, port: int, *, share: bool) -> OSError | None:
    """Why a socket cannot bind host:port (None: it can), as a listener would (SO_REUSEADDR) and,
    with `share`, beside others that share the port (SO_REUSEPORT, as Granian's workers do)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if share:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def shared_listener(host: str, port: int) -> bool:
    """Whether something listens on host:port that lets others bind beside it: a bind that does
    not share the port fails where one that does succeeds. False when the address is free (or
    taken outright: the caller's own bind then says why)."""
    refused = bind_error(host, port, share=False)
    return refused is not None and refused.errno == errno.EADDRINUSE


def live_gateways() -> list[Listener]:
    """The live gateways of this user (run directories in the same temporary directory whose lock
    is held), oldest run directory first."""
    base = tempfile.gettempdir()
    found = []
    with contextlib.suppress(OSError):
        paths = sorted(
            (os.path.join(base, name) for name in os.listdir(base) if name.startswith(RUN_DIR_PREFIX)),
            key=_made_ns,
        )
        for path in paths:
            record = _read(os.path.join(path, LISTENING))
            if record is not None and _live(path):
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    found.append(
                        Listener(
                            int(record["pid"]), str(record["host"]), int(record["port"]), dict(record["data"])
                        )
                    )
    return found


def listeners(host: str, port: int) -> list[Listener]:
    """The live gateways listening on `port` at an address that overlaps `host`."""
    return [g for g in live_gateways() if g.port == port and (g.host == host or _WILDCARD & {g.host, host})]


def serving_address(data: dict[str, str]) -> tuple[str, int] | None:
    """Where a live gateway on this data listens (the oldest such), if one does."""
    for gateway in live_gateways():
        if gateway.data == data:
            return gateway.host, gateway.port
    return None


def _made_ns(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _live(run_dir: str) -> bool:
    """Whether the run directory's supervisor (or a worker of it) still lives: its lock is held."""
    try:
        fd = os.open(os.path.join(run_dir, RUN_LOCK), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock this took
    return False


def shown_url(url: str, only: frozenset[str] | None = None) -> str:
    """`url` as messages and run directories show it: without user, password (in its address or
    its query) or fragment, its default port spelled out, so that two spellings of one server
    compare equal. `only`: the query parameters kept (None: all but a password)."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    port = None
    with contextlib.suppress(ValueError):
        port = parts.port
    port = port or _DEFAULT_PORTS.get(parts.scheme)
    if port is not None and parts.hostname:
        netloc += f":{port}"
    query = urlencode(
        [
            (k, v)
            for k, v in parse_qsl(parts.query)
            if k.lower() != "password" and (only is None or k.lower() in only)
        ]
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
