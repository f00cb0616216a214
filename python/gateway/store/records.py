"""What the gateway keeps: the records every store backend reads and writes (gateway.store.base
says what each role of a store does with them). The ones every request makes (its usage record, log
entry and settlement) are `@frozen` (gateway.frozen): immutable to the type checker, as quick to make
as plain dataclasses."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, TypedDict

from ..clock import now_ms
from ..frozen import frozen

# How often a key's spending against its own credit limit starts again from zero (spec 2.4, 8).
LIMIT_RESETS: Final = ("daily", "weekly", "monthly")


@dataclass(frozen=True, slots=True)
class Account:
    id: str
    name: str
    balance: Decimal
    # None: every configured model is allowed.
    allowed_models: frozenset[str] | None = None
    # Requests and tokens per minute allowed on each of the account's keys (spec 8); None: no limit.
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    created_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    account_id: str
    name: str
    prefix: str  # the first characters of the key, for people to recognise it; never enough to use it
    created_at_ms: int
    expires_at_ms: int | None = None
    # The key's own spending limit in US dollars (spec 5.4); None: only the account's balance limits it.
    credit_limit: Decimal | None = None
    # One of LIMIT_RESETS, or None: what the key spent counts against credit_limit for ever.
    limit_reset: str | None = None
    deleted_at_ms: int | None = None
    # What the key spent in the period that starts at spent_period_ms (see gateway.budget).
    spent: Decimal = Decimal(0)
    spent_period_ms: int = 0


@dataclass(frozen=True, slots=True)
class TopUp:
    """Money added to an account: one entry of its ledger, never changed afterwards."""

    id: str
    account_id: str
    amount: Decimal
    note: str | None
    created_at_ms: int
    balance_after: Decimal  # the account's balance right after this top-up


class AccountChanges(TypedDict, total=False):
    """A partial update of an account: a field left out stays as it is, None clears it."""

    name: str
    allowed_models: frozenset[str] | None
    rpm_limit: int | None
    tpm_limit: int | None


class KeyChanges(TypedDict, total=False):
    """A partial update of a key's settings: a field left out stays as it is, None clears it."""

    name: str
    credit_limit: Decimal | None
    limit_reset: str | None
    expires_at_ms: int | None


# What a lease sets money aside from: an account's balance, or a key's own credit limit.
POT_KINDS: Final = ("account", "key")


class NameTaken(Exception):
    """Another account has this name already."""


class SchemaTooNew(RuntimeError):
    """The store's schema has migrations this gateway does not know: a newer gateway has used it
    (upgrade review: an older one started on it, said it was ready, and wrote records without what
    the newer one needs of them). A gateway never runs on it, nor lets its migrations pass it by."""

    def __init__(self, found: str, known: str) -> None:
        super().__init__(
            f"the store's schema is at {found}, newer than this gateway's ({known}): a newer gateway"
            " has used it. Run that version or a later one; going back to an older one is not"
            ' supported (docs/operations.md, "Upgrading")'
        )


class IdempotencyKeyReused(Exception):
    """A top-up with this idempotency key exists already, with another amount or note."""


class ConversationGap(LookupError):
    """A kept conversation misses a turn: the kept response `missing`, which a later turn
    continued, was deleted."""

    def __init__(self, missing: str) -> None:
        super().__init__(missing)
        self.missing = missing


def conversation_turns(rows: Sequence[tuple[bytes, str | None, int]], max_bytes: int) -> list[bytes] | None:
    """kept_conversation's answer from its walk: each turn's (items, previous_id, items' running
    total), oldest first. A walk that ended within `max_bytes` on a turn that continued another
    reached a deleted turn (ConversationGap); past `max_bytes` it stopped on purpose."""
    if not rows:
        return None
    _, previous, total = rows[0]
    if previous is not None and total <= max_bytes:
        raise ConversationGap(previous)
    return [items for items, _, _ in rows]


@dataclass(frozen=True, slots=True)
class KeyContext:
    """Who is calling: the key and its account, as found at authentication."""

    key: ApiKey
    account: Account


@frozen
class UsageRecord:
    """Spec 2.3. `id` is the response body's id; the record belongs to the key that made the request."""

    id: str
    request_id: str
    key_id: str
    account_id: str
    model: str
    status: str  # completed | incomplete | failed
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal
    started_at_ms: int
    ended_at_ms: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def duration_ms(self) -> int:
        return self.ended_at_ms - self.started_at_ms


USAGE_COLUMNS = (
    "id",
    "request_id",
    "key_id",
    "account_id",
    "model",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cost",
    "started_at_ms",
    "ended_at_ms",
)
# A request log entry's fields in order (RequestLog's): the one layout shared by every backend and
# the settlement journal, which keeps all but the bodies.
LOG_COLUMNS = (
    "id",
    "key_id",
    "account_id",
    "method",
    "path",
    "model",
    "status",
    "error_code",
    "started_at_ms",
    "duration_ms",
    "cost",
    "usage_id",
    "attempts",
    "request_body",
    "request_bytes",
    "response_body",
    "response_bytes",
)
LOG_BODY_COLUMNS = ("request_body", "response_body")


@frozen
class RequestLog:
    """One model request as the console's Logs show it (spec 1.4.3, 7.3, 7.5.3), failures included.
    `id` is the request id (x-service-request-id); a request refused for its key has none of its
    own (spec 7.3.1) and no key, account or bodies here. Bodies are kept up to a size limit
    (`*_bytes` give the whole sizes) and purged after the retention period; the rest stays."""

    id: str
    key_id: str | None
    account_id: str | None
    method: str
    path: str
    model: str | None
    status: int
    error_code: str | None
    started_at_ms: int
    duration_ms: int
    cost: Decimal | None  # what was charged; None when nothing was
    usage_id: str | None  # the usage record's id (the response body's id) when one was written
    # The channels it was tried on, as a JSON array of {channel, started_at_ms, duration_ms,
    # error, status}; None when it reached no model.
    attempts: str | None
    request_body: bytes | None
    request_bytes: int
    response_body: bytes | None
    response_bytes: int


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """An answer kept for an idempotent request (spec 8), replayed byte for byte."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class KeptAnswer:
    """The answer an Idempotency-Key keeps (spec 8), made durable in the same step as what the
    request did (its charge: Store.settle; its job: Store.create_job), so that a process killed
    between the two cannot leave a charge whose key a retry may run, and be charged, again. It
    finishes the claim of the request that holds the key (`fingerprint`, still running) only."""

    key_id: str
    idempotency_key: str
    fingerprint: str
    answer: StoredAnswer
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class IdempotencyClaim:
    """What to do with a request that carries an Idempotency-Key: `run` it (this request now holds
    the key), `replay` the stored `answer`, refuse it as `in_progress` (the first still runs) or as
    `reused` (the key was used with another body)."""

    outcome: str
    answer: StoredAnswer | None = None


@dataclass(frozen=True, slots=True)
class StoredImage:
    """An image the gateway serves at its own URL until it expires (spec 2.4). The token, in the URL,
    is the only thing needed to fetch it; key_id is the key whose request made it."""

    token: str
    data: bytes
    content_type: str
    expires_at_ms: int
    key_id: str


# The owner of the lease that holds a job's estimated cost until the job ends (see
# SqliteStore.create_job): not a process, so never reclaimed with dead processes' leases.
JOB_LEASE_PREFIX = "job:"
# The states of a job that has not ended; every other state is final.
JOB_RUNNING = ("queued", "in_progress")


@dataclass(frozen=True, slots=True)
class Job:
    """An asynchronous job the gateway follows upstream, with the money it holds until it ends
    (spec 1.4.4): a video (`kind` "video", spec 2.2, 3.1) or a background response, as deep
    research runs (`kind` "response"). Times are Unix milliseconds."""

    id: str
    kind: str  # video | response
    key_id: str
    account_id: str
    request_id: str  # the creating request's x-service-request-id
    model: str
    channel: str  # the identity of the channel that runs it (ChannelConfig.identity; a name before)
    upstream_id: str
    # queued | in_progress, then completed | failed; a response may also end cancelled | incomplete
    status: str
    progress: int
    hold: Decimal  # the estimate held on the account (and key limit) while it runs
    created_at_ms: int
    completed_at_ms: int | None = None
    expires_at_ms: int | None = None  # when a finished video's file stops being served
    error: str | None = None  # JSON {"code", "message"} once failed
    cost: Decimal | None = None  # charged once it ended
    # A video: what was asked for.
    prompt: str | None = None
    seconds: str | None = None
    size: str | None = None
    # A response: the Response object as its client sees it, as of the latest poll; the gateway id
    # of the response it continues; the gateway's own count of its input (used only when the
    # upstream reports no usage).
    body: bytes | None = None
    previous_id: str | None = None
    prompt_tokens: int = 0
    # The model's prices when the job was held (pricing.prices_text): it is charged at them, as a
    # request is at the configuration it began under, whatever a reload changed meanwhile (money
    # review: a price raised during a render charged it past its hold and the balance). None in a
    # job recorded before they were kept: the model's prices now.
    prices: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseState:
    """Where a stateful response (Responses API) lives upstream: the next turn that names `id` as its
    previous_response_id must go to the channel at `channel_url` and name `upstream_id` there.
    Scoped to the account that made it."""

    id: str
    account_id: str
    model: str
    channel_url: str
    upstream_id: str
    expires_at_ms: int
    # The most tokens of conversation a turn continuing it makes the upstream read again: its
    # prompt and output, or its output limit while its output is not known (a stream, a background
    # response). Recorded before its answer goes out, so the next turn's hold never misses them.
    context_tokens: int = 0
    # Its output items' ids, when known as it is recorded (a plain answer's): recorded as its
    # account's in the same step (Store.remember_items), never read back with the state.
    item_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KeptResponse:
    """A response the gateway made itself, translating a chat model's answer into the Responses API,
    and keeps as OpenAI keeps a stored one: a later turn may continue it (previous_response_id) or
    name its output items (item_reference). `items` is what this turn added to the conversation, a
    JSON array of Responses items: its input (references resolved), then its output; `previous_id`
    the kept response it continued. `body` is the Response object as the client saw it. Scoped to
    the account that made it; kept as long as its conversation (the turns linked by previous_id)."""

    id: str
    account_id: str
    model: str
    previous_id: str | None
    items: bytes
    body: bytes


@frozen
class Settlement:
    """A charge and its records: the usage record and, when the request was logged, its log entry;
    and the answer its Idempotency-Key keeps, when it has one. Applied as one step by every backend."""

    record: UsageRecord
    log: RequestLog | None = None
    answer: KeptAnswer | None = None


# ---------------------------------------------------------------------- the console (gateway.console)

CONSOLE_ROLES: Final = ("member", "operator")


@dataclass(frozen=True, slots=True)
class ConsoleUser:
    """Someone who signs in to the console with an email and a password: a `member` of one account
    (sees and manages only it) or an `operator` (every account; account_id None). A new user has no
    password until they follow their invitation (a single-use link whose token is kept hashed)."""

    id: str
    email: str  # lower-cased, unique
    role: str  # one of CONSOLE_ROLES
    account_id: str | None
    password_hash: str | None  # argon2id (PHC string); None until the invitation is used
    invite_hash: bytes | None  # sha256 of the invitation token while one is open
    invite_expires_at_ms: int | None
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """A signed-in browser. The cookie holds a random token; only its sha256 (`id`) is kept. An
    operator signed in with the admin token has no user (user_id None, role "operator")."""

    id: bytes
    user_id: str | None
    role: str
    account_id: str | None  # a member's account
    csrf: str  # the token every state-changing request must carry
    created_at_ms: int
    seen_at_ms: int  # the last request: idle expiry counts from here
    expires_at_ms: int  # absolute expiry


@dataclass(frozen=True, slots=True)
class Conversation:
    """A playground conversation, kept until its account's members delete it (spec 8)."""

    id: str
    account_id: str
    user_id: str | None
    title: str
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One turn of a conversation; an assistant's answer carries what it cost and which request
    (its request log id) it was."""

    id: str
    conversation_id: str
    role: str  # "system", "user", "assistant", or "failed" (a turn's error, never sent to a model)
    content: str
    model: str | None
    request_id: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cost: Decimal | None
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class LogQuery:
    """Which request log entries a list shows (newest first): every field narrows it; None is any."""

    account_id: str | None = None
    key_id: str | None = None
    model: str | None = None
    # An exact status (404), or a class: 2, 4 or 5 for 2xx, 4xx, 5xx (as `status_class`).
    status: int | None = None
    status_class: int | None = None
    path: str | None = None  # the endpoint, e.g. "/v1/chat/completions"
    since_ms: int | None = None  # started at or after
    until_ms: int | None = None  # started before
    request_id: str | None = None  # exactly this request id (x-service-request-id) or usage id


def log_equalities(
    account_id: str | None, key_id: str | None, query: LogQuery | None
) -> dict[str, Any] | None:
    """The columns a request log list needs equal to a value (the caller's account and key, and
    the query's exact fields), by column; None when no entry can match (the query names another
    account or key than the caller)."""
    equal: dict[str, Any] = {}
    pairs: list[tuple[str, Any]] = [("account_id", account_id), ("key_id", key_id)]
    if query is not None:
        pairs += [
            ("account_id", query.account_id),
            ("key_id", query.key_id),
            ("model", query.model),
            ("status", query.status),
            ("path", query.path),
        ]
    for column, value in pairs:
        if value is not None and equal.setdefault(column, value) != value:
            return None
    return equal


@dataclass(frozen=True, slots=True)
class LogBucket:
    """One bar of the console's charts: requests started in [start_ms, start_ms + width)."""

    start_ms: int
    requests: int
    errors: int  # status 400 and above (499: the client left)
    cost: Decimal


@dataclass(frozen=True, slots=True)
class LogStats:
    """A period's requests for the console's overview: per bucket, and spend per model."""

    buckets: tuple[LogBucket, ...]
    by_model: tuple[tuple[str, int, Decimal], ...]  # (model, requests, cost), costliest first


def new_id(prefix: str) -> str:
    """A new record's id: its kind's prefix and 24 random hex digits."""
    return prefix + os.urandom(12).hex()


ACCOUNT_ID_PREFIX = "acct_"


def new_account(
    name: str,
    balance: Decimal,
    allowed_models: frozenset[str] | None,
    rpm_limit: int | None,
    tpm_limit: int | None,
) -> Account:
    """An account as every backend creates it (Accounts.create_account)."""
    return Account(
        id=new_id(ACCOUNT_ID_PREFIX),
        name=name,
        balance=balance,
        allowed_models=allowed_models,
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
        created_at_ms=now_ms(),
    )


# The note of the top-up an account's starting balance is entered as (opening_top_up).
OPENING_NOTE = "opening balance"


def opening_top_up(account: Account) -> TopUp:
    """The ledger's entry for the balance an account was created with, as every backend writes it in
    the account's own transaction: the top-ups alone then add up to everything ever paid in."""
    return TopUp(
        id=new_id("topup_"),
        account_id=account.id,
        amount=account.balance,
        note=OPENING_NOTE,
        created_at_ms=account.created_at_ms,
        balance_after=account.balance,
    )


def new_key(
    account_id: str,
    name: str,
    prefix: str,
    expires_at_ms: int | None,
    credit_limit: Decimal | None,
    limit_reset: str | None,
) -> ApiKey:
    """A key as every backend creates it (Accounts.create_key); its secret is stored as a hash."""
    return ApiKey(
        id=new_id("key_"),
        account_id=account_id,
        name=name,
        prefix=prefix,
        created_at_ms=now_ms(),
        expires_at_ms=expires_at_ms,
        credit_limit=credit_limit,
        limit_reset=limit_reset,
    )


def new_console_user(
    email: str, role: str, account_id: str | None, invite_hash: bytes | None, invite_expires_at_ms: int | None
) -> ConsoleUser:
    """A console user as every backend creates it (Console.create_console_user): no password yet."""
    return ConsoleUser(
        id=new_id("cu_"),
        email=email.lower(),
        role=role,
        account_id=account_id,
        password_hash=None,
        invite_hash=invite_hash,
        invite_expires_at_ms=invite_expires_at_ms,
        created_at_ms=now_ms(),
    )


def new_chat_message(
    conversation_id: str,
    role: str,
    content: str,
    model: str | None,
    *,
    request_id: str | None = None,
    prompt_tokens: int | None = None,
    completion_tokens: int | None = None,
    cost: Decimal | None = None,
) -> ChatMessage:
    """A turn of a playground conversation, made now; an answer carries its request and charge."""
    return ChatMessage(
        id=new_id("msg_"),
        conversation_id=conversation_id,
        role=role,
        content=content,
        model=model,
        request_id=request_id,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost=cost,
        created_at_ms=now_ms(),
    )
