"""Kinds of token some models price apart from the rest, each at its own price in the one pricing
function and in the hold: a prompt's audio (`audio_input`: GPT-4o audio bills it 16 times its text),
spoken output (`audio_output`), an image edit's input images (`image_input`: GPT image models bill
them twice their text) and Anthropic's one-hour cache writes (`cache_write_1h`: twice input against
1.25 times for five minutes). Before, each was billed and held at the price of its whole."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest
from test_media_prompt import _b64, _wav

from gateway import billing
from gateway.config import ConfigError, Prices, load_settings
from gateway.core import count_prompt_tokens
from gateway.pricing import Usage, cost, format_cost, round_significant
from gateway.sim.images import png
from harness import Gateway, gateway

AUDIO, PLAIN, CLAUDE, IMAGE = (
    "openai/gpt-4o-audio",
    "openai/gpt-4o-text",
    "anthropic/claude-hour",
    "openai/image-kinds",
)
TRANSCRIBE = "openai/gpt-4o-transcribe"
AUDIO_PRICES = Prices(
    input=Decimal("2.50"),
    cached_input=Decimal("1.25"),
    cache_write=Decimal("2.50"),
    cache_write_1h=Decimal("2.50"),
    audio_input=Decimal(40),
    image_input=Decimal("2.50"),
    output=Decimal(10),
    reasoning=Decimal(10),
    audio_output=Decimal(80),
)
CLAUDE_PRICES = Prices(
    input=Decimal(3),
    cached_input=Decimal("0.30"),
    cache_write=Decimal("3.75"),
    cache_write_1h=Decimal(6),
    audio_input=Decimal(3),
    image_input=Decimal(3),
    output=Decimal(15),
    reasoning=Decimal(15),
    audio_output=Decimal(15),
)
IMAGE_PRICES = Prices(
    input=Decimal(5),
    cache_write=Decimal(5),
    cache_write_1h=Decimal(5),
    audio_input=Decimal(5),
    image_input=Decimal(10),
    output=Decimal(40),
    reasoning=Decimal(40),
    audio_output=Decimal(40),
)


def models(sim_url: str) -> str:
    return f"""
[[models]]
name = "{AUDIO}"
type = "chat"
max_output_tokens = 256
[models.prices]
input = "2.50"
cached_input = "1.25"
audio_input = "40"
output = "10"
audio_output = "80"
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
model = "gpt-4o-audio-preview"

[[models]]
name = "{PLAIN}"
type = "chat"
max_output_tokens = 256
[models.prices]
input = "2.50"
output = "10"
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
model = "gpt-4o"

[[models]]
name = "{CLAUDE}"
type = "messages"
max_output_tokens = 64
[models.prices]
input = "3"
cached_input = "0.30"
cache_write = "3.75"
cache_write_1h = "6"
output = "15"
[[models.channels]]
provider = "anthropic"
base_url = "{sim_url}"
model = "claude-sonnet-4-5"

[[models]]
name = "{TRANSCRIBE}"
type = "transcription"
max_output_tokens = 2000
[models.prices]
input = "2.50"
audio_input = "6"
output = "10"
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
model = "gpt-4o-transcribe"

[[models]]
name = "{IMAGE}"
type = "image"
max_output_tokens = 4160
[models.prices]
input = "5"
image_input = "10"
output = "40"
[[models.channels]]
provider = "openai"
base_url = "{sim_url}/v1"
model = "gpt-image-1"
"""


@pytest.fixture(scope="module")
def kgw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with gateway(tmp_path_factory.mktemp("token-kinds"), models(sim_url)) as g:
        yield g


def _spoken_prompt(seconds: int) -> list[Any]:
    clip = {"type": "input_audio", "input_audio": {"data": _b64(_wav(seconds)), "format": "wav"}}
    return [{"role": "user", "content": [{"type": "text", "text": "Say it back [sim tokens=5]"}, clip]}]


# ------------------------------------------------------------------ the pricing function


def test_each_kind_is_priced_at_its_own_price_and_never_beyond_its_whole() -> None:
    text = cost(AUDIO_PRICES, Usage(1_000, 100))
    assert text == Decimal("0.0035")
    # 600 of the prompt's 1,000 tokens are audio, 80 of the output's 100.
    spoken = cost(AUDIO_PRICES, Usage(1_000, 100, audio_prompt_tokens=600, audio_completion_tokens=80))
    assert spoken == (400 * Decimal("2.50") + 600 * 40 + 20 * 10 + 80 * 80) / 1_000_000
    # A part larger than its whole is all of it; cached tokens come first, reasoning first.
    assert cost(AUDIO_PRICES, Usage(100, 10, audio_prompt_tokens=500, audio_completion_tokens=50)) == (
        100 * 40 + 10 * 80
    ) / Decimal(1_000_000)
    assert cost(AUDIO_PRICES, Usage(100, 10, cached_tokens=40, audio_prompt_tokens=100)) == (
        40 * Decimal("1.25") + 60 * 40 + 10 * 10
    ) / Decimal(1_000_000)
    assert cost(AUDIO_PRICES, Usage(0, 10, reasoning_tokens=8, audio_completion_tokens=8)) == (
        8 * 10 + 2 * 80
    ) / Decimal(1_000_000)
    # The hour's writes, of the writes.
    hour = cost(CLAUDE_PRICES, Usage(1_000, 0, cache_write_tokens=800, cache_write_1h_tokens=500))
    assert hour == (200 * 3 + 300 * Decimal("3.75") + 500 * 6) / Decimal(1_000_000)
    assert cost(CLAUDE_PRICES, Usage(1_000, 0, cache_write_1h_tokens=500)) == Decimal("0.003")
    # An edit's input images.
    images = cost(IMAGE_PRICES, Usage(400, 1_000, image_prompt_tokens=323))
    assert images == round_significant((77 * 5 + 323 * 10 + 1_000 * 40) / Decimal(1_000_000))


def test_the_prices_default_to_the_price_of_their_whole(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[[models]]\nname = "m/one"\ntype = "chat"\n'
        '[models.prices]\ninput = "2"\noutput = "8"\ncache_write = "2.5"\n'
        '[[models.channels]]\nprovider = "openai"\nbase_url = "http://127.0.0.1:1/v1"\n'
    )
    prices = load_settings(config).models[0].prices
    assert (prices.audio_input, prices.image_input, prices.cache_write_1h) == (
        Decimal(2),
        Decimal(2),
        Decimal("2.5"),
    )
    assert prices.audio_output == 8
    config.write_text(config.read_text().replace('cache_write = "2.5"', 'audio_input = "x"'))
    with pytest.raises(ConfigError, match="audio_input"):
        load_settings(config)


# ------------------------------------------------------------------ the hold


def test_the_hold_prices_each_kind_at_its_dearest() -> None:
    from gateway.config import ModelConfig

    model = ModelConfig(name="m", type="chat", channels=(), prices=AUDIO_PRICES, max_output_tokens=100)
    held = billing.estimate_usage(
        model, 1_000, {"modalities": ["text", "audio"]}, "max_tokens", audio_tokens=600
    )
    assert (held.audio_prompt_tokens, held.audio_completion_tokens) == (600, 100)
    assert cost(AUDIO_PRICES, held) == (400 * Decimal("2.50") + 600 * 40 + 100 * 80) / Decimal(1_000_000)
    # Text output only: the output at the text price.
    quiet = billing.estimate_usage(model, 1_000, {}, "max_tokens", audio_tokens=600)
    assert quiet.audio_completion_tokens == 0 and quiet.audio_prompt_tokens == 600
    # Claude: the prompt at the hour's write price, the dearest it may be billed at.
    claude = ModelConfig(name="c", type="messages", channels=(), prices=CLAUDE_PRICES, max_output_tokens=10)
    prompt = billing.estimate_usage(claude, 1_000, {}, "max_tokens")
    assert cost(CLAUDE_PRICES, prompt) == (1_000 * 6 + 10 * 15) / Decimal(1_000_000)


def test_the_prompt_count_says_its_audio() -> None:
    body = {"messages": _spoken_prompt(3)}
    tokens, audio = count_prompt_tokens(orjson.dumps(body))
    assert audio == 30 and tokens > audio  # 10 a second


def test_a_long_clip_is_refused_at_the_audio_price(kgw: Gateway) -> None:
    """60 s of audio is 600 tokens: $0.0015 at the text price, $0.024 at the audio price. A balance
    between the two runs the same prompt on a text-priced model and is refused on the audio one."""
    body = {"messages": _spoken_prompt(60), "max_tokens": 1}
    for model, status in ((PLAIN, 200), (AUDIO, 400)):
        handle = kgw.new_key(balance="0.01")
        with kgw.client(handle.key) as http:
            r = http.post("/v1/chat/completions", json={**body, "model": model})
        assert r.status_code == status, r.text
        if status == 400:
            assert r.json()["error"]["code"] == "insufficient_credits"


# ------------------------------------------------------------------ end to end, with the official clients


@pytest.mark.parametrize("stream", [False, True])
def test_spoken_chat_is_charged_its_audio_at_the_audio_prices(kgw: Gateway, stream: bool) -> None:
    handle = kgw.new_key(balance="5")
    kwargs: dict[str, Any] = {
        "model": AUDIO,
        "messages": _spoken_prompt(4),
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "wav"},
        "max_completion_tokens": 200,
    }
    with openai.OpenAI(base_url=kgw.openai_base, api_key=handle.key, max_retries=0) as oai:
        if stream:
            raw = oai.chat.completions.with_raw_response.create(
                **kwargs, stream=True, stream_options={"include_usage": True}
            )
            chunks = list(raw.parse())
            usage = chunks[-1].usage
            said = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
            transcript = "".join(a.transcript or "" for a in said)
        else:
            raw = oai.chat.completions.with_raw_response.create(**kwargs)
            answer = raw.parse()
            usage = answer.usage
            assert answer.choices[0].message.audio is not None
            transcript = answer.choices[0].message.audio.transcript
    assert usage is not None and transcript
    heard = usage.prompt_tokens_details.audio_tokens if usage.prompt_tokens_details else 0
    spoken = usage.completion_tokens_details.audio_tokens if usage.completion_tokens_details else 0
    assert heard == 40 and spoken
    expected = cost(
        AUDIO_PRICES,
        Usage(
            usage.prompt_tokens,
            usage.completion_tokens,
            audio_prompt_tokens=heard,
            audio_completion_tokens=spoken,
        ),
    )
    assert expected > cost(AUDIO_PRICES, Usage(usage.prompt_tokens, usage.completion_tokens))
    if not stream:  # a stream's cost is known only after its head: in the usage record
        assert raw.headers["x-service-cost"] == format_cost(expected)
    assert kgw.wait_balance(handle.account_id, 5 - expected) == 5 - expected


@pytest.mark.parametrize("stream", [False, True])
def test_an_hour_long_cache_write_is_charged_at_its_price(kgw: Gateway, stream: bool) -> None:
    handle = kgw.new_key(balance="5")
    rules = f"{uuid.uuid4().hex} " + "Answer as a patient librarian would, citing shelves. " * 40
    system: Any = [{"type": "text", "text": rules, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    messages: list[Any] = [{"role": "user", "content": "hello [sim tokens=4]"}]
    with anthropic.Anthropic(api_key=handle.key, base_url=kgw.url, max_retries=0) as claude:
        if stream:
            with claude.messages.stream(model=CLAUDE, max_tokens=16, system=system, messages=messages) as s:
                usage = s.get_final_message().usage
        else:
            usage = claude.messages.create(
                model=CLAUDE, max_tokens=16, system=system, messages=messages
            ).usage
    written = usage.cache_creation_input_tokens or 0
    by_ttl = usage.cache_creation
    assert written and by_ttl is not None and by_ttl.ephemeral_1h_input_tokens == written
    prompt = usage.input_tokens + written + (usage.cache_read_input_tokens or 0)
    expected = cost(
        CLAUDE_PRICES,
        Usage(prompt, usage.output_tokens, cache_write_tokens=written, cache_write_1h_tokens=written),
    )
    assert expected > cost(CLAUDE_PRICES, Usage(prompt, usage.output_tokens, cache_write_tokens=written))
    assert kgw.wait_balance(handle.account_id, 5 - expected) == 5 - expected


def test_the_chat_shape_bills_an_hour_long_write_of_a_messages_model() -> None:
    from gateway.translate.usage import messages_usage, usage_from_messages

    usage = usage_from_messages(
        {
            "input_tokens": 5,
            "cache_creation_input_tokens": 100,
            "cache_creation": {"ephemeral_5m_input_tokens": 40, "ephemeral_1h_input_tokens": 60},
            "output_tokens": 3,
        }
    )
    assert (usage.prompt_tokens, usage.cache_write_tokens, usage.cache_write_1h_tokens) == (105, 100, 60)
    assert messages_usage(usage)["cache_creation"] == {
        "ephemeral_5m_input_tokens": 40,
        "ephemeral_1h_input_tokens": 60,
    }
    # Only the breakdown given (review): the writes are its sum, as the core reads a stream's.
    parts = usage_from_messages(
        {
            "input_tokens": 5,
            "cache_creation": {"ephemeral_5m_input_tokens": 40, "ephemeral_1h_input_tokens": 60},
        }
    )
    assert (parts.prompt_tokens, parts.cache_write_tokens, parts.cache_write_1h_tokens) == (105, 100, 60)


def test_an_edits_input_images_are_charged_and_held_at_the_image_price(kgw: Gateway) -> None:
    handle = kgw.new_key(balance="5")
    with openai.OpenAI(base_url=kgw.openai_base, api_key=handle.key, max_retries=0) as oai:
        raw = oai.images.with_raw_response.edit(
            model=IMAGE, image=("a.png", png(4, 4, b"\x10\x80\xf0")), prompt="a hat", size="1024x1024"
        )
        usage = raw.parse().usage
    assert usage is not None and usage.input_tokens_details.image_tokens
    expected = cost(
        IMAGE_PRICES,
        Usage(
            usage.input_tokens,
            usage.output_tokens,
            image_prompt_tokens=usage.input_tokens_details.image_tokens,
            images=1,
        ),
    )
    assert expected > cost(IMAGE_PRICES, Usage(usage.input_tokens, usage.output_tokens, images=1))
    assert raw.headers["x-service-cost"] == format_cost(expected)
    # The hold counts each source image at the model's image_tokens (1,600 here), at that price:
    # a balance that covers the rest is refused.
    hold = cost(IMAGE_PRICES, Usage(1_601, 4_160, image_prompt_tokens=1_600))
    balance = hold - Decimal("0.0001")
    assert balance > cost(IMAGE_PRICES, Usage(1, 4_160)) + cost(IMAGE_PRICES, Usage(1_600))
    poor = kgw.new_key(balance=str(balance))
    with (
        openai.OpenAI(base_url=kgw.openai_base, api_key=poor.key, max_retries=0) as oai,
        pytest.raises(openai.BadRequestError) as refused,
    ):
        oai.images.edit(
            model=IMAGE, image=("a.png", png(4, 4, b"\x10\x80\xf0")), prompt="a", size="1024x1024"
        )
    assert refused.value.code == "insufficient_credits"
    assert f"${format_cost(hold)}" in str(refused.value)


def test_model_group_info_shows_the_kinds_prices(kgw: Gateway) -> None:
    with kgw.client(kgw.new_key().key) as http:
        info = http.get("/model_group/info", params={"model_group": AUDIO}).json()["data"][0]
    assert info["audio_input_cost_per_million_tokens"] == "40"
    assert info["audio_output_cost_per_million_tokens"] == "80"
    assert info["cache_write_1h_cost_per_million_tokens"] == "2.50"


def test_the_cores_counts_come_in_usages_order() -> None:
    """reported_usage takes the core's counts positionally (StreamUsage.counts): each lands in the
    field of its name."""
    from gateway.core import parse_chat_usage, parse_messages_usage
    from gateway.pricing import reported_usage

    chat = parse_chat_usage(
        b'{"usage":{"prompt_tokens":90,"completion_tokens":40,"prompt_tokens_details":{"cached_tokens":7,'
        b'"cache_write_tokens":5,"audio_tokens":60},"completion_tokens_details":{"reasoning_tokens":3,'
        b'"audio_tokens":30}}}'
    )
    message = parse_messages_usage(
        b'{"usage":{"input_tokens":1,"cache_creation_input_tokens":20,'
        b'"cache_creation":{"ephemeral_1h_input_tokens":15},"output_tokens":4}}'
    )
    assert chat is not None and message is not None
    for reported in (chat, message):
        usage = reported_usage(reported)
        for name in (
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "reasoning_tokens",
            "cache_write_tokens",
            "audio_prompt_tokens",
            "cache_write_1h_tokens",
            "audio_completion_tokens",
        ):
            assert getattr(usage, name) == getattr(reported, name), name
        assert usage.image_prompt_tokens == 0 and usage.searches == 0 and usage.image_size is None
    translated = Usage(5, 6, audio_prompt_tokens=2)
    assert reported_usage(translated) is translated


# ------------------------------------------------------------------ streams cut short, audio named by id


def test_a_stream_cut_short_bills_its_prompts_audio_at_the_audio_price(kgw: Gateway) -> None:
    """The upstream's usage comes only at a chat stream's end: a stream the client leaves bills the
    gateway's count of its prompt, its audio at the audio price (before, all at the input price)."""
    handle = kgw.new_key(balance="5")
    messages = _spoken_prompt(40)
    messages[0]["content"][0]["text"] = "Say it back [sim tokens=50 pace=0.05]"
    body = {"model": AUDIO, "messages": messages, "max_tokens": 100, "stream": True}
    with kgw.client(handle.key) as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: {"))
        for _ in zip(range(6), lines, strict=False):  # a few chunks, then away
            pass
    rid = orjson.loads(first.removeprefix("data: "))["id"]
    record = kgw.usage_record(handle.key, rid)
    assert record["status"] == "incomplete"
    audio = 400  # 40 s at 10 tokens a second
    prompt, completion = record["usage"]["prompt_tokens"], record["usage"]["completion_tokens"]
    expected = cost(AUDIO_PRICES, Usage(prompt, completion, audio_prompt_tokens=audio))
    assert Decimal(str(record["cost"])) == expected
    assert expected > cost(AUDIO_PRICES, Usage(prompt, completion)) * 10


def test_a_messages_stream_cut_short_bills_its_hour_long_writes_at_their_price(kgw: Gateway) -> None:
    """message_start says the prompt's split (cache reads, writes kept an hour): a stream the client
    leaves is billed that split, not the whole prompt at the input price."""
    handle = kgw.new_key(balance="5")
    rules = f"{uuid.uuid4().hex} " + "Answer as a patient librarian would, citing shelves. " * 40
    body = {
        "model": CLAUDE,
        "max_tokens": 60,
        "stream": True,
        "system": [{"type": "text", "text": rules, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [{"role": "user", "content": "hello [sim tokens=50 pace=0.05]"}],
    }
    started: dict[str, Any] = {}
    with kgw.client(handle.key) as http, http.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200
        deltas = 0
        for line in r.iter_lines():
            if line.startswith("data: {") and '"message_start"' in line:
                started = orjson.loads(line.removeprefix("data: "))["message"]
            elif line.startswith("data: {") and '"content_block_delta"' in line:
                deltas += 1
                if deltas == 3:
                    break
    written = started["usage"]["cache_creation_input_tokens"]
    assert written and started["usage"]["cache_creation"]["ephemeral_1h_input_tokens"] == written
    record = kgw.usage_record(handle.key, started["id"])
    assert record["status"] == "incomplete"
    prompt, completion = record["usage"]["prompt_tokens"], record["usage"]["completion_tokens"]
    expected = cost(
        CLAUDE_PRICES, Usage(prompt, completion, cache_write_tokens=written, cache_write_1h_tokens=written)
    )
    assert Decimal(str(record["cost"])) == expected > cost(CLAUDE_PRICES, Usage(prompt, completion))


def test_audio_named_by_id_is_held_at_the_most_the_model_speaks(kgw: Gateway) -> None:
    """An assistant message's `"audio": {"id": ...}` is an earlier spoken answer, billed again as
    audio input, its bytes never passing the gateway: held at the model's max_output_tokens (256
    here) of audio each. Five of them at $40 a million are $0.0512: refused on $0.02."""
    messages: list[Any] = [{"role": "assistant", "audio": {"id": f"audio_{i}"}} for i in range(5)]
    messages.append({"role": "user", "content": "and now? [sim tokens=2]"})
    handle = kgw.new_key(balance="0.02")
    with kgw.client(handle.key) as http:
        named = http.post(
            "/v1/chat/completions", json={"model": AUDIO, "max_tokens": 1, "messages": messages}
        )
        plain = http.post(
            "/v1/chat/completions", json={"model": AUDIO, "max_tokens": 1, "messages": messages[-1:]}
        )
    assert named.status_code == 400 and named.json()["error"]["code"] == "insufficient_credits"
    assert plain.status_code == 200, plain.text


def test_a_transcription_billed_by_tokens_prices_its_audio_apart(kgw: Gateway) -> None:
    """gpt-4o-transcribe reports its input as audio tokens (input_token_details.audio_tokens), at
    the model's audio_input price; the hold counts the upload's length as such tokens too."""
    handle = kgw.new_key(balance="5")
    wav = _wav(30)
    with openai.OpenAI(base_url=kgw.openai_base, api_key=handle.key, max_retries=0) as oai:
        raw = oai.audio.transcriptions.with_raw_response.create(model=TRANSCRIBE, file=("a.wav", wav))
        answer = raw.parse()
    usage = answer.usage
    assert usage is not None and usage.type == "tokens"
    heard = usage.input_token_details.audio_tokens if usage.input_token_details else 0
    assert heard == 300
    expected = cost(
        Prices(input=Decimal("2.50"), audio_input=Decimal(6), output=Decimal(10)),
        Usage(usage.input_tokens, usage.output_tokens, audio_prompt_tokens=heard),
    )
    assert raw.headers["x-service-cost"] == format_cost(expected)


def test_a_spoken_stream_cut_before_its_usage_bills_its_transcript_as_audio(kgw: Gateway) -> None:
    """A spoken answer's audio tokens come only in its final usage: one the client leaves before
    that is billed its delivered transcript's tokens at the audio output price, the least its
    audio can have taken (before: at the text price)."""
    handle = kgw.new_key(balance="5")
    body = {
        "model": AUDIO,
        "messages": [{"role": "user", "content": "Speak [sim tokens=60 pace=0.05]"}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "wav"},
        "max_completion_tokens": 250,
        "stream": True,
    }
    with kgw.client(handle.key) as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: {"))
        for _ in zip(range(8), lines, strict=False):  # a few words said, then away
            pass
    record = kgw.usage_record(handle.key, orjson.loads(first.removeprefix("data: "))["id"])
    assert record["status"] == "incomplete"
    prompt, completion = record["usage"]["prompt_tokens"], record["usage"]["completion_tokens"]
    assert 0 < completion < 60
    expected = cost(AUDIO_PRICES, Usage(prompt, completion, audio_completion_tokens=completion))
    assert Decimal(str(record["cost"])) == expected > cost(AUDIO_PRICES, Usage(prompt, completion))
