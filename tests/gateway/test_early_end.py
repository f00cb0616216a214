"""Billing of a stream that ends early (spec 6.1.9), for the chat, messages and responses shapes.

A stream cut short (upstream connection broken, upstream error chunk, client gone, upstream silent
past the idle window) is billed for the full prompt plus the output streamed up to that point; the
usage record says status "incomplete"; the balance loses exactly the record's cost. A stream that
ends before any output is an ordinary JSON error (6.1.7) and is not billed at all. Reasoning streamed
before the answer counts as output. The billed cases also run on the translated streams (the chat
endpoint on the message-style model, the messages endpoint on a chat model).

"The full prompt" is what the complete request of the same prompt is billed for: the simulator's
directives (drop_after, error_after, stall_after) only act on streams, so the same body without
stream=true is that complete request. "The output streamed" is counted exactly: the o200k_base
tokens (the models' tokenizer) of the text every content event the client received carries, and
the simulator's words being one token each, that is also the number of chunks it sent.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import orjson
import pytest

from gateway.config import Prices
from gateway.core import count_tokens
from gateway.pricing import Usage, cost
from harness import Gateway, KeyHandle, chat_model, gateway

# The prices harness.chat_model gives every model (no reasoning price of its own: the output price).
PRICES = Prices(
    input=Decimal("2.50"), cached_input=Decimal("1.25"), output=Decimal(10), reasoning=Decimal(10)
)
# How long a stream that failed before any output is watched for a charge that must not come.
NO_CHARGE_WAIT = 1.0
# The short gateway's stream idle window (spec 6.1.8 says 120 s; settings make it short).
IDLE_SECONDS = 0.5
# The gap the simulator leaves between chunks of a stream it will cut (see the drop test).
DROP_PACE = "30ms"


# ---------------------------------------------------------------- the three shapes


def _chat_output(data: dict[str, Any]) -> str:
    out = ""
    for choice in data.get("choices") or []:
        delta = choice.get("delta") or {}
        out += (delta.get("reasoning_content") or "") + (delta.get("content") or "")
    return out


def _messages_output(data: dict[str, Any]) -> str:
    if data.get("type") != "content_block_delta":
        return ""
    delta = data["delta"]
    return str(delta.get("thinking") or delta.get("text") or delta.get("partial_json") or "")


def _responses_output(data: dict[str, Any]) -> str:
    kind = str(data.get("type", ""))
    if kind.endswith(".delta") and isinstance(data.get("delta"), str):
        return str(data["delta"])
    return ""


@dataclass(frozen=True)
class Shape:
    name: str
    path: str
    model: str
    body: Callable[[str, bool], dict[str, Any]]
    output: Callable[[dict[str, Any]], str]  # the output text one streamed event carries
    prompt_field: str  # where a complete answer's body reports its prompt tokens


CHAT = Shape(
    "chat",
    "/v1/chat/completions",
    "openai/gpt-4o-mini",
    lambda content, stream: {
        "model": "openai/gpt-4o-mini",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
    },
    _chat_output,
    "prompt_tokens",
)
MESSAGES = Shape(
    "messages",
    "/v1/messages",
    "anthropic/claude-sonnet-4-5",
    lambda content, stream: {
        "model": "anthropic/claude-sonnet-4-5",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
    },
    _messages_output,
    "input_tokens",
)
RESPONSES = Shape(
    "responses",
    "/v1/responses",
    "openai/gpt-4.1-mini",
    lambda content, stream: {"model": "openai/gpt-4.1-mini", "input": content, "stream": stream},
    _responses_output,
    "input_tokens",
)
# Each shape's endpoint on a model of the other family: the gateway translates the stream.
CHAT_TO_MESSAGES = Shape(
    "chat-on-claude",
    CHAT.path,
    MESSAGES.model,
    lambda content, stream: {**CHAT.body(content, stream), "model": MESSAGES.model},
    _chat_output,
    "prompt_tokens",
)
MESSAGES_TO_CHAT = Shape(
    "messages-on-gpt",
    MESSAGES.path,
    CHAT.model,
    lambda content, stream: {**MESSAGES.body(content, stream), "model": CHAT.model},
    _messages_output,
    "input_tokens",
)
# The responses shape on a messages model: translated twice (message events, chat, responses).
RESPONSES_TO_MESSAGES = Shape(
    "responses-on-claude",
    RESPONSES.path,
    MESSAGES.model,
    lambda content, stream: {**RESPONSES.body(content, stream), "model": MESSAGES.model},
    _responses_output,
    "input_tokens",
)
SHAPES = [pytest.param(s, id=s.name) for s in (CHAT, MESSAGES, RESPONSES)]
# The billed cases run on the translated streams too; the slower unbilled and stall cases do not.
ALL_SHAPES = [
    *SHAPES,
    *(pytest.param(s, id=s.name) for s in (CHAT_TO_MESSAGES, MESSAGES_TO_CHAT, RESPONSES_TO_MESSAGES)),
]


# ---------------------------------------------------------------- streaming and looking up


@dataclass
class Streamed:
    """What the client got from one streamed request."""

    status: int
    content_type: str
    events: list[tuple[str | None, dict[str, Any] | str]] = field(default_factory=list)
    text: str = ""  # the output text of every content event received, concatenated
    chunks: int = 0  # content events received (events carrying output text)
    json: dict[str, Any] | None = None  # the body, when the answer was not a stream

    @property
    def rid(self) -> str:
        """The id every chunk carries (spec 6.1.6), which is also the usage record's id."""
        ids = {data["id"] for _, data in self.events if isinstance(data, dict) and "id" in data}
        assert len(ids) == 1, ids
        return str(ids.pop())

    @property
    def final_error(self) -> dict[str, Any] | None:
        """The error object of the final chunk, if the stream ended with one (spec 6.1.7)."""
        if not self.events:
            return None
        _, data = self.events[-1]
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return dict(data["error"])
        return None


def stream(
    g: Gateway, key: KeyHandle, shape: Shape, content: str, read_chunks: int | None = None
) -> Streamed:
    """POST a streamed request and read it to its end, or, with `read_chunks`, only until that many
    content events arrived, then close the connection (the client disconnects)."""
    with g.client(key.key) as c, c.stream("POST", shape.path, json=shape.body(content, True)) as r:
        got = Streamed(r.status_code, r.headers.get("content-type", ""))
        if not got.content_type.startswith("text/event-stream"):
            r.read()
            got.json = r.json()
            return got
        name: str | None = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                raw = line[len("data: ") :]
                data: dict[str, Any] | str = raw if raw == "[DONE]" else orjson.loads(raw)
                got.events.append((name, data))
                name = None
                piece = shape.output(data) if isinstance(data, dict) else ""
                if piece:
                    got.text += piece
                    got.chunks += 1
                    if read_chunks is not None and got.chunks >= read_chunks:
                        break  # leaving the `with` closes the connection mid-stream
    return got


def complete_prompt_tokens(g: Gateway, shape: Shape, content: str) -> int:
    """The prompt tokens the complete (non-streamed) request of `content` is billed for, from its usage
    record, on an account of its own."""
    probe = g.new_key()
    with g.client(probe.key) as c:
        r = c.post(shape.path, json=shape.body(content, False))
    assert r.status_code == 200, r.text
    record = g.usage_record(probe.key, r.json()["id"])
    assert record["status"] == "completed"
    assert record["usage"]["prompt_tokens"] == r.json()["usage"][shape.prompt_field]
    return int(record["usage"]["prompt_tokens"])


def usage_rows(g: Gateway, account_id: str) -> int:
    with sqlite3.connect(g.db_path) as conn:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM usage_records WHERE account_id = ?", (account_id,)
        ).fetchone()
    return int(count)


# ---------------------------------------------------------------- a gateway with a short idle window


@pytest.fixture(scope="module")
def quick(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose stream idle window is short (as test_timeouts.py does), with the three shapes."""
    models = (
        chat_model(CHAT.model, "gpt-4o-mini", sim_url)
        + chat_model(MESSAGES.model, "claude-sonnet-4-5", sim_url, type_="messages", provider="anthropic")
        + chat_model(RESPONSES.model, "gpt-4.1-mini", sim_url, type_="responses")
    )
    limits = f"stream_idle_timeout_seconds = {IDLE_SECONDS}"
    with gateway(tmp_path_factory.mktemp("early-end"), models, limits) as g:
        yield g


# ---------------------------------------------------------------- the two rules


def assert_ends_with_error(got: Streamed, shape: Shape, code: str) -> None:
    """Spec 6.1.7: a stream that failed after it started ends with a final chunk carrying the error
    object (an `error` event in the shapes whose events are named), and without [DONE]."""
    assert got.status == 200
    error = got.final_error
    assert error is not None and error["code"] == code, got.events[-1:]
    if shape.path != CHAT.path:
        assert got.events[-1][0] == "error"
    assert all(data != "[DONE]" for _, data in got.events)
    # Every chunk carries the stream's id, the last one too (spec 6.1.6).
    last = got.events[-1][1]
    assert isinstance(last, dict) and last["id"] == got.rid, last


def assert_billed_as_streamed(
    g: Gateway, key: KeyHandle, before: Decimal, shape: Shape, content: str, got: Streamed
) -> dict[str, Any]:
    """Spec 6.1.9 for a stream that produced output: the full prompt plus exactly what was streamed,
    status incomplete, and the balance loses exactly the record's cost."""
    assert got.chunks > 0 and got.text
    record = g.usage_record(key.key, got.rid)
    assert record["id"] == got.rid
    assert record["model"] == shape.model
    assert record["status"] == "incomplete"
    usage = record["usage"]
    assert usage["prompt_tokens"] == complete_prompt_tokens(g, shape, content)
    assert usage["completion_tokens"] == count_tokens(got.text, "o200k_base")
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    charged = Decimal(str(record["cost"]))
    assert charged == cost(PRICES, Usage(usage["prompt_tokens"], usage["completion_tokens"]))
    assert charged > 0
    assert g.wait_balance(key.account_id, before - charged) == before - charged
    assert usage_rows(g, key.account_id) == 1
    return record


# ---------------------------------------------------------------- upstream breaks the connection


@pytest.mark.parametrize("shape", ALL_SHAPES)
@pytest.mark.parametrize("k", [1, 5])
def test_upstream_drop_after_k_bills_prompt_and_streamed_output(
    gw: Gateway, key: KeyHandle, shape: Shape, k: int
) -> None:
    # Paced: the simulator drops by a reset, and a reset arriving with events still unread in the
    # gateway's socket buffer would discard them (TCP), making the count of streamed chunks vary.
    content = f"drop {shape.name} [sim tokens=12 drop_after={k} pace={DROP_PACE}]"
    before = gw.balance(key.account_id)
    got = stream(gw, key, shape, content)
    assert got.status == 200
    assert got.chunks == k
    assert_ends_with_error(got, shape, "provider_error")
    assert_billed_as_streamed(gw, key, before, shape, content, got)


# ---------------------------------------------------------------- upstream sends an error chunk


@pytest.mark.parametrize("shape", ALL_SHAPES)
def test_upstream_error_after_k_bills_prompt_and_streamed_output(
    gw: Gateway, key: KeyHandle, shape: Shape
) -> None:
    content = f"error {shape.name} [sim tokens=12 error_after=3]"
    before = gw.balance(key.account_id)
    got = stream(gw, key, shape, content)
    assert got.status == 200
    assert got.chunks == 3
    assert_ends_with_error(got, shape, "provider_error")
    assert_billed_as_streamed(gw, key, before, shape, content, got)


# ---------------------------------------------------------------- the client disconnects


@pytest.mark.parametrize("shape", ALL_SHAPES)
@pytest.mark.parametrize("k", [1, 4])
def test_client_disconnect_after_k_bills_only_what_it_received(
    gw: Gateway, key: KeyHandle, shape: Shape, k: int
) -> None:
    # Paced, so the next chunk is still being generated when the client leaves: it must not be billed.
    content = f"leave {shape.name} [sim tokens=40 pace=100ms]"
    before = gw.balance(key.account_id)
    got = stream(gw, key, shape, content, read_chunks=k)
    assert got.status == 200
    assert got.chunks == k
    assert got.final_error is None
    record = assert_billed_as_streamed(gw, key, before, shape, content, got)
    assert record["usage"]["completion_tokens"] == k  # one simulator word is one token


# ---------------------------------------------------------------- reasoning counts as output


@pytest.mark.parametrize("shape", ALL_SHAPES)
def test_reasoning_streamed_before_the_answer_is_billed(gw: Gateway, key: KeyHandle, shape: Shape) -> None:
    # Five words of reasoning come first; the upstream breaks after three of them, before any answer.
    content = f"think {shape.name} [sim tokens=8 reasoning=5 drop_after=3 pace={DROP_PACE}]"
    before = gw.balance(key.account_id)
    got = stream(gw, key, shape, content)
    assert got.status == 200
    assert got.chunks == 3
    if shape.path == CHAT.path:  # the chunks were reasoning, not answer text
        deltas = [d["choices"][0]["delta"] for _, d in got.events if isinstance(d, dict) and d.get("choices")]
        assert not any(d.get("content") for d in deltas)
        assert sum(1 for d in deltas if d.get("reasoning_content")) == 3
    record = assert_billed_as_streamed(gw, key, before, shape, content, got)
    assert record["usage"]["completion_tokens"] > 0


# ---------------------------------------------------------------- the upstream stalls (short window)


@pytest.mark.parametrize("shape", SHAPES)
def test_stall_after_k_times_out_and_bills_streamed_output(quick: Gateway, shape: Shape) -> None:
    key = quick.new_key()
    content = f"stall {shape.name} [sim tokens=12 stall_after=3]"
    before = quick.balance(key.account_id)
    got = stream(quick, key, shape, content)
    assert got.status == 200
    assert got.chunks == 3
    assert_ends_with_error(got, shape, "timeout")
    assert_billed_as_streamed(quick, key, before, shape, content, got)


# ---------------------------------------------------------------- k = 0: failed before any output


@pytest.mark.parametrize("shape", SHAPES)
def test_failure_before_any_output_is_json_error_and_free(quick: Gateway, shape: Shape) -> None:
    """Spec 6.1.7 and 6.1.9 at k = 0, for each way a stream can end: a plain JSON error with the code's
    status, and nothing charged or recorded. On the short-window gateway (for the stall), and all the
    ways before one wait for a charge that must not come."""
    ways = [
        ("drop_after=0", 502, "provider_error"),
        ("error_after=0", 502, "provider_error"),
        # The provider at capacity, said inside the stream: as its 429 (other channels, cool-down).
        ("error_after=0 overloaded", 429, "provider_overloaded"),
        ("stall_after=0", 408, "timeout"),
    ]
    watched: list[tuple[str, KeyHandle, Decimal]] = []
    for directive, status, code in ways:
        key = quick.new_key()
        before = quick.balance(key.account_id)
        got = stream(quick, key, shape, f"{shape.name} at zero [sim tokens=12 {directive}]")
        assert got.status == status, (directive, got)
        assert got.content_type.startswith("application/json"), directive
        assert got.json is not None and got.json["error"]["code"] == code, (directive, got.json)
        assert not got.events
        watched.append((directive, key, before))
    time.sleep(NO_CHARGE_WAIT)
    for directive, key, before in watched:
        assert quick.balance(key.account_id) == before, directive
        assert usage_rows(quick, key.account_id) == 0, directive


# ---------------------------------------------------------------- reasoning at the price a whole stream pays

DEAR_THINKING = replace(PRICES, reasoning=Decimal(100))


@pytest.fixture(scope="module")
def dear(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose models price reasoning apart, ten times their output."""

    def priced(toml: str) -> str:
        return toml.replace('output = "10.00"\n', 'output = "10.00"\nreasoning = "100.00"\n')

    models = priced(chat_model(CHAT.model, "gpt-4o-mini", sim_url)) + priced(
        chat_model(MESSAGES.model, "claude-sonnet-4-5", sim_url, type_="messages", provider="anthropic")
    )
    with gateway(tmp_path_factory.mktemp("dear-thinking"), models) as g:
        yield g


@pytest.mark.parametrize(
    ("shape", "apart"), [(CHAT, True), (MESSAGES, False), (CHAT_TO_MESSAGES, False), (MESSAGES_TO_CHAT, True)]
)
def test_streamed_reasoning_is_priced_as_the_whole_stream_prices_it(
    dear: Gateway, shape: Shape, apart: bool
) -> None:
    """OpenAI's usage counts reasoning apart: at the reasoning price, whole or cut. Anthropic's
    counts thinking within its output tokens, so a whole Claude stream pays output prices for it,
    and its thinking cut short does too (review: at the reasoning price, three thinking tokens cost
    more than the whole answer)."""
    key = dear.new_key()
    whole = stream(dear, key, shape, f"whole {shape.name} [sim tokens=8 reasoning=5]")
    cut = stream(
        dear, key, shape, f"cut {shape.name} [sim tokens=8 reasoning=5 drop_after=3 pace={DROP_PACE}]"
    )
    charged = []
    for got in (whole, cut):
        record = dear.usage_record(key.key, got.rid)
        usage = record["usage"]
        reasoning = min(5, usage["completion_tokens"]) if apart else 0  # the first five are thinking
        priced = cost(
            DEAR_THINKING,
            Usage(usage["prompt_tokens"], usage["completion_tokens"], reasoning_tokens=reasoning),
        )
        assert Decimal(str(record["cost"])) == priced, (got.rid, usage)
        charged.append(priced)
    assert charged[1] < charged[0]  # three tokens of the stream cost less than all of it
