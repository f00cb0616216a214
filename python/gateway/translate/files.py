"""A file given as data in a text request (a chat `file` part's or an `input_file`'s `file_data`):
a data: URL, base64 or percent-encoded, or bare base64 (which the chat shape means as a PDF). Read
once here for the translations, which say it in another shape's terms."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_to_bytes

PDF_TYPE: Final = "application/pdf"
# Files that are text under another media type than text/*: read as their text by a model that
# takes text documents only (a CSV, Markdown or JSON file is the model's to read as text).
TEXT_APPLICATION_TYPES: Final = frozenset(
    {"application/json", "application/xml", "application/yaml", "application/x-yaml"}
)


@dataclass(frozen=True, slots=True)
class FileData:
    media_type: str  # lower case; a PDF's for bare base64
    encoded: str  # the bytes as base64 (as given, when they came so)
    raw: bytes
    charset: str | None  # a text's, when its data: URL names one

    @property
    def is_text(self) -> bool:
        """Whether the file is text by its media type (text/plain, text/csv, application/json...)."""
        return self.media_type.startswith("text/") or self.media_type in TEXT_APPLICATION_TYPES

    def text(self) -> str | None:
        """The bytes as text, in the charset named (UTF-8 by default); None when they are not."""
        try:
            return self.raw.decode(self.charset or "utf-8")
        except (LookupError, UnicodeDecodeError):
            return None


def read_file_data(given: str) -> FileData | None:
    """The file `given` holds; None when it is empty, or not a data: URL or base64 of anything."""
    if not given.startswith("data:"):
        encoded = "".join(given.split())  # whitespace allowed, as MIME wraps base64
        raw = _decoded(encoded)
        return None if not raw else FileData(PDF_TYPE, encoded, raw, None)
    header, comma, data = given[5:].partition(",")
    media_type, *options = (part.strip() for part in header.split(";"))
    charset = next((o.split("=", 1)[1].strip('"') for o in options if o.lower().startswith("charset=")), None)
    if "base64" in (o.lower() for o in options):
        encoded = "".join(data.split())
        raw = _decoded(encoded)
    else:
        raw = unquote_to_bytes(data)
        encoded = base64.b64encode(raw).decode()
    if not comma or not raw:
        return None
    return FileData(media_type.lower() or "text/plain", encoded, raw, charset)


def _decoded(data: str) -> bytes:
    """Base64 decoded; empty when it is not base64."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return b""
