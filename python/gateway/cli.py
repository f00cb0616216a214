"""The `gateway` command: serve, sim, demo, admin and check-config."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import json
import math
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, TextIO, TypeVar, cast

from . import admin_fields as field
from . import deployment, management
from .auth import admin_token, display_prefix, generate_key, hash_key
from .clock import rfc3339
from .config import (
    CONFIG_ENV,
    DEMO_SIM_ADDRESS_ENV,
    FLAGS_ENV,
    LISTEN_ENV,
    SIM_PORT,
    WORKERS_ENV,
    ConfigError,
    Settings,
    load_settings,
    store_of_file,
)
from .drain import KILL_GRACE_SECONDS
from .errors import GatewayError
from .store import (
    LIMIT_RESETS,
    Account,
    AccountChanges,
    ConsoleUser,
    IdempotencyKeyReused,
    KeyChanges,
    NameTaken,
    SchemaTooNew,
    Store,
    open_store,
)
from .store.records import ACCOUNT_ID_PREFIX, CONSOLE_ROLES
from .store.sqlite.files import JOURNAL, SQLITE_OWN, beside, owned
from .telemetry import otlp

T = TypeVar("T")
DEMO_ACCOUNT = "demo"
DEMO_BALANCE = Decimal(100)
DEMO_MEMBER = "demo@example.com"  # the demo account's console member (`gateway demo`)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the gateway")
    _server_args(serve)

    sim = sub.add_parser("sim", help="run the upstream simulator")
    sim.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    sim.add_argument("--port", type=int, default=SIM_PORT, help=f"the port to listen on (default {SIM_PORT})")

    demo = sub.add_parser("demo", help="run the simulator and the gateway, and print a demo key")
    _server_args(demo)
    demo.add_argument(
        "--sim-port", type=int, default=SIM_PORT, help=f"the simulator's port (default {SIM_PORT})"
    )

    _admin_args(sub.add_parser("admin", help="manage accounts, money and keys (as /admin/v1 does)"))

    check = sub.add_parser(
        "check-config", help="check a settings file and name every problem in it, starting nothing"
    )
    check.add_argument("file", help="the TOML settings file")

    args = parser.parse_args(argv)
    if args.command == "check-config":
        return _check_config(args.file)
    if args.command == "admin":
        os.umask(PRIVATE_FILES)  # a store `gateway admin` makes first is as private as serve's
    try:
        if args.command == "sim":
            return _sim(args.host, args.port)
        if args.command == "admin" and args.action == "migrate-store":
            return _migrate_store(args)
        if args.command == "admin":
            args.config = args.config or args.admin_config
            if args.config is None:
                parser.error(f"admin {args.action}: --config is required")
            if args.action == "backup-store":  # reads the file's [store] alone, starts no store
                return _backup_store(args.config, args.to)
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
    except (AdminError, ServiceUnreachable, SchemaTooNew) as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    except GatewayError as exc:  # a value refused by the same checks the management API makes
        print(f"gateway: {exc.message}", file=sys.stderr)
        return 1
    except Exception as exc:
        # A store that cannot be opened or written (no such file or database, refused, wrong
        # user, a read-only or full disk): its reason in one line, not a traceback (operator
        # review). asyncpg is not imported before it is needed.
        if not isinstance(exc, OSError | sqlite3.Error) and not type(exc).__module__.startswith("asyncpg"):
            raise
        print(f"gateway: the store cannot be used: {exc}", file=sys.stderr)
        return 1


def _check_config(path: str) -> int:
    """`gateway check-config FILE`: every problem of the file on stderr, one line each naming its
    place (status 1), else `ok` (status 0). Nothing is started (no store, no network) and the
    environment variables the file names need not be set: one that is not is only a warning."""
    from .config import check_config_file

    report = check_config_file(path)
    for warning in report.warnings:
        print(f"{path}: warning: {warning}", file=sys.stderr)
    for problem in report.problems:
        print(f"{path}: {problem}", file=sys.stderr)
    if report.problems:
        return 1
    print(f"ok: {path} ({report.models} model{'' if report.models == 1 else 's'})")
    return 0


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="the TOML settings file")
    p.add_argument("--host", default=None, help="overrides server.host")
    p.add_argument("--port", type=int, default=None, help="overrides server.port")
    p.add_argument("--workers", type=int, default=None, help="overrides server.workers")


def _listening(settings: Settings, args: argparse.Namespace) -> tuple[str, int, int]:
    """Where the gateway listens and how many workers it runs: a flag given on the command line
    over the file's value, checked as that is (review: `--workers 0` ran the file's count)."""
    if args.port is not None and not 0 < args.port < 65536:
        raise ConfigError(f"--port: cannot listen on port {args.port}: a port is a number from 1 to 65535")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be positive")
    port = settings.port if args.port is None else args.port
    return args.host or settings.host, port, settings.workers if args.workers is None else args.workers


def _serve(config: str, settings: Settings, args: argparse.Namespace) -> None:
    # This process becomes Granian's supervisor (same pid, so signals reach it), holding nothing of
    # this command's imports: only the workers load the app.
    host, port, _ = _listening(settings, args)
    joining = _ready_to_serve(settings, host, port)
    command = _granian(config, settings, args, joining)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command[0], command)


# The gateway's files (the store with its key hashes and request bodies, its journal, the image files
# it serves, the demo key) are its own user's alone: made with this umask, as PostgreSQL's are.
PRIVATE_FILES = 0o077


def _ready_to_serve(settings: Settings, host: str, port: int) -> list[int]:
    """What `serve` and `demo` settle before any worker starts: private files, a store directory
    that takes them, an address free to listen on (or shared with the same deployment: the pids
    of the gateways joined)."""
    os.umask(PRIVATE_FILES)
    _check_store_directory(settings)
    _check_port(host, port)
    joining = _check_joining(settings, host, port)
    asyncio.run(_check_services(settings))
    return joining


def _check_store_directory(settings: Settings) -> None:
    """The embedded store's directory exists (or is made now) and takes new files: else a plain
    message naming the setting, not every worker's traceback as it fails to open the store."""
    if settings.store_backend != "sqlite":
        return
    directory = settings.store_path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except (FileExistsError, NotADirectoryError):
        reason = "a file stands where a directory must be"
    except OSError as exc:
        reason = exc.strerror or str(exc)
    else:
        return
    raise ConfigError(
        f"store.path: {settings.store_path}: its directory {directory} cannot hold the store's files"
        f" ({reason})"
    )


class ServiceUnreachable(Exception):
    """The PostgreSQL store does not answer at start: one line and exit status 1, not every
    worker's traceback as each fails to start (and is started again, and fails)."""


async def _check_services(settings: Settings) -> None:
    """The PostgreSQL store answers, once, before any worker starts, and no store is one a newer
    gateway has migrated (SchemaTooNew: one line here, not each worker's traceback as its store
    refuses to start). Not Redis: a gateway starts without it and says why it is not ready (GET
    /ready, 503) until Redis answers."""
    if settings.store_backend == "postgres":
        import asyncpg

        where = deployment.shown_url(settings.store_url or "")
        from .store.postgres.migrate import newer_than_known

        try:
            conn = await asyncpg.connect(settings.store_url, timeout=10)
            try:
                applied = set()
                if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
                    applied = {row[0] for row in await conn.fetch("SELECT version FROM schema_migrations")}
            finally:
                await conn.close()
        except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise ServiceUnreachable(
                f"the store (PostgreSQL at {where}) cannot be reached: {_reason(exc)}"
            ) from None
        newer = newer_than_known(applied)
        if newer is not None:
            raise newer
    elif settings.store_path.exists():
        from .store.sqlite.schema import refuse_newer

        with contextlib.closing(sqlite3.connect(settings.store_path, timeout=10)) as db:
            (version,) = db.execute("PRAGMA user_version").fetchone()
        refuse_newer(version)


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


MAX_EXPIRY_DAYS: Final = 36_600  # a century: a key meant never to expire takes no expiry


def _days(text: str) -> float:
    """--expires-in-days: a positive, finite number (0 would make a key expired at birth)."""
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not 0 < days <= MAX_EXPIRY_DAYS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of days above 0 and at most {MAX_EXPIRY_DAYS}"
        )
    return days


def _check_port(host: str, port: int, what: str = "server") -> None:
    """The address is free to listen on, as Granian's workers will: else a plain message, not
    Granian's traceback and Rust backtrace."""
    if not 1 <= port <= 65535:  # --port overrides the file, whose own port is checked with it
        raise ConfigError(f"{what}: cannot listen on port {port}: a port is a number from 1 to 65535")
    refused = deployment.bind_error(host, port, share=True)
    if refused is not None:
        raise ConfigError(f"{what}: cannot listen on {host}:{port}: {refused.strerror or refused}")


def _check_joining(settings: Settings, host: str, port: int) -> list[int]:
    """Workers listen with SO_REUSEPORT, so binding beside another gateway's always succeeds and
    the kernel then splits connections between the two. Only the same deployment (same store and
    Redis: a handover) may do that; anything else on the port stops this start (gateway.deployment).
    Returns the pids of the gateways joined (the supervisor logs the handover)."""
    if not deployment.shared_listener(host, port):
        return []
    ours = deployment.identity(settings)
    others = deployment.listeners(host, port)
    if not others:
        raise ConfigError(
            f"server: {host}:{port} is already served by a process that shares its port (another"
            " gateway, run from another temporary directory?): two servers on one port split its"
            " requests between them; stop it, or choose another port"
        )
    for other in others:
        if other.data != ours:
            raise ConfigError(
                f"server: {host}:{port} is already served by another gateway (pid {other.pid}) on other"
                f" data ({deployment.describe(other.data)}; this one: {deployment.describe(ours)}):"
                " two deployments on one port would split its requests between them; stop it, or"
                " choose another port"
            )
    return [other.pid for other in others]


def _granian(config: str, settings: Settings, args: argparse.Namespace, joining: list[int]) -> list[str]:
    """The command line of Granian's supervisor for the gateway (gateway.supervisor); `joining`,
    the gateways on the same port it joins (a handover, which it logs)."""
    admin_token(settings)  # a bad admin token stops here with a plain message, not in every worker
    if settings.otlp_endpoint and not otlp.available():  # ... and a missing exporter
        raise ConfigError(otlp.MISSING)
    # Worker processes load the settings themselves from this path.
    os.environ[CONFIG_ENV] = str(Path(config).resolve())
    host, port, workers = _listening(settings, args)
    options = {
        "host": host,
        "port": port,
        "workers": workers,
        "drain_seconds": settings.drain_seconds,
        "drain_notice_seconds": settings.drain_notice_seconds,
        "kill_grace_seconds": KILL_GRACE_SECONDS,
        "metrics_listen": settings.metrics_listen if settings.metrics_enabled else None,
        "joining": joining,
    }
    # Each worker sizes its share of a balance's leases by the number of workers (gateway.funds).
    os.environ[WORKERS_ENV] = str(options["workers"])
    # ... and builds the URLs it hands out from where it listens (routes/common.public_base).
    os.environ[LISTEN_ENV] = f"{options['host']}:{options['port']}"
    # ... and a reload knows which of those the file does not decide (gateway.reload).
    os.environ[FLAGS_ENV] = ",".join(
        name for name in ("host", "port", "workers") if getattr(args, name) not in (None, "")
    )
    return [sys.executable, "-m", "gateway.supervisor", json.dumps(options)]


# ---------------------------------------------------------------- demo


def _demo(config: str, settings: Settings, args: argparse.Namespace) -> int:
    host, port, _ = _listening(settings, args)
    if args.sim_port == port:  # both would listen there: the gateway failed after the banner
        raise ConfigError(f"--sim-port {port} is the gateway's own port: give the simulator another")
    # SIGTERM (or SIGHUP: the terminal went away) to this process alone stops the demo as Ctrl-C
    # does: the gateway drains, the simulator stops.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    joining = _ready_to_serve(settings, host, port)
    _check_port("127.0.0.1", args.sim_port, "--sim-port (the simulator)")
    sim = subprocess.Popen(
        [sys.executable, "-m", "gateway", "sim", "--port", str(args.sim_port)],
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_for_port("127.0.0.1", args.sim_port, sim)
        key = _run(lambda store: _demo_key(store, settings.store_path.parent / "demo-key"), settings)
        console_password = _run(_demo_member, settings)
        token = _demo_admin_token(settings)
        _demo_upstream_keys(settings, args.sim_port)
        print("The gateway is starting with the built-in simulator behind every model.")
        print("Base URL (openai clients take it with /v1 appended; anthropic clients as it is):")
        print(f"http://{host}:{port}")
        print("Demo API key:")
        print(key)
        if token is not None:
            print("The management API (/admin/v1, docs/admin.md) takes this admin token (export it):")
            print(f"{settings.admin_token_env}={token}")
        print(f"Console: http://{host}:{port}/console/")
        print(f"Console sign-in: {DEMO_MEMBER} / {console_password}")
        sys.stdout.flush()
        # A child, not this process: the simulator is stopped when the gateway stops. Ctrl-C
        # reaches both (one process group); the gateway then shuts down cleanly.
        _on_sim_port(args.sim_port)
        gateway = subprocess.Popen(_granian(config, settings, args, joining))
        try:
            ended = gateway.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached the gateway too, unless only this process was interrupted.
            with contextlib.suppress(ProcessLookupError):
                gateway.send_signal(signal.SIGINT)
            _stopped(gateway, seconds=30)
            ended = 0
    finally:
        sim.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            sim.wait(5)
    # A gateway that failed (not one stopped by a signal) fails the demo.
    return ended if ended > 0 else 0


def _demo_upstream_keys(settings: Settings, sim_port: int) -> None:
    """What channels sign in with, for the simulator behind every demo model: a placeholder for
    keys and secrets the environment lacks (azure takes any), the simulator's own AWS key pair
    (bedrock checks the signature), and a service account of the demo's own whose tokens come from
    the simulator (vertex, through Google's application default credentials)."""
    from .sim.bedrock import ACCESS_KEY_ID, SECRET_ACCESS_KEY

    for model in settings.models:
        for channel in model.channels:
            for env in (channel.api_key_env, channel.oauth and channel.oauth.client_secret_env):
                if env and not os.environ.get(env):
                    os.environ[env] = "sim-demo-key"
            if channel.provider == "bedrock":
                os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET_ACCESS_KEY)
                os.environ.pop("AWS_SESSION_TOKEN", None)
            if channel.provider == "vertex" and channel.credentials_file is None:
                key_file = settings.store_path.parent / "demo-vertex-key.json"
                token_uri = f"http://127.0.0.1:{sim_port}/token"
                # Made again for another simulator port (code review: a demo on a new --sim-port
                # asked the first run's port for its tokens).
                if _token_uri(key_file) != token_uri:
                    _write_service_account(key_file, token_uri)
                os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = str(key_file)


def _token_uri(key_file: Path) -> object:
    """The token endpoint a service account key file names; None when there is no such file."""
    try:
        account = json.loads(key_file.read_text())
    except (OSError, ValueError):
        return None
    return account.get("token_uri") if isinstance(account, dict) else None


def _write_service_account(path: Path, token_uri: str) -> None:
    """A service account key file as Google issues them (a new RSA key), its token endpoint the
    simulator's: only for the demo."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    account = {
        "type": "service_account",
        "project_id": "demo-project",
        "private_key_id": "demo",
        "private_key": pem,
        "client_email": "gateway-demo@demo-project.iam.gserviceaccount.com",
        "client_id": "0",
        "token_uri": token_uri,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(account))
    path.chmod(0o600)


def _demo_admin_token(settings: Settings) -> str | None:
    """The management API's token for the demo: the one in the environment variable the settings
    name when it is set, else a new one put there for the gateway to read (the API is then on).
    None when the configuration has no [admin] token_env (the API stays off)."""
    env = settings.admin_token_env
    if env is None:
        return None
    token = admin_token(settings) or secrets.token_hex(32)
    os.environ[env] = token
    return token


def _on_sim_port(sim_port: int) -> None:
    """The demo's channels reach the simulator on `sim_port`: the configuration file, read by the
    gateway at start and at each reload, takes that port for the simulator's default (config.py,
    DEMO_SIM_ADDRESS_ENV)."""
    if sim_port != SIM_PORT:
        os.environ[DEMO_SIM_ADDRESS_ENV] = f"127.0.0.1:{sim_port}"


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stopped(proc: subprocess.Popen[bytes], seconds: float) -> None:
    """Wait for a stopping process, through further Ctrl-Cs; killed if it takes too long."""
    deadline = time.monotonic() + seconds
    while proc.poll() is None:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
        except KeyboardInterrupt:
            continue


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


async def _demo_member(store: Store) -> str:
    """A new random password for the demo account's console member (made now if there is none),
    shown only in this run's output: a run never shows an earlier run's password."""
    from .console.security import hash_password

    password = secrets.token_urlsafe(12)
    user = await store.find_console_user(DEMO_MEMBER)
    if user is None:
        account = await store.find_account(DEMO_ACCOUNT) or await store.create_account(
            DEMO_ACCOUNT, DEMO_BALANCE
        )
        try:
            user = await store.create_console_user(DEMO_MEMBER, "member", account.id, None, None)
        except NameTaken:  # another run made it a moment ago
            user = await store.find_console_user(DEMO_MEMBER)
            if user is None:
                raise
    await store.set_console_password(user.id, hash_password(password))
    return password


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
        store = open_store(settings)
        await store.start()
        try:
            return await action(store)
        finally:
            await store.close()

    return asyncio.run(go())


NONE = "none"  # on the command line: clear the setting
LIMIT_RESET_CHOICES = (*LIMIT_RESETS, NONE)
# What each command-line option holds: how its text becomes the value the field's reader (gateway.
# admin_fields, shared with /admin/v1) takes as JSON. "none" is null: the setting cleared.
_RATE_HELP = 'per minute for each of the account\'s keys; "none" for no limit'
_MODELS_HELP = 'comma-separated model names the account may call; "none" for every model, "" for none'
_EXPIRY_HELP = 'Unix ms, ISO 8601 (2026-12-31T23:59:59Z), or "none"'


def _admin_args(admin: argparse.ArgumentParser) -> None:
    # --config before the action (`gateway admin --config my.toml list-accounts`) or after it.
    admin.add_argument(
        "--config", dest="admin_config", metavar="CONFIG", default=None, help="the TOML settings file"
    )
    actions = admin.add_subparsers(dest="action", required=True)

    def action(name: str, summary: str, *aliases: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=summary, aliases=list(aliases))
        p.set_defaults(action=name)
        p.add_argument("--config", default=None, help="the TOML settings file")
        return p

    def account_settings(p: argparse.ArgumentParser) -> None:
        p.add_argument("--allowed-models", default=None, help=_MODELS_HELP)
        p.add_argument("--rpm-limit", default=None, help="requests " + _RATE_HELP)
        p.add_argument("--tpm-limit", default=None, help="tokens " + _RATE_HELP)

    acct = action("create-account", "create an account (POST /admin/v1/accounts)")
    acct.add_argument("--name", required=True)
    acct.add_argument("--balance", default="0", help="US dollars, e.g. 25.50")
    account_settings(acct)
    action("list-accounts", "list the accounts with their balances and limits")
    show = action("show-account", "print an account as GET /admin/v1/accounts/{id} answers it")
    show.add_argument("--account", required=True, help="account name or id")
    update = action("update-account", "change an account's name, allowed models or rate limits")
    update.add_argument("--account", required=True, help="account name or id")
    update.add_argument("--name", default=None, help="a new name")
    account_settings(update)
    top = action("top-up", "add money to an account and print its new balance")
    top.add_argument("--account", required=True, help="account name or id")
    top.add_argument("--amount", required=True, help="US dollars, e.g. 10.00")
    top.add_argument("--note", default=None, help="kept with the top-up, e.g. an invoice number")
    top.add_argument("--idempotency-key", default=None, help="the same key again adds nothing")
    top_ups = action("list-top-ups", "list an account's top-ups (its ledger)")
    top_ups.add_argument("--account", required=True, help="account name or id")
    key = action("create-key", "create a key for an account and print it (once)")
    key.add_argument("--account", required=True, help="account name or id")
    key.add_argument("--name", default="default")
    expiry = key.add_mutually_exclusive_group()
    expiry.add_argument("--expires-in-days", type=_days, default=None, help="a positive number of days")
    expiry.add_argument("--expires-at", default=None, help=_EXPIRY_HELP)
    key.add_argument("--credit-limit", default=None, help="the key's own limit in US dollars")
    key.add_argument("--limit-reset", default=None, choices=LIMIT_RESETS)
    keys = action("list-keys", "list an account's keys (never their secrets)")
    keys.add_argument("--account", required=True, help="account name or id")
    show_key = action("show-key", "print a key as GET /admin/v1/keys/{id} answers it (never its secret)")
    show_key.add_argument("--key-id", required=True)
    limit = action(
        "set-key-limit", "change a key's name, credit limit, its reset or its expiry", "update-key"
    )
    limit.add_argument("--key-id", required=True)
    limit.add_argument("--name", default=None, help="a new name")
    limit.add_argument("--credit-limit", default=None, help='US dollars, or "none" for no limit')
    limit.add_argument("--limit-reset", default=None, choices=LIMIT_RESET_CHOICES)
    limit.add_argument("--expires-at", default=None, help=_EXPIRY_HELP)
    rotate = action("rotate-key", "give a key a new secret and print it (once); the old one stops at once")
    rotate.add_argument("--key-id", required=True)
    delete = action("delete-key", "delete a key; it stops working at once")
    delete.add_argument("--key-id", required=True)
    logs = action("list-logs", "list request logs, newest first (GET /admin/v1/logs)")
    logs.add_argument("--account", default=None, help="account name or id")
    logs.add_argument("--key-id", default=None)
    logs.add_argument("--limit", default=None, help=f"1 to {field.MAX_PAGE} (default {field.DEFAULT_PAGE})")
    logs.add_argument("--before", default=None, help="the id of the last entry of the previous page")
    log = action("show-log", "print one request log with its bodies, as GET /admin/v1/logs/{id}")
    log.add_argument("--id", required=True, help="the request's x-service-request-id")
    user = action(
        "create-console-user",
        "create a console user and print their invitation link (once; POST /admin/v1/console-users)",
    )
    user.add_argument("--email", required=True)
    user.add_argument("--role", default="member", choices=CONSOLE_ROLES)
    user.add_argument("--account", default=None, help="a member's account: name or id")
    users = action("list-console-users", "list the console users (of one account)")
    users.add_argument("--account", default=None, help="account name or id")
    invite = action(
        "invite-console-user",
        "open a new invitation for a console user and print its link (once); ends their sessions",
    )
    invite.add_argument("--user", required=True, help="the user's email or id")
    gone = action("delete-console-user", "delete a console user; their sessions end at once")
    gone.add_argument("--user", required=True, help="the user's email or id")
    backup = action(
        "backup-store",
        "copy the embedded (SQLite) store, consistent as of one moment, while it serves or not",
    )
    backup.add_argument("--to", required=True, help="the new file (never overwritten)")
    move = actions.add_parser(
        "migrate-store",
        help="copy a stopped embedded (SQLite) deployment's data into an empty PostgreSQL database",
    )
    move.set_defaults(action="migrate-store")
    move.add_argument("--config", default=None, help=argparse.SUPPRESS)  # refused with a reason
    move.add_argument(
        "--from", dest="source", required=True, help="the SQLite database, or a config file using it"
    )
    move.add_argument(
        "--to", dest="target", required=True, help="a postgresql:// URL, or a config file using it"
    )


def _backup_store(config: str, to: str) -> int:
    """`gateway admin backup-store --config X --to FILE` (docs/operations.md, "Backups"): SQLite's
    online backup, one read transaction over the whole copy, so the copy is the store as of one
    moment while the gateway writes on; checked, then given its name (never half a file there)."""
    store = store_of_file(config)
    if store.backend != "sqlite":
        raise AdminError(
            "backup-store copies the embedded (SQLite) store; PostgreSQL's is backed up with its own"
            ' tools (pg_dump): docs/operations.md, "Backups"'
        )
    target = Path(to)
    if not target.parent.is_dir():  # else SQLite's "unable to open database file", as if the store
        raise AdminError(f"--to {target}: no such directory {target.parent}")
    if not store.path.is_file():
        raise AdminError(f"store.path {store.path}: no such database")
    _not_the_stores_own(store.path, target)
    needs = sum(f.stat().st_size for f in (store.path, beside(store.path, "-wal")) if f.exists())
    free = shutil.disk_usage(target.parent).free
    if free < needs:  # else SQLite's "database or disk is full", as if the store's disk were
        raise AdminError(f"--to {target}: {target.parent} has {free:,} bytes free, the copy needs {needs:,}")
    try:  # the name is taken first, so that nothing made there meanwhile is replaced by the copy
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        raise AdminError(f"--to {target}: the file exists already (a backup never overwrites one)") from None
    except OSError as exc:  # read-only, not ours: the destination's fault, not the store's
        raise AdminError(f"--to {target}: cannot be written ({exc.strerror or exc})") from None
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    kept = False
    try:
        with (
            contextlib.closing(sqlite3.connect(store.path, timeout=30)) as source,
            contextlib.closing(sqlite3.connect(partial)) as copy,
        ):
            source.backup(copy)
            (check,) = copy.execute("PRAGMA quick_check").fetchone()
            (version,) = copy.execute("PRAGMA user_version").fetchone()
        if check != "ok":
            raise AdminError(f"the copy did not pass SQLite's check ({check}); nothing was kept")
        os.replace(partial, target)  # over the name this command took above
        kept = True
    finally:
        for leftover in (partial, *(beside(partial, end) for end in SQLITE_OWN)):
            leftover.unlink(missing_ok=True)
        if not kept:
            target.unlink(missing_ok=True)
    print(json.dumps({"backup": str(target), "bytes": target.stat().st_size, "schema_version": version}))
    return 0


def _not_the_stores_own(db: Path, target: Path) -> None:
    """A backup named as one of the store's own files would be taken by SQLite (a `-journal` or
    `-wal` it finds is applied or discarded at the next open) or by the gateway (black-box review:
    the copy was accepted, then deleted)."""
    db = db.resolve()
    where = target.resolve()
    if where in owned(db) or beside(db, JOURNAL) in where.parents:
        raise AdminError(f"--to {target}: one of the store's own files; name the backup otherwise")


def _migrate_store(args: argparse.Namespace) -> int:
    """`gateway admin migrate-store --from X --to Y` (docs/deploy.md)."""
    from .store.move import MoveError, run

    if args.admin_config or args.config:  # given before the action or after it
        raise AdminError(
            "admin migrate-store: the stores are --from and --to (each a path or URL, or a config"
            " file naming it), not --config"
        )
    # Of a config file only [store] is read: the copy needs neither Redis nor the models.
    source, target = Path(args.source), args.target
    if source.suffix == ".toml":
        of_source = store_of_file(source)
        if of_source.backend != "sqlite":
            raise AdminError(f"--from {source}: its store is not SQLite")
        source = of_source.path
    if target.endswith(".toml"):
        of_target = store_of_file(target)
        if of_target.url is None:
            raise AdminError(f"--to {target}: its store is not PostgreSQL")
        target = of_target.url
    if not target.startswith(("postgres://", "postgresql://")):
        raise AdminError("--to: a postgresql:// URL or a config file whose store is PostgreSQL")
    try:
        moved = run(source, target)
    except MoveError as exc:
        raise AdminError(str(exc)) from None
    print(json.dumps({"rows": moved.rows, "balances": str(moved.balances), "charged": str(moved.charged)}))
    return 0


def _admin(settings: Settings, args: argparse.Namespace) -> int:
    actions: dict[str, Callable[[Store, argparse.Namespace], Awaitable[None]]] = {
        "create-account": _create_account,
        "list-accounts": _list_accounts,
        "show-account": _show_account,
        "update-account": _update_account,
        "top-up": _top_up,
        "list-top-ups": _list_top_ups,
        "create-key": _create_key,
        "list-keys": _list_keys,
        "show-key": _show_key,
        "set-key-limit": _set_key_limit,
        "rotate-key": _rotate_key,
        "delete-key": _delete_key,
        "list-logs": _list_logs,
        "show-log": _show_log,
        "create-console-user": _create_console_user,
        "list-console-users": _list_console_users,
        "invite-console-user": _invite_console_user,
        "delete-console-user": _delete_console_user,
    }
    args.settings = settings
    args.configured = frozenset(m.name for m in settings.models)
    asyncio.run(_check_services(settings))  # a database out of reach: where, and why, in one line
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _run(lambda store: actions[args.action](store, args), settings)
    return _write_out(printed.getvalue(), f"admin {args.action}")


def _write_out(text: str, command: str) -> int:
    """What a command printed, written once it has run: an output that fails is then told apart
    from the store (review: `rotate-key > /dev/full` said the store could not be used, and the
    key had been rotated)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head`): it took what it wanted. Nothing more goes to the pipe,
        # not even at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:
        raise AdminError(
            f"{command} ran (a change it makes is made), but its output could not be written:"
            f" {exc.strerror or exc}"
        ) from None
    return 0


def _sim(host: str, port: int) -> int:
    """`gateway sim`: the upstream simulator, until stopped."""
    from .sim import run

    try:
        run(host, port)
    except OSError as exc:
        reason = exc.strerror or exc
        print(f"gateway: the simulator cannot listen on {host}:{port}: {reason}", file=sys.stderr)
        return 1
    return 0


# Each action calls the same store method as its /admin/v1 endpoint, with the same checks: the
# options are read by the management API's own field readers (admin_fields), named as options.


def _read(given: dict[str, object], readers: Mapping[str, field.Reader]) -> dict[str, Any]:
    return field.read_fields(given, readers, param=lambda name: "--" + name.replace("_", "-"))


def _account_options(args: argparse.Namespace) -> dict[str, object]:
    """The account settings given on the command line, as the JSON values the readers take."""
    given: dict[str, object] = {}
    if args.allowed_models is not None:
        models = args.allowed_models
        given["allowed_models"] = None if models == NONE else [m for m in models.split(",") if m]
    for option in ("rpm_limit", "tpm_limit"):
        text = getattr(args, option)
        if text is not None:
            given[option] = None if text == NONE else int(text) if text.isdigit() else text
    return given


async def _create_account(store: Store, args: argparse.Namespace) -> None:
    given = {"name": args.name, "balance": args.balance, **_account_options(args)}
    fields = _read(given, {**field.account_fields(args.configured), "balance": field.money})
    try:
        print((await store.create_account(fields.pop("name"), fields.pop("balance"), **fields)).id)
    except NameTaken as exc:
        raise AdminError(str(exc)) from None


async def _list_accounts(store: Store, args: argparse.Namespace) -> None:
    print("id\tname\tbalance\tallowed_models\trpm_limit\ttpm_limit")
    for a in await store.list_accounts():
        models = "*" if a.allowed_models is None else ",".join(sorted(a.allowed_models))
        row = (a.id, a.name, field.money_text(a.balance), models, _text(a.rpm_limit), _text(a.tpm_limit))
        print("\t".join(row))


async def _show_account(store: Store, args: argparse.Namespace) -> None:
    from .management import account_json

    _print_json(account_json(await _account(store, args.account)))


async def _update_account(store: Store, args: argparse.Namespace) -> None:
    from .management import account_json

    account = await _account(store, args.account)
    given = _account_options(args)
    if args.name is not None:
        given["name"] = args.name
    if not given:
        raise AdminError("nothing to change: give --name, --allowed-models, --rpm-limit or --tpm-limit")
    changes = cast(AccountChanges, _read(given, field.account_fields(args.configured)))
    try:
        updated = await store.update_account(account.id, changes)
    except NameTaken as exc:
        raise AdminError(str(exc)) from None
    if updated is None:
        raise AdminError(f"no account {args.account!r}")
    _print_json(account_json(updated))


async def _top_up(store: Store, args: argparse.Namespace) -> None:
    from .idempotency import MAX_KEY_CHARS as MAX_IDEMPOTENCY_KEY_CHARS

    account = await _account(store, args.account)
    fields = _read({"amount": args.amount, "note": args.note}, field.TOP_UP_FIELDS)
    key = args.idempotency_key
    if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise AdminError(f"--idempotency-key must have 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters")
    try:
        done = await store.top_up(account.id, fields["amount"], fields["note"], key)
    except IdempotencyKeyReused:
        raise AdminError("this --idempotency-key was used for a top-up with another amount or note") from None
    if done is None:
        raise AdminError(f"no account {args.account!r}")
    made, replayed = done
    if replayed:  # nothing added: the balance after that earlier top-up, said to be that
        print(
            f"already done with this --idempotency-key ({made.id}, {rfc3339(made.created_at_ms)}):"
            f" nothing added; the balance was {field.money_text(made.balance_after)} after it",
            file=sys.stderr,
        )
    print(field.money_text(made.balance_after))


async def _list_top_ups(store: Store, args: argparse.Namespace) -> None:
    account = await _account(store, args.account)
    print("id\tcreated_at\tamount\tbalance_after\tnote")
    for t in await store.list_top_ups(account.id):
        row = (
            t.id,
            rfc3339(t.created_at_ms),
            field.money_text(t.amount),
            field.money_text(t.balance_after),
            _text(t.note),
        )
        print("\t".join(row))


async def _create_key(store: Store, args: argparse.Namespace) -> None:
    from .management import refuse_reserved_name

    account = await _account(store, args.account)
    given: dict[str, object] = {"name": args.name, "limit_reset": args.limit_reset}
    if args.credit_limit is not None:
        given["credit_limit"] = args.credit_limit
    if args.expires_at is not None:
        given["expires_at"] = _moment(args.expires_at)
    elif args.expires_in_days is not None:
        given["expires_at"] = time.time_ns() // 1_000_000 + int(args.expires_in_days * 86_400_000)
    fields = _read(given, field.KEY_FIELDS)
    refuse_reserved_name(fields.get("name"))
    secret = generate_key()
    record = await store.create_key(
        account.id,
        fields["name"],
        hash_key(secret),
        display_prefix(secret),
        fields.get("expires_at"),
        credit_limit=fields.get("credit_limit"),
        limit_reset=fields["limit_reset"],
    )
    print(f"created key {record.id} for account {account.name!r}", file=sys.stderr)
    print(secret)


async def _list_keys(store: Store, args: argparse.Namespace) -> None:
    account = await _account(store, args.account)
    from .budget import spent_now
    from .clock import now_ms

    print("id\tprefix\tname\tcredit_limit\tlimit_reset\tspent\texpires_at\tcreated_at\tdeleted_at")
    now = now_ms()
    for k in await store.list_keys(account.id):
        row = (
            k.id,
            k.prefix,
            k.name,
            "-" if k.credit_limit is None else field.money_text(k.credit_limit),
            _text(k.limit_reset),
            field.money_text(spent_now(k, now)),  # in the current period, as show-key says it
            "-" if k.expires_at_ms is None else rfc3339(k.expires_at_ms),
            rfc3339(k.created_at_ms),
            "-" if k.deleted_at_ms is None else rfc3339(k.deleted_at_ms),
        )
        print("\t".join(row))


async def _show_key(store: Store, args: argparse.Namespace) -> None:
    from .management import key_json

    key = await store.get_key(args.key_id)
    if key is None:
        raise AdminError(f"no key with id {args.key_id!r}")
    _print_json(key_json(key))


async def _set_key_limit(store: Store, args: argparse.Namespace) -> None:
    from .management import key_json, refuse_renaming

    given: dict[str, object] = {}
    if args.name is not None:
        given["name"] = args.name
    if args.credit_limit is not None:
        given["credit_limit"] = None if args.credit_limit == NONE else args.credit_limit
    if args.limit_reset is not None:
        given["limit_reset"] = None if args.limit_reset == NONE else args.limit_reset
    if args.expires_at is not None:
        given["expires_at"] = None if args.expires_at == NONE else _moment(args.expires_at)
    if not given:
        raise AdminError("nothing to change: give --name, --credit-limit, --limit-reset or --expires-at")
    fields = _read(given, field.KEY_FIELDS)
    if "expires_at" in fields:
        fields["expires_at_ms"] = fields.pop("expires_at")
    if "name" in fields:
        refuse_renaming(await store.get_key(args.key_id), fields["name"])
    updated = await store.update_key(args.key_id, cast(KeyChanges, fields))
    if updated is None:
        raise AdminError(f"no live key with id {args.key_id!r}")
    _print_json(key_json(updated))


async def _rotate_key(store: Store, args: argparse.Namespace) -> None:
    secret = generate_key()
    if await store.rotate_key(args.key_id, hash_key(secret), display_prefix(secret)) is None:
        raise AdminError(f"no live key with id {args.key_id!r}")
    print(secret)


async def _delete_key(store: Store, args: argparse.Namespace) -> None:
    from .management import key_json

    if not await store.delete_key(args.key_id) or (key := await store.get_key(args.key_id)) is None:
        raise AdminError(f"no live key with id {args.key_id!r}")
    print(f"deleted key {args.key_id}: it stops working at once", file=sys.stderr)
    _print_json(key_json(key))  # as DELETE /admin/v1/keys/{id} answers it, `deleted_at` set


async def _list_logs(store: Store, args: argparse.Namespace) -> None:
    account_id = None if args.account is None else (await _account(store, args.account)).id
    limit = field.page_size(args.limit, "--limit")
    # A filter that names nothing is a mistake, as the API answers it: an empty list would look
    # like "no requests".
    if args.key_id is not None and await store.get_key(args.key_id) is None:
        raise AdminError(f"no key with id {args.key_id!r}")
    entries = await store.list_request_logs(
        account_id=account_id, key_id=args.key_id, before=args.before, limit=limit
    )
    found = management.found_by(store.get_request_log)
    await management.known_cursor(args.before, entries, "--before", "request log", found)
    print("id\tstarted_at\tstatus\terror_code\tmodel\tcost\tduration_ms\tmethod\tpath\tkey_id")
    for e in entries:
        row = (
            e.id,
            rfc3339(e.started_at_ms),
            str(e.status),
            _text(e.error_code),
            _text(e.model),
            "-" if e.cost is None else field.money_text(e.cost),
            str(e.duration_ms),
            e.method,
            e.path,
            _text(e.key_id),
        )
        print("\t".join(row))


async def _show_log(store: Store, args: argparse.Namespace) -> None:
    from .management import log_with_bodies_json

    entry = await store.get_request_log(args.id)
    if entry is None:
        raise AdminError(f"no request log with id {args.id!r}")
    _print_json(log_with_bodies_json(entry))


async def _create_console_user(store: Store, args: argparse.Namespace) -> None:
    from .routes import console_users

    given: dict[str, object] = {"email": args.email, "role": args.role}
    if args.account is not None:
        given["account_id"] = (await _account(store, args.account)).id
    user, token = await console_users.create_user(
        store, given, param=lambda name: "--" + name.replace("_id", "")
    )
    print(f"created console user {user.id} ({user.email}, {user.role})", file=sys.stderr)
    print(console_users.invite_url(_console_base(args.settings), token))


def _console_base(settings: Settings) -> str:
    """The base of a link a command prints. The command runs beside the gateway, not in it: without
    `public_base_url`, the address a live gateway on the same data listens on (its --host and
    --port), else the configured one."""
    from .routes import console_users

    if not settings.public_base_url:
        serving = deployment.serving_address(deployment.identity(settings))
        if serving is not None:
            settings = dataclasses.replace(settings, host=serving[0], port=serving[1])
    return console_users.base_url(settings, None)


async def _list_console_users(store: Store, args: argparse.Namespace) -> None:
    from .routes.console_users import user_status

    account_id = None if args.account is None else (await _account(store, args.account)).id
    print("id\temail\trole\taccount_id\tstatus\tcreated_at")
    for u in await store.list_console_users(account_id):
        row = (u.id, u.email, u.role, _text(u.account_id), user_status(u), rfc3339(u.created_at_ms))
        print("\t".join(row))


async def _console_user(store: Store, ref: str) -> ConsoleUser:
    """The console user with that email, or that id."""
    user = await store.find_console_user(ref) if "@" in ref else await store.get_console_user(ref)
    if user is None:
        raise AdminError(f"no console user {ref!r}")
    return user


async def _invite_console_user(store: Store, args: argparse.Namespace) -> None:
    from .routes import console_users

    user, token = await console_users.invite_user(store, (await _console_user(store, args.user)).id)
    print(f"new invitation for {user.email}: their sessions have ended", file=sys.stderr)
    print(console_users.invite_url(_console_base(args.settings), token))


async def _delete_console_user(store: Store, args: argparse.Namespace) -> None:
    from .routes import console_users

    user = await console_users.delete_user(store, (await _console_user(store, args.user)).id)
    print(f"deleted console user {user.id} ({user.email}): their sessions have ended", file=sys.stderr)
    _print_json(console_users.deleted_json(user))  # as the API answers it


async def _account(store: Store, ref: str) -> Account:
    """The account of that id, or of that name (ids first: a name cannot take an id's shape now,
    but one given before may have it)."""
    account = await store.get_account(ref) if ref.startswith(ACCOUNT_ID_PREFIX) else None
    if account is None:
        account = await store.find_account(ref)
    if account is None:
        raise AdminError(f"no account named {ref!r}")
    return account


def _moment(text: str) -> int | str:
    """--expires-at as the reader takes it: Unix ms (digits) or an ISO 8601 string."""
    return int(text) if text.isdigit() else text


def _print_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=2))


def _text(value: object) -> str:
    return "-" if value is None else str(value)
