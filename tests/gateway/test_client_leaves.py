"""A client that leaves (spec 6.1.9: output generated after the stop is not billed).

The gateway watches the connection while it waits for the model, for plain requests and for streams
before their first token: a client that leaves cancels the request at once (the upstream call with
it), is billed exactly what it was sent (nothing, when nothing was sent) and is logged with status
499. Every text shape, the translated ones included, with a slow and a fast upstream.
"""

from __future__ import annotations

import socket
import sqlite3
import time
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from test_early_end import ALL_SHAPES, Shape, stream, usage_rows

from gateway.core import count_tokens
from harness import Gateway, KeyHandle, eventually, read_json_answer

# How long the model waits before its first token (or its plain answer) in the "slow" cases, and
# when the client gives up.
SLOW_TTFT = "2s"
LEAVE_AFTER = 0.3


def log_rows(g: Gateway, key_id: str, count: int, seconds: float = 5.0) -> list[dict[str, Any]]:
    """The key's request log entries once there are `count`, oldest first."""

    def enough() -> list[dict[str, Any]] | None:
        with sqlite3.connect(g.db_path) as conn:
            conn.row_factory = sqlite3.Row
            rows = [
                dict(r)
                for r in conn.execute(
                    "SELECT id, status, error_code, cost, usage_id, duration_ms FROM request_logs"
                    " WHERE key_id = ? ORDER BY started_at_ms",
                    (key_id,),
                )
            ]
        return rows if len(rows) >= count else None

    return eventually(enough, seconds, what=f"{count} request log entries of {key_id}")


def leave_after(g: Gateway, key: KeyHandle, path: str, body: dict[str, Any], seconds: float) -> None:
    """Send a request over a raw socket and close the connection after `seconds`, having read
    nothing: the client leaves while the gateway waits for the model."""
    url = urlsplit(g.url)
    payload = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80)) as s:
        s.sendall(head + payload)
        time.sleep(seconds)  # the client stays this long, reading nothing, then leaves


def assert_left_unbilled(g: Gateway, key: KeyHandle, before: Decimal) -> None:
    """Logged 499 at once (not when the model answered), nothing charged, no usage record."""
    (row,) = log_rows(g, key.key_id, 1)
    assert row["status"] == 499, row
    assert row["cost"] is None and row["usage_id"] is None
    # Noticed while the model was still thinking: the request ended long before its 2 s wait did.
    assert row["duration_ms"] < 1500, row
    time.sleep(2.5)  # the model would have answered by now: still nothing billed
    assert g.balance(key.account_id) == before
    assert usage_rows(g, key.account_id) == 0
    assert len(log_rows(g, key.key_id, 1)) == 1


@pytest.mark.parametrize("shape", ALL_SHAPES)
def test_stream_left_before_the_first_token_is_not_billed(gw: Gateway, shape: Shape) -> None:
    key = gw.new_key()
    before = gw.balance(key.account_id)
    body = shape.body(f"slow {shape.name} [sim tokens=200 ttft={SLOW_TTFT}]", True)
    leave_after(gw, key, shape.path, body, LEAVE_AFTER)
    assert_left_unbilled(gw, key, before)


@pytest.mark.parametrize("shape", ALL_SHAPES)
def test_plain_request_left_before_the_answer_is_not_billed(gw: Gateway, shape: Shape) -> None:
    key = gw.new_key()
    before = gw.balance(key.account_id)
    body = shape.body(f"slow plain {shape.name} [sim tokens=200 ttft={SLOW_TTFT}]", False)
    leave_after(gw, key, shape.path, body, LEAVE_AFTER)
    assert_left_unbilled(gw, key, before)


@pytest.mark.parametrize("shape", ALL_SHAPES)
def test_stream_left_at_once_from_a_fast_upstream_bills_at_most_what_was_sent(
    gw: Gateway, shape: Shape
) -> None:
    """k = 0: the client reads the answer's head (which comes with the first token) and leaves.
    Billed: nothing, or the prompt and the first token; never the rest of the answer."""
    key = gw.new_key()
    before = gw.balance(key.account_id)
    content = f"fast {shape.name} [sim tokens=200 pace=50ms]"
    with gw.client(key.key) as c, c.stream("POST", shape.path, json=shape.body(content, True)) as r:
        assert r.status_code == 200
    (row,) = log_rows(gw, key.key_id, 1)
    assert row["status"] == 499, row
    time.sleep(1.0)  # a charge, if any, has landed by now (and nothing more will): the balance is final
    if row["usage_id"] is None:
        assert gw.balance(key.account_id) == before
        return
    with gw.client(key.key) as c:
        record = c.get(f"/v1/usage/{row['usage_id']}").json()
    assert record["status"] == "incomplete"
    assert record["usage"]["completion_tokens"] <= 2  # the first chunk, at most one more in flight
    assert gw.balance(key.account_id) == before - gw_decimal(record["cost"])


@pytest.mark.parametrize("shape", ALL_SHAPES)
def test_stream_left_mid_way_is_logged_499_and_billed_what_it_received(gw: Gateway, shape: Shape) -> None:
    key = gw.new_key()
    content = f"midway {shape.name} [sim tokens=200 pace=50ms]"
    got = stream(gw, key, shape, content, read_chunks=3)
    assert got.chunks == 3
    (row,) = log_rows(gw, key.key_id, 1)
    assert row["status"] == 499, row
    with gw.client(key.key) as c:
        deadline = time.monotonic() + 5
        while (r := c.get(f"/v1/usage/{got.rid}")).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.03)
    record = r.json()
    assert record["status"] == "incomplete"
    # What the client read, and at most the chunk in flight when it left: never the other 190.
    received = count_tokens(got.text, "o200k_base")
    assert received <= record["usage"]["completion_tokens"] <= received + 1
    assert row["cost"] is not None and gw_decimal(row["cost"]) == gw_decimal(record["cost"])
    # The log's summary says the usage billed, not the upstream's count as of the stream's start.
    ((body,),) = gw.query("SELECT response_body FROM request_logs WHERE id = ?", row["id"])
    summary = orjson.loads(body)
    assert summary["usage"]["completion_tokens"] == record["usage"]["completion_tokens"]


def gw_decimal(value: Any) -> Decimal:
    return Decimal(str(value))


def test_a_client_that_leaves_mid_body_is_logged_as_answered_and_nothing_more(gw: Gateway) -> None:
    """The server reports it as it reports a malformed chunked body (below), so it is logged with
    the 400 a client still there would read; nothing is charged."""
    key = gw.new_key()
    url = urlsplit(gw.url)
    payload = orjson.dumps({"model": "test/chat", "messages": [{"role": "user", "content": "x" * 100}]})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80)) as s:
        s.sendall(head + payload[:40])
        time.sleep(0.2)  # the gateway is reading the body when the client goes
    (row,) = log_rows(gw, key.key_id, 1)
    assert row["status"] == 400 and row["error_code"] == "invalid_request", row
    assert row["cost"] is None and row["usage_id"] is None


def test_a_malformed_chunked_body_gets_the_spec_error(gw: Gateway) -> None:
    """Granian reports a body whose chunked framing is broken as it reports a client gone mid-body;
    a client still there reads a 400 invalid_request in the spec's format, never a bare status, and
    its log entry says that answer (review: it said 499, with no body, spec 7.5.3)."""
    key = gw.new_key()
    url = urlsplit(gw.url)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key.key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80), timeout=10) as s:
        s.sendall(head + b"zz\r\nnot hex\r\n0\r\n\r\n")
        answer = read_json_answer(s)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    body = orjson.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "invalid_request" and "chunked" in body["error"]["message"]
    (row,) = log_rows(gw, key.key_id, 1)
    assert row["status"] == 400 and row["error_code"] == "invalid_request" and row["cost"] is None


def test_a_client_that_closes_right_after_the_last_event_got_a_whole_stream(gw: Gateway) -> None:
    """A client that reads to `data: [DONE]` and closes at once (httpx breaking out of its loop
    there) left nothing unread: logged 200 and billed as complete, not 499 `incomplete`, though
    the gateway may still be reading the upstream's end (here the simulator waits 300 ms before
    ending its body, as an upstream may; operator review: 20 of 60 were 499)."""
    key = gw.new_key(balance="5")
    url = urlsplit(gw.url)
    payload = orjson.dumps(
        {
            "model": "openai/gpt-4o-mini",
            "stream": True,
            "messages": [{"role": "user", "content": "[sim tokens=10 linger=300ms]"}],
        }
    )
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key.key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    rounds = 5
    for _ in range(rounds):
        with socket.create_connection((url.hostname or "127.0.0.1", url.port or 80)) as s:
            s.sendall(head + payload)
            seen = b""
            while b"data: [DONE]" not in seen:
                got = s.recv(65536)
                assert got, seen
                seen += got
    rows = log_rows(gw, key.key_id, rounds)
    assert [r["status"] for r in rows] == [200] * rounds
    with sqlite3.connect(gw.db_path) as conn:
        statuses = [
            r
            for (r,) in conn.execute(
                "SELECT status FROM usage_records WHERE account_id = ?", (key.account_id,)
            )
        ]
    assert statuses == ["completed"] * rounds
