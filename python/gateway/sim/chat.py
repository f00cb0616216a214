"""OpenAI's Chat Completions API (POST .../chat/completions): whole answers and streams, with
reasoning, tool calls, structured output, spoken output (`modalities: ["audio"]`: the answer as
`message.audio`, its transcript and a short WAV, billed as audio tokens) and the directives
that slow or break a stream. A prompt's audio parts are reported as its audio tokens."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from ..core import count_prompt_tokens, count_tokens
from . import directives, speech, structured, tools
from .directives import DirectiveError, Directives
from .tools import ToolCall
from .wire import EventStream, bad_json, json_object, openai_error, reply
from .words import last_text, spaced, within_limit

if TYPE_CHECKING:
    from .state import Simulator


async def create(sim: Simulator, request: web.Request, *, azure: bool = False) -> web.StreamResponse:
    """OpenAI's answer, or with `azure` Azure OpenAI's: its content filter's refusal and results."""
    body = await request.read()
    req = json_object(body)
    if req is None:
        return bad_json()
    if not isinstance(req.get("model"), str) or not isinstance(req.get("messages"), list):
        return openai_error(400, "'model' and 'messages' are required.")
    headers = request.headers
    sim.record(
        {
            "path": "/v1/chat/completions",
            "body": req,
            "authorization": headers.get("authorization"),
            "traceparent": headers.get("traceparent"),
        }
    )
    if req.get("max_tokens") is not None and req.get("max_completion_tokens") is not None:
        # As OpenAI's API (and Azure's) refuses the two together.
        return openai_error(
            400,
            "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not supported.",
            code="invalid_parameter_combination",
            param="max_tokens",
        )
    try:
        model, d = directives.parse(req["model"], headers.get("x-sim"), last_text(req["messages"]))
    except DirectiveError as exc:
        return openai_error(400, str(exc))
    if d.ttft:
        await asyncio.sleep(d.ttft)
    if d.fail is not None:
        kind = "rate_limit_error" if d.fail == 429 else "server_error"
        # A 400 names the field at fault, as OpenAI's do: here the messages, which hold the marker.
        param = "messages" if d.fail == 400 else None
        return openai_error(d.fail, f"Simulated failure {d.fail}.", kind, param=param)
    if d.refuse and azure:
        return reply(400, AZURE_PROMPT_FILTERED)
    if d.refuse:  # OpenAI's refusal under its content policy
        return openai_error(
            400,
            "Your request was rejected as a result of our safety system. Your prompt may contain "
            "text that is not allowed by our safety system.",
            code="content_policy_violation",
        )
    cap = req.get("max_completion_tokens") or req.get("max_tokens")
    modalities = req.get("modalities")
    speaks = isinstance(modalities, list) and "audio" in modalities
    if speaks and isinstance(cap, int):  # the limit counts the audio tokens too
        cap //= 1 + AUDIO_TOKENS_PER_TOKEN
    thought, n = within_limit(cap, d.reasoning, d.tokens)
    prompt_tokens, audio_tokens = count_prompt_tokens(body)
    turn = Turn(
        id="chatcmpl-sim" + hashlib.blake2b(body, digest_size=10).hexdigest(),
        created=int(time.time()),
        model=model,
        words=spaced(body, n),
        reasoning=spaced(body, thought, offset=3),
        call=tools.openai_tool_call(req, d.tool, body),
        finish="length" if n < d.tokens else "stop",
        prompt_tokens=prompt_tokens,
        audio_prompt_tokens=audio_tokens,
        speaks=speaks and not tools.openai_tool_call(req, d.tool, body),
    )
    schema = structured.requested_schema(req, "chat")
    if schema is not None:  # JSON for the schema, whole whatever the length
        turn.words = structured.pieces(structured.answer_text(schema, turn.words))
        turn.finish = "stop"
    if turn.call is not None:
        turn.finish = "tool_calls"
    elif d.filter_after is not None and d.filter_after < len(turn.words):
        turn.words, turn.finish = turn.words[: d.filter_after], "content_filter"
    if req.get("stream") is True:
        opts = req.get("stream_options")
        with_usage = isinstance(opts, dict) and opts.get("include_usage") is True and not d.no_usage
        return await _stream(request, turn, with_usage, d, azure)
    completion = _completion(turn)
    if d.no_usage:
        del completion["usage"]
    if azure:
        completion["prompt_filter_results"] = AZURE_PROMPT_RESULTS
        completion["choices"][0]["content_filter_results"] = _azure_results(turn.finish)
    return reply(200, orjson.dumps(completion))


@dataclass(slots=True, kw_only=True)
class Turn:
    """What the model says, before it is framed as one completion or as a stream of chunks."""

    id: str
    created: int
    model: str
    words: list[str]
    reasoning: list[str]
    call: ToolCall | None
    finish: str
    prompt_tokens: int
    audio_prompt_tokens: int = 0
    speaks: bool = False  # the answer is spoken: message.audio, its words the transcript

    @property
    def text(self) -> str:
        """The turn's content, or a tool call's arguments."""
        return "".join(self.words) if self.call is None else self.call.arguments_json

    def usage(self) -> dict[str, Any]:
        reasoning = count_tokens("".join(self.reasoning)) if self.reasoning else 0
        text = count_tokens(self.text)
        spoken = text * AUDIO_TOKENS_PER_TOKEN if self.speaks else 0
        completion = text + spoken + reasoning
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": self.audio_prompt_tokens},
            "completion_tokens_details": {
                "reasoning_tokens": reasoning,
                "audio_tokens": spoken,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }


# Spoken output: audio tokens per token of its transcript (about what GPT-4o's speech takes), and
# the audio itself, a short WAV of the speech simulator's tone.
AUDIO_TOKENS_PER_TOKEN = 4
SPOKEN = base64.b64encode(speech.render("wav", 0.05)).decode()


def _completion(turn: Turn) -> dict[str, Any]:
    call = turn.call
    message: dict[str, Any] = {
        "role": "assistant",
        "content": turn.text if call is None and not turn.speaks else None,
        "refusal": None,
        "annotations": [],
    }
    if turn.speaks:
        message["audio"] = {
            "id": "audio_" + turn.id.removeprefix("chatcmpl-"),
            "data": SPOKEN,
            "expires_at": turn.created + 3600,
            "transcript": turn.text,
        }
    if call is not None:
        message["tool_calls"] = [call.chat_tool_call()]
    if turn.reasoning:
        message["reasoning_content"] = "".join(turn.reasoning)
    return {
        "id": turn.id,
        "object": "chat.completion",
        "created": turn.created,
        "model": turn.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": turn.finish}],
        "usage": turn.usage(),
        "service_tier": "default",
        "system_fingerprint": "fp_sim",
    }


async def _stream(
    request: web.Request, turn: Turn, with_usage: bool, d: Directives, azure: bool
) -> web.StreamResponse:
    stream = EventStream(request)
    await stream.open()
    if azure:  # Azure's streams open with the prompt's filter results, in a chunk of no choice
        await stream.data(
            {
                "choices": [],
                "created": 0,
                "id": "",
                "model": "",
                "object": "",
                "prompt_filter_results": AZURE_PROMPT_RESULTS,
            }
        )
    base: dict[str, Any] = {
        "id": turn.id,
        "object": "chat.completion.chunk",
        "created": turn.created,
        "model": turn.model,
        "service_tier": "default",
        "system_fingerprint": "fp_sim",
    }
    if with_usage:
        base["usage"] = None

    async def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> None:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        await stream.data({**base, "choices": [choice]})

    async def fail() -> None:
        error = {
            "message": "Rate limit reached: retry later."
            if d.overloaded
            else "Simulated failure mid-stream.",
            "type": "rate_limit_exceeded" if d.overloaded else "server_error",
            "param": None,
            "code": "rate_limit_exceeded" if d.overloaded else None,
        }
        await stream.data({"error": error})

    async def keepalive() -> None:
        await stream.send(b": keep-alive\n\n")

    call = turn.call
    await chunk({"role": "assistant", "content": "" if call is None else None, "refusal": None})
    content: list[dict[str, Any]]
    if turn.speaks:  # the transcript as it is said, then the audio, as OpenAI streams them
        audio_id = "audio_" + turn.id.removeprefix("chatcmpl-")
        content = [{"audio": {"id": audio_id, "transcript": w}} for w in turn.words]
        content.append({"audio": {"id": audio_id, "data": SPOKEN, "expires_at": turn.created + 3600}})
    else:
        content = [{"content": w} for w in turn.words] if call is None else call.chat_deltas()
    deltas: list[dict[str, Any]] = [{"reasoning_content": w} for w in turn.reasoning] + content
    for i, delta in enumerate(deltas):
        if not await directives.before_piece(d, i, stream.drop, fail, keepalive):
            return await stream.end()
        await chunk(delta)
    if azure:
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": turn.finish}
        choice["content_filter_results"] = _azure_results(turn.finish)
        await stream.data({**base, "choices": [choice]})
    else:
        await chunk({}, turn.finish)
    if with_usage:
        await stream.data({**base, "choices": [], "usage": turn.usage()})
    if not d.no_done:
        await stream.send(b"data: [DONE]\n\n")
    if d.linger:
        await asyncio.sleep(d.linger)
    return await stream.end()


# Azure OpenAI's content filter: its categories, the results of a prompt it let through, and its
# refusal of a prompt (400 content_filter, as Azure answers it).
AZURE_CATEGORIES = ("hate", "self_harm", "sexual", "violence")
AZURE_PROMPT_RESULTS = [
    {
        "prompt_index": 0,
        "content_filter_results": {c: {"filtered": False, "severity": "safe"} for c in AZURE_CATEGORIES},
    }
]
AZURE_PROMPT_FILTERED = orjson.dumps(
    {
        "error": {
            "message": "The response was filtered due to the prompt triggering Azure OpenAI's content "
            "management policy. Please modify your prompt and retry. To learn more about our content "
            "filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
            "type": None,
            "param": "prompt",
            "code": "content_filter",
            "status": 400,
            "innererror": {
                "code": "ResponsibleAIPolicyViolation",
                "content_filter_result": {
                    **{c: {"filtered": False, "severity": "safe"} for c in AZURE_CATEGORIES},
                    "violence": {"filtered": True, "severity": "high"},
                },
            },
        }
    }
)


def _azure_results(finish: str) -> dict[str, Any]:
    """An answer's filter results: violence cut it when it ended on content_filter."""
    results = {c: {"filtered": False, "severity": "safe"} for c in AZURE_CATEGORIES}
    if finish == "content_filter":
        results["violence"] = {"filtered": True, "severity": "medium"}
    return results
