"""What every provider adapter shares: sending a request and turning upstream failures into the
spec's errors. An adapter module supplies the URL, the headers and the parameter lists."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import orjson

from ..config import ChannelConfig
from ..errors import GatewayError
from .http import UNSENT_FAILURES, UPSTREAM_FAILURES, UpstreamClient, UpstreamResponse, is_timeout

T = TypeVar("T")


# For providers whose wire format is the model type's own (OpenAI-compatible, Anthropic, Cohere,
# Azure): bodies and streams pass unchanged.
def unchanged(channel: ChannelConfig, operation: str, body: bytes) -> bytes:
    return body


def unchanged_answer(channel: ChannelConfig, operation: str, content: bytes, request: bytes) -> bytes:
    return content


def nothing_to_check(model_type: str, payload: dict[str, Any]) -> None:
    """For the same providers: what the route checked is what the upstream is asked."""


async def bearer_headers(
    channel: ChannelConfig,
    client_headers: Mapping[str, str],
    upstream: UpstreamClient,
    *,
    url: str = "",
    body: bytes = b"",
) -> dict[str, str]:
    """JSON both ways, and the channel's key as a bearer token (OpenAI's API and Cohere's)."""
    out = {"content-type": "application/json", "accept": "application/json"}
    key = channel.api_key()
    if key:
        out["authorization"] = f"Bearer {key}"
    return out


def no_stream_translation(channel: ChannelConfig, operation: str) -> None:
    return None


async def send(
    client: UpstreamClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    stream: bool,
    read_timeout: float,
    replayable: bool = True,
) -> UpstreamResponse:
    """POST and return a 2xx response whose body is left for the caller (any other status is the
    spec's error for it: a redirect too, which the gateway does not follow, its channel's
    base_url being the upstream's own).

    read_timeout is the longest silence allowed from the upstream: the stream idle window for streams
    (a timeout is then 408), the synchronous window otherwise (504). A request that is not
    `replayable` (it creates a job upstream) is not retried once it may have been sent."""
    try:
        response = await client.post(url, body, headers, read_timeout)
    except UPSTREAM_FAILURES as exc:
        unsent = isinstance(exc, UNSENT_FAILURES)
        if is_timeout(exc) and not unsent:
            raise GatewayError(
                "timeout",
                "The model did not answer within the time window.",
                status=408 if stream else 504,
                # Another channel may answer; waiting a whole window again on this one may not.
                retry="other" if replayable else "never",
                # Spec 8: the synchronous window's end is "connection closed and 504 timeout".
                headers=None if stream else {"connection": "close"},
            ) from exc
        raise GatewayError(
            "provider_error",
            "The model's provider could not be reached.",
            retry="any" if replayable or unsent else "never",
        ) from exc
    if not is_success(response.status):
        try:
            payload = await response.read()
        except UPSTREAM_FAILURES:
            payload = b""
        finally:
            response.release()
        raise upstream_error(response.status, payload, response.headers.get("retry-after"), headers)
    return response


def is_success(status: int) -> bool:
    """An upstream status that carries the answer asked for (2xx)."""
    return 200 <= status < 300


# Where an answer that is a failure says so: an error body's `error` comes first ({"error": ...},
# Anthropic's {"type": "error", "error": ...}), a Responses object's among its first fields (after
# id, object, created_at, status). An answer's text comes later, and is escaped there.
ERROR_WITHIN: Final = 512


def is_error_answer(content: bytes) -> bool:
    """Whether a 2xx answer is a failure all the same: a JSON object whose `error` is set (a
    server that answers its failures with 200, a Responses result that failed). It is the model's
    failure (502, not charged), not a result to pass on. Most answers are told by a search of
    their first bytes (find, not `in`: gateway.edge); a Responses object's `"error": null` too."""
    at = content.find(b'"error"', 0, ERROR_WITHIN)
    if at == -1 or content[at + 7 : at + 16].lstrip(b": \t\r\n").startswith(b"null"):
        return False
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return False
    return isinstance(data, dict) and bool(data.get("error"))


async def read_capped(response: UpstreamResponse, limit: int, what: str) -> bytes:
    """A response's whole body, refused with provider_error once it passes `limit` bytes (never
    buffered beyond it); `what` names the body in that error ("image", "file")."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise GatewayError("provider_error", f"The model's {what} is larger than the gateway keeps.")
        parts.append(chunk)
    return b"".join(parts)


# The upstream statuses that say it is at capacity: 429, and Anthropic's 529 overloaded_error.
OVERLOADED_STATUSES: Final = frozenset({429, 529})


class UpstreamRefusal(GatewayError):
    """A request the model's provider refused as invalid, with the field it named (OpenAI's
    `error.param`; media review: it was dropped), as the provider received the request: a route
    that translated the request clears it (routes/translated.py)."""


# The request headers that carry a channel's credential: the bearer token (OpenAI, Azure AD,
# Vertex), Anthropic's x-api-key, Azure's api-key, Google's x-goog-api-key, and AWS's session token
# (Bedrock with temporary credentials; its signature is no secret, its secret key never sent).
CREDENTIAL_HEADERS: Final = frozenset(
    {"authorization", "x-api-key", "api-key", "x-goog-api-key", "x-amz-security-token"}
)
# Shorter values are no secret worth the search (and could match ordinary words of a message).
_SHORTEST_SECRET: Final = 8
REDACTED: Final = b"[redacted]"


def without_credentials(payload: bytes, sent: Mapping[str, str]) -> bytes:
    """An upstream's answer with the credentials the gateway sent it (`sent`: the request's
    headers) blanked out: some upstreams quote the key or the header they refused in their error
    message, which reaches the client and the request log (security review)."""
    for name, value in sent.items():
        if name.lower() not in CREDENTIAL_HEADERS:
            continue
        secret = value.partition(" ")[2] or value if name.lower() == "authorization" else value
        for text in {value, secret}:
            if len(text) >= _SHORTEST_SECRET:
                payload = payload.replace(text.encode(), REDACTED)
    return payload


def upstream_error(
    status: int, payload: bytes, retry_after: str | None, sent: Mapping[str, str] | None = None
) -> GatewayError:
    """An upstream failure in the spec's vocabulary. Upstream credentials never leak into it: the
    ones the gateway sent (`sent`, the request's headers) are blanked out of what it quotes."""
    if sent:
        payload = without_credentials(payload, sent)
    if status in OVERLOADED_STATUSES:
        seconds = retry_after if retry_after and retry_after.isdigit() else "1"
        return GatewayError(
            "provider_overloaded",
            "The model's provider is at capacity. Retry with backoff or choose another model.",
            headers={"retry-after": seconds},
            retry="other",  # the upstream asked for a pause: another channel, not this one again
        )
    if status in REFUSAL_STATUSES:
        refusal = content_refusal(status, payload)
        if refusal is not None:
            return _refused(refusal)
    if status == 400 and _key_refused(payload):
        # Google answers an invalid API key with 400: the gateway's set-up, not the caller's request.
        return GatewayError(
            "provider_error", "The model's provider refused the gateway's key.", retry="other"
        )
    if status in (400, 413, 422):
        message, param = _refusal(payload)
        return UpstreamRefusal("invalid_request", "The model rejected the request: " + message, param=param)
    if status >= 500:
        return GatewayError(
            "provider_error",
            f"The model's provider failed (HTTP {status}).",
            status=503 if status == 503 else 502,
            retry="any",
        )
    # 401/403/404 and the rest: the gateway's own upstream set-up is at fault, not the caller.
    # Another channel may be set up right: the request moves there, but is not retried here.
    return GatewayError(
        "provider_error", f"The model's provider refused the gateway (HTTP {status}).", retry="other"
    )


# What a provider says inside a stream when it is at capacity: Anthropic's overloaded_error and
# rate_limit_error, Bedrock's throttlingException, OpenAI's rate_limit_exceeded, Google's
# RESOURCE_EXHAUSTED (compared in lower case).
STREAM_OVERLOAD_KINDS: Final = frozenset(
    {
        "overloaded_error",
        "rate_limit_error",
        "rate_limit_exceeded",
        "throttlingexception",
        "resource_exhausted",
    }
)


def stream_failure(error: bytes | None) -> GatewayError:
    """A stream that ended before its first token, with the error event it ended on (its raw JSON,
    in the shape's format) or none, in the spec's vocabulary: the provider at capacity is handled
    as its 429 (another channel, a cool-down for this one); anything else is a failure another
    attempt may get past; a refusal under its content policy is content_filtered, as the
    same refusal is before a stream."""
    if error is not None and _overload_kind(error):
        return upstream_error(429, error, None)
    refusal = content_refusal(400, error) if error is not None else None
    if refusal is not None:
        return _refused(refusal)
    return GatewayError("provider_error", "The model's stream failed before it started.", retry="any")


def _refused(refusal: str) -> GatewayError:
    # The same input gets the same refusal on every channel: not retried, not charged, and no
    # failure of the channel (retry None: the upstream answered).
    return GatewayError(
        "content_filtered", "The model's provider refused the request under its content policy: " + refusal
    )


def _overload_kind(error: bytes) -> bool:
    try:
        data = orjson.loads(error)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(data, dict):
        return False
    holders = [data, data.get("error"), (data.get("response") or {}).get("error")]
    for holder in holders:
        if isinstance(holder, dict):
            for field in ("type", "code", "status"):
                kind = holder.get(field)
                if isinstance(kind, str) and kind.lower() in STREAM_OVERLOAD_KINDS:
                    return True
    return False


def _key_refused(payload: bytes) -> bool:
    """Google's error for an API key it does not take (reason API_KEY_INVALID)."""
    return b"API_KEY_INVALID" in payload


# What a provider's `param` may be to be passed on: a field's name or path, not free text.
_PARAM: Final = re.compile(r"[A-Za-z0-9_.\[\]-]{1,200}")


def _refusal(payload: bytes) -> tuple[str, str | None]:
    """error.message of an OpenAI- or Anthropic-format error body (or a Cohere body's message),
    and error.param of an OpenAI-format one when it names a field."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    message = "no details given."
    for holder in (error, data):
        said = holder.get("message") if isinstance(holder, dict) else None
        if isinstance(said, str) and said:
            message = said[:500]
            break
    param = error.get("param") if isinstance(error, dict) else None
    return message, param if isinstance(param, str) and _PARAM.fullmatch(param) else None


# The upstream statuses a content-policy refusal comes with: 400 (OpenAI, Azure, Anthropic), 403
# (OpenRouter's moderation), 422, and Cohere's 498 "unsafe request".
REFUSAL_STATUSES: Final = frozenset({400, 403, 422, 498})
# OpenAI's codes for a request its safety system refused: content_policy_violation (images, chat),
# moderation_blocked (GPT image models), content_filter (Azure OpenAI's prompt filter).
_REFUSAL_CODES: Final = frozenset({"content_policy_violation", "moderation_blocked", "content_filter"})
# Words of an `invalid_prompt` error that make it a safety refusal ("your prompt was flagged as
# potentially violating our usage policy"), not a malformed prompt.
_POLICY_WORDS: Final = ("usage polic", "safety", "flagged", "content polic")


def _field(holder: dict[str, Any], key: str, kind: type[T], default: T) -> T:
    value = holder.get(key)
    return value if isinstance(value, kind) else default


def content_refusal(status: int, payload: bytes) -> str | None:
    """The upstream's message when its error is a refusal under its content policy, else None.
    Recognised: OpenAI's codes above (and `invalid_prompt` naming its usage policy), Azure's
    ResponsibleAIPolicyViolation, Anthropic's "Output blocked by content filtering policy",
    Cohere's 498 and "blocked input/output" messages, OpenRouter's 403 with moderation reasons."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = None
    body: dict[str, Any] = data if isinstance(data, dict) else {}
    error: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else body
    message = _field(error, "message", str, "")
    code, kind = error.get("code"), error.get("type")
    inner = _field(error, "innererror", dict, {})
    metadata = _field(error, "metadata", dict, {})
    lowered = message.lower()
    code = code if isinstance(code, str) else None
    kind = kind if isinstance(kind, str) else None
    refused = (
        code in _REFUSAL_CODES
        or kind in _REFUSAL_CODES
        or inner.get("code") == "ResponsibleAIPolicyViolation"
        or (code == "invalid_prompt" and any(word in lowered for word in _POLICY_WORDS))
        or "content filtering policy" in lowered  # Anthropic
        or status == 498  # Cohere: "blocked due to potential violations of the Usage Guidelines"
        or lowered.startswith(("blocked input", "blocked output"))  # Cohere
        or (status == 403 and "reasons" in metadata and "flagged_input" in metadata)  # OpenRouter
    )
    if not refused:
        return None
    filtered = inner.get("content_filter_result")
    flagged = sorted(
        name
        for name, verdict in (filtered.items() if isinstance(filtered, dict) else [])
        if isinstance(verdict, dict) and verdict.get("filtered") is True
    )
    text = message[:500] or "no details given."
    return text + (f" (flagged: {', '.join(flagged)})" if flagged else "")
