"""The images the gateway serves itself: each generated image is a URL, valid for a limited time
(spec 2.4, 8; 24 hours by default, `limits.image_url_ttl_seconds`).

The bytes are kept in the store, so any gateway instance sharing it serves any image. A URL is
`<base>/v1/images/files/<token>`, the token 32 random bytes: like OpenAI's own image URLs, it is the
capability and needs no API key, so the URL can be handed to a browser or another program as is.
"""

from __future__ import annotations

import secrets

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..clock import now_ms
from ..errors import GatewayError
from ..state import GatewayState
from ..store import StoredImage
from .common import public_base

FILES_PATH = "/v1/images/files/"
TOKEN_BYTES = 32
# Served images never run as a page of the gateway's origin (an SVG may carry scripts).
_SAFE_HEADERS = {
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'none'; sandbox",
}


def media_type(data: bytes) -> str | None:
    """The image format by its magic bytes: PNG, JPEG, WEBP or GIF; None for anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    return None


def dimensions(data: bytes) -> tuple[int, int] | None:
    """An image's width and height from its header (PNG, JPEG, WEBP), without decoding it; None
    when the header does not say (or is not one of those)."""
    kind = media_type(data)
    if kind == "image/png" and len(data) >= 24 and data[12:16] == b"IHDR":
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if kind == "image/jpeg":
        return _jpeg_dimensions(data)
    if kind == "image/webp" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8X":
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
        if chunk == b"VP8L" and data[20] == 0x2F:
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
            return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(
                data[28:30], "little"
            ) & 0x3FFF
    return None


# JPEG's start-of-frame markers (the frame header holds the size): C0-CF but DHT, JPG and DAC.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_dimensions(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _SOF:
            return int.from_bytes(data[at + 7 : at + 9], "big"), int.from_bytes(data[at + 5 : at + 7], "big")
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return None


async def keep(
    state: GatewayState, request: Request, key_id: str, images: list[tuple[bytes, str]]
) -> list[str]:
    """Store each (bytes, content type) and return its URL, in order. Every image is committed
    before this returns: a URL handed out is always served."""
    expires_at_ms = now_ms() + round(state.settings.image_url_ttl_seconds * 1000)
    stored = [
        StoredImage(secrets.token_urlsafe(TOKEN_BYTES), data, content_type, expires_at_ms, key_id)
        for data, content_type in images
    ]
    await state.store.put_images(stored)
    base = public_base(state, request)
    return [base + FILES_PATH + image.token for image in stored]


def routes(state: GatewayState) -> list[Route]:
    async def image_file(request: Request) -> Response:
        image = await state.store.get_image(request.path_params["token"])
        now = now_ms()
        if image is None or image.expires_at_ms <= now:
            if image is not None:
                await state.store.purge_images(now)
            raise GatewayError("not_found", "No such image: the URL is wrong or has expired.")
        headers = {
            "cache-control": f"private, max-age={(image.expires_at_ms - now) // 1000}",
            **_SAFE_HEADERS,
        }
        return Response(image.data, media_type=image.content_type, headers=headers)

    return [Route(FILES_PATH + "{token}", image_file, methods=["GET"])]
