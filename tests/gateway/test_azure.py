"""Azure OpenAI channels (provider = "azure"): deployment URLs and the v1 API, the api-key header and
Entra ID tokens, Azure's content filter, through the official openai and anthropic clients."""

from __future__ import annotations

import asyncio
import base64
import json
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
from gateway.errors import GatewayError
from gateway.pricing import Usage, cost
from gateway.providers.credentials import TokenCache
from gateway.providers.http import UpstreamClient
from harness import Gateway, chat_stream, eventually, gateway

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


# ---------------------------------------------------------------- workload and managed identities

WORKLOAD = "azure-workload/gpt-4o-mini"  # AKS workload identity: a federated token file
IMDS = "azure-imds/gpt-4o-mini"  # a VM's user-assigned managed identity
APP_SERVICE = "azure-app/gpt-4o-mini"  # App Service's managed identity (IDENTITY_ENDPOINT)
IDENTITY_SECRET = "app-service-identity-header"


def identity_models(sim_url: str, token_file: Path) -> str:
    def model(name: str, sign_in: str) -> str:
        return f"""
[[models]]
name = "{name}"
type = "chat"
{PRICES}
[[models.channels]]
provider = "azure"
base_url = "{sim_url}"
model = "prod-4o-mini"
{sign_in}
"""

    workload = "\n".join(
        [
            'entra_auth = "workload_identity"',
            'tenant_id = "tenant-w"',
            'client_id = "workload-app"',
            f'federated_token_file = "{token_file}"',
            f'token_url = "{sim_url}/tenant-w/oauth2/v2.0/token"',
        ]
    )
    imds = "\n".join(
        [
            'entra_auth = "managed_identity"',
            'client_id = "user-assigned-1"',
            f'token_url = "{sim_url}/metadata/identity/oauth2/token"',
        ]
    )
    return (
        model(WORKLOAD, workload) + model(IMDS, imds) + model(APP_SERVICE, 'entra_auth = "managed_identity"')
    )


def federated_token(subject: str) -> str:
    """A JWT as Kubernetes projects it for a service account (the simulator reads, not verifies, it)."""

    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    claims = {"iss": "https://oidc.example", "sub": subject, "aud": "api://AzureADTokenExchange"}
    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


@pytest.fixture(scope="module")
def igw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("azure-identities")
    token_file = tmp / "azure-identity-token"
    token_file.write_text(federated_token("system:serviceaccount:ai:gateway"))
    env = {"IDENTITY_ENDPOINT": sim_url + "/msi/token", "IDENTITY_HEADER": IDENTITY_SECRET}
    with gateway(tmp, identity_models(sim_url, token_file), env=env) as g:
        yield g


def signed_in_requests(igw: Gateway, sim: httpx.Client, model: str) -> list[dict[str, Any]]:
    """Ask `model` something; the simulator's records from then on (its log forgotten first: it
    keeps the last 1,000, so a count taken before stopped telling where the new ones start)."""
    sim.delete("/_sim/requests")
    handle = igw.new_key()
    with openai.OpenAI(api_key=handle.key, base_url=igw.url + "/v1", max_retries=0) as client:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi [sim tokens=2]"}]
        )
    entries: list[dict[str, Any]] = sim.get("/_sim/requests").json()
    assert [e.get("auth") for e in entries if e["path"].startswith("/openai/")] == ["entra"]
    return entries


def test_a_workload_identity_signs_in_with_its_federated_token(igw: Gateway, sim: httpx.Client) -> None:
    (token,) = [e for e in signed_in_requests(igw, sim, WORKLOAD) if e["path"] == "/oauth2/v2.0/token"]
    assert token["tenant"] == "tenant-w"
    assert token["body"] == {
        "grant_type": "client_credentials",
        "client_id": "workload-app",
        "scope": "https://cognitiveservices.azure.com/.default",
        "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
    }
    assert token["assertion"] == federated_token("system:serviceaccount:ai:gateway")


def test_a_vm_s_managed_identity_signs_in_through_imds(igw: Gateway, sim: httpx.Client) -> None:
    entries = signed_in_requests(igw, sim, IMDS)
    (token,) = [e for e in entries if e["path"] == "/metadata/identity/oauth2/token"]
    assert token["metadata"] == "true"
    assert token["query"] == {
        "resource": "https://cognitiveservices.azure.com",
        "api-version": "2018-02-01",
        "client_id": "user-assigned-1",
    }


def test_app_service_s_managed_identity_uses_its_identity_endpoint(igw: Gateway, sim: httpx.Client) -> None:
    entries = signed_in_requests(igw, sim, APP_SERVICE)
    (token,) = [e for e in entries if e["path"] == "/msi/token"]
    assert token["identity_header"] == IDENTITY_SECRET and token["metadata"] is None
    assert token["query"] == {"resource": "https://cognitiveservices.azure.com", "api-version": "2019-08-01"}


def test_a_rotated_federated_token_is_read_at_the_next_fetch(
    sim_url: str, sim: httpx.Client, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(federated_token("first"))
    settings = parse_settings(tomllib.loads(identity_models(sim_url, token_file)), tmp_path)
    credentials = next(m.channels[0].oauth for m in settings.models if m.name == WORKLOAD)
    assert credentials is not None and credentials.kind == "workload_identity"

    async def go() -> None:
        client = UpstreamClient(settings)
        await client.start()
        try:
            cache = TokenCache()
            await cache.bearer(credentials, client)
            token_file.write_text(federated_token("second"))  # as the kubelet rotates it
            cache._tokens[credentials].refresh_at = 0.0  # as if its refresh time had come
            await cache.bearer(credentials, client)
            token_file.write_text("")
            cache._tokens[credentials].refresh_at = 0.0
            with pytest.raises(GatewayError, match="federated token file is empty"):
                await cache.bearer(credentials, client)
        finally:
            await client.close()

    asyncio.run(go())
    assertions = [
        e["assertion"] for e in sim.get("/_sim/requests").json() if e["path"] == "/oauth2/v2.0/token"
    ]
    assert assertions[-2:] == [federated_token("first"), federated_token("second")]


def test_identity_settings_come_from_the_platform_s_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_TENANT_ID", "t-env")
    monkeypatch.setenv("AZURE_CLIENT_ID", "c-env")
    monkeypatch.setenv("AZURE_FEDERATED_TOKEN_FILE", "/var/run/secrets/azure/tokens/azure-identity-token")
    monkeypatch.setenv("AZURE_AUTHORITY_HOST", "https://login.microsoftonline.us/")
    monkeypatch.delenv("IDENTITY_ENDPOINT", raising=False)

    def credentials(channel: dict[str, Any]) -> Any:
        raw = {
            "models": [
                {
                    "name": "azure/m",
                    "type": "chat",
                    "channels": [{"provider": "azure", "base_url": "https://r.openai.azure.com", **channel}],
                }
            ]
        }
        return parse_settings(raw, Path("/tmp")).models[0].channels[0].oauth

    workload = credentials({"entra_auth": "workload_identity"})
    assert (workload.client_id, workload.federated_token_file) == (
        "c-env",
        "/var/run/secrets/azure/tokens/azure-identity-token",
    )
    assert workload.token_url == "https://login.microsoftonline.us/t-env/oauth2/v2.0/token"
    vm = credentials({"entra_auth": "managed_identity"})
    assert vm.token_url == "http://169.254.169.254/metadata/identity/oauth2/token"
    assert vm.client_id is None and vm.identity_header_env is None
    monkeypatch.setenv("IDENTITY_ENDPOINT", "http://localhost:8081/msi/token")
    app = credentials({"entra_auth": "managed_identity", "client_id": "user-assigned"})
    assert app.token_url == "http://localhost:8081/msi/token" and app.identity_header_env == "IDENTITY_HEADER"


@pytest.mark.parametrize(
    ("channel", "message"),
    [
        ({}, "an azure channel signs in with api_key_env or Entra ID"),
        ({"entra_auth": "password"}, "entra_auth: must be one of"),
        ({"entra_auth": "managed_identity", "tenant_id": "t"}, "tenant_id: not used with entra_auth"),
        ({"entra_auth": "client_secret", "federated_token_file": "/f"}, "federated_token_file: not used"),
        (
            {"entra_auth": "workload_identity", "client_id": "c", "federated_token_file": "/f"},
            "needs tenant_id",
        ),
        ({"entra_auth": "managed_identity", "api_key_env": "K"}, "not both"),
        ({"api_key_env": "K", "tenant_id": "t", "client_id": "c", "client_secret_env": "S"}, "not both"),
        ({"tenant_id": "t"}, "missing client_id, client_secret_env"),
        ({"provider": "openai", "entra_auth": "managed_identity"}, "only an azure channel takes it"),
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


def responses_models(sim_url: str) -> str:
    """A Responses model on each of Azure's URL styles: the v1 API, and an api_version."""
    return "[background]\npoll_seconds = 0.2\n" + "".join(
        f"""
[[models]]
name = "{name}"
type = "responses"
{PRICES}
[[models.channels]]
provider = "azure"
base_url = "{sim_url}"
model = "o4-mini-deep-research+render=400ms"
api_key_env = "{KEY_ENV}"
{extra}
"""
        for name, extra in (
            ("azure-v1/o4-mini", ""),
            ("azure-dated/o4-mini", 'api_version = "2025-04-01-preview"'),
        )
    )


@pytest.mark.parametrize(
    ("model", "root"),
    [("azure-v1/o4-mini", "/openai/v1/responses/"), ("azure-dated/o4-mini", "/openai/responses/")],
)
def test_responses_azure_keeps_are_reached_at_azures_urls(
    sim_url: str, sim: httpx.Client, tmp_path: Path, model: str, root: str
) -> None:
    """A stored response is fetched and deleted, and a background one polled to its end, at Azure's
    own URLs (/openai/v1/responses/{id}, or /openai/responses/{id}?api-version=), not OpenAI's."""
    env = {KEY_ENV: "azure-key-1"}
    with gateway(tmp_path, responses_models(sim_url), env=env) as g:
        handle = g.new_key(balance="5")
        with openai.OpenAI(api_key=handle.key, base_url=g.url + "/v1", max_retries=0) as client:
            made = client.responses.create(model=model, input="keep this [sim tokens=3]")
            sim.delete("/_sim/requests")
            assert client.responses.retrieve(made.id).output_text == made.output_text
            client.responses.delete(made.id)
            ran = client.responses.create(model=model, input="later [sim tokens=3]", background=True)
            eventually(lambda: client.responses.retrieve(ran.id).status == "completed", 10)
            assert client.responses.retrieve(ran.id).output_text
    reached = [e for e in sim.get("/_sim/requests").json() if e.get("method") in ("GET", "DELETE")]
    assert {e["method"] for e in reached} == {"GET", "DELETE"}
    assert all(e["path"].startswith(root) for e in reached), reached
