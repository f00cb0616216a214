"""Writing a multipart/form-data body: the parts of a client's upload that the gateway sends on."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FormPart:
    name: str
    data: bytes
    filename: str | None = None  # set for a file, None for a plain field
    content_type: str | None = None


def encode_form(parts: Iterable[FormPart]) -> tuple[bytes, str]:
    """The body and its Content-Type header (with a fresh random boundary)."""
    boundary = "gateway" + os.urandom(12).hex()
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
    return bytes(out), f"multipart/form-data; boundary={boundary}"


def _quote(value: str) -> str:
    # As browsers do (WHATWG): a quote, CR and LF in a field name or filename are percent-encoded.
    return value.replace('"', "%22").replace("\r", "%0D").replace("\n", "%0A")
