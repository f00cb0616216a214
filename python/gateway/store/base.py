"""What the gateway keeps, and the interface every backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Protocol, TypedDict

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


class IdempotencyKeyReused(Exception):
    """A top-up with this idempotency key exists already, with another amount or note."""


@dataclass(frozen=True, slots=True)
class KeyContext:
    """Who is calling: the key and its account, as found at authentication."""

    key: ApiKey
    account: Account


@dataclass(frozen=True, slots=True)
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

    # The record as one flat row, in USAGE_COLUMNS order (money as decimal text): the one mapping
    # shared by every backend and the settlement journal.
    def as_row(self) -> tuple[str, str, str, str, str, str, int, int, str, int, int]:
        return (
            self.id,
            self.request_id,
            self.key_id,
            self.account_id,
            self.model,
            self.status,
            self.prompt_tokens,
            self.completion_tokens,
            str(self.cost),
            self.started_at_ms,
            self.ended_at_ms,
        )

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> UsageRecord:
        return cls(
            row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], Decimal(row[8]), row[9], row[10]
        )


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


@dataclass(frozen=True, slots=True)
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
    channel: str  # the name of the channel that runs it
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


class Store(Protocol):
    async def start(self) -> None:
        """Open connections, create or migrate the schema."""

    async def close(self) -> None:
        """Flush pending writes and close."""

    async def find_key(self, key_hash: bytes) -> KeyContext | None:
        """The live (not deleted) key with this hash, with its account. May come from a cache that
        every change to a key or an account invalidates, across processes: the account's balance and
        the key's spending in it are as of some earlier moment, never to be used for money decisions
        (gateway.funds decides those)."""

    @property
    def lease_owner(self) -> str:
        """This process's name on its leases (and its settlement journal)."""

    async def lease(self, kind: str, pot_id: str, need: Decimal, share: int, now_ms: int) -> Decimal:
        """Set money of a pot aside for this process's holds (gateway.funds), atomically with every
        other process's leases: the pot is an account's balance (`kind` "account") or a key's own
        credit limit in the period that contains `now_ms` ("key"). What is free is the pot minus
        every live lease on it. Grants nothing when less than `need` is free; otherwise `need` plus
        a 1/`share` part of the rest (so that `share` processes can each hold a part). Returns the
        amount granted; this process's lease on the pot grows by it."""

    async def return_lease(self, kind: str, pot_id: str, amount: Decimal) -> None:
        """Give back part of this process's lease on a pot."""

    async def free(self, kind: str, pot_id: str, now_ms: int) -> Decimal | None:
        """What a pot holds that no process has leased, as `lease` counts it (None: a key without a
        credit limit). A read for what a refusal says, never for deciding about money."""

    async def reclaim_orphans(self) -> int:
        """Apply the settlements that dead processes journaled and return their leases; returns
        how many settlements were new. Safe to call at any time from any process."""

    def settle(self, record: UsageRecord, entry: RequestLog | None = None) -> None:
        """Store the usage record and the request's log entry and charge its cost, atomically and
        exactly once, taking the cost off this process's leases on the account and the key as well.
        Returns at once; from then on the charge and its records survive a killed process (the log
        entry's bodies excepted). The record is readable moments later."""

    def note_progress(self, record: UsageRecord, entry: RequestLog) -> None:
        """A running stream's settlement so far (what it delivered): applied, with its log entry,
        only if this process dies before the stream's own settlement. Returns at once."""

    def forget_progress(self, usage_id: str) -> None:
        """A stream that noted progress ended without a settlement."""

    async def get_usage(self, usage_id: str, key_id: str) -> UsageRecord | None:
        """The record, only if it belongs to this key."""

    def log_request(self, entry: RequestLog) -> None:
        """Keep the entry. Returns at once; written with the next group commit."""

    async def list_request_logs(
        self, *, account_id: str | None, key_id: str | None, before: str | None, limit: int
    ) -> list[RequestLog]:
        """Newest first, without bodies; `before` is the id of the last entry of the previous page."""

    async def get_request_log(self, log_id: str) -> RequestLog | None:
        """One entry, with its bodies unless they were purged."""

    async def purge_log_bodies(self, before_ms: int) -> int:
        """Drop the bodies of every entry started before `before_ms`; returns how many."""

    async def put_images(self, images: Sequence[StoredImage]) -> None:
        """Keep the images, all or none; committed when this returns, so their URLs may be handed out."""

    async def get_image(self, token: str) -> StoredImage | None:
        """The image with this token, whether or not it has expired."""

    async def purge_images(self, now_ms: int) -> int:
        """Delete every image expired at `now_ms`; returns how many were deleted."""

    async def remember_response(self, state: ResponseState) -> None:
        """Keep where a response's state lives; committed when this returns."""

    async def find_response(self, response_id: str, account_id: str, now_ms: int) -> ResponseState | None:
        """The unexpired state of this account's response."""

    async def purge_responses(self, now_ms: int) -> int:
        """Delete every response state expired at `now_ms`; returns how many were deleted."""

    async def create_job(self, job: Job, pots: Sequence[tuple[str, str]]) -> None:
        """Record a new job and move its hold, `job.hold` on each (kind, pot_id) pot, from this
        process's lease to the job's own, in one transaction: the money stays set aside whatever
        happens to this process, until finish_job."""

    async def claim_jobs(self, now_ms: int, lease_ms: int, limit: int) -> list[Job]:
        """Up to `limit` unfinished jobs due for a poll, leased to this process for `lease_ms` so
        that no other process polls them meanwhile."""

    async def note_job_progress(
        self, job_id: str, status: str, progress: int, next_poll_at_ms: int, body: bytes | None = None
    ) -> None:
        """An unfinished job's latest state (and a response's latest body); its lease ends and its
        next poll is due then."""

    async def finish_job(
        self,
        job_id: str,
        status: str,
        *,
        error: str | None,
        record: UsageRecord | None,
        now_ms: int,
        body: bytes | None = None,
        content: bytes | None = None,
        content_type: str | None = None,
        ttl_ms: int = 0,
    ) -> bool:
        """End a job exactly once, in `status`: charged the usage `record` when there is one (else
        nothing), a video's file kept for `ttl_ms`, a response's final body kept; either way its
        hold goes back. False when it had already ended."""

    async def get_job(self, job_id: str, key_id: str, kind: str) -> Job | None:
        """The job of this kind, if this key made it."""

    async def list_jobs(
        self, key_id: str, kind: str, *, after: str | None, limit: int, newest_first: bool
    ) -> list[Job]:
        """This key's jobs of this kind by creation, from just after the job `after`."""

    async def get_video_content(self, job_id: str, key_id: str, now_ms: int) -> tuple[bytes, str] | None:
        """A completed job's file and content type, until it expires."""

    async def purge_video_files(self, now_ms: int) -> int:
        """Delete the files expired at `now_ms` (the jobs stay); returns how many."""

    async def claim_idempotency(
        self, key_id: str, idempotency_key: str, fingerprint: str, now_ms: int, lease_ms: int, ttl_ms: int
    ) -> IdempotencyClaim:
        """Atomically, across processes: a key unknown, expired, or held by a request whose lease
        ran out (its process died) is taken for this request (`run`) for `lease_ms`; else the
        outcome for the request holding it or the answer kept for it."""

    async def finish_idempotency(
        self,
        key_id: str,
        idempotency_key: str,
        fingerprint: str,
        answer: StoredAnswer | None,
        now_ms: int,
        ttl_ms: int,
    ) -> None:
        """Keep the answer of the request that ran under the key, for `ttl_ms`; None forgets the key
        (an answer that is not kept: the next request with it runs again)."""

    async def purge_idempotency(self, now_ms: int) -> int:
        """Delete every idempotency entry expired at `now_ms`; returns how many were deleted."""

    async def create_account(
        self,
        name: str,
        balance: Decimal,
        *,
        allowed_models: frozenset[str] | None = None,
        rpm_limit: int | None = None,
        tpm_limit: int | None = None,
    ) -> Account:
        """A new account; NameTaken if another has this name."""

    async def find_account(self, name: str) -> Account | None:
        """The account with this name."""

    async def get_account(self, account_id: str) -> Account | None:
        """The account with this id."""

    async def list_accounts(self, *, after: str | None = None, limit: int | None = None) -> list[Account]:
        """Accounts, oldest first: from the one after the account with id `after`, at most `limit`."""

    async def update_account(self, account_id: str, changes: AccountChanges) -> Account | None:
        """The account after the change, or None if there is no such account; NameTaken if the new
        name is another account's."""

    async def top_up(
        self, account_id: str, amount: Decimal, note: str | None, idempotency_key: str | None = None
    ) -> tuple[TopUp, bool] | None:
        """Add `amount` to the balance and to the ledger in one transaction, serialised with every
        settlement, so no concurrent charge or top-up is lost. With an idempotency key the account
        already used, nothing is added: the earlier top-up comes back (IdempotencyKeyReused if its
        amount or note differ). Returns the top-up and whether it was that earlier one; None if
        there is no such account."""

    async def list_top_ups(
        self, account_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[TopUp]:
        """The account's ledger, oldest first (paged as list_accounts)."""

    async def create_key(
        self,
        account_id: str,
        name: str,
        key_hash: bytes,
        prefix: str,
        expires_at_ms: int | None,
        *,
        credit_limit: Decimal | None = None,
        limit_reset: str | None = None,
    ) -> ApiKey:
        """A new key of an existing account, stored by its hash only."""

    async def get_key(self, key_id: str) -> ApiKey | None:
        """The key with this id, deleted or not."""

    async def list_keys(
        self, account_id: str, *, after: str | None = None, limit: int | None = None
    ) -> list[ApiKey]:
        """The account's keys, deleted ones included, oldest first (paged as list_accounts)."""

    async def update_key(self, key_id: str, changes: KeyChanges) -> ApiKey | None:
        """The live key after the change, or None if there is no live key with this id."""

    async def rotate_key(self, key_id: str, key_hash: bytes, prefix: str) -> ApiKey | None:
        """Give the live key a new secret: the old one stops working at once; its id, settings and
        usage stay. None if there is no live key with this id."""

    async def delete_key(self, key_id: str) -> bool:
        """Delete the live key (it stops working at once); False if there is none with this id."""
