"""Identifiers. Unguessable (they gate usage lookups together with the key) and cheap to make."""

from __future__ import annotations

import os


def response_id(prefix: str) -> str:
    """The id in a response body (and on every chunk of its stream), e.g. chatcmpl-…"""
    return prefix + os.urandom(15).hex()


def request_id() -> str:
    """The x-service-request-id header value: a different id, for logs and support (spec 7.3)."""
    return "req_" + os.urandom(15).hex()
