"""The safety check before a model runs (spec 7.2 `content_filtered`, 7.5.2).

A model whose configuration names a moderation model (its own `safety`, or `[safety] model` for
every checked type) has the text of each request read by that moderation model before anything is
held or sent: through the gateway's own channels (gateway.routing: retried and failed over like any
request), in OpenAI's moderations shape. A flagged request is refused with 400 `content_filtered`,
naming the flagged categories (never the prompt), holds nothing, reaches no model and is charged
nothing. A request that passes runs as usual; the check itself is not charged to the client. When the
moderation model fails, `[safety] on_error` decides: "refuse" (the default) answers its error, not
charged; "allow" lets the request run unchecked. Every try of the check is in the request's log
entry, beside the model's own attempts, with its verdict (docs/behaviour.md, "Safety checks").
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from starlette.requests import Request

from .config import ModelConfig
from .context import Call
from .errors import GatewayError
from .routes.upstream import call_upstream
from .routing import Attempt
from .state import GatewayState

log = logging.getLogger("gateway.safety")

# The request fields whose text a model of each type reads: its prompt, and the tools, output
# formats and predictions it is told of (their names, descriptions and schemas are read as prompt
# too; review: text hidden there, in a text document or file, or in a tool call's arguments, went
# unchecked). The first one is the `param` of the refusal.
CHECKED_FIELDS: Final = {
    "chat": ("messages", "tools", "functions", "response_format", "prediction"),
    "messages": ("messages", "system", "tools"),
    "responses": ("input", "instructions", "tools", "text", "prompt"),
    "image": ("prompt",),
    "video": ("prompt",),
    "speech": ("input",),
}
# Keys whose string values are not words the model reads: kinds, ids, roles, references to media
# (URLs, file ids, data URLs), signatures and opaque state, settings. Objects under them are still
# read (a Responses `text.format` holds a schema).
_NOT_TEXT: Final = frozenset(
    {
        "type",
        "id",
        "role",
        "status",
        "tool_call_id",
        "tool_use_id",
        "call_id",
        "url",
        "image_url",
        "file_url",
        "file_id",
        "media_type",
        "mime_type",
        "detail",
        "format",
        "signature",
        "encrypted_content",
        "$ref",
    }
)
# Keys whose value is skipped whole: settings that hold no prompt.
_SKIPPED: Final = frozenset({"cache_control"})
# Plain-text documents and files are read as text; other media (images, audio, PDFs) are not.
_TEXT_MEDIA: Final = ("text/",)
# What the model's answer (errors, failures) keeps of the moderation model's own failure codes; any
# other failure of the check (a malformed answer, the moderation upstream refusing our request) is
# reported as provider_error: the gateway's own set-up is at fault, not the caller.
_PASSED_ON: Final = frozenset({"provider_error", "provider_overloaded", "timeout"})


@dataclass(slots=True)
class SafetyAttempt(Attempt):
    """One try of a request's safety check on one channel of the moderation model, as the request
    log shows it, before the model's own attempts."""

    check: str = "safety"
    model: str = ""  # the moderation model
    # "passed" or "flagged" on the try that answered; "error" when the check failed (on_error
    # "allow": the request ran unchecked); None on a try that failed and was retried.
    verdict: str | None = None
    categories: list[str] = field(default_factory=list)  # what was flagged

    def logged(self) -> dict[str, object]:
        logged = Attempt.logged(self)
        logged["check"] = self.check
        logged["model"] = self.model
        logged["verdict"] = self.verdict
        logged["categories"] = self.categories
        return logged


def request_texts(payload: dict[str, Any], fields: Iterable[str]) -> list[str]:
    """The texts of the request's `fields`, one input of the check each: a string field, or one
    element of a list field (a message, an input item, a tool) with every text in it, content
    parts and blocks, tool calls and their arguments, tool results, thinking, names, descriptions
    and schemas, and the text of plain-text documents and files, one per line."""
    out: list[str] = []
    for name in fields:
        value = payload.get(name)
        for item in value if isinstance(value, list) else [value]:
            found: list[str] = []
            _collect(item, found)
            text = "\n".join(found)
            if text.strip():
                out.append(text)
    return out


def _collect(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        if value.strip():
            out.append(value)
    elif isinstance(value, list):
        for item in value:
            _collect(item, out)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in _SKIPPED or (key in _NOT_TEXT and isinstance(item, str)):
                continue
            if key in ("data", "file_data"):
                text = _media_text(value, item, typed=key == "data")
                if text:
                    out.append(text)
                continue
            _collect(item, out)


def _media_text(holder: dict[str, Any], data: Any, *, typed: bool) -> str | None:
    """The text of a document's or file's data when it is plain text: Anthropic's text source
    (`{type: text, data}`) or base64 source of a text/* media type, a data URL of a text/* type, or
    (a file's `file_data`, which need not say its type) base64 of UTF-8 text; None for other media.
    `typed`: data that is text only when its holder says so (audio's and images' `data`)."""
    if not isinstance(data, str):
        return None
    if holder.get("type") == "text":
        return data
    media = holder.get("media_type") or holder.get("mime_type")
    if data.startswith("data:"):
        head, _, data = data.partition(",")
        media = head[5:].split(";", 1)[0]
    if not isinstance(media, str) and typed:
        return None
    if isinstance(media, str) and not media.startswith(_TEXT_MEDIA):
        return None
    try:
        text = base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    return text if "\x00" not in text else None


async def check(
    state: GatewayState,
    request: Request,
    call: Call,
    model: ModelConfig,
    payload: dict[str, Any],
    endpoint_type: str | None = None,
) -> None:
    """Run the model's safety check on the request, or return at once when it has none. Raises
    content_filtered when the request is flagged. `endpoint_type` names the shape of `payload`
    (the endpoint's type, when it serves a translated model); by default the model's own."""
    name = model.safety_model
    if name is None:
        return
    moderator = state.registry.get(name)
    assert moderator is not None, "config.py checks that every safety model exists"
    fields = CHECKED_FIELDS[endpoint_type or model.type]
    texts = request_texts(payload, fields)
    if not texts:
        return
    call.model = model.name  # a refused request is logged under the model it asked for
    first = len(call.attempts)
    verdict: str | None = None
    flagged: list[str] = []
    try:
        answer = await call_upstream(
            state, request, call, moderator, state.registry.channel_body(moderator, {"input": texts})
        )
        is_flagged, flagged = _verdict(answer.content)
        verdict = "flagged" if is_flagged else "passed"
    except GatewayError as err:
        verdict = "error"
        if state.settings.safety.on_error == "allow":
            log.warning("safety check by %s failed (%s); the request runs unchecked", name, err.code)
            return
        if err.code in _PASSED_ON:
            raise GatewayError(
                err.code,
                f"The safety check could not run: {err.message}",
                status=err.status,
                headers=err.headers,
            ) from err
        raise GatewayError("provider_error", f"The safety check could not run: {err.message}") from err
    finally:
        _mark(call, first, name, verdict, flagged)
    if verdict == "flagged":
        what = f"flagged for {', '.join(flagged)}" if flagged else "flagged"
        raise GatewayError(
            "content_filtered",
            f"The gateway's safety check refused the request before the model ran: its `{fields[0]}` "
            f"was {what}. Nothing was charged; the same input gets the same answer.",
            param=fields[0],
        )


def _verdict(content: bytes) -> tuple[bool, list[str]]:
    """Whether an OpenAI moderations answer flags any input, and the categories it flags."""
    try:
        data = orjson.loads(content)
        results = data["results"]
        if not isinstance(results, list) or not results:
            raise TypeError
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise GatewayError("provider_error", "the moderation model sent a malformed answer.") from exc
    flagged = False
    categories: set[str] = set()
    for result in results:
        if not isinstance(result, dict) or result.get("flagged") is not True:
            continue
        flagged = True
        named = result.get("categories")
        if isinstance(named, dict):
            categories.update(k for k, v in named.items() if v is True)
    return flagged, sorted(categories)


def _mark(call: Call, first: int, model: str, verdict: str | None, categories: list[str]) -> None:
    """The check's tries, as the router recorded them, become safety attempts of the log entry; the
    verdict goes on the last one (on an entry of its own, without a channel, when none was tried)."""
    tries = call.attempts[first:]
    if not tries and verdict is not None:  # refused before any channel was tried (all at capacity)
        call.attempts.append(SafetyAttempt("", time.time_ns() // 1_000_000, model=model, verdict=verdict))
        return
    for i, attempt in enumerate(tries):
        last = i == len(tries) - 1
        call.attempts[first + i] = SafetyAttempt(
            attempt.channel,
            attempt.started_ms,
            attempt.duration_ms,
            attempt.error,
            attempt.status,
            model=model,
            verdict=verdict if last else None,
            categories=categories if last else [],
        )
