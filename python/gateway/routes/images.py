"""POST /v1/images/generations (JSON) and POST /v1/images/edits (multipart), Shape A.

Whatever the upstream answers, base64 images or links to its own files, the client gets one URL per
image served by the gateway itself (see image_files.py): links are downloaded at once, while they
are fresh. Everything else of the upstream's answer (created, revised_prompt, usage, ...) is kept.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import billing, safety
from ..config import ModelConfig, Prices
from ..context import Call
from ..core import MultipartPart, count_tokens
from ..errors import GatewayError, invalid_request
from ..ids import response_id
from ..pricing import Usage, format_cost
from ..providers.base import read_capped
from ..providers.http import UPSTREAM_FAILURES
from ..registry import REQUIRED_FIELDS
from ..routing import ChannelBody
from ..state import GatewayState
from ..translate.usage import reported_count, token_count
from . import image_files
from .common import REQUEST_ID_HEADER, model_endpoint, parse_object, read_body, resolve_model
from .multipart import FormPart, channel_form, form_parts
from .text import count_input
from .upstream import call_upstream, window_closed, window_left

IMAGE_FIELDS = ("image", "image[]")  # one image, or several as the openai client sends a list
EDIT_FIELDS = REQUIRED_FIELDS["image"] | frozenset(IMAGE_FIELDS)
REPEATABLE = frozenset({"image"})  # several source images, each its own `image` part
UPLOADS = (*IMAGE_FIELDS, "mask")
ACCEPTED_UPLOADS = frozenset({"image/png", "image/jpeg", "image/webp"})  # what OpenAI's edits take
MAX_DOWNLOAD_BYTES = 50 * 1024 * 1024  # one image linked from an upstream answer
MAX_IMAGES = 10  # the most images one request may ask for (`n`), as OpenAI's image API takes
# Formats an answer may name (output_format) that the bytes alone do not tell (SVG is text).
_FORMAT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp", "svg": "image/svg+xml"}


def _not_streamed(stream: Any) -> None:
    """Streamed image generation (server-sent partial images) is not served: the official client
    asked for it reads only events, so a JSON answer would be charged and read as nothing."""
    if stream is True or (isinstance(stream, str) and stream.lower() == "true"):
        raise invalid_request(
            "Streamed image generation is not served here: leave `stream` (and `partial_images`) out;"
            " the answer comes once the images exist, one URL each.",
            "stream",
        )


def routes(state: GatewayState) -> list[Route]:
    async def generations(request: Request, call: Call) -> Response:
        payload = parse_object(await read_body(request, state.settings.max_request_bytes))
        model = resolve_model(state, call, payload.get("model"), "image")
        prompt = _prompt(payload.get("prompt"))
        _not_streamed(payload.get("stream"))
        order = _order(payload.get("n"), payload.get("size"), payload.get("quality"))
        await safety.check(state, request, call, model, payload)
        await billing.hold(
            state,
            call,
            model,
            await count_input(state, request, call, model, lambda: _estimate(model, prompt, order)),
        )
        upstream_body = state.registry.channel_body(model, payload, call)
        asked = payload.get("response_format")
        return await _create(state, request, call, model, prompt, order, upstream_body, asked)

    async def edits(request: Request, call: Call) -> Response:
        raw = await read_body(request, state.settings.max_request_bytes)
        content_type = request.headers.get("content-type", "")
        parts = form_parts(raw, content_type, REPEATABLE)
        if parts is None:
            raise invalid_request("The request must be a well-formed multipart/form-data body.")
        fields = {p.name: p.data.decode(errors="replace") for p in parts if p.name not in UPLOADS}
        model = resolve_model(state, call, fields.get("model"), "image")
        prompt = _prompt(fields.get("prompt"))
        _not_streamed(fields.get("stream"))
        if not any(p.name in IMAGE_FIELDS for p in parts):
            raise invalid_request("`image` is required: the image to edit (PNG, JPEG or WEBP).", "image")
        _check_sides(p for p in parts if p.name in UPLOADS)
        order = _order(_int(fields.get("n")), fields.get("size"), fields.get("quality"))
        # Its source images are input too (GPT image models bill them as image tokens).
        order = replace(order, sources=sum(p.name in IMAGE_FIELDS for p in parts))
        if order.size is None:
            # Left to the model, an edit's size may follow its source: held at the largest given.
            order = replace(order, source_area=_largest_area(p.data for p in parts if p.name in UPLOADS))
        await safety.check(state, request, call, model, fields)
        await billing.hold(
            state,
            call,
            model,
            await count_input(state, request, call, model, lambda: _estimate(model, prompt, order)),
        )
        kept = state.registry.form_parts(model, parts, EDIT_FIELDS, call)
        upstream_body, form_type = channel_form(_form_part(p) for p in kept)
        asked = fields.get("response_format")
        return await _create(
            state, request, call, model, prompt, order, upstream_body, asked, form_type, "image_edit"
        )

    return [
        Route(
            "/v1/images/generations", model_endpoint(state, generations, idempotent=True), methods=["POST"]
        ),
        Route("/v1/images/edits", model_endpoint(state, edits, idempotent=True), methods=["POST"]),
        *image_files.routes(state),
    ]


def _prompt(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise invalid_request("`prompt` is required: a text description of the image.", "prompt")
    return value


def _form_part(part: MultipartPart) -> FormPart:
    """A part as the upstream receives it (channel_form names the upstream's model): an upload
    checked to be an image, labelled with its real type (clients often send
    application/octet-stream, which OpenAI refuses)."""
    if part.name not in UPLOADS:
        return FormPart(part.name, part.data, part.filename, part.content_type)
    kind = image_files.media_type(part.data)
    param = "mask" if part.name == "mask" else "image"
    if not part.data:
        raise invalid_request(f"The `{param}` file is empty.", param)
    if kind not in ACCEPTED_UPLOADS:
        raise invalid_request(f"The `{param}` file is not a PNG, JPEG or WEBP image.", param)
    filename = part.filename or f"{param}.{kind.removeprefix('image/')}"
    return FormPart(part.name, part.data, filename, kind)


async def _create(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    prompt: str,
    order: ImageOrder,
    upstream_body: ChannelBody,
    asked: Any,
    content_type: str | None = None,
    operation: str | None = None,
) -> Response:
    """The shared second half: call the model, fetch its images, keep them, answer with URLs (and
    each image's base64 too where the client reads that: `_inline`). `asked` is the request's
    `response_format`."""
    try:
        # Spec 8: start to last byte, downloads included; from the request's start.
        async with asyncio.timeout(window_left(state, call)):
            answered = await call_upstream(
                state, request, call, model, upstream_body, content_type, operation
            )
            answer, items = _read_answer(answered.content)
            images = [await _image_bytes(state, answer, item) for item in items]
    except TimeoutError as exc:
        raise window_closed(state) from exc
    urls = await image_files.keep(state, request, call.ctx.key.id, images)
    rid = response_id("img-")
    data = [
        {
            "url": url,
            **({"b64_json": _base64(item, image)} if _inline(asked, item) else {}),
            **{k: v for k, v in item.items() if k not in ("url", "b64_json")},
        }
        for url, item, (image, _) in zip(urls, items, images, strict=True)
    ]
    usage = _usage(answer, len(images), model, prompt, order)
    body = orjson.dumps({**answer, "id": rid, "data": data, "usage": _usage_object(answer, usage)})
    charged = billing.settle(state, call, model, rid, "completed", usage)
    headers = {REQUEST_ID_HEADER: call.request_id, "x-service-cost": format_cost(charged)}
    return Response(body, media_type="application/json", headers=headers)


def _inline(asked: Any, item: dict[str, Any]) -> bool:
    """Whether an entry carries its image's base64 (`b64_json`) beside the gateway's URL: when the
    client asked for it, or asked for nothing and the upstream answered so (GPT image models
    always do, and clients written for them read `b64_json`, as the AI SDK's generateImage does)."""
    return asked == "b64_json" or (asked in (None, "") and isinstance(item.get("b64_json"), str))


def _base64(item: dict[str, Any], data: bytes) -> str:
    """The image's base64: the upstream's own text when it sent one (checked when decoded)."""
    given = item.get("b64_json")
    return given if isinstance(given, str) else base64.b64encode(data).decode()


def _read_answer(content: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The answer object and its image entries, each with a b64_json or a url string."""
    try:
        answer = orjson.loads(content)
    except orjson.JSONDecodeError:
        answer = None
    items = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(answer, dict) or not isinstance(items, list) or not all(_is_image(i) for i in items):
        raise GatewayError("provider_error", "The model's provider sent a malformed answer.")
    return answer, items


def _is_image(item: Any) -> bool:
    return isinstance(item, dict) and (
        isinstance(item.get("b64_json"), str) or isinstance(item.get("url"), str)
    )


async def _image_bytes(
    state: GatewayState, answer: dict[str, Any], item: dict[str, Any]
) -> tuple[bytes, str]:
    """An entry's bytes and content type: decoded, or downloaded from the upstream's link."""
    declared: str | None = None
    if isinstance(item.get("b64_json"), str):
        try:
            data = base64.b64decode(item["b64_json"], validate=True)
        except binascii.Error as exc:
            raise GatewayError("provider_error", "The model's provider sent a malformed image.") from exc
    else:
        data, declared = await _download(state, item["url"])
    kind = image_files.media_type(data) or _FORMAT_TYPES.get(str(answer.get("output_format")))
    return data, kind or declared or "application/octet-stream"


async def _download(state: GatewayState, url: str) -> tuple[bytes, str | None]:
    """The file an upstream answer links to (no credentials go with it), and its content type."""
    try:
        response = await state.upstream.get(url, state.settings.sync_timeout_seconds)
        try:
            if response.status != 200:
                raise GatewayError(
                    "provider_error", f"The model's image could not be fetched (HTTP {response.status})."
                )
            data = await read_capped(response, MAX_DOWNLOAD_BYTES, "image")
            return data, response.headers.get("content-type")
        finally:
            response.release()
    except UPSTREAM_FAILURES as exc:
        raise GatewayError("provider_error", "The model's image could not be fetched.") from exc


@dataclass(frozen=True, slots=True)
class ImageOrder:
    """What an image request asks for: how many images, of which size and quality (None: the
    model's default or "auto", decided by the model)."""

    n: int
    size: str | None
    quality: str | None
    # An edit's largest source image's area in pixels, when no size is asked for (None: unknown).
    source_area: int | None = None
    sources: int = 0  # an edit's source images


def _order(n: Any, size: Any, quality: Any) -> ImageOrder:
    def named(value: Any) -> str | None:
        return value if isinstance(value, str) and value and value != "auto" else None

    if n is not None and billing.positive_int(n) is None:
        # Held as one image, an `n` an upstream reads another way ("10") would be charged as ten.
        raise invalid_request("`n` must be a positive integer: the number of images.", "n")
    if n is not None and n > MAX_IMAGES:
        raise invalid_request(f"`n` must be at most {MAX_IMAGES}: the number of images.", "n")
    for name, value in (("size", size), ("quality", quality)):
        if value is not None and not isinstance(value, str):  # priced by name: a number names none
            example = "1024x1024" if name == "size" else "high"
            raise invalid_request(f"`{name}` must be a string (e.g. {example}).", name)
    sides = _SIZE.match(size) if isinstance(size, str) else None
    # Its length first: int() refuses a number of thousands of digits (ValueError, a 500).
    if sides is not None and not all(len(s) <= 5 and 1 <= int(s) <= MAX_IMAGE_SIDE for s in sides.groups()):
        # No model makes such an image: a value it does not accept, not a hold no balance covers.
        raise invalid_request(
            f"`size` must be WIDTHxHEIGHT with each side from 1 to {MAX_IMAGE_SIDE} pixels (e.g. 1024x1024).",
            "size",
        )
    return ImageOrder(n or 1, named(size), named(quality))


def _estimate(model: ModelConfig, prompt: str, order: ImageOrder) -> Usage:
    """The most an image request may cost: its images at their price (at the dearest variant the
    model has when size or quality is left to the model), the prompt's tokens, an edit's source
    images at the model's `image_tokens` each (at the image input price where that is dearer than
    input), and the most output its images may take in tokens (GPT image models bill their output
    as tokens): _output_bound."""
    size, quality = order.size, order.quality
    if size is None or quality is None:
        size, quality = _dearest_variant(model.prices, size, quality)
    sources = order.sources * model.image_tokens
    return Usage(
        prompt_tokens=count_tokens(prompt, model.tokenizer) + sources,
        image_prompt_tokens=sources if model.prices.image_input > model.prices.input else 0,
        completion_tokens=_output_bound(model, order),
        images=order.n,
        image_size=size,
        image_quality=quality,
    )


def _dearest_variant(prices: Prices, size: str | None, quality: str | None) -> tuple[str | None, str | None]:
    """The size and quality an image is held at when the request leaves either to the model: the
    dearest listed variant that agrees with what it does name (dall-e-3 at 1024x1024 without a
    quality: 1024x1024/hd, not the dearest of every size)."""
    dearest: tuple[Decimal, str, str] | None = None  # price, size, quality ("" when not listed)
    for variant, price in prices.images:
        listed_size, _, listed_quality = variant.partition("/")
        if size is not None and listed_size != size:
            continue
        if quality is not None and listed_quality and listed_quality != quality:
            continue
        if dearest is None or price > dearest[0]:
            dearest = (price, listed_size, listed_quality)
    if dearest is None or dearest[0] <= prices.image_price(size, quality):
        return size, quality
    return dearest[1], dearest[2] or quality


def _output_bound(model: ModelConfig, order: ImageOrder) -> int:
    """Each image may take the model's max_output_tokens for a 1024x1024 one, times its area over
    that when it is larger (an edit that names no size: its largest source image's): an image's
    output tokens grow with its area (gpt-image-1: 1056 at 1024x1024 medium, 1584 at 1024x1536),
    and a size the upstream accepts however large must not take the balance below zero."""
    per_image = model.max_output_tokens
    sides = _SIZE.match(order.size or "")
    area = int(sides[1]) * int(sides[2]) if sides is not None else order.source_area
    if area is not None and area > _BASE_AREA:
        per_image = -(-per_image * area // _BASE_AREA)
    return order.n * per_image


def _check_sides(uploads: Iterable[MultipartPart]) -> None:
    """Refuse an image or mask whose header gives a side of 0 or past MAX_IMAGE_SIDE: a corrupt or
    crafted header (review: PNG's 2^32-1, past even what PNG allows, made the hold trillions of
    dollars, and the answer insufficient_credits, where a bad image is invalid_request)."""
    for part in uploads:
        sides = image_files.dimensions(part.data)
        if sides is not None and not all(0 < side <= MAX_IMAGE_SIDE for side in sides):
            width, height = sides
            raise invalid_request(
                f"The `{part.name}` file's header says it is {width}x{height} pixels: each side must be"
                f" 1 to {MAX_IMAGE_SIDE} (the file is corrupt, or not an image an image model takes).",
                "image" if part.name in IMAGE_FIELDS else part.name,
            )


def _largest_area(images: Iterable[bytes]) -> int | None:
    """The largest area (width times height) the images' headers say, None when none says."""
    areas = [w * h for w, h in filter(None, map(image_files.dimensions, images))]
    return max(areas, default=None)


# WIDTHxHEIGHT, any number of (ASCII) digits: _order refuses sides past MAX_IMAGE_SIDE, so the
# sizes _output_bound reads are small numbers.
_SIZE = re.compile(r"^([0-9]+)x([0-9]+)$")
# The largest side an image request may ask for, well past what image models make.
MAX_IMAGE_SIDE: Final = 16384
_BASE_AREA = 1024 * 1024


def _int(text: str | None) -> Any:
    """A form field that holds a whole number, as one (ASCII digits only: int() would read "٣" as
    3 where an upstream may not); anything else as it is, for the check that refuses it."""
    if text is None:
        return None
    digits = text.strip()
    return int(digits) if digits.isascii() and digits.isdigit() else text


def _usage(answer: dict[str, Any], images: int, model: ModelConfig, prompt: str, order: ImageOrder) -> Usage:
    """The upstream's token usage when it reports one (GPT image models: input_tokens, of them
    an edit's source images' image_tokens, and output_tokens), else the prompt's tokens as the
    gateway counts them; plus the images, at the size and quality the answer says they have (GPT
    image models name them), else as ordered."""
    size = answer.get("size") if isinstance(answer.get("size"), str) else order.size
    quality = answer.get("quality") if isinstance(answer.get("quality"), str) else order.quality
    reported = answer.get("usage")
    if isinstance(reported, dict) and reported_count(reported.get("input_tokens")) is not None:
        details = reported.get("input_tokens_details")
        details = details if isinstance(details, dict) else {}
        return Usage(
            prompt_tokens=token_count(reported.get("input_tokens")),
            completion_tokens=token_count(reported.get("output_tokens")),
            cached_tokens=token_count(details.get("cached_tokens")),
            image_prompt_tokens=token_count(details.get("image_tokens")),
            images=images,
            image_size=size,
            image_quality=quality,
        )
    return Usage(
        prompt_tokens=count_tokens(prompt, model.tokenizer),
        images=images,
        image_size=size,
        image_quality=quality,
    )


def _usage_object(answer: dict[str, Any], usage: Usage) -> Any:
    """The answer's `usage` (spec 1.4.1): the upstream's own when it reports one (GPT image models),
    else OpenAI's image usage shape filled with the tokens the gateway counted and billed (DALL-E
    reports none): the prompt's text tokens as input, no output tokens."""
    reported = answer.get("usage")
    if isinstance(reported, dict) and reported_count(reported.get("input_tokens")) is not None:
        return reported
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"text_tokens": usage.prompt_tokens, "image_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
