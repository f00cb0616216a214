"""Request bodies between the two text shapes: the mapping of every field, the 400s, and round trips."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.translate import chat_request_from_messages, messages_request_from_chat

PNG = "iVBORw0KGgo="


def test_chat_request_as_a_messages_request() -> None:
    chat = {
        "model": "anthropic/claude",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": [{"type": "text", "text": "in English"}]},
            {"role": "user", "content": "weather?", "name": "ann"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                    {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": ""}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "one"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "two"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "and?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/PNG;base64,{PNG}", "detail": "low"},
                    },
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
                ],
            },
        ],
        "max_completion_tokens": 50,
        "max_tokens": 10,  # the older name loses to max_completion_tokens
        "temperature": 0.3,
        "top_p": 0.8,
        "stop": "END",
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "description": "F", "parameters": {"type": "object"}},
            },
            {"type": "function", "function": {"name": "g"}},
            {"type": "custom", "custom": {"name": "grammar"}},
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "user": "u-1",
        "seed": 1,
        "logit_bias": {"1": 1},
    }
    assert messages_request_from_chat(chat, 4096) == {
        "model": "anthropic/claude",
        "system": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "in English"}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
                    {"type": "tool_use", "id": "call_2", "name": "g", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "one"},
                    {"type": "tool_result", "tool_use_id": "call_2", "content": "two"},
                    {"type": "text", "text": "and?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
                ],
            },
        ],
        "max_tokens": 50,
        "temperature": 0.3,
        "top_p": 0.8,
        "stream": True,
        "stop_sequences": ["END"],
        "tools": [
            {"name": "f", "input_schema": {"type": "object"}, "description": "F"},
            {"name": "g", "input_schema": {"type": "object", "properties": {}}},
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u-1"},
    }


def test_messages_request_as_a_chat_request() -> None:
    messages = {
        "model": "openai/gpt",
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "s"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1, 2]}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "here:"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "sun"}],
                    },
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/gif", "data": "R0lG"},
                    },
                ],
            },
        ],
        "max_tokens": 30,
        "temperature": 0.1,
        "top_k": 4,
        "stop_sequences": ["END"],
        "stream": True,
        "tools": [
            {"name": "f", "description": "F", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u-2"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "service_tier": "auto",
    }
    assert chat_request_from_messages(messages, "max_completion_tokens") == {
        "model": "openai/gpt",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"a":[1,2]}'},
                    }
                ],
            },
            # The tool result first, right after the call, whatever its place in the user turn.
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sun"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "here:"},
                    {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lG"}},
                ],
            },
        ],
        "max_completion_tokens": 30,
        "temperature": 0.1,
        "top_k": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "stop": ["END"],
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object"}, "description": "F"},
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": False,
        "user": "u-2",
    }


@pytest.mark.parametrize(
    ("chat_choice", "messages_choice"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ({"type": "function", "function": {"name": "f"}}, {"type": "tool", "name": "f"}),
    ],
)
def test_tool_choice_both_ways(chat_choice: Any, messages_choice: dict[str, Any]) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat = {"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": chat_choice}
    assert messages_request_from_chat(chat, 10)["tool_choice"] == messages_choice
    back = chat_request_from_messages(
        {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 10,
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": messages_choice,
        },
        "max_tokens",
    )
    assert back["tool_choice"] == chat_choice


def test_allowed_tools_narrow_the_tools() -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in ("f", "g")]
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "g"}}]},
    }
    request = messages_request_from_chat(
        {"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": choice}, 10
    )
    assert [t["name"] for t in request["tools"]] == ["g"] and request["tool_choice"] == {"type": "any"}


def test_defaults_and_what_is_left_out() -> None:
    request = messages_request_from_chat({"model": "m", "messages": [{"role": "user", "content": "x"}]}, 123)
    assert request == {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 123}
    # Parallel calls off without a tool_choice: the model's default choice, without parallel calls.
    request = messages_request_from_chat(
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "parallel_tool_calls": False,
        },
        1,
    )
    assert request["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    # Only server tools: no tools and no tool choice reach a chat model.
    request = chat_request_from_messages(
        {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 5,
            "tools": [{"type": "bash_20250124", "name": "bash"}],
            "tool_choice": {"type": "any"},
        },
        "max_tokens",
    )
    assert request == {"model": None, "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}


def _message(content: Any, role: str = "user") -> dict[str, Any]:
    return {"messages": [{"role": role, "content": content}]}


@pytest.mark.parametrize(
    ("chat", "param"),
    [
        ({"messages": [{"role": "critic", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0]"),
        (_message(7), "messages[0].content"),
        (_message([{"type": "input_audio", "input_audio": {}}]), "messages[0].content[0]"),
        (_message([{"type": "file", "file": {"file_id": "f"}}]), "messages[0].content[0].file.file_id"),
        (
            _message([{"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AA"}}]),
            "messages[0].content[0].image_url",
        ),
        (
            _message([{"type": "image_url", "image_url": {"url": "data:image/png,AA"}}]),
            "messages[0].content[0].image_url",
        ),
        (_message([{"type": "image_url", "image_url": {}}]), "messages[0].content[0].image_url"),
        (_message([{"type": "image_url"}]), "messages[0].content[0].image_url"),
        (
            _message([{"type": "image_url", "image_url": "file:///etc/passwd"}]),
            "messages[0].content[0].image_url",
        ),
        (_message([{"type": "image_url", "image_url": {"url": "x"}}], "system"), "messages[0].content[0]"),
        (_message(3, "system"), "messages[0].content"),
        ({"messages": [{"role": "assistant", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "assistant", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "assistant", "function_call": {"name": "f"}}]}, "messages[0].function_call"),
        ({"messages": [{"role": "assistant", "tool_calls": {}}]}, "messages[0].tool_calls"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}, "messages[0].tool_calls[0]"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
                ]
            },
            "messages[0].tool_calls[0]",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{"}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {}}}],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": True},
            "max_completion_tokens",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "stop": ["a", 1]}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": {}}, "tools"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": ["f"]}, "tools[0]"),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools[0].function",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}],
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": "always",
            },
            "tool_choice",
        ),
    ],
)
def test_chat_requests_that_cannot_be_translated(chat: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        messages_request_from_chat(chat, 10)
    assert (caught.value.code, caught.value.status, caught.value.param) == ("invalid_request", 400, param)


SIGNED = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
REDACTED = {"type": "redacted_thinking", "data": "opaque"}


def test_signed_thinking_blocks_start_the_assistant_turn_again() -> None:
    """Review (LangChain, litellm, the Agents SDK on a Claude model with thinking and tools): the
    chat answer's signed thinking was lost, and Anthropic refuses the tool loop's next turn unless
    the turn that called the tools starts with it. `thinking_blocks` (translate.answers; streamed
    entries carry an `index`, left out) goes back first, exactly its own fields."""
    assistant = {
        "role": "assistant",
        "content": "Looking.",
        "reasoning_content": "hmm",
        "thinking_blocks": [{**SIGNED, "index": 0}, REDACTED],
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    chat = {
        "messages": [
            {"role": "user", "content": "weather?"},
            assistant,
            {"role": "tool", "tool_call_id": "call_1", "content": "sun"},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    turn = messages_request_from_chat(chat, 10)["messages"][1]
    assert turn["content"] == [
        SIGNED,
        REDACTED,
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {}},
    ]
    # A provider that is not sent `thinking` (Bedrock, Gemini) is not sent the blocks either.
    plain = messages_request_from_chat(chat, 10, thinking=False)["messages"][1]
    assert [block["type"] for block in plain["content"]] == ["text", "tool_use"]


@pytest.mark.parametrize(
    "given",
    [
        "sig",
        [{"type": "thinking", "thinking": "hmm"}],
        [{"type": "thinking", "thinking": "hmm", "signature": ""}],
        [{"type": "thinking", "signature": "sig"}],
        [{"type": "redacted_thinking"}],
        [{"type": "text", "text": "hmm", "signature": "sig"}],
        ["hmm"],
    ],
)
def test_thinking_blocks_that_cannot_go_back_are_400(given: Any) -> None:
    chat = {
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "y", "thinking_blocks": given},
        ]
    }
    with pytest.raises(GatewayError) as caught:
        messages_request_from_chat(chat, 10)
    assert caught.value.status == 400 and str(caught.value.param).startswith("messages[1].thinking_blocks")


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (_message("x", "system"), "messages[0].role"),
        (_message(None), "messages[0].content"),
        (_message(["x"]), "messages[0].content[0]"),
        (_message([{"type": "document", "source": {}}]), "messages[0].content[0].source"),
        (
            _message([{"type": "image", "source": {"type": "file", "file_id": "f"}}]),
            "messages[0].content[0].source",
        ),
        (
            _message(
                [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]
            ),
            "messages[0].content[0].content[0]",
        ),
        (_message([{"type": "tool_result", "content": "x"}]), "messages[0].content[0].tool_use_id"),
        (_message([{"type": "tool_use", "id": "t", "name": "f", "input": {}}]), "messages[0].content[0]"),
        (
            _message([{"type": "tool_use", "id": "t", "name": "f", "input": []}], "assistant"),
            "messages[0].content[0]",
        ),
        (_message([{"type": "server_tool_use", "id": "t"}], "assistant"), "messages[0].content[0]"),
        ({**_message("x"), "system": [{"type": "image"}]}, "system[0]"),
        ({**_message("x"), "system": 5}, "system"),
        ({**_message("x"), "stop_sequences": "END"}, "stop_sequences"),
        ({**_message("x"), "tools": [{"name": "f"}]}, "tools[0]"),
        ({**_message("x"), "tools": "f"}, "tools"),
        ({**_message("x"), "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ],
)
def test_messages_requests_that_cannot_be_translated(messages: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        chat_request_from_messages({**messages, "max_tokens": 5}, "max_tokens")
    assert (caught.value.code, caught.value.status, caught.value.param) == ("invalid_request", 400, param)


# ---------------------------------------------------------------- round trips

texts = st.text(min_size=1, max_size=12)
# What orjson reads a JSON number as: a 64-bit integer (larger ones become floats).
int64s = st.integers(-(2**63), 2**63 - 1)
json_values = st.none() | st.booleans() | int64s | st.text(max_size=6)
arguments = st.dictionaries(st.text(max_size=5), json_values | st.lists(json_values, max_size=2), max_size=3)
call_ids = st.from_regex(r"[a-z]{4}_[A-Za-z0-9]{6}", fullmatch=True)
images = st.sampled_from(
    [f"data:image/png;base64,{PNG}", "data:image/webp;base64,UklGRg==", "https://x.test/cat.jpg"]
)
tool_names = st.sampled_from(["f", "g", "get_weather"])


@st.composite
def chat_conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Chat conversations in the form the message shape gives back unchanged: one system message at
    most and first, user and assistant turns alternating, tool results right after their calls."""
    conversation: list[dict[str, Any]] = []
    if draw(st.booleans()):
        conversation.append({"role": "system", "content": draw(texts)})
    for _ in range(draw(st.integers(1, 3))):
        parts = draw(
            st.lists(
                st.one_of(
                    texts.map(lambda t: {"type": "text", "text": t}),
                    images.map(lambda u: {"type": "image_url", "image_url": {"url": u}}),
                ),
                min_size=2,
                max_size=3,
            )
        )
        conversation.append({"role": "user", "content": draw(st.sampled_from([draw(texts), parts]))})
        calls = [
            {
                "id": draw(call_ids),
                "type": "function",
                "function": {"name": draw(tool_names), "arguments": orjson.dumps(draw(arguments)).decode()},
            }
            for _ in range(draw(st.integers(0, 2)))
        ]
        if calls:
            conversation.append(
                {"role": "assistant", "content": draw(st.none() | texts), "tool_calls": calls}
            )
            conversation.extend(
                {"role": "tool", "tool_call_id": c["id"], "content": draw(texts)} for c in calls
            )
        else:
            conversation.append({"role": "assistant", "content": draw(texts)})
    return conversation


@st.composite
def chat_parameters(draw: st.DrawFn) -> dict[str, Any]:
    params: dict[str, Any] = {"max_tokens": draw(st.integers(1, 10_000))}
    for name, values in (
        ("temperature", st.floats(0, 2)),
        ("top_p", st.floats(0, 1)),
        ("stop", st.lists(texts, min_size=1, max_size=3)),
        ("user", texts),
    ):
        if draw(st.booleans()):
            params[name] = draw(values)
    if draw(st.booleans()):
        params["tools"] = [
            {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
            for n in draw(st.lists(tool_names, min_size=1, max_size=3, unique=True))
        ]
        choice: Any = draw(st.sampled_from([None, "auto", "none", "required", "function"]))
        if choice == "function":
            choice = {"type": "function", "function": {"name": params["tools"][0]["function"]["name"]}}
        if choice is not None:
            params["tool_choice"] = choice
            if choice != "none" and draw(st.booleans()):
                params["parallel_tool_calls"] = False
    return params


@given(chat_conversations(), chat_parameters())
def test_chat_to_messages_and_back_is_the_same_request(
    conversation: list[dict[str, Any]], params: dict[str, Any]
) -> None:
    chat = {"model": "m", "messages": conversation, **params}
    assert chat_request_from_messages(messages_request_from_chat(chat, 1), "max_tokens") == chat


@st.composite
def message_conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Message-shape conversations in the form the chat shape gives back unchanged: one text block at
    most per assistant turn and before its tool calls, tool results with text content."""
    conversation: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        blocks = results + draw(
            st.lists(
                st.one_of(
                    texts.map(lambda t: {"type": "text", "text": t}),
                    st.just(
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        }
                    ),
                    st.just({"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}),
                ),
                min_size=0 if results else 2,
                max_size=3,
            )
        )
        if not results and draw(st.booleans()):
            conversation.append({"role": "user", "content": draw(texts)})
        elif len(blocks) == 1 and blocks[0]["type"] == "text":
            conversation.append({"role": "user", "content": blocks[0]["text"]})
        else:
            conversation.append({"role": "user", "content": blocks})
        uses = [
            {"type": "tool_use", "id": draw(call_ids), "name": draw(tool_names), "input": draw(arguments)}
            for _ in range(draw(st.integers(0, 2)))
        ]
        text = draw(st.none() | texts)
        if uses:
            head = [{"type": "text", "text": text}] if text else []
            conversation.append({"role": "assistant", "content": head + uses})
        else:
            conversation.append({"role": "assistant", "content": text or "ok"})
        results = [{"type": "tool_result", "tool_use_id": u["id"], "content": draw(texts)} for u in uses]
    if results:
        conversation.append({"role": "user", "content": results})
    return conversation


@given(message_conversations(), st.none() | texts, st.integers(1, 10_000))
def test_messages_to_chat_and_back_is_the_same_request(
    conversation: list[dict[str, Any]], system: str | None, max_tokens: int
) -> None:
    request: dict[str, Any] = {"model": "m", "messages": conversation, "max_tokens": max_tokens}
    if system is not None:
        request["system"] = system
    assert messages_request_from_chat(chat_request_from_messages(request, "max_tokens"), 1) == request


# ---------------------------------------------------------------- anything a client sends: a result or a 400

json_trees = st.recursive(
    st.none()
    | st.booleans()
    | int64s
    | st.floats(allow_nan=False)
    | st.sampled_from(
        ["", "x", "text", "image_url", "tool", "user", "assistant", "function", "data:image/png;base64,AA"]
    ),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "type",
                    "text",
                    "image_url",
                    "url",
                    "tool_calls",
                    "id",
                    "function",
                    "name",
                    "arguments",
                    "source",
                    "tool_use_id",
                    "input",
                    "tool_call_id",
                    "media_type",
                    "data",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
fields = st.sampled_from(
    [
        "stop",
        "stop_sequences",
        "tools",
        "tool_choice",
        "system",
        "max_completion_tokens",
        "metadata",
        "parallel_tool_calls",
        "user",
    ]
)


@given(
    st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "tool_call_id"]), json_trees),
        min_size=1,
        max_size=3,
    ),
    st.dictionaries(fields, json_trees, max_size=3),
)
def test_any_chat_request_translates_or_is_a_400(
    messages: list[dict[str, Any]], params: dict[str, Any]
) -> None:
    try:
        messages_request_from_chat({"messages": messages, **params}, 10)
    except GatewayError as err:
        assert err.code == "invalid_request"


@given(
    st.lists(st.dictionaries(st.sampled_from(["role", "content"]), json_trees), min_size=1, max_size=3),
    st.dictionaries(fields, json_trees, max_size=3),
)
def test_any_messages_request_translates_or_is_a_400(
    messages: list[dict[str, Any]], params: dict[str, Any]
) -> None:
    try:
        chat_request_from_messages({"messages": messages, **params, "max_tokens": 5}, "max_tokens")
    except GatewayError as err:
        assert err.code == "invalid_request"


def test_an_image_link_for_a_provider_that_takes_only_data_names_the_client_s_part() -> None:
    """Bedrock and Gemini take images as data only: the 400 names the part in the client's own
    messages, not in the merged turns (here two user messages make one turn)."""
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "look"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "this"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                ],
            },
        ]
    }
    assert messages_request_from_chat(chat, 64)["messages"][0]["content"][-1]["source"]["type"] == "url"
    with pytest.raises(GatewayError) as caught:
        messages_request_from_chat(chat, 64, image_links=False)
    assert caught.value.param == "messages[2].content[1]" and "not links" in caught.value.message
