"""The interface every store backend implements, cut by role: accounts and keys, the ledger (money),
request logs, blobs, response states, jobs and idempotency. `Store` is all of them, with a start and
a close; code that needs one role takes that role. The records they read and write are in
store/records.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Protocol

from .records import (
    Account,
    AccountChanges,
    ApiKey,
    ChatMessage,
    ConsoleSession,
    ConsoleUser,
    Conversation,
    IdempotencyClaim,
    Job,
    KeptAnswer,
    KeptResponse,
    KeyChanges,
    KeyContext,
    LogQuery,
    LogStats,
    RequestLog,
    ResponseState,
    StoredAnswer,
    StoredImage,
    TopUp,
    UsageRecord,
)


class Accounts(Protocol):
    """Accounts and their keys: the hot path's key lookup, and the management operations."""

    async def find_key(self, key_hash: bytes) -> KeyContext | None:
        """The live (not deleted) key with this hash, with its account. May come from a cache that
        every change to a key or an account invalidates, across processes: the account's balance and
        the key's spending in it are as of some earlier moment, never to be used for money decisions
        (gateway.funds decides those)."""

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


class Ledger(Protocol):
    """Money: leases that holds are placed against (gateway.funds), settlements, usage records,
    and which lease owners are alive."""

    @property
    def lease_owner(self) -> str:
        """This process's name on its leases."""

    @property
    def lease_epoch(self) -> int:
        """Changes whenever this process's leases were taken from it (a network store reclaimed it
        as dead after a stall longer than its liveness bound, while it was alive): what it believes
        it leased is gone, and its holds must lease afresh (gateway.funds)."""

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

    async def recall(self, kind: str, pot_id: str) -> Decimal:
        """Ask every other process leasing the pot to give back what none of its holds uses (each
        answers at its next housekeeping pass: `recalls`, `answer_recall`). Returns what their
        leases on it amount to: the most that can come back (jobs' leases are all held: not asked)."""

    async def recalls(self) -> list[tuple[str, str]]:
        """The pots (kind, pot_id) on which another process has recalled this process's lease and
        this process has not answered."""

    async def answer_recall(self, kind: str, pot_id: str, amount: Decimal) -> None:
        """Give back `amount` (possibly zero) of this process's lease on the pot, answering its recall."""

    async def recall_pending(self, kind: str, pot_id: str) -> bool:
        """Whether a recall on the pot is still waiting for some process's answer."""

    async def live_owners(self) -> int:
        """How many lease owners (processes, of every instance sharing the store) are alive, at
        least 1: a pot's free money is shared among them (gateway.funds)."""

    async def reclaim_orphans(self) -> int:
        """Apply the settlements that dead processes journaled and return their leases; returns
        how many settlements were new. Safe to call at any time from any process."""

    async def settle(
        self, record: UsageRecord, entry: RequestLog | None = None, answer: KeptAnswer | None = None
    ) -> None:
        """Store the usage record and the request's log entry and charge its cost, atomically and
        exactly once, taking the cost off this process's leases on the account and the key as well;
        and keep `answer` for its Idempotency-Key in the same step. Returns once the charge and its
        records are durable: they survive a killed process (the log entry's bodies excepted). The
        record may become readable moments later; a kept answer is readable by every process on
        return (an Idempotency-Key's retry may reach another at once), unless the store is too slow
        to show it soon, when it waits no more than a moment."""

    def note_progress(self, record: UsageRecord, entry: RequestLog) -> None:
        """A running stream's settlement so far (what it delivered): applied, with its log entry,
        only if this process dies before the stream's own settlement. Returns at once."""

    def forget_progress(self, usage_id: str) -> None:
        """A stream that noted progress ended without a settlement."""

    def follow_load(self, running: Callable[[], int]) -> None:
        """`running()` says how many of this process's requests are under way (an in-memory count,
        read from any thread). A store whose writes take the process's own CPU may gather more of
        them into one commit while many requests run: each of those waits in line anyway, and a
        larger commit costs less per write. While few run, a commit is kept short, since a request
        that meets it waits for it."""

    async def get_usage(self, usage_id: str, key_id: str) -> UsageRecord | None:
        """The record, only if it belongs to this key."""

    async def account_usages(self, account_id: str, usage_ids: Sequence[str]) -> list[UsageRecord]:
        """The records with these ids that belong to this account, in one read (a page of logs)."""


class RequestLogs(Protocol):
    """The request log (spec 1.4.3, 7.5.3)."""

    def log_request(self, entry: RequestLog) -> None:
        """Keep the entry. Returns at once; written with the next group commit."""

    async def list_request_logs(
        self,
        *,
        account_id: str | None,
        key_id: str | None,
        before: str | None,
        limit: int,
        query: LogQuery | None = None,
    ) -> list[RequestLog]:
        """Newest first, without bodies; `before` is the id of the last entry of the previous page.
        `query` narrows it further (its account_id and key_id, when set, must match the others)."""

    async def log_stats(
        self, account_id: str | None, since_ms: int, until_ms: int, bucket_ms: int
    ) -> LogStats:
        """The requests of one account (every account: None) started in [since_ms, until_ms): per
        bucket of `bucket_ms` from since_ms (every bucket, empty ones too) and per model. Fast on
        millions of entries (an index on account and start time)."""

    async def get_request_log(self, log_id: str) -> RequestLog | None:
        """One entry, with its bodies unless they were purged."""

    async def purge_log_bodies(self, before_ms: int) -> int:
        """Drop the bodies of every entry started before `before_ms`; returns how many."""


class Blobs(Protocol):
    """Bytes served back to clients: generated images and finished videos."""

    async def put_images(self, images: Sequence[StoredImage]) -> None:
        """Keep the images, all or none; committed when this returns, so their URLs may be handed out."""

    async def get_image(self, token: str) -> StoredImage | None:
        """The image with this token, whether or not it has expired."""

    async def purge_images(self, now_ms: int) -> int:
        """Delete every image expired at `now_ms`; returns how many were deleted."""

    async def get_video_content(self, job_id: str, key_id: str, now_ms: int) -> tuple[bytes, str] | None:
        """A completed job's file and content type, until it expires."""

    async def purge_video_files(self, now_ms: int) -> int:
        """Delete the files expired at `now_ms` (the jobs stay); returns how many."""


class ResponseStates(Protocol):
    """Stateful responses (Responses API): where one lives upstream, or, for a chat model's
    translated answers, the conversation the gateway keeps itself."""

    async def remember_response(self, state: ResponseState) -> None:
        """Keep where a response's state lives; committed when this returns."""

    async def find_response(self, response_id: str, account_id: str, now_ms: int) -> ResponseState | None:
        """The unexpired state of this account's response."""

    async def forget_response(self, response_id: str, account_id: str) -> bool:
        """Delete this account's response state; whether there was one."""

    async def gateway_response_id(
        self, upstream_id: str, channel_url: str, account_id: str, now_ms: int
    ) -> str | None:
        """The gateway's id of this account's unexpired response that the upstream at
        `channel_url` keeps as `upstream_id` (a previous_response_id it names)."""

    async def keep_response(
        self, kept: KeptResponse, expires_at_ms: int, touches: Sequence[str] = ()
    ) -> None:
        """Keep a translated response; committed when this returns. It joins the conversation of
        its `previous_id` (or begins one); that conversation, and those of the kept responses in
        `touches` (whose items the turn named), are kept until `expires_at_ms` at least. Work
        proportional to the turn, not to its conversation's length."""

    async def find_kept_response(self, response_id: str, account_id: str, now_ms: int) -> KeptResponse | None:
        """This account's kept response, while its conversation is unexpired."""

    async def kept_conversation(
        self, response_id: str, account_id: str, now_ms: int, max_bytes: int
    ) -> list[bytes] | None:
        """The `items` of this account's kept response and of every turn before it, oldest first;
        None when the response is not kept (unknown, expired, another account's). The walk stops
        once the items add up to more than `max_bytes`: the caller sees the sum is over. Raises
        ConversationGap when, within `max_bytes`, it reaches a turn that was deleted."""

    async def delete_kept_response(self, response_id: str, account_id: str) -> bool:
        """Delete this account's kept response (its items and body); whether there was one. The
        turns that continued it stay, and their conversation has a gap (kept_conversation)."""

    async def kept_items(self, response_ids: Sequence[str], account_id: str, now_ms: int) -> dict[str, bytes]:
        """The `items` of those of these kept responses that are this account's and unexpired."""

    async def remember_items(self, account_id: str, item_ids: Sequence[str], expires_at_ms: int) -> None:
        """Record that these output items of a response an upstream keeps (its own ids: `msg_...`,
        `fc_...`) are this account's until `expires_at_ms` (a later expiry wins): a later turn's
        item_reference may name them. Committed when this returns."""

    async def known_items(self, account_id: str, item_ids: Sequence[str], now_ms: int) -> set[str]:
        """Those of these item ids recorded as this account's and unexpired."""

    async def purge_responses(self, now_ms: int) -> int:
        """Delete every response state, kept response and recorded item expired at `now_ms`;
        returns how many."""


class Jobs(Protocol):
    """Asynchronous jobs (videos, background responses): created with their hold, polled by one
    process at a time, ended exactly once."""

    async def create_job(
        self, job: Job, pots: Sequence[tuple[str, str]], answer: KeptAnswer | None = None
    ) -> None:
        """Record a new job and move its hold, `job.hold` on each (kind, pot_id) pot, from this
        process's lease to the job's own, in one transaction: the money stays set aside whatever
        happens to this process, until finish_job. The same transaction keeps `answer` for the
        request's Idempotency-Key, so that a retry never starts a second job."""

    async def job_counts(self) -> dict[tuple[str, str], int]:
        """How many jobs there are, by (kind, status): for the metrics (gateway.metrics)."""

    async def claim_jobs(self, now_ms: int, lease_ms: int, limit: int) -> list[Job]:
        """Up to `limit` unfinished jobs due for a poll, leased to this process for `lease_ms` so
        that no other process polls them meanwhile."""

    async def release_jobs(self, job_ids: Sequence[str]) -> None:
        """Let go of these unfinished jobs' poll claims (a process stopping mid-poll): another
        process may poll them at once, instead of when the claims' lease runs out."""

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

    async def job_key(self, job_id: str, account_id: str, kind: str) -> str | None:
        """The key of this account that made the job of this kind, if one did."""

    async def list_jobs(
        self, key_id: str, kind: str, *, after: str | None, limit: int, newest_first: bool
    ) -> list[Job]:
        """This key's jobs of this kind by creation, from just after the job `after`."""


class Idempotency(Protocol):
    """Idempotency-Key claims and the answers kept for them (spec 8)."""

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


class Console(Protocol):
    """The console's own records: its users, their sessions, and playground conversations."""

    async def create_console_user(
        self,
        email: str,
        role: str,
        account_id: str | None,
        invite_hash: bytes | None,
        invite_expires_at_ms: int | None,
    ) -> ConsoleUser:
        """A new user (email lower-cased); NameTaken if a user has this email already."""

    async def get_console_user(self, user_id: str) -> ConsoleUser | None: ...

    async def find_console_user(self, email: str) -> ConsoleUser | None:
        """The user with this email (compared lower-cased)."""

    async def find_console_invite(self, invite_hash: bytes, now_ms: int) -> ConsoleUser | None:
        """The user whose open invitation has this token hash and has not expired at now_ms."""

    async def list_console_users(self, account_id: str | None = None) -> list[ConsoleUser]:
        """Every user (of one account), oldest first."""

    async def set_console_password(
        self, user_id: str, password_hash: str, invite: tuple[bytes, int] | None = None
    ) -> bool:
        """Set the password, close the invitation (single use) and end every session of the user
        (one signed in with the old password, as a demo's new run sets a new one); False if there
        is no such user, or, with `invite` (token hash, now_ms), if that invitation is no longer
        open (used, replaced or expired): two uses of one link cannot both succeed."""

    async def set_console_invite(self, user_id: str, invite_hash: bytes, expires_at_ms: int) -> bool:
        """Open a new invitation (a password reset by the operator): the old password stops working
        and every session of the user ends. False if there is no such user."""

    async def delete_console_user(self, user_id: str) -> bool:
        """Delete the user and end their sessions (their conversations stay with the account)."""

    async def create_console_session(self, session: ConsoleSession) -> None: ...

    async def get_console_session(self, session_id: bytes) -> ConsoleSession | None: ...

    async def touch_console_session(self, session_id: bytes, seen_at_ms: int) -> None:
        """Note the session's latest request (idle expiry counts from it)."""

    async def delete_console_session(self, session_id: bytes) -> None: ...

    async def purge_console_sessions(self, now_ms: int, idle_ms: int) -> int:
        """Delete sessions past their absolute expiry or idle for idle_ms; returns how many."""

    async def create_conversation(self, conversation: Conversation) -> None: ...

    async def list_conversations(self, account_id: str) -> list[Conversation]:
        """The account's conversations, most recently updated first."""

    async def get_conversation(
        self, conversation_id: str, account_id: str
    ) -> tuple[Conversation, list[ChatMessage]] | None:
        """The conversation with its messages in order, if it is this account's."""

    async def rename_conversation(self, conversation_id: str, account_id: str, title: str) -> bool: ...

    async def delete_conversation(self, conversation_id: str, account_id: str) -> bool:
        """Delete the conversation and its messages, if it is this account's."""

    async def add_chat_message(self, message: ChatMessage, account_id: str) -> bool:
        """Append a message (and bump its conversation's updated_at); False if the conversation is
        not this account's."""


class Readiness(Protocol):
    """Whether the store can serve (GET /ready)."""

    async def ready(self) -> str | None:
        """None when the database answers, its schema is migrated and writes go through; else why
        not, in words an operator can act on (nothing secret: no URL, no password). Returns within
        about a second whatever the database does."""


class Store(
    Accounts, Ledger, RequestLogs, Blobs, ResponseStates, Jobs, Idempotency, Console, Readiness, Protocol
):
    """A whole backend: every role, opened and closed."""

    async def start(self) -> None:
        """Open connections, create or migrate the schema."""

    async def close(self) -> None:
        """Flush pending writes and close."""
