"""content_filtered (spec 7.2, 7.5.2): an upstream's content-policy refusal, and the gateway's own
safety check run by a moderation model through its channels before the model runs; POST
/v1/moderations. Through real processes and the official openai and anthropic clients."""

from __future__ import annotations

import base64
import json
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.config import ConfigError, parse_settings
from gateway.errors import GatewayError
from gateway.providers.base import upstream_error
from gateway.safety import CHECKED_FIELDS, request_texts
from harness import Gateway, KeyHandle, chat_model, gateway, request_logs

TOKEN_ENV = "GATEWAY_TEST_ADMIN_TOKEN"
TOKEN = "admin-" + "0123456789abcdef" * 3
MODERATION = "openai/omni-moderation-latest"
BROKEN_MODERATION = "sim/broken-moderation"
CHAT = "openai/gpt-4o-mini"  # checked by [safety] model
UNCHECKED = "openai/gpt-4o-unchecked"  # safety = false
FRAGILE = "openai/fragile"  # checked by a moderation model whose upstream fails
MESSAGES = "anthropic/claude-sonnet-4-5"
RESPONSES = "openai/gpt-4.1-mini"
IMAGE = "openai/gpt-image-1"


def models_toml(sim_url: str) -> str:
    config = chat_model(MODERATION, "omni-moderation-latest", sim_url, type_="moderation")
    config += chat_model(BROKEN_MODERATION, "omni-moderation-latest+fail=503", sim_url, type_="moderation")
    config += chat_model(CHAT, "gpt-4o-mini", sim_url)
    config += chat_model(UNCHECKED, "gpt-4o-mini", sim_url, extra="safety = false")
    config += chat_model(FRAGILE, "gpt-4o-mini", sim_url, extra=f'safety = "{BROKEN_MODERATION}"')
    config += chat_model(MESSAGES, "claude-sonnet-4-5", sim_url, type_="messages", provider="anthropic")
    config += chat_model(RESPONSES, "gpt-4.1-mini", sim_url, type_="responses")
    config += chat_model(IMAGE, "gpt-image-1", sim_url, type_="image")
    return config


@pytest.fixture(scope="module")
def sgw(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = models_toml(sim_url)
    config += f'\n[safety]\nmodel = "{MODERATION}"\n[admin]\ntoken_env = "{TOKEN_ENV}"\n'
    with gateway(tmp_path_factory.mktemp("safety"), config, env={TOKEN_ENV: TOKEN}) as g:
        yield g


@pytest.fixture
def handle(sgw: Gateway) -> KeyHandle:
    return sgw.new_key()


@pytest.fixture
def admin(sgw: Gateway) -> Iterator[httpx.Client]:
    with sgw.admin(TOKEN) as c:
        yield c


@pytest.fixture
def oai(sgw: Gateway, handle: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=sgw.openai_base, api_key=handle.key, max_retries=0) as c:
        yield c


@pytest.fixture
def claude(sgw: Gateway, handle: KeyHandle) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=sgw.url, api_key=handle.key, max_retries=0) as c:
        yield c


def unique(text: str) -> str:
    """A prompt no other test sends, to find exactly this test's requests in the simulator."""
    return f"{text} ({uuid.uuid4().hex})"


def received(sim: httpx.Client, path: str, marker: str) -> int:
    """How many requests to `path` carrying `marker` the simulator received."""
    entries = sim.get("/_sim/requests").json()
    return sum(1 for e in entries if e.get("path") == path and marker in str(e.get("body")))


def usage_absent(gw: Gateway, key: str, usage_id: str) -> bool:
    time.sleep(0.3)  # a usage record would be there by now
    with gw.client(key) as c:
        return c.get(f"/v1/usage/{usage_id}").status_code == 404


# --- an upstream's refusal under its content policy -------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_content_policy_refusal_is_content_filtered(
    sgw: Gateway,
    handle: KeyHandle,
    admin: httpx.Client,
    oai: openai.OpenAI,
    sim: httpx.Client,
    stream: bool,
) -> None:
    prompt = unique("[sim fail=content_policy] tell me")
    before = sgw.balance(handle.account_id)
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model=UNCHECKED, messages=[{"role": "user", "content": prompt}], stream=stream
        )
    err = caught.value
    assert err.status_code == 400 and err.code == "content_filtered"
    assert err.type == "content_policy_violation"
    assert "content policy" in err.message and "safety system" in err.message
    # Not retried (the same input gets the same answer on every channel), not charged.
    assert received(sim, "/v1/chat/completions", prompt) == 1
    assert sgw.wait_balance(handle.account_id, before) == before
    request_id = err.response.headers["x-service-request-id"]
    assert usage_absent(sgw, handle.key, request_id)
    # The usage lookup's 404 is logged too (as every failure is): the refusal's own entry.
    [entry] = [e for e in request_logs(admin, handle.key_id, 2) if e["id"] == request_id]
    assert (entry["id"], entry["status"], entry["error_code"], entry["cost"]) == (
        request_id,
        400,
        "content_filtered",
        None,
    )
    assert entry["model"] == UNCHECKED


def test_anthropic_refusal_is_content_filtered(
    sgw: Gateway, handle: KeyHandle, claude: anthropic.Anthropic, sim: httpx.Client
) -> None:
    prompt = unique("[sim fail=content_policy] write")
    before = sgw.balance(handle.account_id)
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=MESSAGES, max_tokens=50, messages=[{"role": "user", "content": prompt}])
    body = caught.value.body
    assert isinstance(body, dict) and body["error"]["code"] == "content_filtered"
    assert "content filtering policy" in body["error"]["message"]
    assert received(sim, "/v1/messages", prompt) == 1
    assert sgw.wait_balance(handle.account_id, before) == before


OPENAI_IMAGE = {
    "error": {
        "message": "Your request was rejected as a result of our safety system. Your prompt may "
        "contain text that is not allowed by our safety system.",
        "type": "invalid_request_error",
        "param": None,
        "code": "content_policy_violation",
    }
}
GPT_IMAGE = {
    "error": {
        "message": "Your request was rejected by the safety system. safety_violations=[violence].",
        "type": "image_generation_user_error",
        "param": None,
        "code": "moderation_blocked",
    }
}
AZURE = {
    "error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's content "
        "management policy. Please modify your prompt and retry.",
        "type": None,
        "param": "prompt",
        "code": "content_filter",
        "status": 400,
        "innererror": {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                "hate": {"filtered": False, "severity": "safe"},
                "sexual": {"filtered": False, "severity": "safe"},
                "violence": {"filtered": True, "severity": "medium"},
            },
        },
    }
}
REASONING = {
    "error": {
        "message": "Invalid prompt: your prompt was flagged as potentially violating our usage "
        "policy. Please try again with a different prompt.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_prompt",
    }
}
ANTHROPIC = {
    "type": "error",
    "error": {"type": "invalid_request_error", "message": "Output blocked by content filtering policy"},
}
COHERE_OLD = {
    "message": "blocked output: please adjust your prompt and try again, as this generation may "
    "be a potential violation of our Usage Guidelines."
}
OPENROUTER = {
    "error": {
        "code": 403,
        "message": "openai/gpt-4o requires moderation on OpenRouter. Your input was flagged for "
        '"harassment".',
        "metadata": {"reasons": ["harassment"], "flagged_input": "...", "provider_name": "OpenAI"},
    }
}


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, OPENAI_IMAGE),
        (400, GPT_IMAGE),
        (400, AZURE),
        (400, REASONING),
        (400, ANTHROPIC),
        (498, {"message": "blocked input: please adjust your prompt and try again."}),
        (400, COHERE_OLD),
        (403, OPENROUTER),
    ],
)
def test_providers_content_refusals_map_to_content_filtered(status: int, body: dict[str, Any]) -> None:
    err = upstream_error(status, orjson.dumps(body), None)
    assert (err.code, err.status, err.type) == ("content_filtered", 400, "content_policy_violation")
    assert err.retry is None  # not retried, not moved to another channel
    if body is AZURE:
        assert err.message.endswith("(flagged: violence)")


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (
            400,
            {"error": {"message": "Invalid prompt: 'messages' is empty.", "code": "invalid_prompt"}},
            "invalid_request",
        ),
        (
            400,
            {"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}},
            "invalid_request",
        ),
        (
            403,
            {"error": {"message": "Project does not have access to model", "code": "model_not_found"}},
            "provider_error",
        ),
    ],
)
def test_other_upstream_errors_are_not_content_refusals(status: int, body: dict[str, Any], code: str) -> None:
    assert upstream_error(status, orjson.dumps(body), None).code == code


# --- the gateway's own safety check -----------------------------------------------------------


def chat_plain(oai: openai.OpenAI, claude: anthropic.Anthropic, prompt: str) -> None:
    oai.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": prompt}])


def chat_stream(oai: openai.OpenAI, claude: anthropic.Anthropic, prompt: str) -> None:
    for _ in oai.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": prompt}], stream=True
    ):
        pass


def responses_plain(oai: openai.OpenAI, claude: anthropic.Anthropic, prompt: str) -> None:
    oai.responses.create(model=RESPONSES, input=[{"role": "user", "content": prompt}])


def responses_stream(oai: openai.OpenAI, claude: anthropic.Anthropic, prompt: str) -> None:
    for _ in oai.responses.create(model=RESPONSES, input=prompt, stream=True):
        pass


def messages_plain(oai: openai.OpenAI, claude: anthropic.Anthropic, prompt: str) -> None:
    claude.messages.create(model=MESSAGES, max_tokens=50, messages=[{"role": "user", "content": prompt}])


def messages_stream(oai: openai.OpenAI, claude: anthropic.Anthropic, prompt: str) -> None:
    with claude.messages.stream(
        model=MESSAGES,
        max_tokens=50,
        system="Be brief.",
        messages=[{"role": "user", "content": [{"type": "text", "text": prompt}]}],
    ) as events:
        for _ in events:
            pass


Send = Callable[[openai.OpenAI, anthropic.Anthropic, str], None]
SHAPES: list[tuple[Send, str, str]] = [
    (chat_plain, "/v1/chat/completions", "messages"),
    (chat_stream, "/v1/chat/completions", "messages"),
    (responses_plain, "/v1/responses", "input"),
    (responses_stream, "/v1/responses", "input"),
    (messages_plain, "/v1/messages", "messages"),
    (messages_stream, "/v1/messages", "messages"),
]


def error_of(exc: openai.APIStatusError | anthropic.APIStatusError) -> dict[str, Any]:
    body = exc.body if isinstance(exc, anthropic.APIStatusError) else {"error": exc.body}
    assert isinstance(body, dict)
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize(("send", "path", "param"), SHAPES, ids=[s[0].__name__ for s in SHAPES])
def test_safety_check_refuses_before_the_model_runs(
    sgw: Gateway,
    handle: KeyHandle,
    admin: httpx.Client,
    oai: openai.OpenAI,
    claude: anthropic.Anthropic,
    sim: httpx.Client,
    send: Send,
    path: str,
    param: str,
) -> None:
    secret = uuid.uuid4().hex
    prompt = f"how do I hurt {secret} [sim flag=hate,violence]"
    before = sgw.balance(handle.account_id)
    with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as caught:
        send(oai, claude, prompt)
    refused = caught.value
    assert isinstance(refused, openai.BadRequestError | anthropic.BadRequestError)
    error = error_of(refused)
    assert refused.status_code == 400
    assert error["code"] == "content_filtered" and error["param"] == param
    # A streamed request refused before it starts is an ordinary JSON error.
    assert refused.response.headers["content-type"].startswith("application/json")
    assert "hate, violence" in error["message"] and secret not in error["message"]
    assert received(sim, "/v1/moderations", secret) == 1
    assert received(sim, path, secret) == 0  # the model never ran
    assert sgw.wait_balance(handle.account_id, before) == before
    [entry] = request_logs(admin, handle.key_id, 1)
    assert (entry["status"], entry["error_code"], entry["cost"], entry["model"]) == (
        400,
        "content_filtered",
        None,
        {"/v1/chat/completions": CHAT, "/v1/responses": RESPONSES, "/v1/messages": MESSAGES}[path],
    )
    [check] = entry["attempts"]
    assert (check["check"], check["model"], check["verdict"], check["categories"]) == (
        "safety",
        MODERATION,
        "flagged",
        ["hate", "violence"],
    )


def test_passing_check_lets_the_request_run_and_is_not_charged(
    sgw: Gateway, handle: KeyHandle, admin: httpx.Client, oai: openai.OpenAI, sim: httpx.Client
) -> None:
    prompt = unique("Say hello")
    before = sgw.balance(handle.account_id)
    raw = oai.chat.completions.with_raw_response.create(
        model=CHAT, messages=[{"role": "system", "content": "Be kind."}, {"role": "user", "content": prompt}]
    )
    assert raw.parse().choices[0].message.content
    charged = Decimal(raw.headers["x-service-cost"])
    # The check's own cost is not the client's: the balance moves by the model's cost alone.
    assert sgw.wait_balance(handle.account_id, before - charged) == before - charged
    assert received(sim, "/v1/moderations", prompt) == 1
    [moderated] = [e for e in sim.get("/_sim/requests").json() if prompt in str(e.get("body"))][:1]
    assert moderated["body"]["input"] == ["Be kind.", prompt]
    [entry] = request_logs(admin, handle.key_id, 1)
    assert (entry["status"], entry["cost"]) == (200, raw.headers["x-service-cost"])
    check, attempt = entry["attempts"]
    assert (check["check"], check["verdict"], check["categories"]) == ("safety", "passed", [])
    assert "check" not in attempt and attempt["error"] is None


def test_same_input_gets_the_same_answer(sgw: Gateway, handle: KeyHandle) -> None:
    body = {"model": CHAT, "messages": [{"role": "user", "content": "again [sim flag=harassment]"}]}
    with sgw.client(handle.key) as c:
        first, second = (c.post("/v1/chat/completions", json=body) for _ in range(2))
    assert first.status_code == second.status_code == 400
    assert first.json() == second.json()
    assert first.json()["error"]["code"] == "content_filtered"


FLAG = "[sim flag=hate]"
TEXT_FILE = "data:text/plain;base64," + base64.b64encode(f"notes {FLAG}".encode()).decode()
ASKED: Any = {"role": "user", "content": "go on"}
CALLED = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"q": FLAG})}}
TOOL = {"type": "function", "function": {"name": "f", "description": FLAG, "parameters": {"type": "object"}}}
PARAMETER = {"type": "object", "properties": {"q": {"type": "string", "description": FLAG}}}
# Review: each of these reached the model unchecked, and was charged.
HIDDEN: list[tuple[str, str, dict[str, Any]]] = [
    (
        "messages: a plain-text document",
        "/v1/messages",
        {
            "model": MESSAGES,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": FLAG},
                        },
                        {"type": "text", "text": "summarise"},
                    ],
                }
            ],
        },
    ),
    (
        "chat: a text file part",
        "/v1/chat/completions",
        {
            "model": CHAT,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "summarise"},
                        {"type": "file", "file": {"filename": "a.txt", "file_data": TEXT_FILE}},
                    ],
                }
            ],
        },
    ),
    (
        "responses: a text input_file",
        "/v1/responses",
        {
            "model": RESPONSES,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "summarise"},
                        {"type": "input_file", "filename": "a.txt", "file_data": TEXT_FILE},
                    ],
                }
            ],
        },
    ),
    (
        "chat: a tool's description",
        "/v1/chat/completions",
        {"model": CHAT, "messages": [ASKED], "tools": [TOOL]},
    ),
    (
        "chat: a parameter's description",
        "/v1/chat/completions",
        {
            "model": CHAT,
            "messages": [ASKED],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": PARAMETER}}],
        },
    ),
    (
        "messages: a tool's description",
        "/v1/messages",
        {
            "model": MESSAGES,
            "messages": [ASKED],
            "tools": [{"name": "f", "description": FLAG, "input_schema": {"type": "object"}}],
        },
    ),
    (
        "chat: a tool call's arguments",
        "/v1/chat/completions",
        {
            "model": CHAT,
            "messages": [
                ASKED,
                {"role": "assistant", "content": None, "tool_calls": [CALLED]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
            ],
        },
    ),
    (
        "messages: a tool_use's input",
        "/v1/messages",
        {
            "model": MESSAGES,
            "messages": [
                ASKED,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": FLAG}}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "done"}]},
            ],
        },
    ),
    (
        "responses: a function_call's arguments",
        "/v1/responses",
        {
            "model": RESPONSES,
            "input": [
                ASKED,
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": json.dumps({"q": FLAG})},
                {"type": "function_call_output", "call_id": "c1", "output": "done"},
            ],
        },
    ),
    (
        "chat: the prediction",
        "/v1/chat/completions",
        {"model": CHAT, "messages": [ASKED], "prediction": {"type": "content", "content": FLAG}},
    ),
    (
        "chat: the response format's description",
        "/v1/chat/completions",
        {
            "model": CHAT,
            "messages": [ASKED],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "description": FLAG, "schema": {"type": "object"}},
            },
        },
    ),
    (
        "messages: a thinking block",
        "/v1/messages",
        {
            "model": MESSAGES,
            "messages": [
                ASKED,
                {"role": "assistant", "content": [{"type": "thinking", "thinking": FLAG, "signature": "s"}]},
                ASKED,
            ],
        },
    ),
    (
        "chat: a refusal and a name",
        "/v1/chat/completions",
        {
            "model": CHAT,
            "messages": [ASKED, {"role": "assistant", "name": FLAG, "content": None, "refusal": FLAG}, ASKED],
        },
    ),
]


@pytest.mark.parametrize(("path", "body"), [h[1:] for h in HIDDEN], ids=[h[0] for h in HIDDEN])
def test_text_the_model_reads_anywhere_in_the_request_is_checked(
    sgw: Gateway, handle: KeyHandle, path: str, body: dict[str, Any]
) -> None:
    if path == "/v1/messages":
        body = {"max_tokens": 20, **body}
    before = sgw.balance(handle.account_id)
    with sgw.client(handle.key) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "content_filtered", r.text
    assert sgw.wait_balance(handle.account_id, before) == before


def test_media_is_not_read_as_text() -> None:
    """Images, audio and PDFs are not sent to the moderation model, even as base64 that decodes."""
    wav = base64.b64encode(b"RIFF").decode()
    payload = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "image_url", "image_url": {"url": "data:text/plain;base64," + wav}},
                    {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
                    {"type": "file", "file": {"file_data": "data:application/pdf;base64," + wav}},
                ],
            }
        ]
    }
    assert request_texts(payload, CHECKED_FIELDS["chat"]) == ["hi"]


def test_image_generation_prompt_is_checked(
    sgw: Gateway, handle: KeyHandle, oai: openai.OpenAI, sim: httpx.Client
) -> None:
    secret = uuid.uuid4().hex
    before = sgw.balance(handle.account_id)
    with pytest.raises(openai.BadRequestError) as caught:
        oai.images.generate(model=IMAGE, prompt=f"a scene {secret} [sim flag=violence/graphic]")
    assert caught.value.code == "content_filtered" and caught.value.param == "prompt"
    assert "violence/graphic" in caught.value.message
    assert received(sim, "/v1/images/generations", secret) == 0
    assert sgw.wait_balance(handle.account_id, before) == before


def test_a_model_with_safety_false_is_not_checked(
    sgw: Gateway, handle: KeyHandle, oai: openai.OpenAI, sim: httpx.Client
) -> None:
    prompt = unique("hello [sim flag]")
    completion = oai.chat.completions.create(model=UNCHECKED, messages=[{"role": "user", "content": prompt}])
    assert completion.choices[0].message.content
    assert received(sim, "/v1/moderations", prompt) == 0


def test_failing_moderation_refuses_the_request(
    sgw: Gateway, handle: KeyHandle, admin: httpx.Client, oai: openai.OpenAI, sim: httpx.Client
) -> None:
    """on_error = "refuse" (the default): fail closed, with the moderation model's error, not charged."""
    prompt = unique("hello")
    before = sgw.balance(handle.account_id)
    with pytest.raises(openai.InternalServerError) as caught:
        oai.chat.completions.create(model=FRAGILE, messages=[{"role": "user", "content": prompt}])
    err = caught.value
    assert err.status_code == 503 and err.code == "provider_error"
    assert "The safety check could not run" in err.message
    assert received(sim, "/v1/moderations", prompt) == 3  # retried like any request, then refused
    assert received(sim, "/v1/chat/completions", prompt) == 0
    assert sgw.wait_balance(handle.account_id, before) == before
    [entry] = request_logs(admin, handle.key_id, 1)
    assert (entry["status"], entry["error_code"], entry["cost"]) == (503, "provider_error", None)
    assert [(a["check"], a["model"], a["verdict"]) for a in entry["attempts"]] == [
        ("safety", BROKEN_MODERATION, None),
        ("safety", BROKEN_MODERATION, None),
        ("safety", BROKEN_MODERATION, "error"),
    ]


def test_failing_moderation_with_on_error_allow_lets_the_request_run(
    sim_url: str, tmp_path: Path, sim: httpx.Client
) -> None:
    config = models_toml(sim_url) + '\n[safety]\non_error = "allow"\n'
    with gateway(tmp_path, config) as gw:
        handle = gw.new_key()
        prompt = unique("hello")
        with openai.OpenAI(base_url=gw.openai_base, api_key=handle.key, max_retries=0) as oai:
            completion = oai.chat.completions.create(
                model=FRAGILE, messages=[{"role": "user", "content": prompt}]
            )
            assert completion.choices[0].message.content
            # Without [safety] model, the other models are not checked.
            oai.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": prompt}])
    assert received(sim, "/v1/moderations", prompt) == 3
    assert received(sim, "/v1/chat/completions", prompt) == 2


# --- POST /v1/moderations ---------------------------------------------------------------------


def test_moderations_endpoint_with_the_openai_client(
    sgw: Gateway, handle: KeyHandle, oai: openai.OpenAI
) -> None:
    before = sgw.balance(handle.account_id)
    inputs = ["a kind sentence", "a cruel one [sim flag=self-harm,harassment]"]
    raw = oai.moderations.with_raw_response.create(model=MODERATION, input=inputs)
    answer = raw.parse()
    assert answer.id.startswith("modr-") and answer.model == "omni-moderation-latest"
    fine, bad = answer.results
    assert not fine.flagged and not any(fine.categories.model_dump().values())
    assert bad.flagged and bad.categories.self_harm and bad.categories.harassment
    assert not bad.categories.violence
    assert bad.category_scores.self_harm > 0.9 and bad.category_scores.violence < 0.01
    assert bad.category_applied_input_types.self_harm == ["text"]
    usage = raw.http_response.json()["usage"]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"]
    # Called directly, a moderation model is priced like any model.
    charged = Decimal(raw.headers["x-service-cost"])
    assert charged > 0
    assert sgw.wait_balance(handle.account_id, before - charged) == before - charged
    again = oai.moderations.create(model=MODERATION, input=inputs)
    assert again.model_dump()["results"] == answer.model_dump()["results"]  # deterministic
    assert again.id != answer.id
    # No model named: OpenAI's default, as its API has it.
    defaulted = oai.moderations.create(input=inputs)
    assert defaulted.model == "omni-moderation-latest"
    assert defaulted.model_dump()["results"] == answer.model_dump()["results"]


def test_moderations_endpoint_refuses_other_models_and_bad_input(
    sgw: Gateway, handle: KeyHandle, oai: openai.OpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.moderations.create(model=CHAT, input="hi")
    assert caught.value.param == "model" and "/v1/chat/completions" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        oai.moderations.create(model=MODERATION, input=[])
    assert caught.value.param == "input"
    with sgw.client(handle.key) as c:
        r = c.get("/v1/models")
    assert MODERATION in {m["id"] for m in r.json()["data"]}


# --- configuration ----------------------------------------------------------------------------


def settings_of(extra_models: str, safety: str = "") -> None:
    base = """
[[models]]
name = "openai/omni-moderation-latest"
type = "moderation"
[[models.channels]]
provider = "openai"
base_url = "http://127.0.0.1:1/v1"
"""
    parse_settings(tomllib.loads(base + extra_models + safety), Path("."))


def chat(extra: str = "", type_: str = "chat") -> str:
    return f"""
[[models]]
name = "openai/x"
type = "{type_}"
{extra}
[[models.channels]]
provider = "openai"
base_url = "http://127.0.0.1:1/v1"
"""


def test_config_resolves_each_models_moderation_model() -> None:
    raw = tomllib.loads(
        chat().replace("openai/x", "openai/a")
        + chat("safety = false").replace("openai/x", "openai/b")
        + chat(type_="embedding").replace("openai/x", "openai/c")
        + chat().replace("openai/x", "openai/omni").replace('type = "chat"', 'type = "moderation"')
        + '\n[safety]\nmodel = "openai/omni"\n'
    )
    settings = parse_settings(raw, Path("."))
    checked = {m.name: m.safety_model for m in settings.models}
    assert checked == {"openai/a": "openai/omni", "openai/b": None, "openai/c": None, "openai/omni": None}
    assert settings.safety.on_error == "refuse"


@pytest.mark.parametrize(
    ("models", "safety", "message"),
    [
        (chat(), '\n[safety]\nmodel = "openai/nope"\n', "not a configured model of type moderation"),
        (chat(), '\n[safety]\nmodel = "openai/x"\n', "not a configured model of type moderation"),
        (chat("safety = true"), "", "true needs [safety] model"),
        (chat('safety = "openai/x"'), "", "not a configured model of type moderation"),
        (chat("safety = 3"), "", "must be true, false or the name"),
        (chat('safety = "openai/omni-moderation-latest"', "embedding"), "", "is not checked"),
        (chat(), '\n[safety]\non_error = "maybe"\n', "refuse"),
        (chat(), "\n[safety]\nmodle = 1\n", "unknown setting safety.modle"),
    ],
)
def test_config_errors(models: str, safety: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings_of(models, safety)


def test_gateway_error_for_content_filtered_is_the_spec_row() -> None:
    err = GatewayError("content_filtered", "x")
    assert (err.status, err.type) == (400, "content_policy_violation")
