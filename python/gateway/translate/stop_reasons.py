"""Why a model stopped, in both text shapes: Anthropic's stop_reason and OpenAI's finish_reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

FINISH_REASON_FOR_STOP_REASON: Final[Mapping[str, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# The chat shape does not say whether "stop" was the model's own end or a stop sequence: end_turn.
STOP_REASON_FOR_FINISH_REASON: Final[Mapping[str, str]] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def finish_reason(stop_reason: Any) -> str:
    """The chat shape's finish_reason for a message's stop_reason ("stop" when unknown)."""
    return FINISH_REASON_FOR_STOP_REASON.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def stop_reason(finish_reason: Any, called_tools: bool = False) -> str:
    """The message shape's stop_reason for a chat finish_reason ("end_turn" when unknown).
    `called_tools`: the answer has tool calls. Some OpenAI-compatible servers (vLLM and Ollama
    builds) end such an answer with "stop"; Anthropic's clients go on with a tool loop only on
    "tool_use", so an answer that called tools and stopped on its own is "tool_use"."""
    found = (
        STOP_REASON_FOR_FINISH_REASON.get(finish_reason, "end_turn")
        if isinstance(finish_reason, str)
        else "end_turn"
    )
    return "tool_use" if called_tools and found == "end_turn" else found
