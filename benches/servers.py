"""The paths under test, each started on loopback against the same simulator.

floor    the client straight to the simulator
passthrough  a bare pass-through on the gateway's own stack (Granian RSGI + aiohttp, no features:
         benches/passthrough.py): what a gateway on this stack costs at the least
stack    the gateway's serving stack itself with no feature (Granian ASGI + the gateway's own
         upstream client: benches/stack_floor.py): what the gateway's features cost over it
gateway  this gateway as a user runs it: auth, billing, usage records, embedded SQLite store
gateway-pg  the same gateway as several instances run it: PostgreSQL store and Redis (one instance)
litellm  LiteLLM's proxy (own virtual environment), no database
portkey  Portkey's open-source gateway (npm), when Node.js is present
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LITELLM = HERE / ".venv-litellm" / "bin" / "litellm"
PORTKEY = HERE / ".portkey" / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"

# What the simulator is asked for, per workload (directives ride on the upstream model name).
UPSTREAM_MODEL = {
    "chat": "sim-chat",
    "chat_stream": "sim-chat+tokens=200",
    "chat_paced": "sim-chat+tokens=50+pace=2ms",
    "embeddings": "sim-embed",
}
MODEL_TYPE = {"embeddings": "embedding"}  # the rest are chat
PATH = {"embeddings": "/embeddings"}  # the rest are /chat/completions
# The many-keys workload: chat requests spread over this many keys on this many accounts, one key
# after the other (a deployment's writer dirties a leaf of each key's and account's log indexes per
# commit; a single key, the other workloads, is the cheap case).
MANY_KEYS = "chat_keys"
KEYS, ACCOUNTS = 50, 20
# The rate-limited workload: chat on a key whose account sets requests and tokens per minute, high
# enough never to refuse (the gateway paths only): what every request of a limited key pays for
# its limits (the embedded bucket file's operations, or Redis's).
LIMITED = "chat_limited"
LIMITED_RPM, LIMITED_TPM = 1_000_000_000, 2_000_000_000  # within PostgreSQL's integer
# The realistic-prompt workload: chat whose request carries a conversation of about 4 KB (a system
# prompt, earlier turns, a question), as a deployment's requests do; every other workload sends one
# short line. The gateway counts every prompt before it goes upstream (the hold, the token
# reservation): with a real prompt that count is much of its own time.
PROMPT = "chat_prompt"
# The Bedrock event-stream path (this gateway only): a 200-chunk stream through a bedrock channel,
# whose answer is ConverseStream's binary framing, signed with the simulator's own AWS key pair.
BEDROCK_STREAM = "chat_stream_bedrock"
BEDROCK_UPSTREAM = "sim-chat+tokens=200"
BEDROCK_REGION = "us-east-1"


@dataclass
class Target:
    name: str
    base_url: str  # what an OpenAI client takes as its base: .../v1
    headers: dict[str, str]
    pid: int | None  # the server process whose tree is measured (None for the floor)
    model: dict[str, str] = field(default_factory=dict)  # workload -> model name to send
    version: str = ""
    # workload -> (url, body, headers) of a request not in the chat shape (the floor's Bedrock one)
    requests: dict[str, tuple[str, bytes, dict[str, str]]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # the MANY_KEYS workload's (this gateway's paths)
    limited_key: str | None = None  # the LIMITED workload's (this gateway's paths)
    placement: str = ""  # where the services it uses ran, when that is not the default (gateway-pg)

    def serves(self, workload: str) -> bool:
        if workload == PROMPT:
            return "chat" in self.model
        if workload == MANY_KEYS:
            return bool(self.keys)
        if workload == LIMITED:
            return self.limited_key is not None
        return workload in self.model or workload in self.requests

    def headers_for(self, workload: str) -> dict[str, str]:
        if workload == LIMITED and self.limited_key is not None:
            return {**self.headers, "authorization": f"Bearer {self.limited_key}"}
        return self.headers

    def url(self, workload: str) -> str:
        return self.base_url + PATH.get(workload, "/chat/completions")

    def model_for(self, workload: str) -> str:
        return self.model["chat" if workload in (MANY_KEYS, LIMITED, PROMPT) else workload]


class BenchKeys(NamedTuple):
    """The keys _mint_keys made: `many` over ACCOUNTS accounts (the first serves every workload
    but MANY_KEYS and LIMITED) and `limited`, on an account of its own with limits."""

    many: list[str]
    limited: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(port: int, proc: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port}")


@dataclass(frozen=True)
class Launch:
    """How a path's server process is started: under `wrapper` (a program that runs the command
    after it, such as valgrind), given `start_seconds` to listen."""

    wrapper: tuple[str, ...] = ()
    start_seconds: float = 60.0


@contextmanager
def process(
    args: list[str],
    port: int,
    cpu: str,
    log: Path,
    env: dict[str, str] | None = None,
    launch: Launch = Launch(),
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # no database, as stated
        proc = subprocess.Popen(
            ["taskset", "-c", cpu, *launch.wrapper, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**environment, **(env or {})},
            start_new_session=True,
        )
        try:
            try:
                wait_for(port, proc, launch.start_seconds)
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}; see {log}:\n{log.read_text(errors='replace')[-3000:]}") from None
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()


@contextmanager
def simulator(workdir: Path, cpu: str) -> Iterator[str]:
    port = free_port()
    with process(
        [sys.executable, "-m", "gateway", "sim", "--port", str(port)], port, cpu, workdir / "sim.log"
    ):
        yield f"http://127.0.0.1:{port}"


def floor(sim: str) -> Target:
    return Target(
        "floor",
        sim + "/v1",
        {"content-type": "application/json"},
        None,
        model=dict(UPSTREAM_MODEL),
        version="simulator",
        requests={BEDROCK_STREAM: _converse_stream(sim)},
    )


@contextmanager
def passthrough(sim: str, workdir: Path, cpu: str) -> Iterator[Target]:
    """benches/passthrough.py on Granian (RSGI, uvloop, one worker: as the gateway is served)."""
    import aiohttp
    import granian

    version = f"granian {granian.__version__}, aiohttp {aiohttp.__version__}"
    env = {"PASSTHROUGH_UPSTREAM": sim + "/v1"}
    with _bare_app("passthrough", "passthrough", "rsgi", version, env, workdir, cpu) as target:
        yield target


@contextmanager
def stack_floor(
    sim: str, workdir: Path, cpu: str, launch: Launch = Launch(), hold_head: bool = False
) -> Iterator[Target]:
    """benches/stack_floor.py: the gateway's serving stack (Granian ASGI, uvloop, its own upstream
    client) with no feature, served as the gateway is. With `hold_head` (path `held`), it holds a
    stream's head back until its first token (STACK_FLOOR_HOLD_HEAD), as spec 6.1.7 asks of the
    gateway: the first token's anchor."""
    import granian

    version = f"granian {granian.__version__} (ASGI), gateway.providers.http"
    env = {"STACK_FLOOR_UPSTREAM": sim + "/v1"}
    name = "stack"
    if hold_head:
        version, name = version + ", head held to the first token", "held"
        env["STACK_FLOOR_HOLD_HEAD"] = "1"
    with _bare_app(name, "stack_floor", "asgi", version, env, workdir, cpu, launch) as target:
        yield target


def held_floor(sim: str, workdir: Path, cpu: str) -> AbstractContextManager[Target]:
    """The stack floor holding a stream's head back until its first token."""
    return stack_floor(sim, workdir, cpu, hold_head=True)


@contextmanager
def _bare_app(
    name: str,
    module: str,
    interface: str,
    version: str,
    env: dict[str, str],
    workdir: Path,
    cpu: str,
    launch: Launch = Launch(),
) -> Iterator[Target]:
    """One of the featureless anchors (benches/<module>.py) on one Granian worker with uvloop."""
    port = free_port()
    args = [
        str(Path(sys.executable).parent / "granian"),
        "--interface",
        interface,
        "--loop",
        "uvloop",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--http",  # as the gateway serves (gateway.supervisor)
        "1",
        "--backlog",
        "4096",
        "--no-log",
        "--working-dir",
        str(HERE),
        f"{module}:app",
    ]
    with process(args, port, cpu, workdir / f"{module}.log", env, launch) as proc:
        yield Target(
            name,
            f"http://127.0.0.1:{port}/v1",
            {"content-type": "application/json"},
            proc.pid,
            model=dict(UPSTREAM_MODEL),
            version=version,
        )


def _converse_stream(sim: str) -> tuple[str, bytes, dict[str, str]]:
    """The client straight to the simulator's ConverseStream: the Bedrock path's floor, signed once
    (the simulator takes a signature for 15 minutes)."""
    from gateway.providers.sigv4 import AwsCredentials, sign
    from gateway.sim.bedrock import ACCESS_KEY_ID, SECRET_ACCESS_KEY

    url = f"{sim}/model/{BEDROCK_UPSTREAM.replace('+', '%2B')}/converse-stream"
    body = json.dumps({"messages": [{"role": "user", "content": [{"text": "Say something."}]}]}).encode()
    headers = {"content-type": "application/json", "accept": "application/json"}
    creds = AwsCredentials(ACCESS_KEY_ID, SECRET_ACCESS_KEY)
    return url, body, sign("POST", url, headers, body, creds, BEDROCK_REGION, "bedrock")


def _gateway_config(sim: str, port: int, workers: int, services: str) -> str:
    """The gateway's settings for the bench: its port and workers, `services` ([store], [redis])
    and one priced model per workload on the simulator."""
    models = "".join(
        f"""
[[models]]
name = "bench/{workload}"
type = "{MODEL_TYPE.get(workload, "chat")}"
[models.prices]
input = "0.15"
output = "0.60"
[[models.channels]]
provider = "openai"
base_url = "{sim}/v1"
model = "{upstream}"
"""
        for workload, upstream in UPSTREAM_MODEL.items()
    )
    models += f"""
[[models]]
name = "bench/{BEDROCK_STREAM}"
type = "chat"
[models.prices]
input = "0.15"
output = "0.60"
[[models.channels]]
provider = "bedrock"
base_url = "{sim}"
model = "{BEDROCK_UPSTREAM}"
region = "{BEDROCK_REGION}"
"""
    return f"[server]\nport = {port}\nworkers = {workers}\n{services}{models}"


@contextmanager
def _serve(
    name: str, config: Path, port: int, keys: BenchKeys, cpu: str, workdir: Path, launch: Launch = Launch()
) -> Iterator[Target]:
    with process(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
        port,
        cpu,
        workdir / f"{name}.log",
        env=_simulator_aws(),
        launch=launch,
    ) as proc:
        yield Target(
            name,
            f"http://127.0.0.1:{port}/v1",
            {"content-type": "application/json", "authorization": f"Bearer {keys.many[0]}"},
            proc.pid,
            model={w: f"bench/{w}" for w in [*UPSTREAM_MODEL, BEDROCK_STREAM]},
            version=_git_version(),
            keys=keys.many,
            limited_key=keys.limited,
        )


def _simulator_aws() -> dict[str, str]:
    """The AWS credentials the gateway signs Bedrock requests with: the simulator's own pair."""
    from gateway.sim.bedrock import ACCESS_KEY_ID, SECRET_ACCESS_KEY

    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY}


@contextmanager
def gateway(
    sim: str, workdir: Path, cpu: str, workers: int = 1, launch: Launch = Launch()
) -> Iterator[Target]:
    port = free_port()
    db = workdir / "gateway.db"
    config = workdir / "gateway.toml"
    config.write_text(_gateway_config(sim, port, workers, f'[store]\npath = "{db}"\n'))
    keys = asyncio.run(_mint_keys(config))
    with _serve("gateway", config, port, keys, cpu, workdir, launch) as target:
        yield target


# The services of the gateway-pg path: the machine's PostgreSQL (a fresh database made through its
# `test` database, dropped afterwards) and Redis (keys under a prefix of the run's own, deleted).
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"


class Unavailable(Exception):
    """A service a path needs does not answer: the path is skipped, saying why."""


# The machine's own service processes, by the name the kernel gives them (/proc/PID/comm).
SERVICE_PROCESSES = ("postgres", "redis-server")


@contextmanager
def services_on(cpu: str) -> Iterator[list[int]]:
    """PostgreSQL's and Redis's processes, every thread, kept off the server's core while the block
    runs: on `cpu`, as a database on a machine of its own would be; their affinity restored after.
    PostgreSQL's later backends inherit it from its postmaster. Yields the processes moved: none
    when they are not this machine's processes or may not be moved (another user's, no privilege),
    and the path is then measured as before, with them on either core."""
    moved: dict[int, set[int]] = {}  # thread id: its affinity before
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or (entry / "comm").read_text().strip() not in SERVICE_PROCESSES:
                continue
            tids = [int(task.name) for task in (entry / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                before = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {int(cpu)})
            except OSError:
                continue
            moved[tid] = before
        if any(tid in moved for tid in tids):
            pids.append(int(entry.name))
    try:
        yield pids
    finally:
        for tid, before in moved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before)


@contextmanager
def gateway_pg(
    sim: str,
    workdir: Path,
    cpu: str,
    workers: int = 1,
    services_cpu: str | None = None,
    launch: Launch = Launch(),
) -> Iterator[Target]:
    """The `gateway` path's gateway (same workers, models and kind of key) on PostgreSQL + Redis;
    with `services_cpu`, their processes run there (services_on) while it serves."""
    run = secrets.token_hex(4)
    database = f"gw_bench_{run}"
    prefix = f"bench-{run}"
    asyncio.run(_check_redis())
    asyncio.run(_postgres(f'CREATE DATABASE "{database}"'))
    try:
        url = POSTGRES_URL.rsplit("/", 1)[0] + "/" + database
        port = free_port()
        config = workdir / "gateway-pg.toml"
        services = f'[store]\nbackend = "postgres"\nurl = "{url}"\n[redis]\nurl = "{REDIS_URL}"\nprefix = "{prefix}"\n'
        config.write_text(_gateway_config(sim, port, workers, services))
        keys = asyncio.run(_mint_keys(config))
        with contextlib.ExitStack() as placed:
            placement = ""
            if services_cpu is not None:
                moved = placed.enter_context(services_on(services_cpu))
                placement = (
                    f"PostgreSQL and Redis ran on CPU {services_cpu}, off the server's core"
                    if moved
                    else "PostgreSQL and Redis could not be moved off the server's core"
                )
                print(f"  {placement} ({len(moved)} processes moved)", flush=True)
            with _serve("gateway-pg", config, port, keys, cpu, workdir, launch) as target:
                target.placement = placement
                yield target
    finally:
        try:
            asyncio.run(_postgres(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        except Exception as exc:  # PostgreSQL went away meanwhile: the rows measured stand
            print(f"  could not drop the database {database}: {exc}", flush=True)
        asyncio.run(_forget_redis(prefix))


async def _postgres(sql: str) -> None:
    import asyncpg

    try:
        conn = await asyncpg.connect(POSTGRES_URL, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise Unavailable(f"PostgreSQL at {POSTGRES_URL} is unusable ({exc})") from None
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _check_redis() -> None:
    import redis.asyncio as redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        await client.ping()
    except (OSError, redis.RedisError) as exc:
        raise Unavailable(f"Redis at {REDIS_URL} does not answer ({exc})") from None
    finally:
        await client.aclose()


async def _forget_redis(prefix: str) -> None:
    import redis.asyncio as redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    except (OSError, redis.RedisError):
        pass  # they expire by themselves
    finally:
        await client.aclose()


async def _mint_keys(config: Path) -> BenchKeys:
    """KEYS keys over ACCOUNTS accounts with plenty of money, through the store the config names,
    and LIMITED's key on an account of its own with limits it never reaches."""
    sys.path.insert(0, str(ROOT / "python"))
    from gateway.auth import display_prefix, generate_key, hash_key
    from gateway.config import load_settings
    from gateway.store import open_store

    store = open_store(load_settings(config))
    await store.start()
    try:
        accounts = [
            await store.create_account(f"bench-{n}-" + secrets.token_hex(4), Decimal(1_000_000))
            for n in range(ACCOUNTS)
        ]
        keys = []
        for n in range(KEYS):
            key = generate_key()
            await store.create_key(
                accounts[n % ACCOUNTS].id, f"bench-{n}", hash_key(key), display_prefix(key), None
            )
            keys.append(key)
        limited = await store.create_account(
            "bench-limited-" + secrets.token_hex(4),
            Decimal(1_000_000),
            rpm_limit=LIMITED_RPM,
            tpm_limit=LIMITED_TPM,
        )
        key = generate_key()
        await store.create_key(limited.id, "bench-limited", hash_key(key), display_prefix(key), None)
        return BenchKeys(keys, key)
    finally:
        await store.close()


def _git_version() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return out.stdout.strip()


def litellm_available() -> bool:
    return LITELLM.exists()


@contextmanager
def litellm(sim: str, workdir: Path, cpu: str, workers: int = 1) -> Iterator[Target]:
    port = free_port()
    master = "sk-" + secrets.token_hex(16)  # LiteLLM refuses sk-1234
    lines = ["model_list:"]
    for workload, upstream in UPSTREAM_MODEL.items():
        lines += [
            f"  - model_name: bench/{workload}",
            "    litellm_params:",
            f"      model: openai/{upstream}",
            f"      api_base: {sim}/v1",
            "      api_key: sk-sim",
        ]
        if workload in MODEL_TYPE:
            lines += ["    model_info:", f"      mode: {MODEL_TYPE[workload]}"]
    lines += [
        "litellm_settings:",
        "  callbacks: []",
        "  num_retries: 0",
        "  drop_params: true",
        "  request_timeout: 600",
        "general_settings:",
        f"  master_key: {master}",
    ]
    config = workdir / "litellm.yaml"
    config.write_text("\n".join(lines) + "\n")
    env = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_ADMIN_UI": "True",
    }
    args = [str(LITELLM), "--config", str(config), "--port", str(port), "--num_workers", str(workers)]
    with process(args, port, cpu, workdir / "litellm.log", env) as proc:
        version = subprocess.run(
            [
                str(LITELLM.parent / "python"),
                "-c",
                "import importlib.metadata as m; print(m.version('litellm'))",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        yield Target(
            "litellm",
            f"http://127.0.0.1:{port}/v1",
            {"content-type": "application/json", "authorization": f"Bearer {master}"},
            proc.pid,
            model={w: f"bench/{w}" for w in UPSTREAM_MODEL},
            version=version,
        )


def portkey_available() -> bool:
    return PORTKEY.exists() and shutil.which("node") is not None


@contextmanager
def portkey(sim: str, workdir: Path, cpu: str) -> Iterator[Target]:
    port = free_port()
    with process(
        ["node", str(PORTKEY), f"--port={port}", "--headless"], port, cpu, workdir / "portkey.log"
    ) as proc:
        headers = {
            "content-type": "application/json",
            "authorization": "Bearer sk-sim",
            "x-portkey-provider": "openai",
            "x-portkey-custom-host": f"{sim}/v1",
        }
        package = PORTKEY.parents[1] / "package.json"
        version = json.loads(package.read_text()).get("version", "")
        yield Target(
            "portkey",
            f"http://127.0.0.1:{port}/v1",
            headers,
            proc.pid,
            model=dict(UPSTREAM_MODEL),
            version=version,
        )
