"""The simulator's OpenAI image endpoints: generations (JSON) and edits (multipart).

Every image is a small solid-colour PNG whose colour comes from a hash of the prompt (and, for edits,
of the uploaded images), so the same request always draws the same pictures. The requested size is
reported as asked but rendered at most MAX_SIDE pixels a side. As OpenAI does, GPT image models
answer with base64, report token usage and refuse `response_format`; DALL-E models answer with
links, or base64 when `response_format` asks. Links point at the simulator itself (FILES_PATH) and
name colour and size, so serving them needs no state.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import struct
import time
import zlib
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..core import count_tokens, parse_multipart
from . import directives
from .directives import DirectiveError
from .wire import Answer, Headers, error_answer, respond

if TYPE_CHECKING:
    from .state import Simulator

FILES_PATH = "/_sim/files/"
MAX_SIDE = 64
MAX_IMAGES = 10  # OpenAI's limit on n
# gpt-image-1's output tokens for one 1024x1024 image at each quality; other sizes scale by area.
OUTPUT_TOKENS = {"low": 272, "medium": 1056, "high": 4160}
INPUT_IMAGE_TOKENS = 323  # what one uploaded image adds to the input of an edit
_SIZE = re.compile(r"^([1-9]\d{0,4})x([1-9]\d{0,4})$")
_FILE = re.compile(r"^([0-9a-f]{6})-([1-9]\d{0,2})x([1-9]\d{0,2})\.png$")


async def generate(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """POST .../images/generations (JSON)."""
    answer, record = _generate(request.headers, await request.read())
    sim.record(record)
    return respond(answer)


async def edit(sim: Simulator, request: web.Request) -> web.StreamResponse:
    """POST .../images/edits (multipart)."""
    answer, record = _edit(request.headers, await request.read())
    sim.record(record)
    return respond(answer)


def file(name: str) -> Answer:
    """GET FILES_PATH<rrggbb>-<w>x<h>.png: the image a link in an answer names."""
    match = _FILE.match(name)
    if match is None or int(match[2]) > MAX_SIDE or int(match[3]) > MAX_SIDE:
        return error_answer(f"Unknown file {FILES_PATH}{name}", status=404)
    return Answer(200, png(int(match[2]), int(match[3]), bytes.fromhex(match[1])), "image/png")


def png(width: int, height: int, rgb: bytes) -> bytes:
    """A valid PNG of one colour: 8-bit RGB, every row unfiltered."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = (b"\x00" + rgb * width) * height
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(pixels))
        + chunk(b"IEND", b"")
    )


def _generate(headers: Headers, body: bytes) -> tuple[Answer, dict[str, Any] | None]:
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        req = None
    if not isinstance(req, dict):
        return error_answer("We could not parse the JSON body of your request."), None
    record = {"path": "/v1/images/generations", "body": req}
    model, prompt = req.get("model"), req.get("prompt")
    if not isinstance(model, str) or not isinstance(prompt, str) or not prompt:
        return error_answer("model and prompt are required", "prompt"), record
    return _draw(headers, model, prompt, req, prompt.encode(), 0, None), record


def _edit(headers: Headers, body: bytes) -> tuple[Answer, dict[str, Any] | None]:
    content_type = headers.get("content-type", "")
    parts = parse_multipart(body, content_type) if content_type.startswith("multipart/form-data") else None
    if parts is None:
        return error_answer("Could not parse multipart form"), None
    fields = {p.name: p.data.decode(errors="replace") for p in parts if p.filename is None}
    images = [p.data for p in parts if p.name in ("image", "image[]") and p.filename is not None]
    mask = next((p.data for p in parts if p.name == "mask" and p.filename is not None), None)
    record = {
        "path": "/v1/images/edits",
        "body": fields,
        "files": [
            {"name": p.name, "filename": p.filename, "content_type": p.content_type, "size": len(p.data)}
            for p in parts
            if p.filename is not None
        ],
    }
    model, prompt = fields.get("model"), fields.get("prompt")
    if model is None or not prompt or not images:
        return error_answer("model, prompt and image are required", "image"), record
    for number, data in enumerate(images, 1):
        if not _is_image(data):
            message = f"Invalid image file or mode for image {number}, please check your image file."
            return error_answer(message, "image"), record
    if mask is not None and not mask.startswith(b"\x89PNG\r\n\x1a\n"):
        return error_answer("Invalid mask image: it must be a PNG file.", "mask"), record
    seed = prompt.encode() + b"".join(hashlib.blake2b(i, digest_size=8).digest() for i in images)
    return _draw(headers, model, prompt, fields, seed, len(images), _png_size(images[0])), record


def _draw(
    headers: Headers,
    model: str,
    prompt: str,
    options: dict[str, Any],
    seed: bytes,
    input_images: int,
    source_size: tuple[int, int] | None,
) -> Answer:
    """The answer for a request already known to be well formed: options are the request's fields
    (JSON values for generations, strings for edits)."""
    try:
        base, d = directives.parse(model, headers.get("x-sim"), prompt)
    except DirectiveError as exc:
        return error_answer(str(exc))
    if d.fail is not None:
        kind = "rate_limit_error" if d.fail == 429 else "server_error"
        return error_answer(f"Simulated failure {d.fail}.", status=d.fail, type_=kind)
    n = _int(options.get("n", 1))
    if n is None or not 1 <= n <= MAX_IMAGES:
        return error_answer(f"n must be an integer from 1 to {MAX_IMAGES}.", "n")
    size = str(options.get("size") or "auto")
    match = _SIZE.match(size)
    if match is None and size != "auto":
        return error_answer(f"Invalid size {size!r}: use auto or WIDTHxHEIGHT.", "size")
    width, height = (int(match[1]), int(match[2])) if match else source_size or (1024, 1024)
    if options.get("output_format", "png") != "png":
        return error_answer("The simulator renders png images only.", "output_format")
    gpt_image = not base.startswith("dall-e")
    if base.startswith("gpt-image") and "response_format" in options:  # as OpenAI refuses it
        return error_answer("Unknown parameter: 'response_format'.", "response_format")
    fmt = options.get("response_format") or ("b64_json" if gpt_image else "url")
    if fmt not in ("url", "b64_json"):
        return error_answer("response_format must be url or b64_json.", "response_format")

    side = (min(width, MAX_SIDE), min(height, MAX_SIDE))
    data = []
    for index in range(n):
        rgb = hashlib.blake2b(seed + index.to_bytes(2), digest_size=3).digest()
        if fmt == "url":
            name = f"{rgb.hex()}-{side[0]}x{side[1]}.png"
            item = {"url": f"http://{headers.get('host', '127.0.0.1')}{FILES_PATH}{name}"}
        else:
            item = {"b64_json": base64.b64encode(png(*side, rgb)).decode()}
        if base == "dall-e-3":
            item["revised_prompt"] = "A simulated picture of: " + prompt
        data.append(item)
    answer: dict[str, Any] = {"created": int(time.time()), "data": data}
    if gpt_image:
        quality = str(options.get("quality") or "medium")
        per_image = math.ceil(OUTPUT_TOKENS.get(quality, OUTPUT_TOKENS["medium"]) * width * height / 1024**2)
        text_tokens, image_tokens = count_tokens(prompt), input_images * INPUT_IMAGE_TOKENS
        answer.update(
            background=options.get("background") or "opaque",
            output_format="png",
            quality=quality,
            size=f"{width}x{height}",
            usage={
                "input_tokens": text_tokens + image_tokens,
                "input_tokens_details": {"text_tokens": text_tokens, "image_tokens": image_tokens},
                "output_tokens": n * per_image,
                "total_tokens": text_tokens + image_tokens + n * per_image,
            },
        )
    return Answer(200, orjson.dumps(answer))


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _is_image(data: bytes) -> bool:
    """PNG, JPEG or WEBP by its magic bytes, as OpenAI's edits accept."""
    return data.startswith((b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")) or (
        data[:4] == b"RIFF" and data[8:12] == b"WEBP"
    )


def _png_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG's header; None for other formats."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n") or len(data) < 24:
        return None
    width, height = struct.unpack(">II", data[16:24])
    return (width, height) if width and height else None
