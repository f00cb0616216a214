"""Settings: one TOML file (see gateway.example.toml), parsed once into frozen dataclasses."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, TypeVar, cast
from urllib.parse import urlsplit

from .core import IMAGE_PART_TOKENS

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
# The provider kinds, and the model types each serves (its adapter in gateway.providers has an
# upstream path for each; a test holds the two together). Data here, so that reading a settings
# file never imports the adapters: a supervisor process stays small.
SERVED_TYPES: Final[Mapping[str, frozenset[str]]] = {
    "openai": frozenset(
        {"chat", "embedding", "image", "responses", "speech", "transcription", "video", "moderation"}
    ),
    "anthropic": frozenset({"messages"}),
    "cohere": frozenset({"rerank"}),
    "azure": frozenset({"chat", "embedding", "image", "responses", "speech", "transcription"}),
    "bedrock": frozenset({"chat"}),
    "gemini": frozenset({"chat", "embedding"}),
    "vertex": frozenset({"chat", "messages", "embedding"}),
}
PROVIDER_KINDS: Final = frozenset(SERVED_TYPES)
# Bedrock's runtime endpoint names its region: https://bedrock-runtime.{region}.amazonaws.com
_BEDROCK_HOST = re.compile(r"^https://bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
# Entra ID (Azure): where a service principal's token comes from, and what it is for.
ENTRA_TOKEN_URL: Final = "https://login.microsoftonline.com/{tenant_id}/oauth2/v2.0/token"
AZURE_OPENAI_SCOPE: Final = "https://cognitiveservices.azure.com/.default"
# A managed identity's token endpoint: the VM's instance metadata service (IMDS), unless the platform
# (App Service, Functions, Container Apps) names its own in IDENTITY_ENDPOINT.
AZURE_IMDS_TOKEN_URL: Final = "http://169.254.169.254/metadata/identity/oauth2/token"
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-:@+]+$")
CONFIG_ENV: Final = "GATEWAY_CONFIG"
# Under `gateway serve`, a copy of the text the supervisor last accepted (checked at start and at
# each reload, gateway.supervisor): what a worker loads, so that one started later (a crashed
# worker's replacement) never takes an edit of the file nobody checked. Relative paths in it are
# still resolved against CONFIG_ENV's folder.
ACCEPTED_CONFIG_ENV: Final = "GATEWAY_CONFIG_ACCEPTED"
# `gateway serve --workers N` tells the workers N through this (the file may say otherwise).
WORKERS_ENV: Final = "GATEWAY_WORKERS"
# `gateway serve --host/--port` tell the workers where they listen ("host:port"), for the URLs they
# hand out (routes/common.public_base).
LISTEN_ENV: Final = "GATEWAY_LISTEN"
# ... and which of host, port and workers the command line set (comma-separated): the file's own
# value of those is not in use, so a reload may edit it (gateway.reload).
FLAGS_ENV: Final = "GATEWAY_FLAGS"
# Where the demo configuration's channels find the simulator (`gateway sim`'s default port), and,
# under `gateway demo --sim-port P`, the address that stands for it wherever a configuration file is
# read (read_config_text): at start and at every reload, so that a reload takes the file as edited
# (a rewritten copy made once at start was all a reload read: docs review).
SIM_PORT: Final = 9911
SIM_ADDRESS: Final = f"127.0.0.1:{SIM_PORT}"
DEMO_SIM_ADDRESS_ENV: Final = "GATEWAY_DEMO_SIM_ADDRESS"
STORE_BACKENDS: Final = ("sqlite", "postgres")
LOG_FORMATS: Final = frozenset({"auto", "json", "text"})
LOG_LEVELS: Final = frozenset({"debug", "info", "warning", "error"})
_URL_SCHEMES: Final = {
    "store": ("postgres://", "postgresql://"),
    "redis": ("redis://", "rediss://", "unix://"),
}

# Every setting the gateway reads, by table ("" is the file's top level; list entries are named
# without their index: "models.channels"). A key not listed here is refused at start-up, naming it.
KNOWN_SETTINGS: Final[Mapping[str, frozenset[str]]] = {
    table: frozenset(keys.split())
    for table, keys in {
        "": "server store redis limits upstream admin logs metrics tracing routing safety videos background "
        "models",
        "server": "host port workers public_base_url allowed_hosts drain_seconds drain_notice_seconds",
        "store": "backend path url url_env pool_size",
        "redis": "url url_env prefix",
        "limits": (
            "max_request_bytes sync_timeout_seconds stream_idle_timeout_seconds image_url_ttl_seconds"
            " body_idle_timeout_seconds send_idle_timeout_seconds"
        ),
        "upstream": "connect_timeout_seconds max_connections",
        "admin": "token_env",
        "logs": "max_body_bytes body_retention_days format level access",
        "metrics": "enabled token_env listen",
        "tracing": "otlp_endpoint service_name",
        "routing": "retries retry_backoff_seconds retry_backoff_max_seconds failures_to_cool_down "
        "cooldown_seconds attempt_timeout_seconds",
        "safety": "model on_error",
        "videos": "poll_seconds max_job_seconds file_ttl_seconds",
        "background": "poll_seconds max_job_seconds file_ttl_seconds",
        "models": "name type tokenizer max_output_tokens image_tokens supported_params safety prices "
        "channels",
        "models.prices": "input cached_input cache_write cache_write_1h audio_input image_input output "
        "reasoning audio_output search character second minute image images",
        "models.channels": "provider base_url model api_key_env name weight priority max_concurrency "
        "api_version tenant_id client_id client_secret_env token_url entra_auth federated_token_file region "
        "aws_profile project location credentials_file",
    }.items()
}


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or wrong; the message names the place."""


@dataclass(frozen=True, slots=True)
class Prices:
    """Exact US dollars: per one million tokens of each kind, per search unit (rerank), per one
    million characters of input (speech), per second and per minute of audio (transcription; both
    may be set, billed on the seconds), and per image: by size and quality where `images` names
    them ("1024x1024/hd", or a size alone), else `image`. The kinds of token some models price
    apart (audio, an edit's input images, hour-long cache writes) default, when parsed, to the
    price of the kind they are part of."""

    input: Decimal = Decimal(0)
    cached_input: Decimal = Decimal(0)
    cache_write: Decimal = Decimal(0)  # prompt tokens written to the provider's cache
    cache_write_1h: Decimal = Decimal(0)  # of those, kept an hour (Anthropic's ttl "1h")
    audio_input: Decimal = Decimal(0)  # prompt tokens of audio (prompt_tokens_details.audio_tokens)
    image_input: Decimal = Decimal(0)  # an image edit's input image tokens (GPT image models)
    output: Decimal = Decimal(0)
    reasoning: Decimal = Decimal(0)
    audio_output: Decimal = Decimal(0)  # output tokens of audio (completion_tokens_details.audio_tokens)
    search: Decimal = Decimal(0)
    character: Decimal = Decimal(0)
    second: Decimal = Decimal(0)
    minute: Decimal = Decimal(0)
    image: Decimal = Decimal(0)
    images: tuple[tuple[str, Decimal], ...] = ()

    def image_price(self, size: str | None, quality: str | None) -> Decimal:
        """One image's price: the most specific of "size/quality", "size"; for an unknown size
        (DALL-E's answers name none) the cheapest listed at the quality (its default size is its
        smallest: dall-e-3 hd at 1024x1024; media review: `image` was charged, half the hd
        price); then `image`."""
        table = dict(self.images)
        for variant in (f"{size}/{quality}", f"{size}"):
            if variant in table:
                return table[variant]
        if size is None and quality is not None:
            at_quality = [price for variant, price in self.images if variant.endswith(f"/{quality}")]
            if at_quality:
                return min(at_quality)
        return self.image


EntraAuth = Literal["client_secret", "workload_identity", "managed_identity"]
ENTRA_AUTHS: Final = ("client_secret", "workload_identity", "managed_identity")


@dataclass(frozen=True, slots=True)
class ClientCredentials:
    """How an azure channel gets its Entra ID bearer token from `token_url` (providers/credentials.py
    fetches, caches and refreshes it): a service principal's secret (`client_secret`), a federated
    token a Kubernetes service account is given (`workload_identity`), or the machine's managed
    identity (`managed_identity`: `client_id` names a user-assigned one)."""

    kind: EntraAuth
    token_url: str
    client_id: str | None
    scope: str
    client_secret_env: str | None = None
    federated_token_file: str | None = None
    # App Service, Functions and Container Apps: their identity endpoint wants this header, whose
    # value is in the environment variable IDENTITY_HEADER (None: the VM's IMDS protocol).
    identity_header_env: str | None = None

    def client_secret(self) -> str | None:
        """Read at call time from the environment; never stored in settings, never logged."""
        return os.environ.get(self.client_secret_env) or None if self.client_secret_env else None


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
    # Azure OpenAI: the API version of deployment URLs (/openai/deployments/{model}/...); None: the
    # v1 API (/openai/v1/...), which takes none.
    api_version: str | None = None
    # A bearer token from OAuth client credentials (Entra ID), in place of an API key.
    oauth: ClientCredentials | None = None
    # Bedrock: the AWS region requests are signed for, and the shared-credentials profile to sign
    # with (None: the environment's credentials, else the default profile).
    region: str | None = None
    aws_profile: str | None = None
    # Vertex AI: the Google Cloud project and location models are called in, and the service
    # account key file to sign in with (None: Google's application default credentials).
    project: str | None = None
    location: str | None = None
    credentials_file: str | None = None

    def api_key(self) -> str | None:
        """Read at call time from the environment; never stored in settings, never logged."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    @property
    def identity(self) -> str:
        """Where the channel's upstream work lives and whose it is: what a job started on it is
        found by after a reload (gateway.jobs), whatever its name and place among the channels
        (an unnamed channel's name is its place)."""
        parts = (
            self.provider,
            self.base_url,
            self.upstream_model,
            self.api_key_env,
            self.region,
            self.project,
            self.location,
            self.api_version,
        )
        return " ".join(part or "-" for part in parts)


# A model's most output when its configuration names none.
DEFAULT_MAX_OUTPUT_TOKENS: Final = 16384
# The most a token count in the file may say (max_output_tokens, image_tokens): far above any
# model's, and within what the core's counts take (a larger one failed every request to its model).
MOST_TOKENS: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    type: str
    channels: tuple[ChannelConfig, ...]
    prices: Prices = field(default_factory=Prices)
    tokenizer: Tokenizer = "o200k_base"
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
    # Whether the file names max_output_tokens (the model's real most, then): only then is a request
    # that sets no output limit sent it (gateway.billing.cap_output). The default could be more than
    # a model takes, which its upstream would refuse.
    max_output_tokens_set: bool = False
    # The prompt tokens held for each image part (gateway._core.count_chat_tokens): the most the
    # provider bills for one image (GPT-4o mini bills about 33 times GPT-4o's tokens per image).
    image_tokens: int = IMAGE_PART_TOKENS
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
    # A request whose body stops arriving for this long is answered 408 timeout (a client that
    # declares more than it sends would otherwise hold its request open for ever).
    body_idle_timeout_seconds: float = 60.0
    # A stream one of whose writes waits this long for its client to read is ended (its upstream
    # released, billed for what it was handed): routes/common.py, SendStall.
    send_idle_timeout_seconds: float = 300.0
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
    # On SIGTERM: how long plain requests and streams may still run before the streams are ended.
    drain_seconds: float = 30.0
    # Before SIGTERM reaches a worker: how long it serves on with `connection: close` on every
    # answer and /ready at 503 (gateway.drain), so that clients and load balancers move away first.
    drain_notice_seconds: float = 1.0
    # GET /metrics: served unless [metrics] enabled = false; it asks for the bearer token held by the
    # environment variable metrics_token_env when that is set; metrics_listen ("host", port): served on
    # that separate address instead of the gateway's.
    metrics_enabled: bool = True
    metrics_token_env: str | None = None
    metrics_listen: tuple[str, int] | None = None
    # Logs on stderr: "json" lines, "text", or "auto" (JSON lines unless stderr is a terminal), from
    # log_level up ("debug", "info", "warning", "error"); access_log: one line per request.
    log_format: str = "auto"
    log_level: str = "info"
    access_log: bool = True
    # Traces: exported over OTLP to this http(s) URL, under this service name; None: not exported.
    otlp_endpoint: str | None = None
    otel_service_name: str = "gateway"


def load_settings(path: str | os.PathLike[str]) -> Settings:
    return settings_from_text(read_config_text(path), path)


@dataclass(frozen=True, slots=True)
class StoreOfFile:
    """A settings file's [store] alone: what `gateway admin migrate-store` reads of a file (the
    rest, [redis] with its environment variables among it, is not needed to copy the data)."""

    backend: str
    path: Path  # the SQLite file (absolute)
    url: str | None  # PostgreSQL's


def store_of_file(path: str | os.PathLike[str]) -> StoreOfFile:
    p = Path(path)
    try:
        raw = _toml(read_config_text(p))
    except ConfigError as exc:
        raise ConfigError(f"config file {p}: {exc}") from exc.__cause__
    backend, store_path, url, _ = _store(_table(raw, "store"), p.resolve().parent)
    return StoreOfFile(backend, store_path, url)


def read_config_text(path: str | os.PathLike[str]) -> str:
    """A configuration file's text; ConfigError naming the file when it cannot be read. Under
    `gateway demo --sim-port`, the simulator's default address in it reads as the demo's."""
    try:
        text = _read_text(Path(path))
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc.__cause__
    moved = os.environ.get(DEMO_SIM_ADDRESS_ENV)
    return text.replace(SIM_ADDRESS, moved) if moved else text


def settings_from_text(text: str, path: str | os.PathLike[str]) -> Settings:
    """The settings of `text`, the content of the file at `path` (which names it in errors and
    anchors its relative paths)."""
    p = Path(path)
    try:
        raw = _toml(text)
    except ConfigError as exc:
        raise ConfigError(f"config file {p}: {exc}") from exc.__cause__
    return parse_settings(raw, base_dir=p.resolve().parent)


def settings_from_env() -> Settings:
    """For server worker processes: the config path travels in GATEWAY_CONFIG, the text the
    supervisor accepted in GATEWAY_CONFIG_ACCEPTED (else the file's own)."""
    path = os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"{CONFIG_ENV} is not set: pass --config to `gateway serve`")
    accepted = os.environ.get(ACCEPTED_CONFIG_ENV)
    settings = settings_from_text(read_config_text(accepted), path) if accepted else load_settings(path)
    workers = os.environ.get(WORKERS_ENV)
    if workers and workers.isdigit() and int(workers) > 0:
        settings = dataclasses.replace(settings, workers=int(workers))
    host, _, port = os.environ.get(LISTEN_ENV, "").rpartition(":")
    if host and port.isdigit():
        settings = dataclasses.replace(settings, host=host, port=int(port))
    return settings


def parse_settings(raw: Mapping[str, Any], base_dir: Path) -> Settings:
    """The settings of a parsed file; ConfigError, naming the place, at the first problem."""
    return _parse(raw, base_dir, _STRICT)


# ---------------------------------------------------------------- checking a file (check-config)


@dataclass(frozen=True, slots=True)
class ConfigReport:
    """What checking a configuration found: `problems` (the gateway would refuse the file: each
    names its place, in file order), `warnings` (e.g. an environment variable the file names that
    is unset where the check ran) and the number of models."""

    problems: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    models: int = 0


def check_config(raw: Mapping[str, Any], base_dir: Path = Path(".")) -> ConfigReport:
    """Every problem of a parsed file at once, by the same rules as parse_settings: each unknown
    key (KNOWN_SETTINGS), then each setting, model, channel and cross-check on its own. Nothing is
    started and the environment variables the file names need not be set."""
    check = _Check(collect=True)
    cleaned = _without_unknown(raw, "", check.problems)
    settings = _parse(cleaned, base_dir, check)
    if settings.otlp_endpoint:  # `gateway serve` refuses to start without the exporter installed
        from .telemetry import otlp

        if not otlp.available():
            check.problems.append(f"tracing.otlp_endpoint: {otlp.MISSING}")
    order = _file_order(raw)
    numbered = sorted(enumerate(dict.fromkeys(check.problems)), key=lambda p: (_place(p[1], order), p[0]))
    return ConfigReport(
        problems=tuple(message for _, message in numbered),
        # Advice about a file the gateway would refuse anyway is noise beside its problems.
        warnings=check.warnings() + (() if numbered else advisories(settings)),
        models=len(settings.models),
    )


# The model types whose requests are held for their output (gateway.billing.cap_output).
TEXT_MODEL_TYPES: Final = frozenset({"chat", "messages", "responses"})


def advisories(settings: Settings) -> tuple[str, ...]:
    """What a valid file leaves to chance, one line each (check-config's warnings; `gateway serve`
    logs them): a text model without max_output_tokens is held at 16384 output tokens but sent no
    limit when a request sets none, so an upstream whose own default is larger can answer past the
    hold (docs/behaviour.md); a model without prices is free."""
    found: list[str] = []
    unset = [m.name for m in settings.models if m.type in TEXT_MODEL_TYPES and not m.max_output_tokens_set]
    if unset:
        found.append(
            f"max_output_tokens is not set for {_some(unset)}: a request without an output limit is held "
            f"at {DEFAULT_MAX_OUTPUT_TOKENS} tokens but sent no limit, and a model whose own longest "
            "answer is longer can be charged past its hold. Set it to each model's real most."
        )
    # A price left out is zero: a model (moderation aside, free upstream too) without any is given
    # away, and a video model without `second` makes its videos free whatever else it prices.
    free = [m.name for m in settings.models if m.type != "moderation" and m.prices == Prices()]
    if free:
        found.append(
            f"{_some(free)} {'has' if len(free) == 1 else 'have'} no prices: every request is served free "
            "of charge. Give each its [models.prices], or keep it free knowingly."
        )
    unpriced_videos = [
        m.name for m in settings.models if m.type == "video" and not m.prices.second and m.prices != Prices()
    ]
    if unpriced_videos:
        found.append(
            f"{_some(unpriced_videos)}: a video model is charged per second of video, and `second` is "
            "not priced: its videos are free. Set [models.prices] second."
        )
    from .providers import reasoning_apart

    unused_reasoning = [
        m.name
        for m in settings.models
        if m.prices.reasoning != m.prices.output
        and m.type in TEXT_MODEL_TYPES
        and not any(reasoning_apart(channel, m.type) for channel in m.channels)
    ]
    if unused_reasoning:
        found.append(
            f"{_some(unused_reasoning)}: a `reasoning` price is set, but the upstream counts thinking "
            "within its output tokens (Anthropic's Messages, Bedrock): it is billed at the output price."
        )
    return tuple(found)


def _some(names: list[str]) -> str:
    """Up to three names, and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def check_config_file(path: str | os.PathLike[str]) -> ConfigReport:
    """check_config on a file; a missing or unreadable file, or one not TOML, is its one problem."""
    try:
        text = _read_text(Path(path))
    except ConfigError as exc:
        return ConfigReport(problems=(str(exc),))
    return check_config_text(text, path)


def check_config_text(text: str, path: str | os.PathLike[str]) -> ConfigReport:
    """check_config on `text`, the content of the file at `path`; text not TOML is its one problem."""
    try:
        raw = _toml(text)
    except ConfigError as exc:
        return ConfigReport(problems=(str(exc),))
    return check_config(raw, base_dir=Path(path).resolve().parent)


@dataclass(frozen=True, slots=True)
class CheckedConfig:
    """A configuration file read once: its text and settings, or the problems that refuse it."""

    text: str = ""
    settings: Settings | None = None
    problems: tuple[str, ...] = ()
    # Environment variables it names that are unset here (check-config's warnings): an upstream
    # key's channel then sends no key. Said, not refused (the demo's channels name keys the
    # simulator does not need).
    warnings: tuple[str, ...] = ()


def check_and_load(path: str | os.PathLike[str]) -> CheckedConfig:
    """Read the file at `path` once, check that text and parse it: what a reload takes (the
    supervisor publishes that very text to the workers it starts)."""
    try:
        text = read_config_text(path)
    except ConfigError as exc:
        return CheckedConfig(problems=(str(exc),))
    report = check_config_text(text, path)
    if report.problems:
        return CheckedConfig(text, problems=report.problems)
    try:
        return CheckedConfig(text, settings_from_text(text, path), warnings=report.warnings)
    except ConfigError as exc:  # e.g. an environment variable it names, unset here
        return CheckedConfig(text, problems=(str(exc),))
    except Exception as exc:  # not expected: named by its kind too, to be found
        return CheckedConfig(text, problems=(f"{type(exc).__name__}: {exc}",))


def validate_config(raw: Mapping[str, Any]) -> list[str]:
    """Every problem of a parsed file (check_config), none when the gateway would take it."""
    return list(check_config(raw).problems)


def _read_text(p: Path) -> str:
    """The file's text; ConfigError (not naming the file) when it cannot be read."""
    try:
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read it: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte {exc.start})") from exc


def _toml(text: str) -> dict[str, Any]:
    """The table of a file's text; ConfigError (not naming the file) when it is not TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # its message ends "(at line L, column C)"
        raise ConfigError(f"not valid TOML: {exc}") from exc


class _Check:
    """How the parsing runs its parts: each setting, each model and channel, each cross-check.

    Strict (start-up, parse_settings): a part's ConfigError is raised, the first problem ending the
    parsing. Collecting (check_config): each part's problem is kept and the parsing goes on with the
    part's stand-in (None unless one is given: later checks skip it, and the Settings then built are
    thrown away), so that one pass names every problem; an environment variable the file names that
    is unset is then a warning, not a problem."""

    __slots__ = ("collect", "problems", "unset")

    def __init__(self, collect: bool = False) -> None:
        self.collect = collect
        self.problems: list[str] = []
        self.unset: dict[str, list[str]] = {}  # an unset environment variable: the settings naming it

    def part(self, fn: Callable[[], T], stand_in: Any = None) -> T:
        """fn(); collecting, `stand_in` when it raises ConfigError (its problem kept)."""
        if not self.collect:
            return fn()
        try:
            return fn()
        except ConfigError as exc:
            self.problems.append(str(exc))
            return cast(T, stand_in)

    def env(self, name: str | None, where: str) -> None:
        """Collecting: notes the setting `where` when the environment variable `name` it names is
        unset or empty here (a warning)."""
        if self.collect and name and not os.environ.get(name):
            self.unset.setdefault(name, []).append(where)

    def warnings(self) -> tuple[str, ...]:
        """One line for each unset environment variable, with (the first few of) the settings naming it."""
        return tuple(
            f"the environment variable {name} is not set here ({', '.join(places[:2])}"
            + (f" and {len(places) - 2} more)" if len(places) > 2 else ")")
            for name, places in self.unset.items()
        )


_STRICT: Final = _Check()
_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


def _without_unknown(table: Mapping[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """`table` without the keys KNOWN_SETTINGS does not list, each named in `problems` as _known
    names it; the tables and arrays of tables it lists are walked alike."""
    known = KNOWN_SETTINGS[_kind(where)]
    kept: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{where}.{key}" if where else key
        if key not in known:
            problems.append(_unknown_message([key], where, known))
        elif _kind(path) in KNOWN_SETTINGS and isinstance(value, dict):
            kept[key] = _without_unknown(value, path, problems)
        elif _kind(path) in KNOWN_SETTINGS and isinstance(value, list):
            kept[key] = [
                _without_unknown(v, f"{path}[{i}]", problems) if isinstance(v, dict) else v
                for i, v in enumerate(value)
            ]
        else:
            kept[key] = value
    return kept


def _file_order(raw: Mapping[str, Any]) -> dict[str, int]:
    """Each key path of the file ("models[1].channels[0].weight"), numbered in the file's order."""
    order: dict[str, int] = {}

    def walk(value: Any, path: str) -> None:
        order.setdefault(path, len(order))
        if isinstance(value, Mapping):
            for key, item in value.items():
                walk(item, f"{path}.{key}" if path else key)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")

    walk(raw, "")
    return order


_MESSAGE_PLACE = re.compile(r"^(?:unknown settings? )?([^\s:,(]+)")
_LAST_STEP = re.compile(r"(?:\.[^.\[]+|\[\d+\])$")


def _place(message: str, order: Mapping[str, int]) -> int:
    """Where in the file the place a problem names is (its nearest enclosing key when the key is
    missing); at the end when the file has none of it (e.g. no [[models]])."""
    match = _MESSAGE_PLACE.match(message)
    path = match.group(1) if match else ""
    while path:
        if path in order:
            return order[path]
        path = _LAST_STEP.sub("", path) if _LAST_STEP.search(path) else ""
    return len(order)


# ---------------------------------------------------------------- parsing


def _parse(raw: Mapping[str, Any], base_dir: Path, check: _Check) -> Settings:
    """The settings, each part run by `check` (strict: parse_settings; collecting: check_config)."""
    part = check.part
    _known(raw, "")
    tables = {
        name: part(partial(_table, raw, name), _EMPTY) for name in sorted(KNOWN_SETTINGS[""] - {"models"})
    }
    server, limits, upstream, logs = tables["server"], tables["limits"], tables["upstream"], tables["logs"]
    metrics, tracing, routing = tables["metrics"], tables["tracing"], tables["routing"]
    models_raw: list[Any] = part(
        lambda: _entries(raw, "models", "[[models]]: at least one model is required"), []
    )
    models = [part(partial(_model, m, f"models[{i}]", check, base_dir)) for i, m in enumerate(models_raw)]
    # Each model with its index and table (collecting, a model that is not a table is None: left out).
    indexed = [(i, m, models_raw[i]) for i, m in enumerate(models) if m is not None]
    part(lambda: _distinct_model_names(m for _, m, _ in indexed))
    safety = part(lambda: _safety_settings(tables["safety"]), SafetySettings())
    resolved = _resolve_safety(indexed, safety, check)
    backend, store_path, store_url, pool_size = part(  # collecting, a refused [store]: no backend
        lambda: _store(tables["store"], base_dir, check), ("", base_dir, None, 10)
    )
    redis_url = part(lambda: _redis_url(tables["redis"], check), "")  # "": given, but wrong
    if backend == "postgres":
        part(lambda: _needs_redis(redis_url))
    admin_token_env = part(lambda: _env_name(tables["admin"], "token_env", "admin.token_env"))
    check.env(admin_token_env, "admin.token_env")
    if check.collect and admin_token_env:  # set, but not a token `serve` takes
        from .auth import admin_token_problem  # auth reads settings: imported here, not at the top

        problem = admin_token_problem(admin_token_env)
        if problem is not None:
            check.problems.append(problem)
    metrics_token_env = part(lambda: _env_name(metrics, "token_env", "metrics.token_env"))
    check.env(metrics_token_env, "metrics.token_env")
    return Settings(
        models=resolved,
        host=part(lambda: _get(server, "host", str, "server.host", "127.0.0.1")),
        port=part(lambda: _port(_get(server, "port", int, "server.port", 8080), "server.port")),
        workers=part(lambda: _count(server, "server.workers", 1)),
        store_backend=backend,
        store_path=store_path,
        store_url=store_url,
        store_pool_size=pool_size,
        redis_url=redis_url,
        redis_prefix=part(lambda: _redis_prefix(tables["redis"])),
        max_request_bytes=part(lambda: _count(limits, "limits.max_request_bytes", 10 * 1024 * 1024)),
        sync_timeout_seconds=part(lambda: _seconds(limits, "limits.sync_timeout_seconds", 240.0)),
        stream_idle_timeout_seconds=part(
            lambda: _seconds(limits, "limits.stream_idle_timeout_seconds", 120.0)
        ),
        body_idle_timeout_seconds=part(lambda: _seconds(limits, "limits.body_idle_timeout_seconds", 60.0)),
        send_idle_timeout_seconds=part(lambda: _seconds(limits, "limits.send_idle_timeout_seconds", 300.0)),
        image_url_ttl_seconds=part(lambda: _seconds(limits, "limits.image_url_ttl_seconds", 86400.0)),
        public_base_url=part(lambda: _base_url(server)),
        allowed_hosts=part(lambda: _allowed_hosts(server)),
        upstream_connect_timeout_seconds=part(
            lambda: _seconds(upstream, "upstream.connect_timeout_seconds", 10.0)
        ),
        upstream_max_connections=part(lambda: _count(upstream, "upstream.max_connections", 1000)),
        admin_token_env=admin_token_env,
        log_max_body_bytes=part(lambda: _count(logs, "logs.max_body_bytes", 1024 * 1024, zero=True)),
        log_body_retention_days=part(lambda: _seconds(logs, "logs.body_retention_days", 365.0, "days")),
        routing=RoutingSettings(
            retries=part(lambda: _count(routing, "routing.retries", 2, zero=True)),
            retry_backoff_seconds=part(lambda: _seconds(routing, "routing.retry_backoff_seconds", 0.25)),
            retry_backoff_max_seconds=part(
                lambda: _seconds(routing, "routing.retry_backoff_max_seconds", 4.0)
            ),
            failures_to_cool_down=part(lambda: _count(routing, "routing.failures_to_cool_down", 3)),
            cooldown_seconds=part(lambda: _seconds(routing, "routing.cooldown_seconds", 30.0)),
            attempt_timeout_seconds=(
                part(lambda: _seconds(routing, "routing.attempt_timeout_seconds", 0.0))
                if "attempt_timeout_seconds" in routing
                else None
            ),
        ),
        videos=_job_settings(tables["videos"], "videos", check),
        background=_job_settings(tables["background"], "background", check),
        safety=safety,
        drain_seconds=part(lambda: _seconds(server, "server.drain_seconds", 30.0, most=MAX_DRAIN_SECONDS)),
        drain_notice_seconds=part(
            lambda: _seconds(server, "server.drain_notice_seconds", 1.0, zero=True, most=MAX_DRAIN_SECONDS)
        ),
        metrics_enabled=part(lambda: _get(metrics, "enabled", bool, "metrics.enabled", True)),
        metrics_token_env=metrics_token_env,
        metrics_listen=part(lambda: _listen(metrics, "listen", "metrics.listen")),
        log_format=part(lambda: _one_of(logs, "format", "logs.format", LOG_FORMATS, "auto")),
        log_level=part(lambda: _one_of(logs, "level", "logs.level", LOG_LEVELS, "info")),
        access_log=part(lambda: _get(logs, "access", bool, "logs.access", True)),
        otlp_endpoint=part(lambda: _endpoint(tracing, "otlp_endpoint", "tracing.otlp_endpoint")),
        otel_service_name=part(lambda: _text(tracing, "service_name", "tracing.service_name", "gateway")),
    )


def _distinct_model_names(models: Iterable[ModelConfig]) -> None:
    names = [m.name for m in models if _MODEL_NAME.match(m.name)]  # collecting: a bad name is named already
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"models: duplicate names {dupes}")


def _redis_url(table: Mapping[str, Any], check: _Check) -> str | None:
    url = _url(table, "redis", check)
    if url:
        from .redis_client import parse_url  # only a gateway with Redis loads its client

        try:
            parse_url(url)
        except ValueError as exc:  # its message never quotes the URL (a password)
            raise ConfigError(f"redis: {exc}") from None
    return url


def _redis_prefix(redis: Mapping[str, Any]) -> str:
    prefix = _get(redis, "prefix", str, "redis.prefix", "gateway")
    if not prefix or not all(c.isalnum() or c in "-_.:" for c in prefix):
        raise ConfigError("redis.prefix: letters, digits, '-', '_', '.' and ':' only, not empty")
    return prefix


def _needs_redis(redis_url: str | None) -> None:
    if redis_url is None:
        raise ConfigError(
            'redis: [store] backend = "postgres" needs [redis] url or url_env (instances share rate '
            "limits and channel state through it)"
        )


def _store(
    store: Mapping[str, Any], base_dir: Path, check: _Check = _STRICT
) -> tuple[str, Path, str | None, int]:
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
    # Collecting, each is checked (a refused one stands in).
    url = check.part(lambda: _postgres_url(store, check), "")
    pool_size = check.part(lambda: _count(store, "store.pool_size", 10), 10)
    return backend, store_path, url, pool_size


def _postgres_url(store: Mapping[str, Any], check: _Check) -> str:
    url = _url(store, "store", check)
    if url is None:
        raise ConfigError('store: backend "postgres" needs url or url_env')
    return url


def _url(table: Mapping[str, Any], where: str, check: _Check = _STRICT) -> str | None:
    """`url`, or `url_env` naming the environment variable that holds it (for passwords); exactly
    one of the two, or neither (None). Collecting, an unset variable is a warning (and "")."""
    if "url" in table and "url_env" in table:
        raise ConfigError(f"{where}: give url or url_env, not both")
    if "url_env" in table:
        name = _env_name(table, "url_env", f"{where}.url_env")
        url = os.environ.get(name or "")
        if not url:
            if not check.collect:
                raise ConfigError(f"{where}.url_env: the environment variable {name} is not set")
            check.env(name, f"{where}.url_env")
            return ""
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
    if not url.isprintable() or any(c.isspace() for c in url):  # a space is written %20 in a URL
        raise ConfigError(f"{source}: must be a URL without spaces or control characters")
    if where == "store":  # PostgreSQL's (a Redis URL is read, and refused, by its own parser)
        try:
            port = urlsplit(url).port  # a port that is not a number or out of range: ValueError
        except ValueError:
            port = 0
        if port == 0:
            raise ConfigError(f"{source}: its port must be a number from 1 to 65535")
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
    indexed: list[tuple[int, ModelConfig, Any]], safety: SafetySettings, check: _Check
) -> tuple[ModelConfig, ...]:
    """Each model's moderation model: its own `safety` (false: none; true: [safety] model; a name:
    that moderation model), else [safety] model for the checked types. `indexed`: each model with
    its index in the file and its table there."""
    types = {m.name: m.type for _, m, _ in indexed}

    def moderation(name: str, where: str) -> str:
        if types.get(name) != "moderation":
            raise ConfigError(f"{where}: {name!r} is not a configured model of type moderation")
        return name

    def chosen(model: ModelConfig, value: Any, where: str) -> str | None:
        if value is not None and not isinstance(value, bool | str):
            raise ConfigError(f"{where}: must be true, false or the name of a moderation model")
        if value is not None and value is not False and model.type not in SAFETY_CHECKED_TYPES:
            raise ConfigError(
                f"{where}: a {model.type} model is not checked; checked types: {sorted(SAFETY_CHECKED_TYPES)}"
            )
        if value is True:
            if safety.model is None:
                raise ConfigError(f"{where}: true needs [safety] model, or name the moderation model here")
            return safety.model
        if isinstance(value, str):
            return moderation(value, where)
        if value is False:
            return None
        return safety.model if model.type in SAFETY_CHECKED_TYPES else None

    if safety.model is not None:
        check.part(partial(moderation, safety.model, "safety.model"))
    out = []
    for i, model, raw in indexed:
        name = check.part(partial(chosen, model, raw.get("safety"), f"models[{i}].safety"))
        out.append(dataclasses.replace(model, safety_model=name) if name else model)
    return tuple(out)


def _job_settings(table: Mapping[str, Any], name: str, check: _Check) -> JobSettings:
    part = check.part
    return JobSettings(
        poll_seconds=part(lambda: _seconds(table, f"{name}.poll_seconds", 10.0)),
        max_job_seconds=part(lambda: _seconds(table, f"{name}.max_job_seconds", 6 * 3600.0)),
        file_ttl_seconds=part(lambda: _seconds(table, f"{name}.file_ttl_seconds", 86400.0)),
    )


def _model(raw: Any, where: str, check: _Check = _STRICT, base_dir: Path = Path(".")) -> ModelConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    part = check.part
    _known(raw, where)
    # Collecting, a bad name or type stands in as "" or "chat": nothing later refuses either.
    name = part(lambda: _model_name(raw, f"{where}.name"), "")
    type_ = part(lambda: _one_of(raw, "type", f"{where}.type", MODEL_TYPES), "chat")
    tokenizer = part(lambda: _one_of(raw, "tokenizer", f"{where}.tokenizer", TOKENIZERS, "o200k_base"))
    channels_raw: list[Any] = part(
        lambda: _entries(raw, "channels", f"{where}.channels: at least one channel is required"), []
    )
    parsed = [
        part(partial(_channel, c, f"{where}.channels[{i}]", name, i, check, base_dir))
        for i, c in enumerate(channels_raw)
    ]
    channels = tuple(c for c in parsed if c is not None)
    part(lambda: _channels_agree(channels, f"{where}.channels"))
    part(lambda: _provider_serves(channels, type_, where))
    return ModelConfig(
        name=name,
        type=type_,
        channels=channels,
        prices=part(lambda: _prices(_table(raw, "prices", where), f"{where}.prices", check), Prices()),
        tokenizer=cast(Tokenizer, tokenizer),
        max_output_tokens=part(
            lambda: _count(raw, f"{where}.max_output_tokens", DEFAULT_MAX_OUTPUT_TOKENS, most=MOST_TOKENS)
        ),
        max_output_tokens_set=raw.get("max_output_tokens") is not None,
        image_tokens=part(lambda: _count(raw, f"{where}.image_tokens", IMAGE_PART_TOKENS, most=MOST_TOKENS)),
        supported_params=part(lambda: _supported_params(raw, f"{where}.supported_params")),
    )


def _provider_serves(channels: tuple[ChannelConfig, ...], type_: str, where: str) -> None:
    """The channels' provider serves models of this type."""
    providers = {c.provider for c in channels}
    if len(providers) != 1:
        return  # none parsed, or several: _channels_agree names that
    (provider,) = providers
    served = SERVED_TYPES.get(provider)
    if served is not None and type_ in MODEL_TYPES and type_ not in served:
        kinds = ", ".join(sorted(served))
        raise ConfigError(f"{where}.type: provider {provider} serves no {type_} model (it serves {kinds})")


def _supported_params(raw: Mapping[str, Any], where: str) -> frozenset[str] | None:
    params = raw.get("supported_params")
    if params is None:
        return None
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise ConfigError(f"{where}: must be a list of strings")
    return frozenset(params)


def _model_name(raw: Mapping[str, Any], where: str) -> str:
    name = _get(raw, "name", str, where)
    if not _MODEL_NAME.match(name):
        raise ConfigError(f"{where}: {name!r} is not of the form <vendor>/<model>")
    return name


def _channels_agree(channels: tuple[ChannelConfig, ...], where: str) -> None:
    """A model's channels share one provider and have distinct names (collecting: a channel's
    provider or name that was refused, None, is left out)."""
    if len({c.provider for c in channels if c.provider is not None}) > 1:
        # A request is built once for the model's shape; only the upstream model name varies.
        raise ConfigError(f"{where}: every channel of a model must have the same provider")
    names = [c.name for c in channels if c.name is not None]
    if len(set(names)) < len(names):
        raise ConfigError(f"{where}: channel names must differ within a model: {names}")


def _channel(
    raw: Any, where: str, model_name: str, index: int, check: _Check = _STRICT, base_dir: Path = Path(".")
) -> ChannelConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    part = check.part
    _known(raw, where)
    provider = part(lambda: _one_of(raw, "provider", f"{where}.provider", PROVIDER_KINDS))
    base_url = part(lambda: _channel_url(raw, f"{where}.base_url"))
    api_key_env = part(lambda: _env_name(raw, "api_key_env", f"{where}.api_key_env"))
    check.env(api_key_env, f"{where}.api_key_env")
    cap = (
        part(lambda: _count(raw, f"{where}.max_concurrency"))
        if raw.get("max_concurrency") is not None
        else None
    )
    oauth = part(lambda: _client_credentials(raw, where, provider))
    if oauth is not None:
        check.env(oauth.client_secret_env, f"{where}.client_secret_env")
    elif provider == "azure" and raw.get("api_key_env") is None and "tenant_id" not in raw:
        part(
            lambda: _refuse(
                f"{where}: an azure channel signs in with api_key_env or Entra ID (entra_auth, or "
                "tenant_id ... for a client secret)"
            )
        )
    return ChannelConfig(
        provider=provider,
        base_url=base_url,
        upstream_model=part(lambda: _get(raw, "model", str, f"{where}.model", model_name.partition("/")[2])),
        api_key_env=api_key_env,
        name=part(lambda: _get(raw, "name", str, f"{where}.name", f"{provider}-{index}")),
        weight=part(lambda: _count(raw, f"{where}.weight", 1)),
        priority=part(lambda: _get(raw, "priority", int, f"{where}.priority", 0)),
        max_concurrency=cap,
        api_version=part(lambda: _only_for("azure", raw, "api_version", where, provider)),
        oauth=oauth,
        region=part(lambda: _bedrock_region(raw, where, provider, base_url)),
        aws_profile=part(lambda: _only_for("bedrock", raw, "aws_profile", where, provider)),
        project=part(lambda: _vertex_required(raw, "project", where, provider)),
        location=part(lambda: _vertex_required(raw, "location", where, provider)),
        credentials_file=part(lambda: _key_file(raw, where, provider, base_dir)),
    )


def _key_file(raw: Mapping[str, Any], where: str, provider: str | None, base_dir: Path) -> str | None:
    """A vertex channel's service account key file; relative to the settings file, as the store's path."""
    given = _only_for("vertex", raw, "credentials_file", where, provider)
    return None if given is None else str(base_dir / given)


def _vertex_required(raw: Mapping[str, Any], key: str, where: str, provider: str | None) -> str | None:
    value = _only_for("vertex", raw, key, where, provider)
    if provider == "vertex" and value is None:
        raise ConfigError(f"{where}.{key}: required for a vertex channel")
    return value


def _bedrock_region(
    raw: Mapping[str, Any], where: str, provider: str | None, base_url: str | None
) -> str | None:
    """The region a bedrock channel signs for: `region`, else the one its base_url names."""
    given = _only_for("bedrock", raw, "region", where, provider)
    if provider != "bedrock" or given is not None:
        return given
    match = _BEDROCK_HOST.match(base_url or "")
    if match is None:
        raise ConfigError(
            f"{where}.region: required when base_url is not https://bedrock-runtime.REGION.amazonaws.com"
        )
    return match[1]


def _refuse(message: str) -> None:
    raise ConfigError(message)


def _only_for(kind: str, raw: Mapping[str, Any], key: str, where: str, provider: str | None) -> str | None:
    """A string setting only a `kind` channel takes."""
    value = raw.get(key)
    if value is None:
        return None
    if provider != kind:
        raise ConfigError(f"{where}.{key}: only a{'n' if kind[0] in 'aeiou' else ''} {kind} channel takes it")
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key}: must be a non-empty string")
    return value


def _client_credentials(raw: Mapping[str, Any], where: str, provider: str | None) -> ClientCredentials | None:
    """Entra ID sign-in of an azure channel, or None (it signs in with api_key_env).

    `entra_auth` says how: "client_secret" (the default when tenant_id is given: tenant_id,
    client_id and client_secret_env), "workload_identity" (AKS: tenant_id, client_id and
    federated_token_file default to what the workload identity webhook puts in the environment)
    or "managed_identity" (client_id only for a user-assigned identity). token_url reaches another
    cloud's login, or another identity endpoint."""
    keys = ("entra_auth", "tenant_id", "client_id", "client_secret_env", "token_url", "federated_token_file")
    given = [k for k in keys if raw.get(k) is not None]
    if not given:
        return None
    if provider != "azure":
        raise ConfigError(f"{where}.{given[0]}: only an azure channel takes it")
    if raw.get("api_key_env") is not None:
        raise ConfigError(f"{where}: api_key_env or Entra ID sign-in ({given[0]} ...), not both")
    kind = _get(raw, "entra_auth", str, f"{where}.entra_auth", "client_secret")
    if kind not in ENTRA_AUTHS:
        raise ConfigError(f"{where}.entra_auth: must be one of {', '.join(ENTRA_AUTHS)}")
    allowed = {
        "client_secret": ("tenant_id", "client_id", "client_secret_env", "token_url"),
        "workload_identity": ("tenant_id", "client_id", "federated_token_file", "token_url"),
        "managed_identity": ("client_id", "token_url"),
    }[kind]
    for key in given:
        if key != "entra_auth" and key not in allowed:
            raise ConfigError(f"{where}.{key}: not used with entra_auth = {kind!r}")
    token_url = _get(raw, "token_url", str, f"{where}.token_url", "")
    if token_url and not token_url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}.token_url: must start with http:// or https://")
    if kind == "managed_identity":
        client_id = _get(raw, "client_id", str, f"{where}.client_id", "") or None
        endpoint = os.environ.get("IDENTITY_ENDPOINT")
        on_app_service = not token_url and bool(endpoint)
        return ClientCredentials(
            kind="managed_identity",
            token_url=token_url or endpoint or AZURE_IMDS_TOKEN_URL,
            client_id=client_id,
            scope=AZURE_OPENAI_SCOPE,
            identity_header_env="IDENTITY_HEADER" if on_app_service else None,
        )
    if kind == "workload_identity":
        tenant = _from_env(raw, "tenant_id", "AZURE_TENANT_ID", where)
        client_id = _from_env(raw, "client_id", "AZURE_CLIENT_ID", where)
        token_file = _from_env(raw, "federated_token_file", "AZURE_FEDERATED_TOKEN_FILE", where)
        authority = os.environ.get("AZURE_AUTHORITY_HOST", "https://login.microsoftonline.com/")
        return ClientCredentials(
            kind="workload_identity",
            token_url=token_url or f"{authority.rstrip('/')}/{tenant}/oauth2/v2.0/token",
            client_id=client_id,
            scope=AZURE_OPENAI_SCOPE,
            federated_token_file=token_file,
        )
    missing = [k for k in ("tenant_id", "client_id", "client_secret_env") if raw.get(k) is None]
    if missing:
        raise ConfigError(
            f"{where}: Entra ID sign-in with a client secret needs tenant_id, client_id and "
            f"client_secret_env; missing {', '.join(missing)}"
        )
    tenant = _get(raw, "tenant_id", str, f"{where}.tenant_id")
    secret_env = _env_name(raw, "client_secret_env", f"{where}.client_secret_env")
    assert secret_env is not None, "checked above"
    return ClientCredentials(
        kind="client_secret",
        token_url=token_url or ENTRA_TOKEN_URL.format(tenant_id=tenant),
        client_id=_get(raw, "client_id", str, f"{where}.client_id"),
        scope=AZURE_OPENAI_SCOPE,
        client_secret_env=secret_env,
    )


def _from_env(raw: Mapping[str, Any], key: str, variable: str, where: str) -> str:
    """A workload identity setting, or the environment variable AKS's webhook sets for it."""
    value = _get(raw, key, str, f"{where}.{key}", "") or os.environ.get(variable, "")
    if not value:
        raise ConfigError(f"{where}: workload identity needs {key} (or the environment variable {variable})")
    return value


def _channel_url(raw: Mapping[str, Any], where: str) -> str:
    return _http_url(_get(raw, "base_url", str, where), where, "https://api.openai.com/v1")


def _http_url(value: str, where: str, example: str) -> str:
    """An http:// or https:// URL with a host, a port from 1 to 65535 if it names one, no spaces, no
    query and no fragment (paths are appended to it), without its trailing slash: checked here,
    where a mistake would otherwise show only as every request's provider_error."""
    refused = f"{where}: must be a URL starting with http:// or https://, e.g. {example}"
    if not value.startswith(("http://", "https://")):
        raise ConfigError(refused)
    try:
        url = urlsplit(value)
        port = url.port  # a port that is not a number or out of range: ValueError
    except ValueError:
        raise ConfigError(f"{where}: its port must be a number from 1 to 65535") from None
    if not url.hostname:
        raise ConfigError(f"{refused} (it names no host)")
    if port == 0:
        raise ConfigError(f"{where}: its port must be a number from 1 to 65535")
    if not value.isprintable() or any(c.isspace() for c in value):
        raise ConfigError(f"{where}: must be a URL without spaces or control characters")
    if url.query or url.fragment or "?" in value or "#" in value:
        raise ConfigError(f"{where}: must be a URL without a query (?...) or a fragment (#...)")
    return value.rstrip("/")


def _port(value: int, where: str) -> int:
    if not 1 <= value <= 65535:
        raise ConfigError(f"{where}: must be a port number from 1 to 65535")
    return value


def _prices(raw: Mapping[str, Any], where: str, check: _Check = _STRICT) -> Prices:
    """[models.prices]; collecting, each price is checked (a refused one stands in as 0)."""

    def price(name: str, default: Any = 0) -> Decimal:
        return check.part(lambda: _money(raw.get(name, default), f"{where}.{name}"), Decimal(0))

    input_, output = price("input"), price("output")
    cache_write = price("cache_write", input_)
    return Prices(
        input=input_,
        cached_input=price("cached_input", input_),
        cache_write=cache_write,
        cache_write_1h=price("cache_write_1h", cache_write),
        audio_input=price("audio_input", input_),
        image_input=price("image_input", input_),
        output=output,
        reasoning=price("reasoning", output),
        audio_output=price("audio_output", output),
        search=price("search"),
        character=price("character"),
        second=price("second"),
        minute=price("minute"),
        image=price("image"),
        images=check.part(lambda: _image_prices(raw.get("images", {}), f"{where}.images"), ()),
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
    if not isinstance(value, str):
        raise ConfigError("server.public_base_url: must be a URL starting with http:// or https://")
    return _http_url(value, "server.public_base_url", "https://gateway.example.com")


def _allowed_hosts(server: Mapping[str, Any]) -> frozenset[str]:
    """`allowed_hosts = ["gateway.example.com", "10.0.0.5:8080"]`: Host headers whose URLs may be
    handed out (a name alone allows it on any port)."""
    value = server.get("allowed_hosts", [])
    if not isinstance(value, list) or not all(
        isinstance(h, str) and h and h.isprintable() and "/" not in h and " " not in h for h in value
    ):
        raise ConfigError('server.allowed_hosts: must be a list of host names, e.g. ["gateway.example.com"]')
    return frozenset(h.lower() for h in value)


def _listen(raw: Mapping[str, Any], key: str, where: str) -> tuple[str, int] | None:
    """`"host:port"` (an IPv6 host in brackets: "[::1]:9090") as (host, port); None when absent."""
    value = raw.get(key)
    if value is None:
        return None
    refused = ConfigError(f'{where}: must be "host:port" with a port from 1 to 65535, e.g. "127.0.0.1:9090"')
    if not isinstance(value, str):
        raise refused
    host, _, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:  # an IPv6 address without brackets: where its port starts is a guess
        raise refused
    if not host or not host.isprintable() or any(c in host for c in " /[]@"):
        raise refused
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        raise refused
    return host, int(port)


def _endpoint(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    """An http:// or https:// URL as _http_url checks it, refused in one message; None when absent."""
    value = raw.get(key)
    if value is None:
        return None
    refused = f"{where}: must be a URL starting with http:// or https://, e.g. http://127.0.0.1:4318"
    if not isinstance(value, str):
        raise ConfigError(refused)
    try:
        return _http_url(value, where, "http://127.0.0.1:4318")
    except ConfigError:
        raise ConfigError(refused) from None


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
    if d > MAX_PRICE:  # review: 1e400 was taken, and requests refused with a 400-digit cost
        raise ConfigError(f"{where}: must be at most {MAX_PRICE} (US dollars)")
    if decimal_places(d) > PRICE_PLACES:
        # 1e-30 was taken, and gave costs and balances 30 digits long.
        raise ConfigError(f"{where}: must have at most {PRICE_PLACES} decimal places")
    return d


def decimal_places(value: Decimal) -> int:
    """The decimal places a finite amount needs: trailing zeros are none ("10.50" needs 1, "100"
    none), as the bounds on prices and on the management API's amounts count them."""
    exponent = value.normalize().as_tuple().exponent
    if not isinstance(exponent, int):
        raise ValueError(f"{value} is not a finite amount")
    return max(-exponent, 0)


def _entries(raw: Mapping[str, Any], key: str, missing: str) -> list[Any]:
    """The array of tables `key` (`[[models]]`, `[[models.channels]]`): `missing` when absent or empty."""
    value = raw.get(key)
    if isinstance(value, dict):  # [models] for [[models]]: one table, not an array of them
        where = missing.partition(":")[0].strip("[]")
        spelt = re.sub(r"\[\d+\]", "", where)  # models[0].channels is written [[models.channels]]
        raise ConfigError(f"{where}: must be an array of tables, written [[{spelt}]] (with double brackets)")
    if not isinstance(value, list) or not value:
        raise ConfigError(missing)
    return value


def _table(raw: Mapping[str, Any], key: str, where: str = "") -> Mapping[str, Any]:
    """The table `key` of `raw` (empty when absent), its keys checked against KNOWN_SETTINGS."""
    path = f"{where}.{key}" if where else key
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: must be a table")
    return _known(value, path)


def _kind(where: str) -> str:
    """The KNOWN_SETTINGS entry of a place: "models[3].channels[0]" is "models.channels"."""
    return re.sub(r"\[\d+\]", "", where)


def _known(table: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """Refuses a key the gateway does not read (a misspelt one would otherwise be ignored)."""
    known = KNOWN_SETTINGS[_kind(where)]
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(_unknown_message(unknown, where, known))
    return table


def _unknown_message(keys: list[str], where: str, known: frozenset[str]) -> str:
    names = ", ".join(f"{where}.{k}" if where else k for k in keys)
    plural = "s" if len(keys) > 1 else ""
    return f"unknown setting{plural} {names} (known: {', '.join(sorted(known))})"


def _get(raw: Mapping[str, Any], key: str, kind: type[T], where: str, default: T | None = None) -> T:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: required")
    if kind is bool and not isinstance(value, bool):  # never 1, 0 or "yes"
        raise ConfigError(f"{where}: must be true or false")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: must be of type {kind.__name__}")
    return value


def _one_of(
    raw: Mapping[str, Any], key: str, where: str, choices: frozenset[str], default: str | None = None
) -> str:
    value = _get(raw, key, str, where, default)
    if value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of {sorted(choices)}")
    return value


def _text(raw: Mapping[str, Any], key: str, where: str, default: str) -> str:
    value = _get(raw, key, str, where, default)
    if not value.strip():
        raise ConfigError(f"{where}: must not be empty")
    return value


def _non_negative(value: int, where: str) -> int:
    if value < 0:
        raise ConfigError(f"{where}: must not be negative")
    return value


def _positive(value: int, where: str) -> int:
    if value <= 0:
        raise ConfigError(f"{where}: must be positive")
    return value


def _count(
    raw: Mapping[str, Any],
    where: str,
    default: int | None = None,
    *,
    zero: bool = False,
    most: int | None = None,
) -> int:
    """The whole number at `where` ("server.workers", its last part the key in `raw`, as for
    _seconds): positive, or zero too where `zero` allows it, and at most `most` where that is set;
    required when there is no default."""
    value = _get(raw, where.rpartition(".")[2], int, where, default)
    if most is not None and value > most:
        raise ConfigError(f"{where}: must be at most {most}")
    return _non_negative(value, where) if zero else _positive(value, where)


# The most any duration setting may say (in its unit): far past any real one, and small enough
# for every timer and signal it is given to.
MAX_DURATION: Final = 10_000_000
# The most a drain may last: a day. The supervisor waits for its workers' end in one poll(2), whose
# timeout is milliseconds in 32 bits (review: 3,000,000 s made the stop fail with a traceback).
MAX_DRAIN_SECONDS: Final = 86_400
# The most a price may say (US dollars per its unit: a million tokens, an image, a second).
MAX_PRICE: Final = Decimal(1_000_000)
# The finest a price may say: a millionth of a millionth of a dollar (per its unit).
PRICE_PLACES: Final = 12


def _seconds(
    raw: Mapping[str, Any],
    where: str,
    default: float,
    unit: str = "seconds",
    zero: bool = False,
    most: int = MAX_DURATION,
) -> float:
    """The setting at `where` ("limits.sync_timeout_seconds", its last part the key in `raw`): a
    positive number of seconds (or of `unit`), or zero where `zero` allows it; at most `most`."""
    value = raw.get(where.rpartition(".")[2], default)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not (value >= 0 if zero else value > 0):  # NaN is neither
        raise ConfigError(f"{where}: must be {'zero or ' if zero else ''}a positive number of {unit}")
    if value > most:  # review: inf and 1e300 were taken, and the server could not stop
        raise ConfigError(f"{where}: must be at most {most:,} {unit}")
    return float(value)
