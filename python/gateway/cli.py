"""The `gateway` command: serve, sim, demo and admin."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TextIO, TypeVar

from .auth import display_prefix, generate_key, hash_key
from .config import CONFIG_ENV, ConfigError, Settings, load_settings
from .store import Store, open_store

T = TypeVar("T")
DEMO_ACCOUNT = "demo"
DEMO_BALANCE = Decimal(100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    _server_args(serve)

    sim = sub.add_parser("sim", help="run the upstream simulator")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=9911)

    demo = sub.add_parser("demo", help="run the simulator and the gateway, and print a demo key")
    _server_args(demo)
    demo.add_argument("--sim-port", type=int, default=9911)

    admin = sub.add_parser("admin", help="manage accounts and keys in the store")
    admin_sub = admin.add_subparsers(dest="action", required=True)
    acct = admin_sub.add_parser("create-account", help="create an account")
    acct.add_argument("--config", required=True)
    acct.add_argument("--name", required=True)
    acct.add_argument("--balance", default="0", help="US dollars, e.g. 25.50")
    key = admin_sub.add_parser("create-key", help="create a key for an account and print it (once)")
    key.add_argument("--config", required=True)
    key.add_argument("--account", required=True, help="account name")
    key.add_argument("--name", default="default")
    key.add_argument("--expires-in-days", type=float, default=None)
    delete = admin_sub.add_parser("delete-key", help="delete a key; it stops working at once")
    delete.add_argument("--config", required=True)
    delete.add_argument("--key-id", required=True)

    args = parser.parse_args(argv)
    try:
        if args.command == "sim":
            from .sim import run

            run(args.host, args.port)
            return 0
        settings = load_settings(args.config)
        if args.command == "serve":
            _serve(args.config, settings, args)
            return 0
        if args.command == "demo":
            return _demo(args.config, settings, args)
        return _admin(settings, args)
    except ConfigError as exc:
        print(f"gateway: configuration error: {exc}", file=sys.stderr)
        return 2
    except AdminError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="the TOML settings file")
    p.add_argument("--host", default=None, help="overrides server.host")
    p.add_argument("--port", type=int, default=None, help="overrides server.port")
    p.add_argument("--workers", type=int, default=None, help="overrides server.workers")


def _serve(config: str, settings: Settings, args: argparse.Namespace) -> None:
    from granian import Granian
    from granian.constants import Interfaces, Loops

    # Worker processes load the settings themselves from this path.
    os.environ[CONFIG_ENV] = str(Path(config).resolve())
    Granian(
        "gateway.app:app_from_env",
        factory=True,
        address=args.host or settings.host,
        port=args.port or settings.port,
        workers=args.workers or settings.workers,
        interface=Interfaces.ASGI,
        loop=Loops.uvloop,
        log_access=False,
        backlog=4096,
    ).serve()


# ---------------------------------------------------------------- demo


def _demo(config: str, settings: Settings, args: argparse.Namespace) -> int:
    host = args.host or settings.host
    port = args.port or settings.port
    sim = subprocess.Popen(
        [sys.executable, "-m", "gateway", "sim", "--port", str(args.sim_port)], stdout=subprocess.DEVNULL
    )
    try:
        _wait_for_port("127.0.0.1", args.sim_port, sim)
        key = _run(lambda store: _demo_key(store, settings.store_path.parent / "demo-key"), settings)
        print("The gateway is starting with the built-in simulator behind every model.")
        print("Base URL (openai clients take it with /v1 appended; anthropic clients as it is):")
        print(f"http://{host}:{port}")
        print("Demo API key:")
        print(key, flush=True)
        _serve(config, settings, args)
    finally:
        sim.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            sim.wait(5)
    return 0


def _wait_for_port(host: str, port: int, proc: subprocess.Popen[bytes], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AdminError(f"the simulator exited (status {proc.returncode}); is port {port} taken?")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise AdminError(f"the simulator did not start listening on {host}:{port}")


async def _demo_key(store: Store, key_file: Path) -> str:
    """The demo key from the last run if it still works; otherwise a new one (kept in key_file, 0600)."""
    with contextlib.suppress(OSError):
        saved = key_file.read_text().strip()
        if saved and await store.find_key(hash_key(saved)) is not None:
            return saved
    account = await store.find_account(DEMO_ACCOUNT) or await store.create_account(DEMO_ACCOUNT, DEMO_BALANCE)
    key = generate_key()
    await store.create_key(account.id, "demo", hash_key(key), display_prefix(key), None)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    with _private_file(key_file) as f:
        f.write(key + "\n")
    return key


@contextlib.contextmanager
def _private_file(path: Path) -> Iterator[TextIO]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yield f


# ---------------------------------------------------------------- admin


class AdminError(Exception):
    pass


def _run(action: Callable[[Store], Awaitable[T]], settings: Settings) -> T:
    async def go() -> T:
        store = open_store(str(settings.store_path))
        await store.start()
        try:
            return await action(store)
        finally:
            await store.close()

    return asyncio.run(go())


def _admin(settings: Settings, args: argparse.Namespace) -> int:
    if args.action == "create-account":
        try:
            balance = Decimal(args.balance)
        except InvalidOperation as exc:
            raise AdminError(f"--balance {args.balance!r} is not a number") from exc

        async def create_account(store: Store) -> str:
            if await store.find_account(args.name) is not None:
                raise AdminError(f"an account named {args.name!r} exists already")
            return (await store.create_account(args.name, balance)).id

        print(_run(create_account, settings))
        return 0
    if args.action == "create-key":

        async def create_key(store: Store) -> str:
            account = await store.find_account(args.account)
            if account is None:
                raise AdminError(f"no account named {args.account!r}")
            expires = None
            if args.expires_in_days is not None:
                expires = time.time_ns() // 1_000_000 + int(args.expires_in_days * 86_400_000)
            key = generate_key()
            record = await store.create_key(
                account.id, args.name, hash_key(key), display_prefix(key), expires
            )
            print(f"created key {record.id} for account {account.name!r}", file=sys.stderr)
            return key

        print(_run(create_key, settings))
        return 0
    if args.action == "delete-key":

        async def delete_key(store: Store) -> bool:
            return await store.delete_key(args.key_id)

        if not _run(delete_key, settings):
            raise AdminError(f"no live key with id {args.key_id!r}")
        return 0
    raise AdminError(f"unknown action {args.action!r}")
