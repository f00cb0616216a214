"""The management API described for tools: an OpenAPI 3.1 document of every route under /admin/v1
(routes/admin.py, routes/console_users.py, routes/admin_config.py), served at GET
/admin/v1/openapi.json with the same admin-token check as the rest of that API (docs/admin.md,
"OpenAPI document").

The request bodies come from the field readers the API itself uses (gateway.admin_fields and
console_users.USER_FIELDS): every field an operation reads must have a schema here, or building the
document fails, so a field cannot be added to the API and left out of its description. The bounds
(name and note lengths, rate limits, page sizes, limit resets, roles) are the readers' own constants.
tests/gateway/test_admin_openapi.py checks the paths against the routes the app registers and the
shapes against real answers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

import orjson

from .. import __version__, idempotency
from .. import admin_fields as field
from ..errors import ERROR_TABLE, ErrorCode
from ..store import LIMIT_RESETS
from ..store.records import CONSOLE_ROLES
from . import console_users

PREFIX: Final = "/admin/v1"
PATH: Final = f"{PREFIX}/openapi.json"
OPENAPI_VERSION: Final = "3.1.0"

Schema = dict[str, Any]

# ---------------------------------------------------------------- values


def _ref(kind: str, name: str) -> Schema:
    return {"$ref": f"#/components/{kind}/{name}"}


def _schema(name: str) -> Schema:
    return _ref("schemas", name)


def _nullable(schema: Schema) -> Schema:
    """The same value, or null (OpenAPI 3.1: JSON Schema's type list, no `nullable`)."""
    if isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


TIME: Final[Schema] = {
    "type": "string",
    "format": "date-time",
    "description": "RFC 3339 in UTC with milliseconds, e.g. 2026-12-31T23:59:59.000Z.",
}
MONEY_OUT: Final[Schema] = {
    "type": "string",
    "pattern": r"^-?[0-9]+(\.[0-9]+)?$",
    "description": 'US dollars as a decimal string in plain digits, e.g. "12.50".',
}
# What field.money reads: a plain decimal string or an exact JSON number, zero or more, below
# MAX_MONEY, at most MONEY_PLACES decimal places.
MONEY_IN: Final[Schema] = {
    "anyOf": [
        {"type": "string", "pattern": rf"^[0-9]+(\.[0-9]{{1,{field.MONEY_PLACES}}})?$"},
        {"type": "number", "minimum": 0, "exclusiveMaximum": int(field.MAX_MONEY)},
    ],
    "description": (
        'US dollars: a decimal string such as "12.50" (plain digits, no exponent) or a JSON number,'
        f" read from its own digits; less than {field.MAX_MONEY:f}, at most {field.MONEY_PLACES}"
        " decimal places."
    ),
}
POSITIVE_MONEY_IN: Final[Schema] = {
    "anyOf": [
        {"type": "string", "pattern": rf"^[0-9]+(\.[0-9]{{1,{field.MONEY_PLACES}}})?$"},
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": int(field.MAX_MONEY)},
    ],
    "description": f"{MONEY_IN['description']} Must be positive.",
}

# The schema of each of admin_fields' readers, by the reader itself; a field read by another reader
# (a lambda, a reader of another module) takes its schema from the operation's `overrides`.
READER_SCHEMAS: Final[Mapping[object, Schema]] = {
    field.name: {
        "type": "string",
        "minLength": 1,
        "maxLength": field.MAX_NAME_CHARS,
        "description": "Printable characters, not only spaces.",
    },
    field.account_name: {
        "type": "string",
        "minLength": 1,
        "maxLength": field.MAX_NAME_CHARS,
        "pattern": "^(?!acct_)",
        "description": "Printable characters, not only spaces; not beginning with acct_ (as account ids do).",
    },
    field.note: {"type": ["string", "null"], "maxLength": field.MAX_NOTE_CHARS},
    field.money: MONEY_IN,
    field.optional_money: {
        "anyOf": [*MONEY_IN["anyOf"], {"type": "null"}],
        "description": f"{MONEY_IN['description']} null: no limit.",
    },
    field.rate_limit: {
        "type": ["integer", "null"],
        "minimum": 1,
        "maximum": field.MAX_RATE,
        "description": "Per minute, for each of the account's keys; null: no limit.",
    },
    field.limit_reset: {
        "enum": [*LIMIT_RESETS, None],
        "description": "When the spending counted against credit_limit starts again (UTC); null: never.",
    },
    field.expiry: {
        "anyOf": [
            {
                "type": "integer",
                "minimum": 0,
                "maximum": field.LATEST_MS,
                "description": "Unix milliseconds.",
            },
            {"type": "string", "format": "date-time", "description": "ISO 8601 with its offset."},
            {"type": "null"},
        ],
        "description": "When the key stops working: Unix milliseconds or an ISO 8601 time with its"
        " offset (2026-12-31T23:59:59Z); null: never.",
    },
}


def _body(
    readers: Mapping[str, field.Reader],
    required: Collection[str] = (),
    overrides: Mapping[str, Schema] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Schema:
    """A request body's schema: one property for each field the operation reads (unknown fields are
    refused, hence additionalProperties false)."""
    overrides = overrides or {}
    defaults = defaults or {}
    unknown = (set(overrides) | set(defaults) | set(required)) - set(readers)
    if unknown:
        raise ValueError(f"the OpenAPI document names fields the API does not read: {sorted(unknown)}")
    properties: dict[str, Schema] = {}
    for name, reader in readers.items():
        schema = overrides.get(name, READER_SCHEMAS.get(reader))
        if schema is None:
            raise ValueError(f"the OpenAPI document has no schema for the field {name!r}")
        properties[name] = {**schema, **({"default": defaults[name]} if name in defaults else {})}
    body: Schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        body["required"] = list(required)
    return body


def _object(description: str, properties: Mapping[str, Schema], **extra: Any) -> Schema:
    """A response object: every property is always present (null when it has no value)."""
    return {
        "type": "object",
        "description": description,
        "required": list(properties),
        "properties": dict(properties),
        **extra,
    }


def _extended(schema: Schema, description: str, **more: Schema) -> Schema:
    return _object(description, {**schema["properties"], **more})


def _list(item: str, description: str, *, paged: bool = True) -> Schema:
    """A list: a page of one (`has_more`), or the whole of it at once."""
    more = {"has_more": {"type": "boolean", "description": "Whether another page follows."}}
    return _object(
        description,
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _schema(item)},
            **(more if paged else {}),
        },
    )


def _id(prefix: str) -> Schema:
    return {"type": "string", "pattern": f"^{prefix}_", "examples": [f"{prefix}_4f2a"]}


def _schemas(configured: Collection[str]) -> dict[str, Schema]:
    model = {"type": "string", **({"enum": sorted(configured)} if configured else {})}
    account = _object(
        "An account: its balance, the models its keys may use and their rate limits.",
        {
            "id": _id("acct"),
            "object": {"const": "account"},
            "name": {"type": "string"},
            "balance": MONEY_OUT,
            "allowed_models": {
                "type": ["array", "null"],
                "items": model,
                "description": "Configured model names; null: every model, []: none.",
            },
            "rpm_limit": {"type": ["integer", "null"], "minimum": 1},
            "tpm_limit": {"type": ["integer", "null"], "minimum": 1},
            "created_at": TIME,
        },
    )
    key = _object(
        "An API key (never its secret but when created or rotated).",
        {
            "id": _id("key"),
            "object": {"const": "api_key"},
            "account_id": _id("acct"),
            "name": {"type": "string"},
            "prefix": {"type": "string", "description": "The secret's first characters, to recognise it."},
            "credit_limit": _nullable(MONEY_OUT),
            "limit_reset": {"enum": [*LIMIT_RESETS, None]},
            "spent": {**MONEY_OUT, "description": "What counts against credit_limit in this period."},
            "expires_at": _nullable(TIME),
            "created_at": TIME,
            "deleted_at": _nullable(TIME),
        },
    )
    top_up = _object(
        "Money added to an account: one entry of its ledger.",
        {
            "id": _id("topup"),
            "object": {"const": "top_up"},
            "account_id": _id("acct"),
            "amount": MONEY_OUT,
            "note": {"type": ["string", "null"]},
            "balance_after": MONEY_OUT,
            "created_at": TIME,
        },
    )
    attempt = {
        "type": "object",
        "description": "One try of the request on one channel.",
        "required": ["channel", "started_ms", "duration_ms", "error", "status"],
        "properties": {
            "channel": {"type": "string"},
            "started_ms": {"type": "integer"},
            "duration_ms": {"type": "integer"},
            "error": {"type": ["string", "null"], "description": "The error code it failed with."},
            "status": {"type": ["integer", "null"]},
            "dropped_params": {"type": "array", "items": {"type": "string"}},
        },
    }
    log = _object(
        "One request to the gateway's model API, failures included.",
        {
            "id": {"type": "string", "description": "The request's x-service-request-id."},
            "object": {"const": "request_log"},
            "key_id": {"type": ["string", "null"]},
            "account_id": {"type": ["string", "null"]},
            "method": {"type": "string"},
            "path": {"type": "string"},
            "model": {"type": ["string", "null"]},
            "status": {"type": "integer"},
            "error_code": {"type": ["string", "null"]},
            "started_at": TIME,
            "duration_ms": {"type": "integer", "minimum": 0},
            "cost": {**_nullable(MONEY_OUT), "description": "What was charged; null when nothing was."},
            "usage_id": {"type": ["string", "null"]},
            "attempts": {"type": "array", "items": _schema("Attempt")},
            "dropped_params": {"type": "array", "items": {"type": "string"}},
            "request_bytes": {"type": "integer", "minimum": 0},
            "response_bytes": {"type": "integer", "minimum": 0},
        },
    )
    kept_body = _object(
        "A kept body: text when it is UTF-8, else base64.",
        {
            "encoding": {"enum": ["utf-8", "base64"]},
            "data": {"type": "string"},
            "truncated": {
                "type": "boolean",
                "description": "Only the first [logs] max_body_bytes were kept.",
            },
        },
    )
    kept = {"anyOf": [_schema("KeptBody"), {"type": "null"}], "description": "null once purged."}
    channel = _object(
        "One channel of a model and its health.",
        {
            "name": {"type": "string"},
            "provider": {"type": "string"},
            "base_url": {"type": "string"},
            "weight": {"type": "integer"},
            "priority": {"type": "integer"},
            "max_concurrency": {"type": ["integer", "null"]},
            "state": {"enum": ["healthy", "at_capacity", "busy", "cooling_down", "half_open"]},
            "in_flight": {"type": "integer"},
            "failures_in_a_row": {"type": "integer"},
            "error_rate": {"type": "number", "minimum": 0, "maximum": 1},
            "latency_ms": {"type": ["number", "null"]},
            "attempts": {"type": "integer"},
            "failures": {"type": "integer"},
            "cooldown_remaining_seconds": {"type": "number", "minimum": 0},
            "shared": {"type": "boolean", "description": "Read from Redis: the deployment's view."},
        },
    )
    model_channels = _object(
        "A model's channels.",
        {
            "object": {"const": "model_channels"},
            "model": {"type": "string"},
            "channels": {"type": "array", "items": _schema("Channel")},
        },
    )
    user = _object(
        "Someone who signs in to the console: a member of one account, or an operator.",
        {
            "id": _id("cu"),
            "object": {"const": "console_user"},
            "email": {"type": "string", "format": "email"},
            "role": {"enum": list(CONSOLE_ROLES)},
            "account_id": {"type": ["string", "null"], "description": "null for an operator."},
            "status": {"enum": ["active", "invited", "invitation_expired"]},
            "invite_expires_at": _nullable(TIME),
            "created_at": TIME,
        },
    )
    error_object = _object(
        "The gateway's error object. Clients branch on `code`; `message` is for people.",
        {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"], "description": "The field or parameter at fault."},
            "code": {"enum": list(ERROR_TABLE)},
        },
    )
    return {
        "Account": account,
        "AccountList": _list("Account", "A page of accounts, oldest first."),
        "TopUp": top_up,
        "TopUpList": _list("TopUp", "A page of an account's ledger, oldest first."),
        "Key": key,
        "KeyWithSecret": _extended(
            key,
            "An API key with its secret, shown this once.",
            key={"type": "string", "pattern": "^sk-", "description": "The secret: shown this once."},
        ),
        "KeyList": _list("Key", "A page of an account's keys, deleted ones included, oldest first."),
        "Attempt": attempt,
        "RequestLog": log,
        "RequestLogWithBodies": _extended(
            log, "One request log entry with its kept bodies.", request_body=kept, response_body=kept
        ),
        "KeptBody": kept_body,
        "RequestLogList": _list("RequestLog", "A page of request logs, newest first."),
        "Channel": channel,
        "ModelChannels": model_channels,
        "ModelChannelsList": _list("ModelChannels", "Every model's channels.", paged=False),
        "ConsoleUser": user,
        "InvitedConsoleUser": _extended(
            user,
            "A console user with their invitation link, shown this once.",
            invite_url={"type": "string", "format": "uri"},
        ),
        "DeletedConsoleUser": _extended(user, "A console user, deleted.", deleted={"const": True}),
        "ConsoleUserList": _list("ConsoleUser", "Console users, oldest first (always one page)."),
        "ErrorObject": error_object,
        "Error": _object("A failure.", {"error": _schema("ErrorObject")}),
        "ConfigReload": _object(
            "The configuration file was checked and handed to the supervisor, which replaces the"
            " workers one by one (this answer comes before that is done).",
            {
                "status": {"const": "reloading"},
                "config": {"type": "string", "description": "The file's name."},
                "warnings": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "What the file leaves unset here (an upstream key's environment"
                    " variable): taken, but said.",
                },
            },
        ),
        "OpenApiDocument": {"type": "object", "description": "This document."},
    }


# ---------------------------------------------------------------- request bodies


def _bodies(configured: Collection[str]) -> dict[str, Schema]:
    models = {
        "type": ["array", "null"],
        "items": {"type": "string", **({"enum": sorted(configured)} if configured else {})},
        "description": "Configured model names the account's keys may use; null: every model, []: none.",
    }
    account = field.account_fields(configured)
    email = {"type": "string", "format": "email", "maxLength": console_users.MAX_EMAIL_CHARS}
    return {
        "CreateAccount": _body(
            {**account, "balance": field.money},
            required=("name",),
            overrides={"allowed_models": models},
            defaults={"balance": "0"},
        ),
        "UpdateAccount": _body(account, overrides={"allowed_models": models}),
        "CreateTopUp": _body(
            field.TOP_UP_FIELDS, required=("amount",), overrides={"amount": POSITIVE_MONEY_IN}
        ),
        "CreateKey": _body(field.KEY_FIELDS, defaults={"name": "default"}),
        "UpdateKey": _body(field.KEY_FIELDS),
        "CreateConsoleUser": _body(
            console_users.USER_FIELDS,
            required=("email",),
            overrides={
                "email": {**email, "description": "Unique, compared lower-cased."},
                "role": {"enum": list(CONSOLE_ROLES)},
                "account_id": {
                    "type": ["string", "null"],
                    "minLength": 1,
                    "description": "The member's account: required for a member, refused for an operator.",
                },
            },
            defaults={"role": "member"},
        ),
    }


# ---------------------------------------------------------------- errors


# Each error answer of the API: (status, the codes it carries, when).
ERRORS: Final[Mapping[str, tuple[int, tuple[ErrorCode, ...], str]]] = {
    "InvalidRequest": (
        400,
        ("invalid_request",),
        "Bad input: a missing, unknown or invalid field or query parameter, named by `param`; for a"
        " reload, a configuration file that is not valid (nothing changes).",
    ),
    "Unauthorized": (401, ("invalid_admin_token",), "No admin token, or a wrong one."),
    "Forbidden": (
        403,
        ("forbidden",),
        "An API key was presented (keys cannot manage keys), or the management API is disabled"
        " (no admin token is configured).",
    ),
    "NotFound": (404, ("not_found",), "No such account, key, request log or console user."),
    "IdempotencyConflict": (
        409,
        ("idempotency_key_reused",),
        "This Idempotency-Key was used for a top-up of this account with another amount or note.",
    ),
    "TooLarge": (413, ("request_too_large",), "The body is larger than the gateway takes."),
    "ServiceUnavailable": (
        503,
        ("service_unavailable",),
        "The gateway cannot reach its database or Redis; nothing was changed. Retry after Retry-After."
        " For a reload: no supervisor runs this gateway (it was not started by `gateway serve`).",
    ),
}


def _error_responses() -> dict[str, Schema]:
    responses: dict[str, Schema] = {}
    for name, (status, codes, when) in ERRORS.items():
        for code in codes:
            if ERROR_TABLE[code][0] != status:
                raise ValueError(f"{code} is answered with {ERROR_TABLE[code][0]}, not {status}")
        narrowed = {
            "properties": {
                "error": {
                    "properties": {
                        "code": {"enum": list(codes)},
                        "type": {"enum": sorted({ERROR_TABLE[c][1] for c in codes})},
                    }
                }
            }
        }
        responses[name] = {
            "description": f"{when} ({', '.join(f'`{c}`' for c in codes)})",
            "content": {"application/json": {"schema": {"allOf": [_schema("Error"), narrowed]}}},
        }
    return responses


STATUS_OF: Final[Mapping[str, int]] = {name: status for name, (status, _, _) in ERRORS.items()}


# ---------------------------------------------------------------- parameters


def _path_id(prefix: str) -> Schema:
    """An id in a path: any string (one of another form is simply not found: 404)."""
    return {"type": "string", "examples": [f"{prefix}_4f2a"]}


PARAMETERS: Final[Mapping[str, Schema]] = {
    "AccountId": {"name": "account_id", "in": "path", "required": True, "schema": _path_id("acct")},
    "KeyId": {"name": "key_id", "in": "path", "required": True, "schema": _path_id("key")},
    "LogId": {
        "name": "log_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": "The request's x-service-request-id.",
    },
    "UserId": {"name": "user_id", "in": "path", "required": True, "schema": _path_id("cu")},
    "Limit": {
        "name": "limit",
        "in": "query",
        "schema": {
            "type": "integer",
            "minimum": 1,
            "maximum": field.MAX_PAGE,
            "default": field.DEFAULT_PAGE,
        },
        "description": "How many entries a page holds.",
    },
    "After": {
        "name": "after",
        "in": "query",
        "schema": {"type": "string"},
        "description": "The id of the last entry of the previous page.",
    },
    "Before": {
        "name": "before",
        "in": "query",
        "schema": {"type": "string"},
        "description": "The id of the last entry of the previous page (the lists runs newest first).",
    },
    "LogAccountId": {
        "name": "account_id",
        "in": "query",
        "schema": {"type": "string"},
        "description": "Only this account's requests.",
    },
    "LogKeyId": {
        "name": "key_id",
        "in": "query",
        "schema": {"type": "string"},
        "description": "Only this key's requests.",
    },
    "UserAccountId": {
        "name": "account_id",
        "in": "query",
        "schema": {"type": "string"},
        "description": "Only this account's members.",
    },
    "IdempotencyKey": {
        "name": "Idempotency-Key",
        "in": "header",
        "schema": {"type": "string", "minLength": 1, "maxLength": idempotency.MAX_KEY_CHARS},
        "description": "Unique per account (an invoice number): the same key again adds nothing and"
        " answers with the first top-up.",
    },
}

# The parameters whose value is checked (400 when it is not what the schema says); the others are
# taken as given (an unknown id simply matches nothing).
CHECKED_PARAMETERS: Final = frozenset({"Limit", "IdempotencyKey"})


# ---------------------------------------------------------------- operations


def _operation(
    operation_id: str,
    summary: str,
    tag: str,
    answer: tuple[int, str],
    *,
    parameters: Iterable[str] = (),
    body: tuple[str, bool] | None = None,
    errors: Iterable[str] = (),
    headers: Mapping[str, Schema] | None = None,
) -> Schema:
    """One operation: `answer` is (status, schema name) of its success; `body` (schema name,
    required) its JSON body; `errors` the error answers beyond those of every operation (401, 403,
    503) and those its body or its parameters bring (400, 413)."""
    parameters = list(parameters)
    names = {"Unauthorized", "Forbidden", "ServiceUnavailable", *errors}
    if body is not None:
        names |= {"InvalidRequest", "TooLarge"}
    if CHECKED_PARAMETERS.intersection(parameters):
        names.add("InvalidRequest")
    status, schema = answer
    success: Schema = {
        "description": schema,
        "content": {"application/json": {"schema": _schema(schema)}},
    }
    if headers:
        success["headers"] = dict(headers)
    operation: Schema = {
        "operationId": operation_id,
        "summary": summary,
        "tags": [tag],
        "responses": {
            str(status): success,
            **{str(STATUS_OF[n]): _ref("responses", n) for n in sorted(names, key=STATUS_OF.__getitem__)},
        },
    }
    if parameters:
        operation["parameters"] = [_ref("parameters", p) for p in parameters]
    if body is not None:
        name, required = body
        operation["requestBody"] = {
            "required": required,
            "content": {"application/json": {"schema": _schema(name)}},
        }
    return operation


def _paths() -> dict[str, dict[str, Schema]]:
    accounts, keys, users = "Accounts", "Keys", "Console users"
    replayed = {
        "Idempotency-Replayed": {
            "description": "`true` when the Idempotency-Key was used already: nothing was added.",
            "schema": {"type": "string", "const": "true"},
        }
    }
    return {
        f"{PREFIX}/openapi.json": {
            "get": _operation("getOpenApiDocument", "This document", "Meta", (200, "OpenApiDocument"))
        },
        f"{PREFIX}/accounts": {
            "post": _operation(
                "createAccount",
                "Create an account",
                accounts,
                (201, "Account"),
                body=("CreateAccount", True),
            ),
            "get": _operation(
                "listAccounts", "List accounts", accounts, (200, "AccountList"), parameters=("Limit", "After")
            ),
        },
        f"{PREFIX}/accounts/{{account_id}}": {
            "get": _operation(
                "getAccount",
                "Get an account",
                accounts,
                (200, "Account"),
                parameters=("AccountId",),
                errors=("NotFound",),
            ),
            "patch": _operation(
                "updateAccount",
                "Change an account's name, models or limits (a field left out stays, null clears it)",
                accounts,
                (200, "Account"),
                parameters=("AccountId",),
                body=("UpdateAccount", False),
                errors=("NotFound",),
            ),
        },
        f"{PREFIX}/accounts/{{account_id}}/top-ups": {
            "post": _operation(
                "createTopUp",
                "Add money to an account",
                "Top-ups",
                (201, "TopUp"),
                parameters=("AccountId", "IdempotencyKey"),
                body=("CreateTopUp", True),
                errors=("NotFound", "IdempotencyConflict"),
                headers=replayed,
            ),
            "get": _operation(
                "listTopUps",
                "List an account's top-ups (its ledger)",
                "Top-ups",
                (200, "TopUpList"),
                parameters=("AccountId", "Limit", "After"),
                errors=("NotFound",),
            ),
        },
        f"{PREFIX}/accounts/{{account_id}}/keys": {
            "post": _operation(
                "createKey",
                "Create a key of an account (its secret is in this answer only)",
                keys,
                (201, "KeyWithSecret"),
                parameters=("AccountId",),
                body=("CreateKey", False),
                errors=("NotFound",),
            ),
            "get": _operation(
                "listKeys",
                "List an account's keys",
                keys,
                (200, "KeyList"),
                parameters=("AccountId", "Limit", "After"),
                errors=("NotFound",),
            ),
        },
        f"{PREFIX}/keys/{{key_id}}": {
            "get": _operation(
                "getKey", "Get a key", keys, (200, "Key"), parameters=("KeyId",), errors=("NotFound",)
            ),
            "patch": _operation(
                "updateKey",
                "Change a live key's name, credit limit or expiry",
                keys,
                (200, "Key"),
                parameters=("KeyId",),
                body=("UpdateKey", False),
                errors=("NotFound",),
            ),
            "delete": _operation(
                "deleteKey",
                "Delete a key (it stops working at once)",
                keys,
                (200, "Key"),
                parameters=("KeyId",),
                errors=("NotFound",),
            ),
        },
        f"{PREFIX}/keys/{{key_id}}/rotate": {
            "post": _operation(
                "rotateKey",
                "Give a key a new secret (the old one stops working at once)",
                keys,
                (200, "KeyWithSecret"),
                parameters=("KeyId",),
                errors=("NotFound",),
            )
        },
        f"{PREFIX}/logs": {
            "get": _operation(
                "listRequestLogs",
                "List request logs, newest first",
                "Request logs",
                (200, "RequestLogList"),
                parameters=("LogAccountId", "LogKeyId", "Limit", "Before"),
                errors=("NotFound",),  # a filter naming no account or key
            )
        },
        f"{PREFIX}/logs/{{log_id}}": {
            "get": _operation(
                "getRequestLog",
                "Get a request log entry with its kept bodies",
                "Request logs",
                (200, "RequestLogWithBodies"),
                parameters=("LogId",),
                errors=("NotFound",),
            )
        },
        f"{PREFIX}/config/reload": {
            "post": _operation(
                "reloadConfig",
                "Reload the configuration file without a restart (checked first)",
                "Configuration",
                (202, "ConfigReload"),
                errors=("InvalidRequest",),
            )
        },
        f"{PREFIX}/channels": {
            "get": _operation(
                "listChannels",
                "Every model's channels and their health",
                "Channels",
                (200, "ModelChannelsList"),
            )
        },
        console_users.PREFIX: {
            "post": _operation(
                "createConsoleUser",
                "Create a console user (their invitation link is in this answer only)",
                users,
                (201, "InvitedConsoleUser"),
                body=("CreateConsoleUser", True),
                errors=("NotFound",),  # the member's account_id
            ),
            "get": _operation(
                "listConsoleUsers",
                "List console users",
                users,
                (200, "ConsoleUserList"),
                parameters=("UserAccountId",),
                errors=("NotFound",),  # a filter naming no account
            ),
        },
        f"{console_users.PREFIX}/{{user_id}}": {
            "get": _operation(
                "getConsoleUser",
                "Get a console user",
                users,
                (200, "ConsoleUser"),
                parameters=("UserId",),
                errors=("NotFound",),
            ),
            "delete": _operation(
                "deleteConsoleUser",
                "Delete a console user (their sessions end at once)",
                users,
                (200, "DeletedConsoleUser"),
                parameters=("UserId",),
                errors=("NotFound",),
            ),
        },
        f"{console_users.PREFIX}/{{user_id}}/invite": {
            "post": _operation(
                "inviteConsoleUser",
                "Open a new invitation (a password reset: their password and sessions stop at once)",
                users,
                (200, "InvitedConsoleUser"),
                parameters=("UserId",),
                errors=("NotFound",),
            )
        },
    }


# ---------------------------------------------------------------- the document


def document(configured: Collection[str] = ()) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the management API for a gateway serving the `configured`
    models (the names allowed_models takes)."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "Gateway management API",
            "version": __version__,
            "description": (
                "Accounts, top-ups, keys, request logs, channel health and console users"
                " (docs/admin.md). Every request carries the admin token as a bearer token; without"
                " a configured admin token the API, this document included, answers 403 `forbidden`."
                " Money is US dollars as decimal strings. Every failure is"
                ' {"error": {"message", "type", "param", "code"}}.'
            ),
        },
        "security": [{"adminToken": []}],
        "tags": [
            {"name": name}
            for name in (
                "Accounts",
                "Top-ups",
                "Keys",
                "Request logs",
                "Channels",
                "Console users",
                "Configuration",
                "Meta",
            )
        ],
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The admin token ([admin] token_env), as Authorization: Bearer <token>."
                    " An API key (sk-...) is refused with 403.",
                }
            },
            "parameters": dict(PARAMETERS),
            "responses": _error_responses(),
            "schemas": {**_schemas(configured), **_bodies(configured)},
        },
    }


def document_json(configured: Collection[str] = ()) -> bytes:
    """The document as the route serves it: built and encoded once, when the app is made."""
    return orjson.dumps(document(configured))
