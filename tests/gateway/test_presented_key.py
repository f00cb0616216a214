"""Which key a request presents (gateway.auth.presented_key), read from the scope's raw header list:
`Authorization: Bearer` first, whatever else comes, else `x-api-key`; another scheme presents
nothing; either header twice is 400 (a proxy in front that read the other copy would authorise
another key than the gateway bills)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.datastructures import Headers
from starlette.requests import Request

from gateway.auth import presented_key
from gateway.errors import GatewayError


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
        ([(b"content-type", b"application/json")], None),
        ([(b"authorization", b"Bearer sk-\xe9")], "sk-\xe9"),  # latin-1, as Starlette decodes
    ],
)
def test_the_key_a_request_presents(headers: list[tuple[bytes, bytes]], key: str | None) -> None:
    assert presented_key(_request(headers)) == key


@pytest.mark.parametrize("name", [b"authorization", b"x-api-key"])
def test_a_key_header_twice_is_refused(name: bytes) -> None:
    with pytest.raises(GatewayError) as refused:
        presented_key(_request([(name, b"Bearer sk-a"), (b"host", b"x"), (name, b"Bearer sk-c")]))
    assert refused.value.status == 400 and refused.value.code == "invalid_request"


_NAMES = st.sampled_from([b"authorization", b"x-api-key", b"content-type", b"host"])
_VALUES = st.sampled_from([b"Bearer sk-a", b"bearer sk-b", b"sk-c", b"Basic x", b"", b"Bearer", b"sk-\xff"])


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=6))
def test_it_reads_what_starlette_s_headers_read(headers: list[tuple[bytes, bytes]]) -> None:
    # The rule as it was written through Starlette's Headers, before the one-pass read.
    seen = Headers(raw=headers)
    if any(len(seen.getlist(name)) > 1 for name in ("authorization", "x-api-key", "host")):
        with pytest.raises(GatewayError):
            presented_key(_request(headers))
        return
    if "authorization" in seen:
        scheme, _, token = seen["authorization"].partition(" ")
        expected = token.strip() if scheme.lower() == "bearer" else None
    else:
        expected = seen.get("x-api-key")
    assert presented_key(_request(headers)) == expected
