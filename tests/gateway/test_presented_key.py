"""Which key a request presents (gateway.auth.presented_key), read from the scope's raw header list:
`Authorization: Bearer` first, whatever else comes, else `x-api-key`; the first of each counts, as
Starlette's Headers reads them; another scheme presents nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers
from starlette.requests import Request

from gateway.auth import presented_key


def _request(headers: list[tuple[bytes, bytes]]) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers})


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ([(b"authorization", b"Bearer sk-a")], "sk-a"),
        ([(b"authorization", b"bearer   sk-a  ")], "sk-a"),
        ([(b"x-api-key", b"sk-b")], "sk-b"),
        ([(b"x-api-key", b"sk-b"), (b"authorization", b"Bearer sk-a")], "sk-a"),
        ([(b"authorization", b"Basic dXNlcjpwdw=="), (b"x-api-key", b"sk-b")], None),
        ([(b"authorization", b"Bearer sk-a"), (b"authorization", b"Bearer sk-c")], "sk-a"),
        ([(b"x-api-key", b"sk-b"), (b"x-api-key", b"sk-d")], "sk-b"),
        ([(b"content-type", b"application/json")], None),
        ([(b"authorization", b"Bearer sk-\xe9")], "sk-\xe9"),  # latin-1, as Starlette decodes
    ],
)
def test_the_key_a_request_presents(headers: list[tuple[bytes, bytes]], key: str | None) -> None:
    assert presented_key(_request(headers)) == key


_NAMES = st.sampled_from([b"authorization", b"x-api-key", b"content-type", b"host"])
_VALUES = st.sampled_from([b"Bearer sk-a", b"bearer sk-b", b"sk-c", b"Basic x", b"", b"Bearer", b"sk-\xff"])


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=6))
def test_it_reads_what_starlette_s_headers_read(headers: list[tuple[bytes, bytes]]) -> None:
    # The rule as it was written through Starlette's Headers, before the one-pass read.
    seen = Headers(raw=headers)
    if "authorization" in seen:
        scheme, _, token = seen["authorization"].partition(" ")
        expected = token.strip() if scheme.lower() == "bearer" else None
    else:
        expected = seen.get("x-api-key")
    assert presented_key(_request(headers)) == expected
