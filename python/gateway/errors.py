"""The one error table (spec 7.2) and the one way a failure becomes an HTTP answer.

Every failure the gateway returns is `{"error": {"message", "type", "param", "code"}}` with the status
of its code. Clients branch on `code`; `message` is for people and may change. Under /v1/messages
(Shape B) the same object is dressed as Anthropic's clients read it: a top-level `"type": "error"`
and `error.type` in Anthropic's vocabulary (MESSAGES_ERROR_TYPES), `code` unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import orjson
from starlette.responses import Response

# The stable error codes (spec 7.2 and the additions below): a typo in one fails type checking.
ErrorCode = Literal[
    "invalid_request",
    "model_not_found",
    "insufficient_credits",
    "key_budget_exceeded",
    "content_filtered",
    "invalid_api_key",
    "key_expired",
    "invalid_admin_token",
    "not_signed_in",
    "model_not_allowed",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "idempotency_key_reused",
    "idempotency_key_in_progress",
    "request_too_large",
    "rate_limited",
    "provider_overloaded",
    "provider_error",
    "timeout",
    "api_error",
    "service_unavailable",
]
# code -> (HTTP status, type). Codes are stable: add, never rename or remove.
ERROR_TABLE: Final[Mapping[ErrorCode, tuple[int, str]]] = {
    "invalid_request": (400, "invalid_request_error"),
    "model_not_found": (400, "not_found_error"),
    "insufficient_credits": (400, "insufficient_credits"),
    "key_budget_exceeded": (400, "insufficient_credits"),
    "content_filtered": (400, "content_policy_violation"),
    "invalid_api_key": (401, "authentication_error"),
    "key_expired": (401, "authentication_error"),
    # Added beyond the spec's table: the management API's admin token is missing or wrong.
    "invalid_admin_token": (401, "authentication_error"),
    # Added beyond the spec's table: a console script called without a signed-in session.
    "not_signed_in": (401, "authentication_error"),
    "model_not_allowed": (403, "permission_error"),
    "forbidden": (403, "permission_error"),
    "not_found": (404, "not_found_error"),
    # Added beyond the spec's table (allowed by spec 7.1/9.2): a known path with the wrong method.
    "method_not_allowed": (405, "invalid_request_error"),
    "idempotency_key_reused": (409, "idempotency_error"),
    "idempotency_key_in_progress": (409, "idempotency_error"),
    # Added beyond the spec's table: body over the 10 MB gateway limit (spec 8).
    "request_too_large": (413, "invalid_request_error"),
    "rate_limited": (429, "rate_limit_error"),
    "provider_overloaded": (429, "rate_limit_error"),
    # provider_error takes the upstream's 5xx family; 502 is its default.
    "provider_error": (502, "api_error"),
    # timeout is 408 for an idle stream and 504 past the synchronous window; 504 is its default.
    "timeout": (504, "api_error"),
    "api_error": (500, "api_error"),
    # Added beyond the spec's table: a service the gateway itself needs (its database, Redis) is
    # unreachable; nothing ran and nothing was charged; retry after Retry-After.
    "service_unavailable": (503, "api_error"),
}


# error.type as Anthropic's API names it, for answers under /v1/messages: its clients (the anthropic
# SDKs, the AI SDK's Anthropic provider) read `type`, not `code`. A spec type that is already one of
# Anthropic's words stays; the others are translated by MESSAGES_ERROR_TYPES (spec type -> word).
ANTHROPIC_ERROR_TYPES: Final = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
        "billing_error",
        "timeout_error",
    }
)
MESSAGES_ERROR_TYPES: Final[Mapping[str, str]] = {
    "insufficient_credits": "billing_error",  # insufficient_credits, key_budget_exceeded
    "content_policy_violation": "invalid_request_error",  # content_filtered (Anthropic's own is a 400)
    "idempotency_error": "invalid_request_error",  # idempotency_key_reused / _in_progress (409)
}
# The answer shapes of errors: the spec's object alone, or dressed for Anthropic's clients.
ErrorShape = Literal["spec", "messages"]
# The Messages API's paths (routes/messages.py). The anthropic client and LiteLLM's `anthropic/`
# models add /v1/messages to the base URL they are given: the gateway's root (spec 1.2), or one
# given with /v1 (/v1/v1/messages). The AI SDK's Anthropic provider adds /messages alone: to a base
# URL given with /v1, as its default has it, or to the root (/messages).
MESSAGES_PATHS = ("/v1/messages", "/v1/v1/messages", "/messages")


def shape_for_path(path: str) -> ErrorShape:
    """How an error under this request path is written: Anthropic's way under /v1/messages (and
    any path below it), the spec's elsewhere."""
    for base in MESSAGES_PATHS:
        if path.startswith(base) and (len(path) == len(base) or path[len(base)] == "/"):
            return "messages"
    return "spec"


class GatewayError(Exception):
    """A failure with a code from ERROR_TABLE. Raise it anywhere; one handler renders it."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        retry: Literal["any", "other", "never"] | None = None,
    ) -> None:
        super().__init__(message)
        default_status, self.type = ERROR_TABLE[code]
        self.code = code
        self.message = message
        self.param = param
        self.status = status if status is not None else default_status
        self.headers = dict(headers) if headers else {}
        # An upstream's failure that the router (gateway.routing) retries before the client hears
        # of it: on "any" channel, the same one included, or on "other" channels only; "never":
        # a failure of the channel all the same, but the request may have reached the upstream
        # and must not be sent twice (it creates a job).
        self.retry = retry

    def body(self, path: str = "") -> bytes:
        """The answer's body for a request to `path` (shape_for_path)."""
        return error_body(self.code, self.message, self.param, shape_for_path(path))


def error_object(
    code: ErrorCode, message: str, param: str | None = None, shape: ErrorShape = "spec"
) -> dict[str, Any]:
    """The spec's error object (2.1); with shape "messages", `type` in Anthropic's vocabulary."""
    type_ = ERROR_TABLE[code][1]
    # provider_overloaded stays the spec's rate_limit_error, also Anthropic's word (a 429): its
    # overloaded_error is a 529, which LiteLLM's Anthropic route raises as a 500 (review).
    if shape == "messages" and type_ not in ANTHROPIC_ERROR_TYPES:
        # A type missing from the table would be a gap of ours: Anthropic's catch-all then.
        type_ = MESSAGES_ERROR_TYPES.get(type_, "api_error")
    return {"message": message, "type": type_, "param": param, "code": code}


def error_body(code: ErrorCode, message: str, param: str | None = None, shape: ErrorShape = "spec") -> bytes:
    """The whole error answer as JSON bytes: `{"error": {...}}`, and for the message shape also
    Anthropic's top-level `"type": "error"`."""
    error = error_object(code, message, param, shape)
    if shape == "messages":
        return orjson.dumps({"type": "error", "error": error})
    return orjson.dumps({"error": error})


def error_response(err: GatewayError, headers: Mapping[str, str] | None = None, path: str = "") -> Response:
    """The HTTP answer for a failure of a request to `path` (its shape: shape_for_path)."""
    merged = {**err.headers, **headers} if headers else err.headers
    return Response(err.body(path), status_code=err.status, headers=merged, media_type="application/json")


def request_too_large(limit: int, whose: str = "gateway's") -> GatewayError:
    """413 for a body past `limit` bytes. The rest of the body is never read, so the connection
    cannot carry another request: the answer says `connection: close`, or a client reusing it
    would have its next request reset."""
    return GatewayError(
        "request_too_large",
        f"The request is larger than the {whose} limit of {limit} bytes.",
        headers={"connection": "close"},
    )


def unexpected_failure() -> GatewayError:
    """500 for a failure nobody foresaw: the client learns nothing of it (the log has it all)."""
    return GatewayError("api_error", "The gateway failed unexpectedly. Retry later.")


def quoted_id(given: str) -> str:
    """A client's id as an error message quotes it: cut short when it is longer than any id."""
    return repr(given if len(given) <= 100 else given[:100] + "...")


def invalid_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError("invalid_request", message, param=param)


class ServiceUnavailable(GatewayError):
    """A service the gateway needs (the store's database, Redis) cannot be reached: 503
    `service_unavailable` with Retry-After, raised by the backends, rendered like any error."""

    def __init__(self, service: str, retry_after: int = 1) -> None:
        super().__init__(
            "service_unavailable",
            f"The gateway cannot reach its {service} at the moment; nothing was run or charged."
            " Retry shortly.",
            headers={"Retry-After": str(retry_after)},
        )
        self.service = service
