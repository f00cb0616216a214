"""Refusals that tell the truth (docs/behaviour.md, "Holds" and "Rate limits"), through the gateway
and the simulator with the official clients.

A 429 is sent only when waiting can help: a request that can never fit its key's tokens-per-minute
limit is 400 invalid_request naming the largest output limit that fits, and one that sets no output
limit reserves what the limit leaves, so it runs. A request the balance or the key's credit limit
cannot cover says the most it could cost and, for a text request, the largest output limit the money
covers (`param`), exactly: that value runs, one more does not.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal

import anthropic
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from harness import Gateway, eventually

MODEL = "openai/gpt-4o-mini"  # $2.50 in, $10.00 out per million tokens in the test gateway
MESSAGES_MODEL = "anthropic/claude-sonnet-4-5"
RESPONSES_MODEL = "openai/gpt-4.1-mini"
SMALL: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hi"}]


@pytest.fixture
def gw(backend_gw: Gateway) -> Gateway:
    """These tests run on both store backends (tests/conftest.py)."""
    return backend_gw


def client(gw: Gateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.openai_base, api_key=key, max_retries=0)


def largest(message: str, param: str) -> int:
    found = re.search(rf"{param} (?:to at most|up to) (\d+)", message)
    assert found, message
    return int(found.group(1))


# ------------------------------------------------------------------ tokens per minute


def test_a_small_request_without_max_tokens_runs_under_a_tokens_limit(gw: Gateway) -> None:
    """tpm_limit = 10000: a chat request without max_tokens (the model's longest answer is 16384
    tokens) used to get 429 forever; it reserves a bounded default output and runs, again and again."""
    handle = gw.new_key(tpm_limit=10_000)
    with client(gw, handle.key) as c:
        for _ in range(3):
            raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=SMALL)
            assert raw.http_response.status_code == 200
            assert int(raw.headers["x-ratelimit-remaining-tokens"]) > 9_000  # corrected to what it used


def test_a_max_tokens_that_can_never_fit_is_400_naming_the_largest_that_fits(gw: Gateway) -> None:
    handle = gw.new_key(tpm_limit=10_000)
    with client(gw, handle.key) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            c.chat.completions.create(model=MODEL, messages=SMALL, max_tokens=12_000)
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["code"] == "invalid_request" and error["param"] == "max_tokens"
        fits = largest(error["message"], "max_tokens")
        # Exactly: one more never fits, the value named runs (the bucket is full).
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model=MODEL, messages=SMALL, max_tokens=fits + 1)
        ok = c.chat.completions.with_raw_response.create(model=MODEL, messages=SMALL, max_tokens=fits)
        assert ok.http_response.status_code == 200
        # The parameter the request used is the one named.
        with pytest.raises(openai.BadRequestError) as caught:
            c.chat.completions.create(model=MODEL, messages=SMALL, max_completion_tokens=12_000)
        assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "max_completion_tokens"


def test_never_fitting_on_the_other_text_shapes(gw: Gateway) -> None:
    handle = gw.new_key(tpm_limit=10_000)
    with client(gw, handle.key) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            c.responses.create(model=RESPONSES_MODEL, input="Say hi", max_output_tokens=12_000)
        assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "max_output_tokens"
        # A prompt that alone is more than the limit names where the prompt is.
        with pytest.raises(openai.BadRequestError) as caught:
            c.responses.create(model=RESPONSES_MODEL, input="hello " * 12_000)
        assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "input"
        with pytest.raises(openai.BadRequestError) as caught:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello " * 12_000}])
        assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "messages"
    with anthropic.Anthropic(base_url=gw.url, api_key=handle.key, max_retries=0) as a:
        with pytest.raises(anthropic.BadRequestError) as refused:
            a.messages.create(
                model=MESSAGES_MODEL, max_tokens=12_000, messages=[{"role": "user", "content": "Say hi"}]
            )
        body = refused.value.body
        assert isinstance(body, dict)
        assert body["error"]["code"] == "invalid_request" and body["error"]["param"] == "max_tokens"


def test_429_only_while_waiting_helps(gw: Gateway) -> None:
    """Two requests that each fit the limit but not together: the second waits for the first (429
    with Retry-After), then runs once the first's reservation has been corrected."""
    handle = gw.new_key(tpm_limit=10_000)
    slow: list[ChatCompletionMessageParam] = [{"role": "user", "content": "wait [sim ttft=3s]"}]
    done = threading.Event()

    def first() -> None:
        with client(gw, handle.key) as c:
            c.chat.completions.create(model=MODEL, messages=slow, max_tokens=7_000)
        done.set()

    def remaining_tokens() -> int:
        """The key's tokens left this minute, from a request that takes none (GET /v1/models)."""
        with gw.client(handle.key) as c:
            return int(c.get("/v1/models").headers["x-ratelimit-remaining-tokens"])

    runner = threading.Thread(target=first)
    runner.start()
    try:
        # The first has reserved its 7000 tokens and waits for its answer.
        eventually(lambda: remaining_tokens() < 7_000, what="the first request's tokens reserved")
        with client(gw, handle.key) as c:
            with pytest.raises(openai.RateLimitError) as caught:
                c.chat.completions.create(model=MODEL, messages=SMALL, max_tokens=7_000)
            assert int(caught.value.response.headers["retry-after"]) >= 1
            assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "rate_limited"
            assert done.wait(15)
            ok = c.chat.completions.with_raw_response.create(model=MODEL, messages=SMALL, max_tokens=7_000)
            assert ok.http_response.status_code == 200
    finally:
        runner.join()


# ------------------------------------------------------------------ money


def test_insufficient_credits_says_what_fits(gw: Gateway) -> None:
    """$0.15 and a request without max_tokens (it holds the model's 16384-token answer, $0.1639):
    the refusal says the most it could cost and the largest max_tokens $0.15 covers, exactly."""
    handle = gw.new_key(balance="0.15")
    with client(gw, handle.key) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            c.chat.completions.create(model=MODEL, messages=SMALL)
        error = caught.value.body
        assert isinstance(error, dict) and error["code"] == "insufficient_credits"
        assert error["param"] == "max_tokens"
        # Its prompt and 16384 tokens at $10 a million, to 4 significant figures.
        assert "may cost up to $0.1639" in error["message"] and "$0.15 available" in error["message"]
        fits = largest(error["message"], "max_tokens")
        # About ($0.15 - the prompt) at $10 a million; exactly: the largest whose hold (rounded to 4
        # significant figures, as every cost) is within $0.15.
        assert 14_950 < fits < 15_050
        with pytest.raises(openai.BadRequestError) as again:
            c.chat.completions.create(model=MODEL, messages=SMALL, max_tokens=fits + 1)
        assert (
            isinstance(again.value.body, dict) and largest(again.value.body["message"], "max_tokens") == fits
        )
        ok = c.chat.completions.with_raw_response.create(model=MODEL, messages=SMALL, max_tokens=fits)
        assert ok.http_response.status_code == 200
    assert gw.wait_balance(handle.account_id, Decimal("0.15") - Decimal(ok.headers["x-service-cost"])) > 0


def test_a_refusal_of_several_choices_says_what_fits_each(gw: Gateway) -> None:
    """n = 3 holds three answers: the refusal names the limit per choice, both the one that fits
    and the one asked for (review: it read as if the request allowed that much in all)."""
    handle = gw.new_key(balance="0.15")
    with client(gw, handle.key) as c, pytest.raises(openai.BadRequestError) as caught:
        c.chat.completions.create(model=MODEL, messages=SMALL, n=3, max_tokens=10_000)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "max_tokens"
    assert "for each of its 3 choices (this request allows 10000 output tokens each)" in error["message"]
    # $0.15 over three answers at $10 a million (the hold rounded to 4 significant figures)
    assert 4_950 < largest(error["message"], "max_tokens") <= 5_000


def test_key_budget_exceeded_says_what_fits(gw: Gateway) -> None:
    handle = gw.new_key(credit_limit="0.05")
    with client(gw, handle.key) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            c.responses.create(model=RESPONSES_MODEL, input="Say hi")
        error = caught.value.body
        assert isinstance(error, dict) and error["code"] == "key_budget_exceeded"
        assert error["param"] == "max_output_tokens" and "credit limit has $0.05" in error["message"]
        fits = largest(error["message"], "max_output_tokens")
        with pytest.raises(openai.BadRequestError):
            c.responses.create(model=RESPONSES_MODEL, input="Say hi", max_output_tokens=fits + 1)
        ok = c.responses.with_raw_response.create(
            model=RESPONSES_MODEL, input="Say hi", max_output_tokens=fits
        )
        assert ok.http_response.status_code == 200


def test_a_refusal_for_the_account_names_the_key_limit_its_largest_output_fits(gw: Gateway) -> None:
    """The account refuses, the key's credit limit is tighter: the largest max_tokens is the one the
    limit covers, and the message says so (review: it read as what the account's money covers)."""
    handle = gw.new_key(balance="0.15", credit_limit="0.05")
    with client(gw, handle.key) as c, pytest.raises(openai.BadRequestError) as caught:
        c.chat.completions.create(model=MODEL, messages=SMALL)
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "insufficient_credits", error
    assert "the account has $0.15 available" in error["message"]
    assert "within the $0.05 this key's credit limit has left" in error["message"]
    assert 4_950 < largest(error["message"], "max_tokens") <= 5_000


def test_not_even_the_prompt_fits_names_no_max_tokens(gw: Gateway) -> None:
    handle = gw.new_key(balance="0.00001")
    with client(gw, handle.key) as c, pytest.raises(openai.BadRequestError) as caught:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello " * 50}])
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "insufficient_credits" and error["param"] is None
    assert "does not cover its prompt" in error["message"]


def test_a_non_token_request_says_the_most_it_could_cost(gw: Gateway) -> None:
    handle = gw.new_key(balance="0.001")
    with client(gw, handle.key) as c, pytest.raises(openai.BadRequestError) as caught:
        c.audio.speech.create(model="openai/tts-1", voice="alloy", input="x" * 100)  # $15 a million
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "insufficient_credits" and error["param"] is None
    assert "may cost up to $0.0015" in error["message"] and "$0.001 available" in error["message"]


# ------------------------------------------------------------------ large prompts

# Runs of one character: BPE merges each piece by piece, the slowest text to count (~0.4 s a MB;
# each under the core's MAX_EXACT_PIECE_BYTES, past which a run counts a token a byte at once).
LONG_RUN = ("a" * 1_000_000 + " ") * 3


@contextmanager
def small_requests(gw: Gateway, key: str) -> Iterator[list[float]]:
    """Small chat requests with `key`, one after another in a thread while the block runs: the
    times they were answered at."""
    answered: list[float] = []
    done = threading.Event()

    def ask() -> None:
        with client(gw, key) as c:
            while not done.is_set():
                c.chat.completions.create(model=MODEL, messages=SMALL, max_tokens=4)
                answered.append(time.monotonic())

    asker = threading.Thread(target=ask)
    asker.start()
    try:
        yield answered
    finally:
        done.set()
        asker.join()


def test_a_large_prompt_the_money_cannot_cover_is_refused_before_it_is_counted(gw: Gateway) -> None:
    """A key with nothing left sends megabytes of prompt: the refusal comes from its output alone,
    before the prompt is counted, on every text shape."""
    broke = gw.new_key(balance="0")
    bodies = {
        "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": LONG_RUN}]},
        "/v1/messages": {
            "model": MESSAGES_MODEL,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": LONG_RUN}],
        },
        "/v1/responses": {"model": RESPONSES_MODEL, "input": LONG_RUN},
    }
    with gw.client(broke.key) as c:
        for path, body in bodies.items():
            r = c.post(path, json=body)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "insufficient_credits"
            assert "before its prompt is counted" in error["message"]


def test_a_large_prompt_is_counted_while_the_worker_serves_others(gw: Gateway) -> None:
    """A paying request whose prompt takes seconds to count does not hold up its worker's other
    requests (the count runs in a thread), and is then held and billed as any other."""
    handle = gw.new_key()
    with gw.client(handle.key) as c, small_requests(gw, handle.key) as small:
        started = time.monotonic()
        try:
            r = c.post(
                "/v1/chat/completions",
                json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": LONG_RUN}]},
                timeout=120,
            )
        finally:
            ended = time.monotonic()
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 20_000
    # Small requests kept completing while the large one was counted (seconds, against ~10 ms each).
    during = [t for t in small if started < t < ended]
    assert len(during) >= 5, (len(during), ended - started)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": "openai/text-embedding-3-small", "input": LONG_RUN}),
        ("/v1/rerank", {"model": "cohere/rerank-v3.5", "query": "q", "documents": [LONG_RUN]}),
        ("/v1/images/generations", {"model": "openai/gpt-image-1", "prompt": LONG_RUN}),
    ],
)
def test_other_endpoints_count_a_large_input_while_the_worker_serves_others(
    gw: Gateway, path: str, body: dict[str, object]
) -> None:
    """Review: a 9 MB embeddings, rerank or image input was counted on the event loop, and every
    request of the worker waited seconds for it. Counted in a thread now: a key with too little
    has its refusal after the count, and meanwhile the worker answers others; a key with nothing
    left at all is refused before anything is counted."""
    broke = gw.new_key(balance="0")
    with gw.client(broke.key) as c:
        r = c.post(path, json=body, timeout=120)
    assert r.status_code == 400 and "input costs more than is left" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["code"] == "insufficient_credits"
    short, paying = gw.new_key(balance="0.00001"), gw.new_key()  # a few tokens' worth
    with gw.client(short.key) as c, small_requests(gw, paying.key) as small:
        time.sleep(0.3)  # the small requests under way
        started = time.monotonic()
        r = c.post(path, json=body, timeout=120)
        ended = time.monotonic()
    assert r.status_code == 400 and r.json()["error"]["code"] == "insufficient_credits", r.text
    during = [t for t in small if started < t < ended]
    assert len(during) >= 5, (len(during), ended - started)


def test_a_large_prompt_cut_short_is_billed_from_its_first_count(gw: Gateway) -> None:
    """A large prompt's stream that the upstream cuts short is billed from the gateway's own prompt
    count (the upstream sent no usage): the count made for the hold, in a thread, not a second one
    on the event loop, which would stop the worker's other requests for seconds."""
    handle = gw.new_key()
    content = LONG_RUN + "[sim tokens=12 drop_after=2 pace=20ms]"
    ids: list[str] = []
    with client(gw, handle.key) as c, small_requests(gw, handle.key) as answered:
        stream = c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], stream=True, timeout=120
        )
        started = time.monotonic()  # the simulator has its own count of the prompt behind it
        with pytest.raises(openai.APIError):  # the final error chunk of a stream cut short
            ids.extend(chunk.id for chunk in stream)
        time.sleep(1.5)  # the stream is settled after its end
    record = gw.usage_record(handle.key, ids[0])
    assert record["status"] == "incomplete"
    assert record["usage"]["prompt_tokens"] > 20_000
    # A count of the prompt on the event loop would leave a gap of seconds among the small answers.
    # (Only from the stream's start: the simulator, which serves them too, counts the prompt before.)
    since = [started, *(t for t in answered if t > started)]
    gaps = [b - a for a, b in itertools.pairwise(since)]
    assert len(gaps) > 10 and max(gaps) < 1.0, (len(gaps), max(gaps, default=None))
