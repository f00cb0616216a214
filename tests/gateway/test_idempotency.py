"""Idempotency-Key (spec 8): honoured on images and speech, scoped to the API key; one run and one
charge however many identical requests arrive; replays byte for byte; 409s; 5xx and oversized
answers not kept; a crashed request's lease runs out; ignored on other endpoints."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest

from gateway import idempotency
from gateway.context import Call
from gateway.errors import ServiceUnavailable
from gateway.store import Account, ApiKey, KeyContext, Store, open_store
from harness import Gateway, KeyHandle, eventually, store_spec, with_store

IMAGES = "/v1/images/generations"
SPEECH = "/v1/audio/speech"
GPT_IMAGE = "openai/gpt-image-1"


def sim_calls(sim: httpx.Client, path: str, marker: str) -> int:
    return sum(1 for e in sim.get("/_sim/requests").json() if e["path"] == path and marker in str(e))


@pytest.fixture
def gw(backend_gw: Gateway) -> Gateway:
    """These tests run on both store backends (tests/conftest.py)."""
    return backend_gw


def records(gw: Gateway, account_id: str) -> int:
    ((count,),) = gw.query("SELECT COUNT(*) FROM usage_records WHERE account_id = ?", account_id)
    return int(count)


def post(gw: Gateway, key: str, path: str, body: dict[str, Any], idem: str | None) -> httpx.Response:
    headers = {} if idem is None else {"idempotency-key": idem}
    with gw.client(key) as c:
        return c.post(path, json=body, headers=headers)


def test_fifty_identical_requests_run_once_and_charge_once(
    gw: Gateway, key: KeyHandle, sim: httpx.Client
) -> None:
    prompt = "a lighthouse " + os.urandom(4).hex()
    body = {"model": GPT_IMAGE, "prompt": prompt}

    async def fifty() -> list[httpx.Response]:
        headers = {"authorization": f"Bearer {key.key}", "idempotency-key": "once-" + prompt}
        async with httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=30) as c:
            return list(await asyncio.gather(*(c.post(IMAGES, json=body) for _ in range(50))))

    answers = asyncio.run(fifty())
    kinds = Counter(
        "first"
        if r.status_code == 200 and "idempotency-replayed" not in r.headers
        else "replay"
        if r.status_code == 200
        else r.json()["error"]["code"]
        for r in answers
    )
    assert (
        kinds["first"] == 1 and kinds["first"] + kinds["replay"] + kinds["idempotency_key_in_progress"] == 50
    )
    for r in answers:
        if r.status_code == 409:
            assert r.headers["retry-after"] == "1"
    first = next(r for r in answers if r.status_code == 200 and "idempotency-replayed" not in r.headers)
    assert all(r.content == first.content for r in answers if r.status_code == 200)  # byte for byte
    assert sim_calls(sim, IMAGES, prompt) == 1
    eventually(lambda: records(gw, key.account_id) >= 1, what="the first request's usage record")
    time.sleep(0.3)  # a second charge, if there were one, would have landed by now
    assert records(gw, key.account_id) == 1
    cost = Decimal(first.headers["x-service-cost"])
    assert gw.balance(key.account_id) == 100 - cost


def test_replay_is_free_and_marked_then_other_body_is_409(
    gw: Gateway, key: KeyHandle, sim: httpx.Client
) -> None:
    prompt = "a kite " + os.urandom(4).hex()
    body = {"model": GPT_IMAGE, "prompt": prompt, "n": 2}
    first = post(gw, key.key, IMAGES, body, "k1")
    assert first.status_code == 200 and "idempotency-replayed" not in first.headers
    charged = Decimal(100) - Decimal(first.headers["x-service-cost"])
    eventually(lambda: gw.balance(key.account_id) == charged, what="the first request's charge")
    balance = gw.balance(key.account_id)
    # The same JSON with its keys in another order is the same request.
    again = post(gw, key.key, IMAGES, {"n": 2, "prompt": prompt, "model": GPT_IMAGE}, "k1")
    assert again.status_code == 200 and again.headers["idempotency-replayed"] == "true"
    assert again.content == first.content and again.headers["content-type"] == first.headers["content-type"]
    assert again.headers["x-service-cost"] == "0"
    assert again.headers["x-service-request-id"] != first.headers["x-service-request-id"]
    # So is the same JSON under another Content-Type, which the gateway reads as JSON all the same
    # (spec review: curl's -d sends form-urlencoded, and got idempotency_key_reused).
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        with gw.client(key.key) as c:
            raw = json.dumps(body).encode()
            headers = {"idempotency-key": "k1", "content-type": content_type}
            typed = c.post(IMAGES, content=raw, headers=headers)
        assert typed.status_code == 200 and typed.headers["idempotency-replayed"] == "true", typed.text
    time.sleep(0.2)  # a charge for the replay, if there were one, would have landed by now
    assert gw.balance(key.account_id) == balance and sim_calls(sim, IMAGES, prompt) == 1
    other = post(gw, key.key, IMAGES, {**body, "n": 1}, "k1")
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert other.headers["x-should-retry"] == "false"  # the official clients' retries stop there
    assert other.json()["error"]["type"] == "idempotency_error"
    # Logged under the model they name, though neither ran (console review: "—").
    for answer in (again, other):
        rid: str = answer.headers["x-service-request-id"]

        def entry(rid: str = rid) -> list[Any]:
            return list(gw.query("SELECT model FROM request_logs WHERE id = ?", rid))

        assert [tuple(row) for row in eventually(entry, what="its log entry")] == [(GPT_IMAGE,)]


def test_keys_are_scoped_to_the_api_key(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    prompt = "a fox " + os.urandom(4).hex()
    body = {"model": GPT_IMAGE, "prompt": prompt}
    other = gw.new_key()
    assert "idempotency-replayed" not in post(gw, key.key, IMAGES, body, "shared").headers
    assert "idempotency-replayed" not in post(gw, other.key, IMAGES, body, "shared").headers
    assert sim_calls(sim, IMAGES, prompt) == 2


def test_a_5xx_is_not_kept_and_a_4xx_is(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    failing = {"model": GPT_IMAGE, "prompt": "broken [sim fail=500] " + os.urandom(4).hex()}
    assert post(gw, key.key, IMAGES, failing, "f").status_code >= 500
    assert post(gw, key.key, IMAGES, failing, "f").status_code >= 500
    # The second request ran again, and each was tried 3 times (the router retries a 5xx twice).
    assert sim_calls(sim, IMAGES, str(failing["prompt"])) == 6
    refused = {"model": GPT_IMAGE, "prompt": "refused [sim fail=400] " + os.urandom(4).hex()}
    first = post(gw, key.key, IMAGES, refused, "r")
    again = post(gw, key.key, IMAGES, refused, "r")
    assert first.status_code == again.status_code == 400
    assert again.content == first.content and again.headers["idempotency-replayed"] == "true"
    assert sim_calls(sim, IMAGES, str(refused["prompt"])) == 1


def test_credit_refusals_are_kept_and_replayed(gw: Gateway) -> None:
    """Spec 7.5.4: an error answer is kept like a success, except 5xx. A request refused for want
    of credits is refused again with the same key, replayed, even once credits are added; a new
    key runs it."""
    poor = gw.new_key(balance="0")
    body = {"model": GPT_IMAGE, "prompt": "a coin " + os.urandom(4).hex()}
    first = post(gw, poor.key, IMAGES, body, "c")
    assert first.json()["error"]["code"] == "insufficient_credits"
    gw.top_up(poor.account_id, "100")
    again = post(gw, poor.key, IMAGES, body, "c")
    assert (again.status_code, again.content) == (400, first.content)
    assert again.headers["idempotency-replayed"] == "true"
    # Spec 7.5.3: the replayed failure is logged with its status and code, as the first was.
    ids = first.headers["x-service-request-id"], again.headers["x-service-request-id"]

    def both_logged() -> list[tuple[Any, ...]] | None:
        rows = gw.query("SELECT status, error_code FROM request_logs WHERE id IN (?, ?)", *ids)
        return rows if len(rows) == 2 else None

    logged = eventually(both_logged, what="both log entries")
    assert [tuple(row) for row in logged] == [(400, "insufficient_credits")] * 2
    assert post(gw, poor.key, IMAGES, body, "c2").status_code == 200


def test_speech_is_replayed_with_its_audio(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    text = "Hello there " + os.urandom(4).hex()
    body = {"model": "openai/tts-1", "input": text, "voice": "alloy", "response_format": "wav"}
    first = post(gw, key.key, SPEECH, body, "s1")
    again = post(gw, key.key, SPEECH, body, "s1")
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and len(first.content) > 44
    assert again.headers["content-type"] == first.headers["content-type"] == "audio/wav"
    assert again.headers["idempotency-replayed"] == "true"
    assert again.headers["x-service-response-id"] == first.headers["x-service-response-id"]
    assert sim_calls(sim, SPEECH, text) == 1


def test_the_openai_client_sends_and_gets_replays(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    prompt = "a comet " + os.urandom(4).hex()
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as client:
        a = client.images.generate(model=GPT_IMAGE, prompt=prompt, extra_headers={"Idempotency-Key": "oc"})
        b = client.images.generate(model=GPT_IMAGE, prompt=prompt, extra_headers={"Idempotency-Key": "oc"})
    assert a.data is not None and b.data is not None and a.data[0].url == b.data[0].url
    assert sim_calls(sim, IMAGES, prompt) == 1


def test_ignored_elsewhere_and_bad_keys_refused(gw: Gateway, key: KeyHandle) -> None:
    chat = {"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "twice"}]}
    a, b = (
        post(gw, key.key, "/v1/chat/completions", chat, "same"),
        post(gw, key.key, "/v1/chat/completions", chat, "same"),
    )
    assert a.json()["id"] != b.json()["id"] and "idempotency-replayed" not in b.headers
    body = {"model": GPT_IMAGE, "prompt": "p"}
    for bad in ("", "x" * 256):
        r = post(gw, key.key, IMAGES, body, bad)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert post(gw, key.key, IMAGES, body, "x" * 255).status_code == 200
    # Characters, not bytes (review: 255 Cyrillic letters, 510 bytes of UTF-8, were refused).
    with gw.client(key.key) as c:
        for letters, status in ((255, 200), (256, 400)):
            r = c.post(IMAGES, json=body, headers={b"idempotency-key": ("я" * letters).encode()})
            assert r.status_code == status, (letters, r.text)
    # Sent twice: refused, as a duplicated Authorization is (which copy a proxy read is unknown).
    with gw.client(key.key) as c:
        r = c.post(IMAGES, json=body, headers=[("Idempotency-Key", "one"), ("Idempotency-Key", "two")])
    assert r.status_code == 400 and r.json()["error"]["param"] == "Idempotency-Key", r.text


def _call(key_id: str) -> Call:
    ctx = KeyContext(ApiKey(key_id, "acct", "k", "sk-", 0), Account("acct", "a", Decimal(1)))
    return Call(ctx=ctx, request_id="req_1", started_ns=0)


class _State:
    def __init__(self, store: Store) -> None:
        self.store = store


@pytest.mark.parametrize(
    ("size", "kept"), [(idempotency.MAX_STORED_BYTES, True), (idempotency.MAX_STORED_BYTES + 1, False)]
)
def test_answers_over_8_mb_are_not_kept(tmp_path: Path, backend: str, size: int, kept: bool) -> None:
    async def go(store: Store) -> str:
        await store.start()
        try:
            call = _call("key_a")
            assert (
                await store.claim_idempotency("key_a", "big", "fp", 1_000, 60_000, 86_400_000)
            ).outcome == "run"
            call.idempotency = ("big", "fp")
            await idempotency.keep(_State(store), call, 200, {"content-type": "audio/wav"}, bytes(size))  # type: ignore[arg-type]
            return (await store.claim_idempotency("key_a", "big", "fp", 2_000, 60_000, 86_400_000)).outcome
        finally:
            await store.close()

    with store_spec(tmp_path, backend) as spec:
        assert asyncio.run(go(open_store(spec.settings()))) == ("replay" if kept else "run")


def test_a_crashed_request_lease_runs_out_and_entries_expire(tmp_path: Path, backend: str) -> None:
    async def go(store: Store) -> list[str]:
        await store.start()
        try:
            claim = store.claim_idempotency
            outcomes = [(await claim("k", "x", "fp", 0, 1_000, 86_400_000)).outcome]  # then its process dies
            outcomes.append((await claim("k", "x", "fp", 999, 1_000, 86_400_000)).outcome)  # still leased
            outcomes.append((await claim("k", "x", "other", 999, 1_000, 86_400_000)).outcome)
            outcomes.append((await claim("k", "x", "fp", 1_000, 1_000, 86_400_000)).outcome)  # lease over
            assert await store.purge_idempotency(86_400_999) == 0
            assert await store.purge_idempotency(86_401_000) == 1
            return outcomes
        finally:
            await store.close()

    with store_spec(tmp_path, backend) as spec:
        assert asyncio.run(go(open_store(spec.settings()))) == ["run", "in_progress", "reused", "run"]


def test_an_answer_the_store_cannot_take_now_is_kept_once_it_can(tmp_path: Path, backend: str) -> None:
    """A request that ran and was charged while the store could not keep its answer (unreachable):
    the answer is kept in the background once the store is back, so a retry with the key replays it
    instead of running, and being charged, again."""

    async def go(store: Store) -> str:
        await store.start()
        real = store.finish_idempotency
        failures = 2

        async def away(*args: Any, **kwargs: Any) -> None:
            nonlocal failures
            if failures:
                failures -= 1
                raise ServiceUnavailable("database")
            await real(*args, **kwargs)

        try:
            assert (
                await store.claim_idempotency("key_a", "k1", "fp", 1_000, 60_000, 86_400_000)
            ).outcome == "run"
            call = _call("key_a")
            call.idempotency = ("k1", "fp")
            state = SimpleNamespace(store=store, settings=SimpleNamespace(sync_timeout_seconds=5.0))
            store.finish_idempotency = away  # type: ignore[method-assign]
            idempotency.keep_when_possible(state, call, 200, {"content-type": "audio/wav"}, b"RIFF")  # type: ignore[arg-type]
            for _ in range(100):  # two failed tries a second apart, then kept
                if not idempotency._KEEPING:
                    break
                await asyncio.sleep(0.05)
            assert not failures and not idempotency._KEEPING
            outcome = await store.claim_idempotency("key_a", "k1", "fp", 2_000, 60_000, 86_400_000)
            return outcome.outcome
        finally:
            store.finish_idempotency = real  # type: ignore[method-assign]
            await store.close()

    with store_spec(tmp_path, backend) as spec:
        assert asyncio.run(go(open_store(spec.settings()))) == "replay"


def test_a_429_is_not_kept_and_the_retry_it_asks_for_runs(gw: Gateway, sim: httpx.Client) -> None:
    """A tokens-per-minute 429 says: wait Retry-After, send it again (spec 7.2, 7.4). Kept (spec
    7.5.4 read alone), that retry got the same 429 back for 24 hours, replayed without Retry-After
    (review): the key is let go, the retry is refused afresh while the bucket is empty, with its
    Retry-After, and runs once the key may go on."""
    probe = gw.new_key(tpm_limit=100_000)
    reserved = 100_000 - int(
        post(gw, probe.key, IMAGES, {"model": GPT_IMAGE, "prompt": "a probe"}, None).headers[
            "x-ratelimit-remaining-tokens"
        ]
    )
    # Room for one image a minute: the second is refused for the minute, not for ever (a 400).
    limited = gw.new_key(tpm_limit=reserved + reserved // 2)
    body = {"model": GPT_IMAGE, "prompt": "a kite " + os.urandom(4).hex()}
    assert post(gw, limited.key, IMAGES, {**body, "prompt": "first"}, None).status_code == 200
    refused = post(gw, limited.key, IMAGES, body, "t")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limited"
    again = post(gw, limited.key, IMAGES, body, "t")
    assert again.status_code == 429 and "idempotency-replayed" not in again.headers
    assert int(again.headers["retry-after"]) >= 1
    assert sim_calls(sim, IMAGES, str(body["prompt"])) == 0

    async def lift(store: Store) -> None:
        await store.update_account(limited.account_id, {"tpm_limit": None})

    with_store(gw.store_settings, lift)

    def retried() -> httpx.Response | None:
        answer = post(gw, limited.key, IMAGES, body, "t")
        return answer if answer.status_code == 200 else None

    ran = eventually(retried, 10, 0.2, what="the retry after the limit went")
    assert "idempotency-replayed" not in ran.headers
    replayed = post(gw, limited.key, IMAGES, body, "t")
    assert replayed.headers["idempotency-replayed"] == "true" and replayed.content == ran.content
    assert sim_calls(sim, IMAGES, str(body["prompt"])) == 1


def test_a_provider_at_capacity_is_not_kept_either(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    """429 provider_overloaded: "retry with backoff" (spec 7.2); a retry with the key asks the
    model again instead of getting the first answer replayed for 24 hours (review)."""
    body = {"model": GPT_IMAGE, "prompt": "[sim fail=429] a busy kite " + os.urandom(4).hex()}
    first = post(gw, key.key, IMAGES, body, "busy")
    assert first.status_code == 429 and first.json()["error"]["code"] == "provider_overloaded"
    tried = sim_calls(sim, IMAGES, str(body["prompt"]))
    assert tried >= 1
    second = post(gw, key.key, IMAGES, body, "busy")
    assert second.status_code == 429 and "idempotency-replayed" not in second.headers
    assert "retry-after" in second.headers
    assert sim_calls(sim, IMAGES, str(body["prompt"])) == 2 * tried
