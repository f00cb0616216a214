"""The simulator's HTTP server: aiohttp.web on uvloop, one route table, one module per API.

OpenAI's, Anthropic's and Cohere's routes match under any prefix (`/v1/chat/completions`,
`/api/v1/chat/completions`, ...), as a base URL may carry one. Other providers' are their own
URLs: Azure OpenAI's (sim/azure.py) under /openai/, Bedrock's (sim/bedrock.py) under /model/,
Gemini's (sim/gemini.py) under /{version}/models/, Vertex AI's (sim/vertex.py) under
/v1/projects/. A path the table does not know, or a method a route does not take, is answered in
the provider's error format (Anthropic's under `/messages`, OpenAI's elsewhere).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler as NextHandler

from . import (
    azure,
    bedrock,
    chat,
    control,
    embeddings,
    gemini,
    images,
    messages,
    moderation,
    rerank,
    responses,
    speech,
    transcription,
    vertex,
    videos,
)
from .state import Simulator
from .wire import anthropic_error, openai_error

Handler = Callable[[Simulator, web.Request], Awaitable[web.StreamResponse]]

# (method, path, handler); paths of the providers' APIs, matched after any prefix.
API: tuple[tuple[str, str, Handler], ...] = (
    ("POST", "chat/completions", chat.create),
    ("POST", "messages", messages.create),
    ("POST", "responses", responses.create),
    ("GET", "responses/{id}", responses.retrieve),
    ("POST", "responses/{id}/cancel", responses.cancel),
    ("DELETE", "responses/{id}", responses.delete),
    ("POST", "embeddings", embeddings.create),
    ("POST", "rerank", rerank.create),
    ("POST", "moderations", moderation.create),
    ("POST", "audio/speech", speech.create),
    ("POST", "audio/transcriptions", transcription.create),
    ("POST", "images/generations", images.generate),
    ("POST", "images/edits", images.edit),
    ("POST", "videos", videos.create),
    ("GET", "videos", videos.list_jobs),
    ("GET", "videos/{id}", videos.retrieve),
    ("DELETE", "videos/{id}", videos.delete),
    ("GET", "videos/{id}/content", videos.content),
    ("GET", "models", control.models),
)
# Other providers' own URL styles, at fixed paths (before the prefix-matched routes).
PROVIDER_ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("POST", "/openai/deployments/{deployment}/" + azure.OPERATION, azure.deployment),
    ("POST", "/openai/v1/" + azure.OPERATION, azure.v1),
    ("POST", "/{tenant}/oauth2/v2.0/token", azure.token),
    ("GET", "/metadata/identity/oauth2/token", azure.managed_identity),
    ("GET", "/msi/token", azure.managed_identity),
    ("POST", "/model/{model}/converse", bedrock.converse),
    ("POST", "/model/{model}/converse-stream", bedrock.converse_stream),
    ("POST", vertex.PREFIX + "/google/models/{model}:generateContent", vertex.gemini_generate),
    ("POST", vertex.PREFIX + "/google/models/{model}:streamGenerateContent", vertex.gemini_stream),
    ("POST", vertex.PREFIX + "/google/models/{model}:predict", vertex.embedding_predict),
    ("POST", vertex.PREFIX + "/anthropic/models/{model}:rawPredict", vertex.anthropic_predict),
    ("POST", vertex.PREFIX + "/anthropic/models/{model}:streamRawPredict", vertex.anthropic_predict),
    ("POST", "/token", vertex.token),
    ("POST", "/{version}/models/{model}:generateContent", gemini.generate),
    ("POST", "/{version}/models/{model}:batchEmbedContents", gemini.batch_embed),
    ("POST", "/{version}/models/{model}:streamGenerateContent", gemini.stream_generate),
)
# The simulator's own routes, at fixed paths.
CONTROL: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/_sim/requests", control.requests),
    ("DELETE", "/_sim/requests", control.forget),
    ("GET", "/_sim/health", control.health),
    ("GET", images.FILES_PATH + "{name}", control.image_file),
)
ANY_PREFIX = "/{prefix:(?:.*/)?}"
MAX_BODY = 256 * 1024 * 1024  # uploads (audio, images, video references) pass whole
MAX_HEAD_LINE = 64 * 1024


@web.middleware
async def _provider_errors(request: web.Request, handler: NextHandler) -> web.StreamResponse:
    """The router's 404 and 405 in the provider's error format, not aiohttp's plain text."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return openai_error(404, f"Unknown path {request.path}", code="unknown_url")
    except web.HTTPMethodNotAllowed as exc:
        message = f"Use {' or '.join(sorted(exc.allowed_methods))}."
        if request.path.endswith("/messages"):
            return anthropic_error(405, message)
        return openai_error(405, message)


def application(sim: Simulator | None = None) -> web.Application:
    simulator = sim or Simulator()
    app = web.Application(middlewares=[_provider_errors], client_max_size=MAX_BODY)
    for method, path, handler in CONTROL + PROVIDER_ROUTES:
        app.router.add_route(method, path, functools.partial(handler, simulator))
    for method, path, handler in API:
        app.router.add_route(method, ANY_PREFIX + path, functools.partial(handler, simulator))
    return app


async def serve(host: str, port: int, sim: Simulator | None = None) -> web.AppRunner:
    """Start serving on host:port; the caller cleans the runner up."""
    runner = web.AppRunner(
        application(sim),
        access_log=None,
        handle_signals=False,
        max_line_size=MAX_HEAD_LINE,
        max_field_size=MAX_HEAD_LINE,
    )
    await runner.setup()
    await web.TCPSite(runner, host, port, backlog=4096).start()
    return runner


def run(host: str, port: int) -> None:
    """Serve until interrupted (`gateway sim`)."""
    import asyncio

    import uvloop

    async def main() -> None:
        runner = await serve(host, port)
        print(f"simulator listening on http://{host}:{port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(main())
