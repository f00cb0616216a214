"""create_app: the Starlette application, its routes, its error handling and its lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import ASGIApp, Scope

from . import background as background_responses
from . import console, jobs, request_log
from . import videos as video_jobs
from .auth import presented_context
from .buckets import BucketStore, FileBuckets
from .clock import instant_ns
from .config import ConfigError, Settings, settings_from_env
from .console.render import with_security_headers
from .console.security import COOKIE_PATH as CONSOLE_PATH
from .core import count_tokens
from .deadline import expire_all
from .drain import Drain, end_with_supervisor, mark_serving
from .edge import AnswerEdge
from .errors import GatewayError, error_response, unexpected_failure
from .funds import Funds
from .housekeeping import flush_metrics, purge_expired, sample_gauges, tend_leases
from .ids import request_id
from .model_dispatch import ModelDispatch
from .providers.http import UpstreamClient
from .ratelimit_headers import RateLimitHeaders
from .ratelimits import RateLimiter, key_slot
from .registry import ModelRegistry
from .routes import (
    admin,
    admin_config,
    chat,
    console_users,
    embeddings,
    images,
    messages,
    models,
    moderations,
    operations,
    rerank,
    responses,
    speech,
    transcription,
    usage,
    videos,
)
from .routes.common import REQUEST_ID_HEADER, ClientGone, body_cut
from .routing import Router
from .runtime_threads import batch_runtime_threads_once_started
from .state import GatewayState
from .store import open_store
from .store.sqlite.files import RATE_LIMITS, beside
from .telemetry import ERROR_CODE, MODEL_REQUEST, Telemetry, logs

if TYPE_CHECKING:
    from .redis_client import RedisClient
    from .shared_channels import SharedChannels
    from .telemetry.otlp import SpanExport

log = logging.getLogger("gateway")
# The kinds of asynchronous job the poller follows (gateway.jobs), by Job.kind.
JOB_KINDS = {"video": video_jobs.KIND, "response": background_responses.KIND}


def _shared_state(settings: Settings) -> tuple[RedisClient | None, BucketStore, SharedChannels | None]:
    """Where rate-limit buckets and channel state live: in Redis when one is configured (every
    instance shares them), else the Rust core's file beside the database and each process's memory.
    Its modules are imported only then."""
    if not settings.redis_url:
        return None, FileBuckets(_beside(settings.store_path, RATE_LIMITS)), None
    from .redis_buckets import RATE_LIMIT_KEYS, RedisBuckets
    from .redis_client import connect
    from .shared_channels import SharedChannels

    # The process's one Redis client (gateway.redis_client), for the state instances share.
    redis = connect(settings.redis_url)
    return (
        redis,
        RedisBuckets(redis, f"{settings.redis_prefix}:{RATE_LIMIT_KEYS}:"),
        SharedChannels(redis, f"{settings.redis_prefix}:channel:"),
    )


def _span_export(settings: Settings) -> SpanExport | None:
    """The OpenTelemetry exporter when [tracing] otlp_endpoint is set (its SDK imported only then)."""
    if not settings.otlp_endpoint:
        return None
    from .telemetry import otlp

    if not otlp.available():
        raise ConfigError(otlp.MISSING)
    return otlp.SpanExport(settings.otlp_endpoint, settings.otel_service_name)


def create_app(settings: Settings) -> Starlette:
    store = open_store(settings)
    redis, buckets, shared = _shared_state(settings)
    state = GatewayState(
        settings=settings,
        registry=ModelRegistry(settings.models),
        store=store,
        upstream=UpstreamClient(settings),
        funds=Funds(store, settings.workers),
        limiter=RateLimiter(buckets),
        router=Router(settings.models, settings.routing, settings.workers, shared=shared),
        telemetry=Telemetry(
            ((m.name, (c.name for c in m.channels)) for m in settings.models), _span_export(settings)
        ),
        drain=Drain(settings.drain_seconds),
        redis=redis,
    )
    store.follow_load(lambda: state.funds.open_holds)  # holds open: this process's requests under way
    logs.configure(settings.log_format, settings.log_level, settings.access_log)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state.drain.install()
        # The plain requests' upstream waits run under the synchronous window's length (within):
        # the drain's last moment ends them all (routes/upstream.call_upstream answers 503).
        state.drain.finals.append(partial(expire_all, settings.sync_timeout_seconds))
        await state.store.start()
        await state.upstream.start()
        warm_tokenizers(settings)
        # Everything loaded so far lives as long as the process: keep it out of the collector's
        # scans, which otherwise show up as pauses in the latency tail.
        gc.collect()
        gc.freeze()
        # A request allocates a few hundred containers: at the default threshold (700) a young-
        # generation collection ran every few requests, about 3% of a worker's CPU under load
        # (perf, benches/README.md). Cycles are still collected, a little later.
        gc.set_threshold(10_000, 10, 10)
        tasks = [
            asyncio.create_task(purge_expired(state)),
            asyncio.create_task(tend_leases(state)),
            asyncio.create_task(jobs.drive_jobs(state, JOB_KINDS)),
            asyncio.create_task(sample_gauges(state)),
            asyncio.create_task(flush_metrics(state)),
            asyncio.create_task(batch_runtime_threads_once_started()),
        ]
        mark_serving()  # for the supervisor: a death from now on is not a start-up failure
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await state.router.close()
            await state.limiter.drain()
            await state.upstream.close()
            await state.store.close()
            if redis is not None:
                await redis.aclose()
            logs.ACCESS.flush()
            state.telemetry.metrics.flush()
            if state.telemetry.spans is not None:
                await asyncio.to_thread(state.telemetry.spans.shutdown)

    app = _GatewayApp(
        state,
        routes=[
            *chat.routes(state),
            *messages.routes(state),
            *responses.routes(state),
            *videos.routes(state),
            *embeddings.routes(state),
            *rerank.routes(state),
            *moderations.routes(state),
            *speech.routes(state),
            *images.routes(state),
            *transcription.routes(state),
            *models.routes(state),
            *operations.routes(state),
            *usage.routes(state),
            *admin.routes(state),
            *admin_config.routes(state),
            *console_users.routes(state),
            *console.routes(state),
        ],
        exception_handlers=dict(EXCEPTION_HANDLERS),
        lifespan=lifespan,
    )
    app.state.gateway = state
    return app


class _GatewayApp(Starlette):
    """Starlette inside the gateway's answer edge (gateway.edge), so that every answer carries its
    headers and is counted, the 500s of Starlette's outermost error handler included; the model
    endpoints are served ahead of Starlette's stack (gateway.model_dispatch), with the same error
    handlers."""

    def __init__(self, state: GatewayState, **kwargs: Any) -> None:
        self._gateway = state
        super().__init__(**kwargs)
        # A path with a slash too many (or too few) is unknown (404 in the spec's format), not a
        # redirect: Starlette's would name the Host header's origin, whatever a client put there,
        # before the key is checked.
        self.router.redirect_slashes = False

    def build_middleware_stack(self) -> ASGIApp:
        state = self._gateway
        return AnswerEdge(
            ModelDispatch(super().build_middleware_stack(), self.routes, answer_exception),
            RateLimitHeaders(state.store, state.limiter),
            state.drain,
            state.telemetry,
        )


def _beside(path: Path, end: str) -> Path:
    """A file next to the database, shared like it by every worker process (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return beside(path, end)


def warm_tokenizers(settings: Settings) -> None:
    """Load every configured vocabulary now, not on the first request that needs it (~10 ms each)."""
    for tokenizer in {m.tokenizer for m in settings.models}:
        count_tokens("warm", tokenizer)


def app_from_env() -> Starlette:
    """Factory for server workers: settings come from the file named by GATEWAY_CONFIG."""
    end_with_supervisor()
    return create_app(settings_from_env())


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    answer = _answer(request, exc)
    await _log_failure(request, answer, exc)
    return answer


async def _body_cut(request: Request, exc: Exception) -> Response:
    # A body that ended before it was whole (read_body's ClientGone, Starlette's ClientDisconnect)
    # outside the model endpoints, which answer it themselves: the same 400, not an unexpected
    # failure (fuzz review: a 500 and a logged traceback, an anonymous client's to write at will).
    return await _gateway_error(request, body_cut())


async def _http_error(request: Request, exc: Exception) -> Response:
    # Starlette's router raises these for unknown paths and wrong methods.
    assert isinstance(exc, HTTPException)
    headers = exc.headers
    if exc.status_code == 405:
        err = GatewayError("method_not_allowed", f"{request.method} is not allowed on {request.url.path}.")
        allowed = _allowed_methods(request)
        headers = {"allow": ", ".join(sorted(allowed))} if allowed else exc.headers
    elif exc.status_code == 404:
        err, headers = GatewayError("not_found", f"No such path: {request.url.path}."), None
    else:
        err, headers = GatewayError("invalid_request", str(exc.detail), status=exc.status_code), None
    answer = _answer(request, err, headers)
    await _log_failure(request, answer, err)
    return answer


# The paths whose failures are logged here: the API keys' (not the console's or the admin API's).
_KEY_PATHS = ("/v1/", "/v2/", "/model_group/")


async def _log_failure(request: Request, answer: Response, err: GatewayError) -> None:
    """Spec 7.5.3, every failure in the logs: a request that is not a model request (those log
    themselves, gateway.billing.close) and failed is logged for the key it presented (an unknown
    path or a wrong method too), or without one when its key was refused (401), as a model
    request refused for its key is. A failure no key can be told of is not logged."""
    scope = request.scope
    if scope.get(MODEL_REQUEST) or scope.get(request_log.LOGGED) or not scope["path"].startswith(_KEY_PATHS):
        return
    try:
        await _log_failure_for_its_key(request, answer, err)
    except Exception:  # the answer matters more than its log entry: never a 500 for the entry
        log.exception("logging the failure of %s %s failed", request.method, scope["path"])


async def _log_failure_for_its_key(request: Request, answer: Response, err: GatewayError) -> None:
    scope = request.scope
    state: GatewayState = request.app.state.gateway
    slot = key_slot(scope)
    ctx = await presented_context(request, state.store)
    if ctx is None and err.status != 401:
        return
    log_id = None
    if ctx is not None:
        # The id the entry is found by, for the client to quote (spec 7.3.2); a key refused (401)
        # gets none, as a model request refused for its key does.
        log_id = answer.headers[REQUEST_ID_HEADER] = request_id()
    body = answer.body if isinstance(answer.body, bytes) else bytes(answer.body)
    state.store.log_request(
        request_log.entry(
            state.settings.log_max_body_bytes,
            request,
            started_ns=slot.started_ns if slot is not None and slot.started_ns else instant_ns(),
            status=err.status,
            response_body=body,
            key_id=None if ctx is None else ctx.key.id,
            account_id=None if ctx is None else ctx.account.id,
            log_id=log_id,
            error_code=err.code,
            keep_request=ctx is not None,
        )
    )


def _allowed_methods(request: Request) -> set[str]:
    """Every method some route serves on the request's path: Starlette's 405 names only the first
    route's, and a path may have several (POST /v1/videos creates, GET lists), within mounts too
    (the console's: review, its forms' POST was left out)."""
    scope = request.scope
    # From the app's own root: a mount that routed the request has moved root_path to itself.
    return _methods_on(
        request.app.routes, {**scope, "root_path": scope.get("app_root_path", scope.get("root_path", ""))}
    )


def _methods_on(routes: Sequence[BaseRoute], scope: Scope) -> set[str]:
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods and route.matches(scope)[0] != Match.NONE:
            methods |= route.methods
        elif isinstance(route, Mount):
            match, child = route.matches(scope)
            if match != Match.NONE:
                methods |= _methods_on(route.routes, {**scope, **child})
    return methods


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    # Logged with its traceback for operators; the client sees the spec's error object, nothing more.
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return _answer(request, unexpected_failure())


# The app's one table of exception handlers: Starlette's, and the model endpoints' ahead of it.
EXCEPTION_HANDLERS: dict[type[Exception], Callable[[Request, Exception], Awaitable[Response]]] = {
    GatewayError: _gateway_error,
    ClientGone: _body_cut,
    ClientDisconnect: _body_cut,
    HTTPException: _http_error,
    Exception: _unexpected_error,
}


async def answer_exception(request: Request, exc: Exception) -> Response:
    """The answer the handler for `exc`'s nearest class gives, as Starlette picks it."""
    for cls in type(exc).__mro__:
        handler = EXCEPTION_HANDLERS.get(cls)
        if handler is not None:
            return await handler(request, exc)
    raise exc  # not reached: every exception is an Exception


def _answer(request: Request, err: GatewayError, headers: Mapping[str, str] | None = None) -> Response:
    """The error's answer, its code noted for the request's metrics (gateway.telemetry); under
    the console, with the console's security headers, as every answer there has them."""
    request.scope[ERROR_CODE] = err.code
    answer = error_response(err, headers, request.url.path)
    path = request.scope["path"]
    if path == CONSOLE_PATH or path.startswith(CONSOLE_PATH + "/"):
        with_security_headers(answer)
    return answer
