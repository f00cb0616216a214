"""Settings: one TOML file (see gateway.example.toml), parsed once into frozen dataclasses."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, cast

T = TypeVar("T")

MODEL_TYPES: Final = frozenset(
    {
        "chat",
        "responses",
        "messages",
        "image",
        "video",
        "embedding",
        "speech",
        "transcription",
        "rerank",
        "moderation",
    }
)
# The types whose requests a safety check reads before the model runs (gateway.safety): those that
# generate from a text the client sends.
SAFETY_CHECKED_TYPES: Final = frozenset({"chat", "responses", "messages", "image", "video", "speech"})
Tokenizer = Literal["o200k_base", "cl100k_base"]
TOKENIZERS: Final = frozenset({"o200k_base", "cl100k_base"})
PROVIDER_KINDS: Final = frozenset({"openai", "anthropic", "cohere"})
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-:@+]+$")
CONFIG_ENV: Final = "GATEWAY_CONFIG"
# `gateway serve --workers N` tells the workers N through this (the file may say otherwise).
WORKERS_ENV: Final = "GATEWAY_WORKERS"
# `gateway serve --host/--port` tell the workers where they listen ("host:port"), for the URLs they
# hand out (routes/common.public_base).
LISTEN_ENV: Final = "GATEWAY_LISTEN"
STORE_BACKENDS: Final = ("sqlite", "postgres")
_URL_SCHEMES: Final = {
    "store": ("postgres://", "postgresql://"),
    "redis": ("redis://", "rediss://", "unix://"),
}

# Every setting the gateway reads, by table ("" is the file's top level; list entries are named
# without their index: "models.channels"). A key not listed here is refused at start-up, naming it.
KNOWN_SETTINGS: Final[Mapping[str, frozenset[str]]] = {
    table: frozenset(keys.split())
    for table, keys in {
        "": "server store redis limits upstream admin logs routing safety videos background models",
        "server": "host port workers public_base_url allowed_hosts",
        "store": "backend path url url_env pool_size",
        "redis": "url url_env prefix",
        "limits": "max_request_bytes sync_timeout_seconds stream_idle_timeout_seconds image_url_ttl_seconds",
        "upstream": "connect_timeout_seconds max_connections",
        "admin": "token_env",
        "logs": "max_body_bytes body_retention_days",
        "routing": "retries retry_backoff_seconds retry_backoff_max_seconds failures_to_cool_down "
        "cooldown_seconds attempt_timeout_seconds",
        "safety": "model on_error",
        "videos": "poll_seconds max_job_seconds file_ttl_seconds",
        "background": "poll_seconds max_job_seconds file_ttl_seconds",
        "models": "name type tokenizer max_output_tokens supported_params safety prices channels",
        "models.prices": "input cached_input output reasoning search character second minute image images",
        "models.channels": "provider base_url model api_key_env name weight priority max_concurrency",
    }.items()
}


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or wrong; the message names the place."""


@dataclass(frozen=True, slots=True)
class Prices:
    """Exact US dollars: per one million tokens of each kind, per search unit (rerank), per one
    million characters of input (speech), per second and per minute of audio (transcription; both
    may be set, billed on the seconds), and per image: by size and quality where `images` names
    them ("1024x1024/hd", or a size alone), else `image`."""

    input: Decimal = Decimal(0)
    cached_input: Decimal = Decimal(0)
    output: Decimal = Decimal(0)
    reasoning: Decimal = Decimal(0)
    search: Decimal = Decimal(0)
    character: Decimal = Decimal(0)
    second: Decimal = Decimal(0)
    minute: Decimal = Decimal(0)
    image: Decimal = Decimal(0)
    images: tuple[tuple[str, Decimal], ...] = ()

    def image_price(self, size: str | None, quality: str | None) -> Decimal:
        """One image's price: the most specific of "size/quality", "size", then `image`."""
        table = dict(self.images)
        for variant in (f"{size}/{quality}", f"{size}"):
            if variant in table:
                return table[variant]
        return self.image


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """One deployment of a model (gateway.routing). Requests go to the best `priority` (lowest
    number) among healthy channels, by `weight` within it; `max_concurrency` caps its requests in
    flight across the gateway's workers."""

    provider: str
    base_url: str
    upstream_model: str
    api_key_env: str | None = None
    name: str = ""
    weight: int = 1
    priority: int = 0
    max_concurrency: int | None = None

    def api_key(self) -> str | None:
        """Read at call time from the environment; never stored in settings, never logged."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    type: str
    channels: tuple[ChannelConfig, ...]
    prices: Prices = field(default_factory=Prices)
    tokenizer: Tokenizer = "o200k_base"
    max_output_tokens: int = 16384
    # None: the provider kind's default list decides what is forwarded (spec 1.3).
    supported_params: frozenset[str] | None = None
    # The moderation model that checks this model's requests before it runs (gateway.safety), from
    # its own `safety` and [safety] model; None: not checked.
    safety_model: str | None = None


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """Retries, backoff and the circuit breaker (gateway.routing)."""

    retries: int = 2
    retry_backoff_seconds: float = 0.25
    retry_backoff_max_seconds: float = 4.0
    failures_to_cool_down: int = 3
    cooldown_seconds: float = 30.0
    # The longest one attempt of a plain request may take on one channel, so that a channel that
    # hangs leaves time to fail over; None: the whole synchronous window.
    attempt_timeout_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class JobSettings:
    """How one kind of asynchronous job is followed (gateway.jobs): [videos], [background]."""

    poll_seconds: float = 10.0  # how often each unfinished job's upstream is asked for its state
    max_job_seconds: float = 6 * 3600.0  # a job unfinished this long is failed and its hold released
    file_ttl_seconds: float = 86400.0  # videos, spec 8: a finished file is served this long


@dataclass(frozen=True, slots=True)
class SafetySettings:
    """The safety check before a model runs (gateway.safety, docs/behaviour.md "Safety checks")."""

    # The moderation model that checks every model of a checked type, unless a model says otherwise.
    model: str | None = None
    # When the moderation model fails: "refuse" the request (provider_error) or "allow" it to run.
    on_error: Literal["refuse", "allow"] = "refuse"


@dataclass(frozen=True, slots=True)
class Settings:
    models: tuple[ModelConfig, ...]
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    # The store (gateway.store): "sqlite", one file at store_path, or "postgres" at store_url with a
    # pool of store_pool_size connections per worker process; a postgres store needs redis_url.
    store_backend: str = "sqlite"
    store_path: Path = Path("var/gateway.db")
    store_url: str | None = field(default=None, repr=False)  # may hold a password: never shown
    store_pool_size: int = 10
    # Redis (rate limits and shared channel state across instances); None: kept locally.
    redis_url: str | None = field(default=None, repr=False)
    # Every Redis key the gateway writes starts with this (and a colon): deployments sharing one
    # Redis keep apart by prefix.
    redis_prefix: str = "gateway"
    max_request_bytes: int = 10 * 1024 * 1024
    sync_timeout_seconds: float = 240.0
    stream_idle_timeout_seconds: float = 120.0
    image_url_ttl_seconds: float = 86400.0
    # Where the URLs the gateway hands out (images, videos) point. None: a request's own scheme and
    # Host when that host is in `allowed_hosts`, else the listen address (host, port); never an
    # unchecked Host header.
    public_base_url: str | None = None
    allowed_hosts: frozenset[str] = frozenset()  # lower case, "name" or "name:port"
    upstream_connect_timeout_seconds: float = 10.0
    upstream_max_connections: int = 1000
    # The environment variable holding the management API's admin token; None: that API is disabled.
    admin_token_env: str | None = None
    # Request logs (spec 8): bodies are kept up to this many bytes each, for this many days.
    log_max_body_bytes: int = 1024 * 1024
    log_body_retention_days: float = 365.0
    routing: RoutingSettings = field(default_factory=RoutingSettings)
    videos: JobSettings = field(default_factory=JobSettings)
    background: JobSettings = field(default_factory=JobSettings)  # background responses
    safety: SafetySettings = field(default_factory=SafetySettings)


def load_settings(path: str | os.PathLike[str]) -> Settings:
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    return parse_settings(raw, base_dir=p.resolve().parent)


def settings_from_env() -> Settings:
    """For server worker processes: the config path travels in GATEWAY_CONFIG."""
    path = os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"{CONFIG_ENV} is not set: pass --config to `gateway serve`")
    settings = load_settings(path)
    workers = os.environ.get(WORKERS_ENV)
    if workers and workers.isdigit() and int(workers) > 0:
        settings = dataclasses.replace(settings, workers=int(workers))
    host, _, port = os.environ.get(LISTEN_ENV, "").rpartition(":")
    if host and port.isdigit():
        settings = dataclasses.replace(settings, host=host, port=int(port))
    return settings


def parse_settings(raw: Mapping[str, Any], base_dir: Path) -> Settings:
    _known(raw, "")
    server = _table(raw, "server")
    store = _table(raw, "store")
    limits = _table(raw, "limits")
    upstream = _table(raw, "upstream")
    admin = _table(raw, "admin")
    logs = _table(raw, "logs")
    routing = _table(raw, "routing")
    models_raw = raw.get("models", [])
    if not isinstance(models_raw, list) or not models_raw:
        raise ConfigError("[[models]]: at least one model is required")
    models = tuple(_model(m, f"models[{i}]") for i, m in enumerate(models_raw))
    names = [m.name for m in models]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"models: duplicate names {dupes}")
    safety = _safety_settings(_table(raw, "safety"))
    models = _resolve_safety(models, models_raw, safety)
    backend, store_path, store_url, pool_size = _store(store, base_dir)
    redis = _table(raw, "redis")
    redis_url = _url(redis, "redis")
    redis_prefix = _get(redis, "prefix", str, "redis.prefix", "gateway")
    if not redis_prefix or not all(c.isalnum() or c in "-_.:" for c in redis_prefix):
        raise ConfigError("redis.prefix: letters, digits, '-', '_', '.' and ':' only, not empty")
    if backend == "postgres" and redis_url is None:
        raise ConfigError(
            'redis: [store] backend = "postgres" needs [redis] url or url_env (instances share rate '
            "limits and channel state through it)"
        )
    return Settings(
        models=models,
        host=_get(server, "host", str, "server.host", "127.0.0.1"),
        port=_get(server, "port", int, "server.port", 8080),
        workers=_positive(_get(server, "workers", int, "server.workers", 1), "server.workers"),
        store_backend=backend,
        store_path=store_path,
        store_url=store_url,
        store_pool_size=pool_size,
        redis_url=redis_url,
        redis_prefix=redis_prefix,
        max_request_bytes=_positive(
            _get(limits, "max_request_bytes", int, "limits.max_request_bytes", 10 * 1024 * 1024),
            "limits.max_request_bytes",
        ),
        sync_timeout_seconds=_seconds(limits, "sync_timeout_seconds", 240.0),
        stream_idle_timeout_seconds=_seconds(limits, "stream_idle_timeout_seconds", 120.0),
        image_url_ttl_seconds=_seconds(limits, "image_url_ttl_seconds", 86400.0),
        public_base_url=_base_url(server),
        allowed_hosts=_allowed_hosts(server),
        upstream_connect_timeout_seconds=_seconds(upstream, "connect_timeout_seconds", 10.0),
        upstream_max_connections=_positive(
            _get(upstream, "max_connections", int, "upstream.max_connections", 1000),
            "upstream.max_connections",
        ),
        admin_token_env=_env_name(admin, "token_env", "admin.token_env"),
        log_max_body_bytes=_non_negative(
            _get(logs, "max_body_bytes", int, "logs.max_body_bytes", 1024 * 1024), "logs.max_body_bytes"
        ),
        log_body_retention_days=_seconds(logs, "body_retention_days", 365.0, "days"),
        routing=RoutingSettings(
            retries=_non_negative(_get(routing, "retries", int, "routing.retries", 2), "routing.retries"),
            retry_backoff_seconds=_seconds(routing, "retry_backoff_seconds", 0.25),
            retry_backoff_max_seconds=_seconds(routing, "retry_backoff_max_seconds", 4.0),
            failures_to_cool_down=_positive(
                _get(routing, "failures_to_cool_down", int, "routing.failures_to_cool_down", 3),
                "routing.failures_to_cool_down",
            ),
            cooldown_seconds=_seconds(routing, "cooldown_seconds", 30.0),
            attempt_timeout_seconds=(
                _seconds(routing, "attempt_timeout_seconds", 0.0)
                if "attempt_timeout_seconds" in routing
                else None
            ),
        ),
        videos=_job_settings(raw, "videos"),
        background=_job_settings(raw, "background"),
        safety=safety,
    )


def _store(store: Mapping[str, Any], base_dir: Path) -> tuple[str, Path, str | None, int]:
    """[store]: the backend, the sqlite file (absolute), the postgres URL and pool size."""
    backend = _get(store, "backend", str, "store.backend", "sqlite")
    if backend not in STORE_BACKENDS:
        raise ConfigError(f'store.backend: {backend!r} is not "sqlite" or "postgres"')
    own = {"sqlite": {"path"}, "postgres": {"url", "url_env", "pool_size"}}[backend]
    stray = sorted(set(store) - own - {"backend"})
    if stray:  # e.g. a path under postgres: refused rather than silently unused
        raise ConfigError(
            f'store.{stray[0]}: not a setting of backend "{backend}" (it takes: {", ".join(sorted(own))})'
        )
    store_path = Path(_get(store, "path", str, "store.path", "var/gateway.db"))
    if not store_path.is_absolute():
        store_path = base_dir / store_path
    if backend == "sqlite":
        return backend, store_path, None, 10
    url = _url(store, "store")
    if url is None:
        raise ConfigError('store: backend "postgres" needs url or url_env')
    pool_size = _positive(_get(store, "pool_size", int, "store.pool_size", 10), "store.pool_size")
    return backend, store_path, url, pool_size


def _url(table: Mapping[str, Any], where: str) -> str | None:
    """`url`, or `url_env` naming the environment variable that holds it (for passwords); exactly
    one of the two, or neither (None)."""
    if "url" in table and "url_env" in table:
        raise ConfigError(f"{where}: give url or url_env, not both")
    if "url_env" in table:
        name = _env_name(table, "url_env", f"{where}.url_env")
        url = os.environ.get(name or "")
        if not url:
            raise ConfigError(f"{where}.url_env: the environment variable {name} is not set")
        source = f"{where}.url_env ({name})"
    elif "url" in table:
        url = _get(table, "url", str, f"{where}.url")
        source = f"{where}.url"
    else:
        return None
    schemes = _URL_SCHEMES[where]
    if not url.startswith(schemes):
        # Never the URL itself in the message: it may hold a password.
        raise ConfigError(f"{source}: must be a URL starting with {' or '.join(schemes)}")
    return url


def _safety_settings(table: Mapping[str, Any]) -> SafetySettings:
    model = table.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ConfigError("safety.model: must be the name of a moderation model")
    on_error = _get(table, "on_error", str, "safety.on_error", "refuse")
    if on_error not in ("refuse", "allow"):
        raise ConfigError('safety.on_error: must be "refuse" or "allow"')
    return SafetySettings(model=model, on_error=cast(Literal["refuse", "allow"], on_error))


def _resolve_safety(
    models: tuple[ModelConfig, ...], models_raw: list[Any], safety: SafetySettings
) -> tuple[ModelConfig, ...]:
    """Each model's moderation model: its own `safety` (false: none; true: [safety] model; a name:
    that moderation model), else [safety] model for the checked types."""
    types = {m.name: m.type for m in models}

    def moderation(name: str, where: str) -> str:
        if types.get(name) != "moderation":
            raise ConfigError(f"{where}: {name!r} is not a configured model of type moderation")
        return name

    if safety.model is not None:
        moderation(safety.model, "safety.model")
    out = []
    for i, (model, raw) in enumerate(zip(models, models_raw, strict=True)):
        where = f"models[{i}].safety"
        value = raw.get("safety")
        if value is not None and not isinstance(value, bool | str):
            raise ConfigError(f"{where}: must be true, false or the name of a moderation model")
        if value is not None and value is not False and model.type not in SAFETY_CHECKED_TYPES:
            raise ConfigError(
                f"{where}: a {model.type} model is not checked; checked types: {sorted(SAFETY_CHECKED_TYPES)}"
            )
        if value is True:
            if safety.model is None:
                raise ConfigError(f"{where}: true needs [safety] model, or name the moderation model here")
            chosen: str | None = safety.model
        elif isinstance(value, str):
            chosen = moderation(value, where)
        elif value is False:
            chosen = None
        else:
            chosen = safety.model if model.type in SAFETY_CHECKED_TYPES else None
        out.append(dataclasses.replace(model, safety_model=chosen) if chosen else model)
    return tuple(out)


def _job_settings(raw: Mapping[str, Any], name: str) -> JobSettings:
    table = _table(raw, name)
    return JobSettings(
        poll_seconds=_seconds(table, "poll_seconds", 10.0),
        max_job_seconds=_seconds(table, "max_job_seconds", 6 * 3600.0),
        file_ttl_seconds=_seconds(table, "file_ttl_seconds", 86400.0),
    )


def _model(raw: Any, where: str) -> ModelConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    _known(raw, where)
    name = _get(raw, "name", str, f"{where}.name")
    if not _MODEL_NAME.match(name):
        raise ConfigError(f"{where}.name: {name!r} is not of the form <vendor>/<model>")
    type_ = _get(raw, "type", str, f"{where}.type")
    if type_ not in MODEL_TYPES:
        raise ConfigError(f"{where}.type: {type_!r} is not one of {sorted(MODEL_TYPES)}")
    tokenizer = _get(raw, "tokenizer", str, f"{where}.tokenizer", "o200k_base")
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"{where}.tokenizer: {tokenizer!r} is not one of {sorted(TOKENIZERS)}")
    channels_raw = raw.get("channels")
    if not isinstance(channels_raw, list) or not channels_raw:
        raise ConfigError(f"{where}.channels: at least one channel is required")
    channels = tuple(_channel(c, f"{where}.channels[{i}]", name, i) for i, c in enumerate(channels_raw))
    if len({c.provider for c in channels}) > 1:
        # A request is built once for the model's shape; only the upstream model name varies.
        raise ConfigError(f"{where}.channels: every channel of a model must have the same provider")
    channel_names = [c.name for c in channels]
    if len(set(channel_names)) < len(channel_names):
        raise ConfigError(f"{where}.channels: channel names must differ within a model: {channel_names}")
    params = raw.get("supported_params")
    if params is not None and (not isinstance(params, list) or not all(isinstance(p, str) for p in params)):
        raise ConfigError(f"{where}.supported_params: must be a list of strings")
    return ModelConfig(
        name=name,
        type=type_,
        channels=channels,
        prices=_prices(_table(raw, "prices", where), f"{where}.prices"),
        tokenizer=cast(Tokenizer, tokenizer),
        max_output_tokens=_positive(
            _get(raw, "max_output_tokens", int, f"{where}.max_output_tokens", 16384),
            f"{where}.max_output_tokens",
        ),
        supported_params=frozenset(params) if params is not None else None,
    )


def _channel(raw: Any, where: str, model_name: str, index: int) -> ChannelConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    _known(raw, where)
    provider = _get(raw, "provider", str, f"{where}.provider")
    if provider not in PROVIDER_KINDS:
        raise ConfigError(f"{where}.provider: {provider!r} is not one of {sorted(PROVIDER_KINDS)}")
    base_url = _get(raw, "base_url", str, f"{where}.base_url").rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}.base_url: must start with http:// or https://")
    api_key_env = raw.get("api_key_env")
    if api_key_env is not None and not isinstance(api_key_env, str):
        raise ConfigError(f"{where}.api_key_env: must be the name of an environment variable")
    cap = raw.get("max_concurrency")
    if cap is not None:
        cap = _positive(
            _get(raw, "max_concurrency", int, f"{where}.max_concurrency"), f"{where}.max_concurrency"
        )
    return ChannelConfig(
        provider=provider,
        base_url=base_url,
        upstream_model=_get(raw, "model", str, f"{where}.model", model_name.split("/", 1)[1]),
        api_key_env=api_key_env,
        name=_get(raw, "name", str, f"{where}.name", f"{provider}-{index}"),
        weight=_positive(_get(raw, "weight", int, f"{where}.weight", 1), f"{where}.weight"),
        priority=_get(raw, "priority", int, f"{where}.priority", 0),
        max_concurrency=cap,
    )


def _prices(raw: Mapping[str, Any], where: str) -> Prices:
    input_ = _money(raw.get("input", 0), f"{where}.input")
    output = _money(raw.get("output", 0), f"{where}.output")
    return Prices(
        input=input_,
        cached_input=_money(raw.get("cached_input", input_), f"{where}.cached_input"),
        output=output,
        reasoning=_money(raw.get("reasoning", output), f"{where}.reasoning"),
        search=_money(raw.get("search", 0), f"{where}.search"),
        character=_money(raw.get("character", 0), f"{where}.character"),
        second=_money(raw.get("second", 0), f"{where}.second"),
        minute=_money(raw.get("minute", 0), f"{where}.minute"),
        image=_money(raw.get("image", 0), f"{where}.image"),
        images=_image_prices(raw.get("images", {}), f"{where}.images"),
    )


def _image_prices(raw: Any, where: str) -> tuple[tuple[str, Decimal], ...]:
    """`images = { "1024x1024" = "0.04", "1024x1792/hd" = "0.12" }`: per image, by size or size/quality."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a table of image variants to prices")
    for variant in raw:
        size, _, quality = variant.partition("/")
        if not size or (("/" in variant) and not quality):
            raise ConfigError(f"{where}: {variant!r} must be a size or size/quality, e.g. 1024x1024/hd")
    return tuple((variant, _money(price, f"{where}.{variant}")) for variant, price in sorted(raw.items()))


def _base_url(server: Mapping[str, Any]) -> str | None:
    value = server.get("public_base_url")
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ConfigError("server.public_base_url: must be a URL starting with http:// or https://")
    return value.rstrip("/")


def _allowed_hosts(server: Mapping[str, Any]) -> frozenset[str]:
    """`allowed_hosts = ["gateway.example.com", "10.0.0.5:8080"]`: Host headers whose URLs may be
    handed out (a name alone allows it on any port)."""
    value = server.get("allowed_hosts", [])
    if not isinstance(value, list) or not all(
        isinstance(h, str) and h and h.isprintable() and "/" not in h and " " not in h for h in value
    ):
        raise ConfigError('server.allowed_hosts: must be a list of host names, e.g. ["gateway.example.com"]')
    return frozenset(h.lower() for h in value)


def _env_name(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: must be the name of an environment variable")
    return value


def _money(value: Any, where: str) -> Decimal:
    # Strings are exact; TOML numbers go through their shortest repr, never through binary float math.
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise ConfigError(f'{where}: must be a price such as "0.15"')
    try:
        d = Decimal(str(value))
    except InvalidOperation as exc:
        raise ConfigError(f"{where}: {value!r} is not a number") from exc
    if not d.is_finite() or d < 0:
        raise ConfigError(f"{where}: must be a finite, non-negative number")
    return d


def _table(raw: Mapping[str, Any], key: str, where: str = "") -> Mapping[str, Any]:
    """The table `key` of `raw` (empty when absent), its keys checked against KNOWN_SETTINGS."""
    path = f"{where}.{key}" if where else key
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: must be a table")
    return _known(value, path)


def _known(table: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """Refuses a key the gateway does not read (a misspelt one would otherwise be ignored)."""
    known = KNOWN_SETTINGS[re.sub(r"\[\d+\]", "", where)]
    unknown = sorted(set(table) - known)
    if unknown:
        names = ", ".join(f"{where}.{k}" if where else k for k in unknown)
        plural = "s" if len(unknown) > 1 else ""
        raise ConfigError(f"unknown setting{plural} {names} (known: {', '.join(sorted(known))})")
    return table


def _get(raw: Mapping[str, Any], key: str, kind: type[T], where: str, default: T | None = None) -> T:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: required")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: must be of type {kind.__name__}")
    return value


def _non_negative(value: int, where: str) -> int:
    if value < 0:
        raise ConfigError(f"{where}: must not be negative")
    return value


def _positive(value: int, where: str) -> int:
    if value <= 0:
        raise ConfigError(f"{where}: must be positive")
    return value


def _seconds(raw: Mapping[str, Any], key: str, default: float, unit: str = "seconds") -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{key}: must be a positive number of {unit}")
    return float(value)
