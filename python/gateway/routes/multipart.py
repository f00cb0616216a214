"""multipart/form-data: reading a client's upload (`form_parts`), and writing the parts of it that
the gateway sends on."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from ..config import ChannelConfig
from ..core import MultipartPart, parse_multipart
from ..errors import invalid_request
from ..routing import ChannelBody

FORM_TYPE = "multipart/form-data"


def is_form(content_type: str) -> bool:
    """Whether a Content-Type is a form (media types are case-insensitive)."""
    return content_type[: len(FORM_TYPE)].lower() == FORM_TYPE


def form_parts(
    raw: bytes, content_type: str, repeatable: frozenset[str] | None = frozenset()
) -> list[MultipartPart] | None:
    """The parts of a form body; None when it is not a well-formed form. A field given more than
    once is refused (400 naming it) unless it is a list (`name[]`) or among `repeatable` (None:
    any, for a reader that only looks): the gateway holds and bills one copy, and an upstream
    that read another would run another request than the one paid for (evasion review: five HD
    images held and charged as one)."""
    if not is_form(content_type):
        return None
    parts = parse_multipart(raw, content_type)
    if parts is not None and repeatable is not None:
        seen: set[str] = set()
        for part in parts:
            name = part.name
            if name in seen and not name.endswith("[]") and name not in repeatable:
                raise invalid_request(f"`{name}` is given more than once; it takes one value.", name)
            seen.add(name)
    return parts


@dataclass(frozen=True, slots=True)
class FormPart:
    name: str
    data: bytes
    filename: str | None = None  # set for a file, None for a plain field
    content_type: str | None = None


def channel_form(parts: Iterable[FormPart]) -> tuple[ChannelBody, str]:
    """The form as whichever channel the request goes to receives it (gateway.routing): its
    `model` part names that channel's upstream model. Returns the body for a channel and the
    Content-Type, the same for every channel (one fresh random boundary)."""
    kept = list(parts)
    boundary = "gateway" + os.urandom(12).hex()
    encoded: dict[str, bytes] = {}

    def for_channel(channel: ChannelConfig) -> bytes:
        name = channel.upstream_model
        if name not in encoded:
            named = (FormPart("model", name.encode()) if p.name == "model" else p for p in kept)
            encoded[name] = _encode(named, boundary)
        return encoded[name]

    return for_channel, f"multipart/form-data; boundary={boundary}"


def _encode(parts: Iterable[FormPart], boundary: str) -> bytes:
    out = bytearray()
    for part in parts:
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{_quote(part.name)}"'.encode()
        if part.filename is not None:
            out += f'; filename="{_quote(part.filename)}"'.encode()
        out += b"\r\n"
        if part.content_type:
            out += f"Content-Type: {part.content_type}\r\n".encode()
        out += b"\r\n" + part.data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out)


def _quote(value: str) -> str:
    # As browsers do (WHATWG): a quote, CR and LF in a field name or filename are percent-encoded.
    return value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
