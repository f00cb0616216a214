"""Vertex AI channels (provider = "vertex"): Gemini (chat) and Anthropic's models (messages) in a
Google Cloud project, signed in with a service account's key through google-auth."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from test_responses_translation import check_responses_shape
from test_translation import usage_record

from gateway.config import ConfigError, Prices, parse_settings
from gateway.core import count_chat_tokens, count_tokens
from gateway.pricing import Usage, cost
from harness import Gateway, chat_stream, gateway

GEMINI = "vertex/gemini-2.5-flash"
CLAUDE = "vertex/claude-sonnet-4-5"
EMBED = "vertex/text-embedding-005"
GEMINI_EMBED = "vertex/gemini-embedding-001"
# As the config below prices them.
GEMINI_PRICES = Prices(input=Decimal("0.30"), output=Decimal("2.50"), reasoning=Decimal("2.50"))
EMBED_PRICES = Prices(input=Decimal("0.025"))
CLAUDE_PRICES = Prices(input=Decimal(3), output=Decimal(15), reasoning=Decimal(15))


def service_account(tmp: Path, token_uri: str) -> Path:
    """A service account key file as Google issues them, its token endpoint the simulator's."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    path = tmp / "service-account.json"
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "sim-project",
                "private_key_id": "k1",
                "private_key": pem,
                "client_email": "gateway@sim-project.iam.gserviceaccount.com",
                "client_id": "1234567890",
                "token_uri": token_uri,
            }
        )
    )
    return path


def models(sim_url: str, key_file: Path) -> str:
    channel = f"""
provider = "vertex"
base_url = "{sim_url}"
project = "sim-project"
location = "us-east5"
credentials_file = "{key_file}"
"""
    return f"""
[[models]]
name = "{GEMINI}"
type = "chat"
[models.prices]
input = "0.30"
output = "2.50"
[[models.channels]]
model = "gemini-2.5-flash"
{channel}

[[models]]
name = "{EMBED}"
type = "embedding"
[models.prices]
input = "0.025"
[[models.channels]]
model = "text-embedding-005"
{channel}

[[models]]
name = "{GEMINI_EMBED}"
type = "embedding"
[models.prices]
input = "0.15"
[[models.channels]]
model = "gemini-embedding-001"
{channel}

[[models]]
name = "{CLAUDE}"
type = "messages"
[models.prices]
input = "3"
output = "15"
[[models.channels]]
model = "claude-sonnet-4-5@20250929"
{channel}
"""


@pytest.fixture(scope="module")
def vgw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("vertex")
    with gateway(tmp, models(sim_url, service_account(tmp, sim_url + "/token"))) as g:
        yield g


def requests_to(sim: httpx.Client, fragment: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = sim.get("/_sim/requests").json()
    return [e for e in entries if fragment in e["path"]]


def test_gemini_on_vertex_plain_and_streamed(vgw: Gateway, sim: httpx.Client) -> None:
    handle = vgw.new_key()
    with openai.OpenAI(api_key=handle.key, base_url=vgw.url + "/v1", max_retries=0) as oai:
        answer = oai.chat.completions.create(
            model=GEMINI, messages=[{"role": "user", "content": "hello [sim tokens=4]"}]
        )
        chunks = list(
            oai.chat.completions.create(
                model=GEMINI,
                messages=[{"role": "user", "content": "again [sim tokens=9]"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9
    paths = {e["path"] for e in requests_to(sim, "/publishers/google/")}
    base = "/v1/projects/sim-project/locations/us-east5/publishers/google/models/gemini-2.5-flash"
    assert {base + ":generateContent", base + ":streamGenerateContent"} <= paths
    tokens = requests_to(sim, "/token")
    assert tokens and tokens[-1]["claims"]["iss"] == "gateway@sim-project.iam.gserviceaccount.com"


def test_anthropic_on_vertex_plain_and_streamed(vgw: Gateway) -> None:
    handle = vgw.new_key()
    with anthropic.Anthropic(api_key=handle.key, base_url=vgw.url, max_retries=0) as claude:
        message = claude.messages.create(
            model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi [sim tokens=5]"}]
        )
        assert message.stop_reason == "end_turn" and message.usage.output_tokens == 5
        with claude.messages.stream(
            model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "go [sim tokens=7]"}]
        ) as stream:
            final = stream.get_final_message()
        assert final.usage.output_tokens == 7
        # The chat shape reaches the same model through translation.
        with openai.OpenAI(api_key=handle.key, base_url=vgw.url + "/v1", max_retries=0) as oai:
            answer = oai.chat.completions.create(
                model=CLAUDE, messages=[{"role": "user", "content": "x [sim tokens=3]"}]
            )
        assert answer.usage is not None and answer.usage.completion_tokens == 3


def test_streams_cut_short_are_billed_for_what_was_delivered(vgw: Gateway) -> None:
    """Spec 6.1.9 through Vertex, both publishers: the whole prompt and exactly the output the client
    was sent. Gemini's usage comes with its last event, so its prompt is the gateway's own count;
    Anthropic's message_start reports the input, which is billed."""
    handle = vgw.new_key(balance="10")
    # Paced: a reset arriving with events still unread would discard them (see test_early_end).
    got = chat_stream(vgw, handle.key, GEMINI, "cut [sim tokens=20 drop_after=6 pace=30ms]")
    assert len(got.text.split()) == 6 and "provider_error" in got.events[-1]
    gemini = cost(GEMINI_PRICES, Usage(count_chat_tokens(got.body), count_tokens(got.text)))
    assert vgw.wait_balance(handle.account_id, Decimal(10) - gemini) == Decimal(10) - gemini

    body = {
        "model": CLAUDE,
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "cut [sim tokens=20 drop_after=4 pace=30ms]"}],
    }
    with httpx.stream(
        "POST", f"{vgw.url}/v1/messages", json=body, headers={"x-api-key": handle.key}, timeout=30
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert len(text.split()) == 4 and events[-1]["type"] == "error"
    record = usage_record(vgw, handle, events[0]["message"]["id"])
    assert record["status"] == "incomplete"
    assert record["usage"]["prompt_tokens"] == events[0]["message"]["usage"]["input_tokens"] > 0
    assert record["usage"]["completion_tokens"] == count_tokens(text)
    claude = cost(CLAUDE_PRICES, Usage(record["usage"]["prompt_tokens"], count_tokens(text)))
    assert Decimal(str(record["cost"])) == claude
    left = Decimal(10) - gemini - claude
    assert vgw.wait_balance(handle.account_id, left) == left


def test_embeddings_through_predict_billed_from_vertex_s_counts(vgw: Gateway, sim: httpx.Client) -> None:
    handle = vgw.new_key(balance="5")
    with openai.OpenAI(api_key=handle.key, base_url=vgw.url + "/v1", max_retries=0) as oai:
        raw = oai.embeddings.with_raw_response.create(
            model=EMBED, input=["one fish", "two fish"], dimensions=8, encoding_format="float"
        )
        floats = raw.parse()
        packed = oai.embeddings.create(model=EMBED, input="one fish", dimensions=8)  # the SDK asks for base64
    assert [len(d.embedding) for d in floats.data] == [8, 8] and [d.index for d in floats.data] == [0, 1]
    assert packed.data[0].embedding == pytest.approx(floats.data[0].embedding)
    # Vertex's own token counts (each prediction's statistics.token_count), as billed.
    assert floats.usage.prompt_tokens == count_tokens("one fish") + count_tokens("two fish")
    assert Decimal(raw.headers["x-service-cost"]) == cost(EMBED_PRICES, Usage(floats.usage.prompt_tokens))
    (sent, _) = [e for e in requests_to(sim, "/text-embedding-005:predict")][-2:]
    assert sent["body"] == {
        "instances": [{"content": "one fish"}, {"content": "two fish"}],
        "parameters": {"autoTruncate": False, "outputDimensionality": 8},
    }
    charged = cost(EMBED_PRICES, Usage(floats.usage.prompt_tokens)) + cost(
        EMBED_PRICES, Usage(packed.usage.prompt_tokens)
    )
    assert vgw.wait_balance(handle.account_id, Decimal(5) - charged) == Decimal(5) - charged


def test_embedding_requests_vertex_refuses_are_400_with_its_reason(vgw: Gateway) -> None:
    handle = vgw.new_key(balance="5")
    with openai.OpenAI(api_key=handle.key, base_url=vgw.url + "/v1", max_retries=0) as oai:
        one = oai.embeddings.create(model=GEMINI_EMBED, input="one text", encoding_format="float")
        assert len(one.data) == 1 and len(one.data[0].embedding) == 768
        # gemini-embedding-001 takes one text per predict call (Google's limit, passed on).
        with pytest.raises(openai.BadRequestError) as caught:
            oai.embeddings.create(model=GEMINI_EMBED, input=["a", "b"])
        assert "at most 1 instance" in caught.value.message
        with pytest.raises(openai.BadRequestError) as tokens:
            oai.embeddings.create(model=EMBED, input=[[1, 2, 3]])
    body = tokens.value.body
    assert isinstance(body, dict) and body["param"] == "input" and "Vertex AI embeds texts" in body["message"]


def test_a_key_google_refuses_is_the_gateways_fault(sim_url: str, tmp_path: Path) -> None:
    key_file = service_account(tmp_path, sim_url + "/wrong-token-endpoint")
    with gateway(tmp_path, models(sim_url, key_file)) as g:
        handle = g.new_key()
        with (
            openai.OpenAI(api_key=handle.key, base_url=g.url + "/v1", max_retries=0) as oai,
            pytest.raises(openai.APIStatusError) as caught,
        ):
            oai.chat.completions.create(model=GEMINI, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "provider_error"


def test_a_vertex_channel_names_its_project_and_location() -> None:
    channel = {"provider": "vertex", "base_url": "https://us-east5-aiplatform.googleapis.com", "model": "m"}
    with pytest.raises(ConfigError, match="project: required for a vertex channel"):
        parse_settings(
            {"models": [{"name": "vertex/m", "type": "chat", "channels": [channel]}]}, Path("/tmp")
        )


def test_the_responses_shape_through_vertex(vgw: Gateway) -> None:
    check_responses_shape(vgw, GEMINI)
