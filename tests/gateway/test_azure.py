"""Azure OpenAI channels (provider = "azure"): deployment URLs and the v1 API, the api-key header and
Entra ID tokens, Azure's content filter, through the official openai and anthropic clients."""

from __future__ import annotations

import asyncio
import tomllib
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.config import ConfigError, Prices, Settings, parse_settings
from gateway.core import count_chat_tokens, count_tokens
from gateway.pricing import Usage, cost
from gateway.providers.credentials import TokenCache
from gateway.providers.http import UpstreamClient
from harness import Gateway, chat_stream, gateway

DEPLOYED = "azure/gpt-4o-mini"  # the deployment style, with an API key
ENTRA = "azure-entra/gpt-4o-mini"  # the v1 API, with Entra ID
EMBED = "azure/text-embedding-3-small"
KEY_ENV = "TEST_AZURE_OPENAI_KEY"
SECRET_ENV = "TEST_AZURE_CLIENT_SECRET"
PRICES = """
[models.prices]
input = "0.15"
output = "0.60"
"""


def models(sim_url: str) -> str:
    return f"""
[[models]]
name = "{DEPLOYED}"
type = "chat"
{PRICES}
[[models.channels]]
provider = "azure"
base_url = "{sim_url}"
model = "prod-4o-mini"
api_version = "2024-10-21"
api_key_env = "{KEY_ENV}"

[[models]]
name = "{ENTRA}"
type = "chat"
{PRICES}
[[models.channels]]
provider = "azure"
base_url = "{sim_url}"
model = "prod-4o-mini"
tenant_id = "tenant-a"
client_id = "gateway-app"
client_secret_env = "{SECRET_ENV}"
token_url = "{sim_url}/tenant-a/oauth2/v2.0/token"

[[models]]
name = "{EMBED}"
type = "embedding"
{PRICES}
[[models.channels]]
provider = "azure"
base_url = "{sim_url}"
model = "embed-small"
api_version = "2024-10-21"
api_key_env = "{KEY_ENV}"
"""


@pytest.fixture(scope="module")
def agw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    env = {KEY_ENV: "azure-key-1", SECRET_ENV: "entra-secret-1"}
    with gateway(tmp_path_factory.mktemp("azure"), models(sim_url), env=env) as g:
        yield g


@pytest.fixture
def oai(agw: Gateway) -> Iterator[openai.OpenAI]:
    handle = agw.new_key()
    with openai.OpenAI(api_key=handle.key, base_url=agw.url + "/v1", max_retries=0) as client:
        yield client


def azure_entries(sim: httpx.Client, marker: str) -> list[dict[str, Any]]:
    """The Azure sign-in records of requests whose chat messages carry `marker`: each Azure
    request records itself, then the operation records its body right after."""
    entries = sim.get("/_sim/requests").json()
    return [
        entries[i]
        for i in range(len(entries) - 1)
        if entries[i]["path"].startswith("/openai/") and marker in str(entries[i + 1]["body"].get("messages"))
    ]


def test_deployment_urls_with_the_api_key(oai: openai.OpenAI, sim: httpx.Client) -> None:
    marker = uuid.uuid4().hex
    answer = oai.chat.completions.create(model=DEPLOYED, messages=[{"role": "user", "content": marker}])
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    assert answer.usage is not None
    (entry,) = azure_entries(sim, marker)
    assert entry["path"] == "/openai/deployments/prod-4o-mini/chat/completions"
    assert (entry["deployment"], entry["api_version"], entry["auth"]) == (
        "prod-4o-mini",
        "2024-10-21",
        "api-key",
    )


def test_a_stream_is_billed_exactly(agw: Gateway, sim: httpx.Client) -> None:
    """Azure opens a stream with a chunk of no choice carrying the prompt's filter results: the
    client still gets a valid stream, and the usage Azure reports is what is charged."""
    handle = agw.new_key(balance="10")
    marker = uuid.uuid4().hex
    with openai.OpenAI(api_key=handle.key, base_url=agw.url + "/v1", max_retries=0) as client:
        stream = client.chat.completions.create(
            model=DEPLOYED,
            messages=[{"role": "user", "content": f"{marker} [sim tokens=12]"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 12 and len(text.split()) == 12
    assert {c.id for c in chunks} == {chunks[0].id}  # the gateway's id on every chunk
    charged = cost(parse_prices(agw.settings, DEPLOYED), Usage(usage.prompt_tokens, usage.completion_tokens))
    assert agw.wait_balance(handle.account_id, Decimal(10) - charged) == Decimal(10) - charged


def test_a_stream_cut_short_is_billed_for_what_was_delivered(agw: Gateway) -> None:
    """Azure's usage chunk comes last: a stream cut before it is billed from the gateway's own
    counts, the whole prompt and exactly the output the client was sent (spec 6.1.9)."""
    handle = agw.new_key(balance="10")
    # Paced: a reset arriving with events still unread would discard them (see test_early_end).
    got = chat_stream(agw, handle.key, DEPLOYED, "cut [sim tokens=20 drop_after=5 pace=30ms]")
    assert len(got.text.split()) == 5
    assert "provider_error" in got.events[-1]
    usage = Usage(count_chat_tokens(got.body), count_tokens(got.text))
    expected = cost(parse_prices(agw.settings, DEPLOYED), usage)
    assert agw.wait_balance(handle.account_id, Decimal(10) - expected) == Decimal(10) - expected


def parse_prices(settings: Settings, model: str) -> Prices:
    return next(m.prices for m in settings.models if m.name == model)


def test_entra_id_tokens_on_the_v1_api_are_fetched_once(oai: openai.OpenAI, sim: httpx.Client) -> None:
    marker = uuid.uuid4().hex
    for _ in range(3):
        oai.chat.completions.create(model=ENTRA, messages=[{"role": "user", "content": marker}])
    entries = azure_entries(sim, marker)
    assert [e["path"] for e in entries] == ["/openai/v1/chat/completions"] * 3
    assert {e["auth"] for e in entries} == {"entra"} and {e["api_version"] for e in entries} == {None}
    tokens = [e for e in sim.get("/_sim/requests").json() if e["path"] == "/oauth2/v2.0/token"]
    assert tokens, "the gateway signed in"
    assert tokens[-1]["tenant"] == "tenant-a" and tokens[-1]["body"]["client_id"] == "gateway-app"
    assert tokens[-1]["body"]["scope"] == "https://cognitiveservices.azure.com/.default"
    assert len(tokens) <= 1 + 1  # one per worker process at most, not one per request


def test_embeddings_through_a_deployment(oai: openai.OpenAI, sim: httpx.Client) -> None:
    answer = oai.embeddings.create(model=EMBED, input=["one", "two"], dimensions=8)
    assert [len(d.embedding) for d in answer.data] == [8, 8]
    paths = [e["path"] for e in sim.get("/_sim/requests").json()]
    assert "/openai/deployments/embed-small/embeddings" in paths


def test_a_prompt_refused_by_the_content_filter_is_content_filtered_and_free(agw: Gateway) -> None:
    handle = agw.new_key(balance="5")
    with (
        openai.OpenAI(api_key=handle.key, base_url=agw.url + "/v1", max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as caught,
    ):
        client.chat.completions.create(
            model=DEPLOYED, messages=[{"role": "user", "content": "[sim fail=content_policy]"}]
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "content_filtered"
    assert agw.balance(handle.account_id) == Decimal(5)


def test_an_answer_cut_by_the_content_filter(agw: Gateway) -> None:
    """finish_reason content_filter reaches chat clients as OpenAI's own; Anthropic's clients read
    it as a refusal. Both are charged for what was produced."""
    handle = agw.new_key(balance="5")
    prices = parse_prices(agw.settings, DEPLOYED)
    with openai.OpenAI(api_key=handle.key, base_url=agw.url + "/v1", max_retries=0) as client:
        answer = client.chat.completions.create(
            model=DEPLOYED, messages=[{"role": "user", "content": "go [sim tokens=9 filter_after=4]"}]
        )
    assert answer.choices[0].finish_reason == "content_filter"
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    with anthropic.Anthropic(api_key=handle.key, base_url=agw.url, max_retries=0) as claude:
        message = claude.messages.create(
            model=DEPLOYED,
            max_tokens=50,
            messages=[{"role": "user", "content": "go [sim tokens=9 filter_after=4]"}],
        )
        assert message.stop_reason == "refusal" and message.usage.output_tokens == 4
        with claude.messages.stream(
            model=DEPLOYED,
            max_tokens=50,
            messages=[{"role": "user", "content": "on [sim tokens=9 filter_after=3]"}],
        ) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "refusal" and final.usage.output_tokens == 3
        charged = cost(prices, Usage(answer.usage.prompt_tokens, 4))
        charged += cost(prices, Usage(message.usage.input_tokens, 4))
        charged += cost(prices, Usage(final.usage.input_tokens, 3))
        assert agw.wait_balance(handle.account_id, Decimal(5) - charged) == Decimal(5) - charged


def test_azure_throttling_is_provider_overloaded(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        oai.chat.completions.create(model=DEPLOYED, messages=[{"role": "user", "content": "[sim fail=429]"}])
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_overloaded"
    assert caught.value.response.headers["retry-after"]


def test_a_wrong_key_is_the_gateways_fault_not_the_callers(sim_url: str, tmp_path: Path) -> None:
    with gateway(tmp_path, models(sim_url), env={SECRET_ENV: "s"}) as g:  # no api key set
        handle = g.new_key()
        with (
            openai.OpenAI(api_key=handle.key, base_url=g.url + "/v1", max_retries=0) as client,
            pytest.raises(openai.APIStatusError) as caught,
        ):
            client.chat.completions.create(model=DEPLOYED, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_error"


def test_tokens_are_cached_and_fetched_again_before_they_expire(
    sim_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "entra-secret-1")
    settings = parse_settings(tomllib.loads(models(sim_url)), Path("/tmp"))
    credentials = next(m.channels[0].oauth for m in settings.models if m.name == ENTRA)
    assert credentials is not None

    async def go() -> tuple[str, str, str]:
        client = UpstreamClient(settings)
        await client.start()
        try:
            cache = TokenCache()
            first = await cache.bearer(credentials, client)
            again = await cache.bearer(credentials, client)
            cache._tokens[credentials].refresh_at = 0.0  # as if its refresh time had come
            fresh = await cache.bearer(credentials, client)
            return first, again, fresh
        finally:
            await client.close()

    first, again, fresh = asyncio.run(go())
    assert first == again and fresh != first


@pytest.mark.parametrize(
    ("channel", "message"),
    [
        ({}, "an azure channel signs in with api_key_env or Entra ID"),
        ({"api_key_env": "K", "tenant_id": "t", "client_id": "c", "client_secret_env": "S"}, "not both"),
        ({"tenant_id": "t"}, "missing client_id, client_secret_env"),
        ({"provider": "openai", "api_version": "2024-10-21"}, "only an azure channel takes it"),
    ],
)
def test_azure_settings_are_checked(channel: dict[str, Any], message: str) -> None:
    raw = {
        "models": [
            {
                "name": "azure/m",
                "type": "chat",
                "channels": [{"provider": "azure", "base_url": "https://r.openai.azure.com", **channel}],
            }
        ]
    }
    with pytest.raises(ConfigError, match=message):
        parse_settings(raw, Path("/tmp"))


def test_a_model_type_azure_does_not_serve_is_refused() -> None:
    channel = {"provider": "azure", "base_url": "https://r.openai.azure.com", "api_key_env": "K"}
    raw = {"models": [{"name": "azure/mod", "type": "moderation", "channels": [channel]}]}
    with pytest.raises(ConfigError, match="provider azure serves no moderation model"):
        parse_settings(raw, Path("/tmp"))


def test_model_group_info_tells_the_parameters_forwarded(agw: Gateway) -> None:
    handle = agw.new_key()
    r = httpx.get(
        f"{agw.url}/model_group/info",
        params={"model_group": DEPLOYED},
        headers={"authorization": f"Bearer {handle.key}"},
    )
    assert r.status_code == 200, r.text
    params = r.json()["data"][0]["supported_openai_params"]
    assert {"temperature", "max_tokens", "tools", "stream_options"} <= set(params)
