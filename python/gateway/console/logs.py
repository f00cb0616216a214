"""An account's request logs (docs/console.md; spec 1.4.3, 7.3.2, 7.5.3): every request, newest
first, paged and filtered (key, model, status, endpoint, time, request id); new entries appear
without a reload (the page's script polls /api/logs for entries newer than the newest shown); the
filtered list exported as CSV; one entry with its attempts, dropped parameters and bodies.

Bodies are hostile input (prompts, model output): the templates escape them and the scripts only
ever set text, never markup. An entry of another account is not found, exactly as an unknown id.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from .. import admin_fields as field
from .. import management
from ..clock import rfc3339
from ..errors import GatewayError, invalid_request
from ..registry import ENDPOINT_FOR_TYPE
from ..store import Account, ApiKey, LogQuery, RequestLog, UsageRecord
from .endpoints import Console
from .playground import messages_from_log_body
from .render import money, page
from .security import Viewer

PAGE_SIZE: Final = 50
POLL_LIMIT: Final = 100  # the newest entries a poll reads; more new ones than this: a gap
CSV_CAP: Final = 100_000  # rows in one export
CSV_PAGE: Final = 1000  # entries read from the store at a time while exporting
BINARY_SHOWN: Final = 8192  # base64 characters of a binary body shown
STATUS_CLASSES: Final = {"2xx": 2, "4xx": 4, "5xx": 5}
FILTER_NAMES: Final = ("key", "model", "status", "endpoint", "from", "to", "q")
# Cells a spreadsheet would take for a formula (CSV injection): written with a leading apostrophe.
FORMULA_START: Final = ("=", "+", "-", "@", "\t", "\r")
CSV_COLUMNS: Final = (
    "id",
    "started_at",
    "status",
    "error_code",
    "duration_ms",
    "cost",
    "model",
    "key_id",
    "key_name",
    "method",
    "endpoint",
    "usage_id",
    "request_bytes",
    "response_bytes",
    "dropped_params",
)


@dataclass(frozen=True, slots=True)
class Filters:
    """The Logs page's filters as the form sent them (kept to fill the form again)."""

    key: str = ""
    model: str = ""
    status: str = ""
    endpoint: str = ""
    since: str = ""  # datetime-local text, UTC
    until: str = ""
    q: str = ""  # a request id (x-service-request-id) or a response (usage) id

    def params(self) -> dict[str, str]:
        """The filters given, as query parameters (for links, the poll and the export)."""
        given = {
            "key": self.key,
            "model": self.model,
            "status": self.status,
            "endpoint": self.endpoint,
            "from": self.since,
            "to": self.until,
            "q": self.q,
        }
        return {name: value for name, value in given.items() if value}

    def any(self) -> bool:
        return bool(self.params())


def _utc_ms(text: str, param: str, *, end: bool = False) -> int:
    """A datetime-local value (no zone) read as UTC; with `end`, the end of the unit it names (a
    "to" of 11:21 or 11:21:48 takes in that minute or that second, as the table shows them)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise invalid_request(f"`{param}` must be a date and time such as 2026-05-01T13:30.", param) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    ms = int(moment.timestamp() * 1000)
    return ms + _unit_ms(text) if end else ms


# The time of day's part of an ISO 8601 text without its offset (Z, +05:30, -08, +0530): the unit
# is read from what is left (time review: the colon of `+00:00` made a minute read as a second).
_TIME_OF_DAY = re.compile(r"[T ]([^Zz+-]*)")
_UNIT_MS = {2: 3_600_000, 4: 60_000, 6: 1000}  # by the digits given: hh, hhmm, hhmmss


def _unit_ms(text: str) -> int:
    """The length of what `text` names: a day, an hour, a minute, a second or a millisecond."""
    found = _TIME_OF_DAY.search(text)
    clock = found.group(1) if found else ""
    if "." in clock or "," in clock:
        return 1
    return _UNIT_MS.get(len(clock.replace(":", "")), 86_400_000) if clock else 86_400_000


def read_filters(
    given: Mapping[str, str], account_id: str, key_ids: set[str]
) -> tuple[Filters, LogQuery, list[str]]:
    """The filters, the store's query for them (always this account's entries only) and what was
    wrong with any of them (that filter is then left out)."""
    text = {name: given.get(name, "").strip() for name in FILTER_NAMES}
    errors: list[str] = []
    key_id = text["key"] or None
    shown_key = key_id or ""
    if key_id is not None and key_id not in key_ids:
        # Said, and the query still asks for it: no entry of this account has it, so none shows.
        errors.append("That key is not one of this account's.")
        shown_key = ""
    status: int | None = None
    status_class: int | None = None
    status_text = text["status"]
    if status_text in STATUS_CLASSES:
        status_class = STATUS_CLASSES[status_text]
    elif (code := small_int(status_text)) is not None and 100 <= code <= 599:
        status = code
    elif status_text:
        errors.append("Status must be 2xx, 4xx, 5xx or a status code such as 429.")
        status_text = ""
    times: dict[str, int | None] = {"from": None, "to": None}
    for name in times:
        if text[name]:
            try:
                times[name] = _utc_ms(text[name], name, end=name == "to")
            except GatewayError as err:
                errors.append(err.message)
    filters = Filters(
        key=shown_key,
        model=text["model"],
        status=status_text,
        endpoint=text["endpoint"],
        since=text["from"] if times["from"] is not None else "",
        until=text["to"] if times["to"] is not None else "",
        q=text["q"],
    )
    query = LogQuery(
        account_id=account_id,
        key_id=key_id,
        model=text["model"] or None,
        status=status,
        status_class=status_class,
        path=text["endpoint"] or None,
        since_ms=times["from"],
        until_ms=times["to"],
        request_id=text["q"] or None,
    )
    return filters, query, errors


def _opens_in_playground(body: bytes | None) -> bool:
    """Whether a logged request body holds messages the playground can open (a body cut at the
    log's size limit, or one that is no chat request, does not: no button that only errs)."""
    if body is None:
        return False
    try:
        return bool(messages_from_log_body(body)[1])
    except GatewayError:
        return False


def small_int(text: str, digits: int = 9) -> int | None:
    """`text` as a number when it is plain ASCII digits, at most `digits` of them; else None (int()
    takes other scripts' digits, and refuses "²" and thousands of digits with an exception)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= digits else None


def _size(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _attempts(entry: RequestLog) -> list[dict[str, Any]]:
    try:
        tried = json.loads(entry.attempts) if entry.attempts else []
    except (ValueError, RecursionError):
        return []
    return [a for a in tried if isinstance(a, dict)] if isinstance(tried, list) else []


def row(
    entry: RequestLog, base: str, key_names: Mapping[str, str], usages: Mapping[str, UsageRecord]
) -> dict[str, Any]:
    """One line of the Logs table, as the page renders it and the poll sends it (already text).
    `usages`: the page's usage records by id (Store.account_usages), for the tokens."""
    usage = usages.get(entry.usage_id or "")
    return {
        "id": entry.id,
        "href": f"{base}/logs/{entry.id}",
        "time": _time(entry.started_at_ms),
        "started_at": rfc3339(entry.started_at_ms),
        "status": entry.status,
        "status_class": f"status-{entry.status // 100}",
        "error_code": entry.error_code or "",
        "latency": f"{entry.duration_ms:,} ms",
        "cost": money(entry.cost) if entry.cost is not None else "—",
        "cost_exact": None if entry.cost is None else field.money_text(entry.cost),
        "size": f"{_size(entry.request_bytes)} → {_size(entry.response_bytes)}",
        # A request billed by other units (a video's seconds, images, characters) counts no tokens.
        "tokens": "—"
        if usage is None or not usage.total_tokens
        else f"{usage.prompt_tokens:,} → {usage.completion_tokens:,}",
        "model": entry.model or "—",
        "key": key_names.get(entry.key_id or "", entry.key_id or "—"),
        "endpoint": entry.path,
    }


def _cell(value: object) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text.startswith(FORMULA_START) else text


def csv_row(entry: RequestLog, key_names: Mapping[str, str]) -> list[str]:
    """One entry as CSV cells: every text cell guarded by `_cell` (the numbers are the gateway's)."""
    return [
        _cell(entry.id),
        rfc3339(entry.started_at_ms),
        str(entry.status),
        _cell(entry.error_code),
        str(entry.duration_ms),
        "" if entry.cost is None else field.money_text(entry.cost),
        _cell(entry.model),
        _cell(entry.key_id),
        _cell(key_names.get(entry.key_id or "", "")),
        _cell(entry.method),
        _cell(entry.path),
        _cell(entry.usage_id),
        str(entry.request_bytes),
        str(entry.response_bytes),
        _cell(" ".join(management.dropped_params(_attempts(entry)))),  # names the client chose
    ]


# ---------------------------------------------------------------- an entry's bodies, as text


@dataclass(frozen=True, slots=True)
class BodyView:
    """A kept body as the entry page shows it: always text (the template escapes it)."""

    kind: str  # json | text | stream | binary | purged | empty
    text: str
    size: int  # the whole body's size
    kept: int  # how many bytes were kept
    truncated: bool
    output_text: str | None = None  # a streamed answer's text (its summary's output_text)
    summary_error: str | None = None


def view_body(data: bytes | None, size: int) -> BodyView:
    if data is None:
        return BodyView("purged" if size else "empty", "", size, 0, False)
    shown = management.body_json(data, size)
    assert shown is not None
    if shown["encoding"] == "base64":
        text: str = shown["data"]
        return BodyView("binary", text[:BINARY_SHOWN], size, len(data), bool(shown["truncated"]))
    raw: str = shown["data"]
    try:
        parsed = json.loads(raw)
        pretty = json.dumps(parsed, indent=2, ensure_ascii=False)
        error = parsed.get("error") if isinstance(parsed, dict) else None
        summary_error = None if error is None else json.dumps(error, ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply to indent: as it came
        return BodyView("text", raw, size, len(data), bool(shown["truncated"]))
    if data.startswith(management.STREAM_SUMMARY_PREFIX) and isinstance(parsed, dict):
        output = parsed.get("output_text")
        return BodyView(
            "stream",
            pretty,
            size,
            len(data),
            False,
            output_text=output if isinstance(output, str) else None,
            summary_error=summary_error,
        )
    return BodyView("json", pretty, size, len(data), bool(shown["truncated"]))


def routes(console: Console) -> list[BaseRoute]:
    state = console.state
    store = state.store
    endpoints = sorted(set(ENDPOINT_FOR_TYPE.values()))

    async def keys_of(account: Account) -> list[ApiKey]:
        return await store.list_keys(account.id)

    async def usages_of(account_id: str, entries: list[RequestLog]) -> dict[str, UsageRecord]:
        """The usage records of a page of entries, in one read: their tokens."""
        found = await store.account_usages(account_id, [e.usage_id for e in entries if e.usage_id])
        return {u.id: u for u in found}

    async def setting(request: Request, viewer: Viewer) -> tuple[Account, list[ApiKey], dict[str, str]]:
        account = await console.account_of(request, viewer)
        keys = await keys_of(account)
        return account, keys, {k.id: k.name for k in keys}

    async def logs_page(request: Request, viewer: Viewer) -> Response:
        account, keys, names = await setting(request, viewer)
        filters, query, errors = read_filters(request.query_params, account.id, set(names))
        before = request.query_params.get("before") or None
        entries = await store.list_request_logs(
            account_id=account.id, key_id=query.key_id, before=before, limit=PAGE_SIZE + 1, query=query
        )
        base = f"/console/a/{account.id}"
        usages = await usages_of(account.id, entries[:PAGE_SIZE])
        rows = [row(e, base, names, usages) for e in entries[:PAGE_SIZE]]
        params = filters.params()
        older = (
            f"{base}/logs?{urlencode({**params, 'before': rows[-1]['id']})}"
            if len(entries) > PAGE_SIZE
            else None
        )
        # Live only on the newest page of a period that has not ended.
        live = before is None and query.until_ms is None
        allowed = account.allowed_models
        models = sorted(m.name for m in state.settings.models if allowed is None or m.name in allowed)
        return page(
            request,
            "logs.html",
            viewer,
            account=account,
            keys=keys,
            models=models,
            endpoints=endpoints,
            filters=filters,
            errors=errors,
            rows=rows,
            first_page=before is None,
            newest_url=f"{base}/logs?{urlencode(params)}" if params else f"{base}/logs",
            older_url=older,
            poll_url=f"{base}/api/logs?{urlencode(params)}" if live else None,
            # Not offered while a filter is refused: the export would be refused the same way.
            csv_url=None
            if errors
            else f"{base}/logs.csv?{urlencode(params)}"
            if params
            else f"{base}/logs.csv",
        )

    async def logs_api(request: Request, viewer: Viewer) -> Response:
        """The entries newer than `since_id` (the newest the page shows), newest first; `gap` when
        more arrived than one poll reads (the page then offers a reload)."""
        account, _, names = await setting(request, viewer)
        _, query, errors = read_filters(request.query_params, account.id, set(names))
        if errors:
            raise invalid_request(errors[0])
        since_id = request.query_params.get("since_id") or None
        entries = await store.list_request_logs(
            account_id=account.id, key_id=query.key_id, before=None, limit=POLL_LIMIT, query=query
        )
        ids = [e.id for e in entries]
        gap = False
        if since_id is not None:
            if since_id in ids:
                entries = entries[: ids.index(since_id)]
            else:
                gap = len(entries) == POLL_LIMIT
        base = f"/console/a/{account.id}"
        usages = await usages_of(account.id, entries)
        data = [row(e, base, names, usages) for e in entries]
        return JSONResponse({"object": "list", "data": data, "gap": gap})

    async def logs_csv(request: Request, viewer: Viewer) -> Response:
        account, _, names = await setting(request, viewer)
        _, query, errors = read_filters(request.query_params, account.id, set(names))
        if errors:
            raise invalid_request(errors[0])

        async def lines() -> AsyncIterator[str]:
            out = io.StringIO()
            writer = csv.writer(out)  # RFC 4180: quoted when needed, CRLF line ends
            writer.writerow(CSV_COLUMNS)
            yield out.getvalue()
            before: str | None = None
            sent = 0
            while sent < CSV_CAP:
                want = min(CSV_PAGE, CSV_CAP - sent)
                entries = await store.list_request_logs(
                    account_id=account.id, key_id=query.key_id, before=before, limit=want, query=query
                )
                if not entries:
                    return
                out.seek(0)
                out.truncate()
                writer.writerows(csv_row(e, names) for e in entries)
                yield out.getvalue()
                sent += len(entries)
                before = entries[-1].id
                if len(entries) < want:
                    return

        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        filename = f"request-logs-{account.id}-{stamp}.csv"
        return StreamingResponse(
            lines(),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": f'attachment; filename="{filename}"'},
        )

    async def log_page(request: Request, viewer: Viewer) -> Response:
        account = await console.account_of(request, viewer)
        log_id = request.path_params["log_id"]
        entry = await store.get_request_log(log_id)
        if entry is None or entry.account_id != account.id:  # another account's: as unknown
            raise GatewayError("not_found", f"No request log {log_id!r}.")
        key = await store.get_key(entry.key_id) if entry.key_id else None
        usage = (
            await store.get_usage(entry.usage_id, entry.key_id) if entry.usage_id and entry.key_id else None
        )
        attempts = _attempts(entry)
        base = f"/console/a/{account.id}"
        return page(
            request,
            "log.html",
            viewer,
            account=account,
            entry=entry,
            row=row(entry, base, {key.id: key.name} if key else {}, {usage.id: usage} if usage else {}),
            key=key,
            usage=usage,
            attempts=[_attempt_view(a) for a in attempts],
            dropped=management.dropped_params(attempts),
            request_body=view_body(entry.request_body, entry.request_bytes),
            response_body=view_body(entry.response_body, entry.response_bytes),
            # Open in playground: a POST (it makes a conversation), never a link a prefetch follows.
            playground_url=(
                f"{base}/playground/from-log/{quote(entry.id, safe='')}"
                if entry.path == "/v1/chat/completions" and _opens_in_playground(entry.request_body)
                else None
            ),
            cost_exact=None if entry.cost is None else field.money_text(entry.cost),
        )

    return [
        Route("/a/{account_id}/logs", console.page(logs_page), methods=["GET"]),
        Route("/a/{account_id}/logs.csv", console.page(logs_csv), methods=["GET"]),
        Route("/a/{account_id}/logs/{log_id}", console.page(log_page), methods=["GET"]),
        # The page's polling: not the viewer's activity (an open Logs tab does not keep the
        # session alive for ever).
        Route("/a/{account_id}/api/logs", console.api(logs_api, activity=False), methods=["GET"]),
    ]


def _attempt_view(attempt: Mapping[str, Any]) -> dict[str, Any]:
    """One try, as the entry page lists it: a channel of the model, or of its safety check."""
    started = attempt.get("started_ms")
    duration = attempt.get("duration_ms")
    return {
        "what": "safety check" if attempt.get("check") else "model",
        "channel": str(attempt.get("channel") or "—"),
        "model": str(attempt.get("model") or ""),
        "started": _time(started) if isinstance(started, int) else "—",
        "duration": f"{duration:,} ms" if isinstance(duration, int) else "—",
        "status": attempt.get("status"),
        "error": attempt.get("error"),
        "verdict": attempt.get("verdict"),
        "answered": attempt.get("error") is None,
    }
