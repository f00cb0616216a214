"""How a caller tells the simulator to misbehave.

Directives are `name=value` pairs, read from three places (later ones win):
  1. the model name after a `+`:      "gpt-4o-mini+ttft=200ms+fail=503"
  2. the header `x-sim`:               "tokens=200, pace=5ms"
  3. a marker in the last message:     "[sim tokens=3 drop_after=2]"
The model name route lets a gateway config pin behaviour per model; the marker lets a test drive one
configured model through the gateway, which forwards neither headers nor anything else of its own.

  tokens=N        output length in words (default 16; max_tokens / max_completion_tokens cap it)
  reasoning=N     stream N words of reasoning_content before the answer (inside the output limit,
                  as every API counts it: what it leaves of the limit is the answer's)
  ttft=D          wait D before the first token (non-streamed: before answering)
  pace=D          wait D between streamed chunks
  fail=STATUS     answer with this HTTP status and an OpenAI-format error body
  fail=content_policy  refuse the request under the provider's content policy: 400 with OpenAI's
                  `content_policy_violation` body (chat completions), Anthropic's "Output blocked by
                  content filtering policy" (messages)
  flag[=CATS]     the moderation model (/v1/moderations, sim/moderation.py) flags the input, for the
                  categories named (comma-separated, e.g. flag=hate,violence; default violence)
  stall_after=N   after N content chunks, send nothing more and keep the connection open
  ping=D          (chat, messages; with stall_after) while stalled, send a keep-alive every D (an SSE
                  comment; Anthropic's `ping` event): bytes, but no output
  linger=D        (chat) after the stream's last event (`data: [DONE]`), wait D before ending the body
  drop_after=N    after N content chunks, cut the connection without ending the stream
  error_after=N   after N content chunks, send an error chunk and end the stream
  overloaded      (with error_after) the error is the provider's "at capacity" one: Anthropic's
                  overloaded_error event, Bedrock's throttlingException, Google's
                  RESOURCE_EXHAUSTED (without a value)
  filter_after=N  (chat) the provider's content filter cuts the answer after N words: it ends there
                  with finish_reason "content_filter", usage counting what was produced
  no_usage        count nothing: no `usage` in a chat answer nor a usage chunk in a chat stream that
                  asked for one, as some OpenAI-compatible servers answer; no `usage` in a plain
                  message (without a value)
  no_done         (chat) end a stream after its finish (and usage) chunk without `data: [DONE]`, as
                  some OpenAI-compatible servers do (without a value)
  tool            call the first tool the request offers (without a value; a tool_choice that forces
                  a call does the same without it, see sim/tools.py)
  render=D        a video job or a background response takes D from creation to its end (default
                  2s; see sim/videos.py and sim/responses.py)
  render_fail     the video job or background response ends `failed` (without a value)
Durations: "150ms", "2s" or plain seconds ("0.5").
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

_MARKER = re.compile(r"\[sim\s+([^\]]*)\]")
_FLAGS = ("tool", "render_fail", "overloaded", "no_usage", "no_done")  # the directives without a value


@dataclass(slots=True)
class Directives:
    tokens: int = 16
    reasoning: int = 0
    ttft: float = 0.0
    pace: float = 0.0
    fail: int | None = None
    stall_after: int | None = None
    linger: float = 0.0
    ping: float = 0.0
    drop_after: int | None = None
    error_after: int | None = None
    overloaded: bool = False  # the error_after error says the provider is at capacity
    filter_after: int | None = None
    tool: bool = False
    no_usage: bool = False
    no_done: bool = False
    render: float = 2.0
    render_fail: bool = False
    refuse: bool = False  # fail=content_policy
    flag: str | None = None  # the moderation categories an input is flagged for, comma-separated


class DirectiveError(ValueError):
    pass


def _duration(text: str) -> float:
    if text.endswith("ms"):
        return float(text[:-2]) / 1000
    if text.endswith("s"):
        return float(text[:-1])
    return float(text)


def _apply(d: Directives, pairs: list[str]) -> None:
    for item in pairs:
        pair = item.strip()
        if not pair:
            continue
        name, sep, value = pair.partition("=")
        if name == "flag":
            d.flag = value or "violence"
            continue
        if name == "fail" and value == "content_policy":
            d.refuse = True
            continue
        if pair in _FLAGS:
            setattr(d, pair, True)
            continue
        if not sep:
            raise DirectiveError(f"directive {pair!r} has no value")
        try:
            if name in ("ttft", "pace", "render", "linger", "ping"):
                setattr(d, name, _duration(value))
            elif name in (
                "tokens",
                "reasoning",
                "fail",
                "stall_after",
                "drop_after",
                "error_after",
                "filter_after",
            ):
                setattr(d, name, int(value))
            else:
                raise DirectiveError(f"unknown directive {name!r}")
        except ValueError as exc:
            raise DirectiveError(f"bad value for {name}: {value!r}") from exc


def parse(model: str, header: str | None, last_message: str | None) -> tuple[str, Directives]:
    """The base model name and the directives that apply to this request."""
    d = Directives()
    base, *suffix = model.split("+")
    _apply(d, suffix)
    if header:
        _apply(d, re.split(r"[,\s]+", header))
    if last_message:
        for match in _MARKER.finditer(last_message):
            _apply(d, match.group(1).split())
    return base, d


async def before_piece(
    d: Directives,
    sent: int,
    drop: Callable[[], None],
    fail: Callable[[], Awaitable[None]],
    keepalive: Callable[[], Awaitable[None]] | None = None,
) -> bool:
    """What every simulated stream does before its piece number `sent` (0-based): wait `pace`, then
    stall (sending `keepalive()` every `ping` meanwhile), drop the connection or send an error as
    the directives say. False: the stream is over."""
    if d.pace:
        await asyncio.sleep(d.pace)
    if d.stall_after is not None and sent >= d.stall_after:
        if d.ping and keepalive is not None:
            for _ in range(int(3600 / d.ping)):
                await asyncio.sleep(d.ping)
                await keepalive()
        await asyncio.sleep(3600)
        return False
    if d.drop_after is not None and sent >= d.drop_after:
        drop()
        return False
    if d.error_after is not None and sent >= d.error_after:
        await fail()
        return False
    return True
