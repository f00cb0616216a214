"""A chat model's answer as a Responses API `Response` object, whole or as the items its stream builds.

The object has every field OpenAI's has (clients with strict schemas, such as the Vercel AI SDK, read
them), echoing the request's settings. Output items: the reasoning (a summary_text part), the message
(one output_text part, or a refusal part), then one function_call item per tool call. A chat answer
cut short by its token limit is `incomplete` with reason max_output_tokens, one stopped by a content
filter `incomplete` with reason content_filter, as OpenAI reports both.
"""

from __future__ import annotations

import time
from typing import Any

from ..pricing import Usage
from .answers import content_text, first_choice, reasoning_text
from .usage import responses_usage

INCOMPLETE_REASON = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_from_chat_completion(
    completion: dict[str, Any], usage: Usage, rid: str, request: dict[str, Any]
) -> dict[str, Any]:
    """The first choice of a chat completion, as the Response `request` asked for."""
    choice, reply = first_choice(completion)
    output: list[dict[str, Any]] = []
    reasoning = reasoning_text(reply)
    if reasoning:
        output.append(reasoning_item(rid, reasoning))
    text, refusal = content_text(reply.get("content")), reply.get("refusal")
    status = finished_status(choice.get("finish_reason"))
    calls = reply.get("tool_calls")
    # A message the model went on from (to its tool calls) was said whole, as its stream shows it.
    said = "completed" if calls else status
    if text:
        output.append(message_item(rid, output_text_part(text), said))
    elif isinstance(refusal, str) and refusal:
        output.append(message_item(rid, refusal_part(refusal), said))
    listed: list[Any] = calls if isinstance(calls, list) else []
    for i, call in enumerate(listed):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            output.append(
                function_call_item(
                    rid,
                    i,
                    call.get("id"),
                    function.get("name"),
                    call_arguments(arguments),
                    # The last call is the one a cut answer was cut in.
                    status if i == len(listed) - 1 else "completed",
                )
            )
    return response_object(
        rid,
        request,
        completion.get("model"),
        status,
        output,
        usage,
        created_at=_created(completion.get("created")),
        finish_reason=choice.get("finish_reason"),
    )


def response_object(
    rid: str,
    request: dict[str, Any],
    model: Any,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    *,
    created_at: int,
    finish_reason: Any = None,
) -> dict[str, Any]:
    """A Response: `status` is in_progress while streamed, then completed or incomplete."""
    reason = INCOMPLETE_REASON.get(finish_reason) if status == "incomplete" else None

    def given(name: str, default: Any) -> Any:
        value = request.get(name)
        return default if value is None else value

    text = request.get("text")
    return {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": reason} if reason else None,
        "instructions": given("instructions", None),
        "max_output_tokens": given("max_output_tokens", None),
        "max_tool_calls": None,
        "model": model if isinstance(model, str) else request.get("model"),
        "output": output,
        "parallel_tool_calls": given("parallel_tool_calls", True),
        "previous_response_id": given("previous_response_id", None),
        "reasoning": given("reasoning", {"effort": None, "summary": None}),
        "service_tier": "default",
        # Kept by the gateway unless the client said not to (routes/kept_responses.py).
        "store": request.get("store") is not False,
        "temperature": given("temperature", 1.0),
        "text": text if isinstance(text, dict) else {"format": {"type": "text"}},
        "tool_choice": given("tool_choice", "auto"),
        "tools": given("tools", []),
        "top_logprobs": given("top_logprobs", 0),
        "top_p": given("top_p", 1.0),
        "truncation": "disabled",
        "usage": responses_usage(usage) if usage is not None else None,
        "user": given("user", None),
        "metadata": given("metadata", {}),
    }


def finished_status(finish_reason: Any) -> str:
    return "incomplete" if finish_reason in INCOMPLETE_REASON else "completed"


def message_item(rid: str, part: dict[str, Any] | None, status: str) -> dict[str, Any]:
    """The answer's message item (without its part while a stream opens it)."""
    return {
        "id": "msg_" + _suffix(rid),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part] if part is not None else [],
    }


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def refusal_part(refusal: str) -> dict[str, Any]:
    return {"type": "refusal", "refusal": refusal}


def reasoning_item(rid: str, summary: str | None) -> dict[str, Any]:
    """The model's reasoning, as a summary (the chat shape has no other form of it); None while a
    stream opens it, with no summary parts yet."""
    parts = [] if summary is None else [{"type": "summary_text", "text": summary}]
    return {"id": "rs_" + _suffix(rid), "type": "reasoning", "summary": parts}


def function_call_item(
    rid: str, index: int, call_id: Any, name: Any, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    """A tool call as a function_call item: `status` incomplete when the answer was cut short
    within it (its arguments may be broken JSON, as OpenAI marks such an item)."""
    return {
        "id": f"fc_{_suffix(rid)}_{index}",
        "type": "function_call",
        "status": status,
        "call_id": call_id if isinstance(call_id, str) else f"call_{_suffix(rid)}_{index}",
        "name": name if isinstance(name, str) else "",
        "arguments": arguments,
    }


def call_arguments(arguments: Any) -> str:
    """A tool call's arguments as a Responses client parses them: a call without any (zero-argument
    tools on vLLM and Ollama stream none) is the empty object, as messages' `input: {}` (review:
    `""` made the openai client's streaming helper raise JSONDecodeError)."""
    return arguments if isinstance(arguments, str) and arguments else "{}"


def _suffix(rid: str) -> str:
    return rid.partition("_")[2] or rid


def _created(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else int(time.time())
