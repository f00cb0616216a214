"""An upstream's HTTP/1.x answer head through the Rust parser (parse_response_head, which the
gateway's upstream client reads every answer with): heads written from RFC 9112's grammar come back
exactly, every prefix of one is incomplete, and any bytes at all give an answer or InvalidHttpError,
never anything else."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core import InvalidHttpError, parse_response_head

TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Field content: visible ASCII, inner spaces and tabs, and obs-text (Latin-1's upper half).
VALUE_CHAR = st.sampled_from(
    [chr(c) for c in range(0x21, 0x7F)] + [" ", "\t"] + [chr(c) for c in range(0x80, 0x100)]
)
names = st.text(TCHAR, min_size=1, max_size=20)
values = st.text(VALUE_CHAR, max_size=40).map(lambda v: v.strip(" \t"))
blanks = st.text(" \t", max_size=3)
headers = st.lists(st.tuples(names, values, blanks, blanks), max_size=30)


def head(
    http11: bool, status: int, reason: str, fields: list[tuple[str, str, str, str]], newline: str
) -> bytes:
    lines = [f"HTTP/1.{int(http11)} {status} {reason}"]
    lines += [f"{name}:{before}{value}{after}" for name, value, before, after in fields]
    return (newline.join(lines) + newline + newline).encode("latin-1")


@settings(max_examples=300, deadline=None)
@given(
    http11=st.booleans(),
    status=st.integers(100, 599),
    reason=st.text(st.sampled_from(TCHAR + " "), max_size=20),
    fields=headers,
    newline=st.sampled_from(["\r\n", "\n"]),
    body=st.binary(max_size=50),
)
def test_a_head_comes_back_exactly_and_its_prefixes_are_incomplete(
    http11: bool,
    status: int,
    reason: str,
    fields: list[tuple[str, str, str, str]],
    newline: str,
    body: bytes,
) -> None:
    raw = head(http11, status, reason, fields, newline)
    assert parse_response_head(raw + body) == (
        http11,
        status,
        [(name, value) for name, value, _, _ in fields],
        len(raw),
    )
    for end in range(len(raw)):
        assert parse_response_head(raw[:end]) is None


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_an_answer_head_a_part_of_one_or_refused(data: bytes) -> None:
    try:
        parsed = parse_response_head(data)
    except InvalidHttpError:
        return
    if parsed is not None:
        assert 0 < parsed[3] <= len(data)


@settings(max_examples=200, deadline=None)
@given(status=st.integers(200, 599), fields=st.lists(st.tuples(names, values), max_size=20))
def test_what_h11_writes_it_reads_as_h11_does(status: int, fields: list[tuple[str, str]]) -> None:
    # h11 (httpx's HTTP/1.1 implementation) as an independent writer and reader of the same head.
    fields = [
        (name, value) for name, value in fields if name.lower() not in ("content-length", "transfer-encoding")
    ]
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.next_event()
    raw = conn.send(
        h11.Response(
            status_code=status, headers=[(n.encode(), v.encode("latin-1")) for n, v in fields], reason=b"R"
        )
    )
    assert raw is not None
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.receive_data(raw)
    theirs = client.next_event()
    assert isinstance(theirs, h11.Response)
    parsed = parse_response_head(raw)
    assert parsed is not None
    ours = [(name.encode(), value.encode("latin-1")) for name, value in parsed[2]]
    assert (parsed[0], parsed[1], ours) == (True, theirs.status_code, list(theirs.headers.raw_items()))


@pytest.mark.parametrize(
    "raw",
    [
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 two hundred\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(257)) + b"\r\n",
    ],
)
def test_what_is_not_an_answer_head_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidHttpError):
        parse_response_head(raw)
