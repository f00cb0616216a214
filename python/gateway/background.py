"""Background responses (spec 1.4.4: deep research): the response kind of gateway.jobs.

POST /v1/responses with `background: true` (for a model that takes the parameter) answers at once
with the Response object `queued`, as OpenAI does; the gateway holds the request's estimated cost and
records a job. The poller follows the upstream's response (GET /responses/{id} there) and keeps the
latest Response object, with the gateway's id, for GET /v1/responses/{id}. When it ends:
- completed or incomplete: charged the upstream's reported usage (or, when it reports none, the
  gateway's own count of the input and of the output text);
- cancelled (POST /v1/responses/{id}/cancel): charged what the upstream reports it used, if anything;
- failed, lost upstream, or unfinished after `[background] max_job_seconds`: not charged.
Either way the hold goes back, exactly once.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Final

from . import billing, jobs
from .clock import now_ms
from .config import ChannelConfig, ModelConfig
from .context import Call
from .core import InvalidJsonError, RewrittenResponse, count_tokens, rewrite_response
from .errors import GatewayError
from .pricing import Usage, prices_text, reported_usage
from .routes.kept_responses import output_item_ids, remember_items
from .state import GatewayState
from .store import JOB_RUNNING, Job
from .translate import response_output_text

# Responses API statuses of a response that has ended.
CHARGED_ENDINGS: Final = frozenset({"completed", "incomplete", "cancelled"})


async def start(
    state: GatewayState,
    call: Call,
    model: ModelConfig,
    channel: ChannelConfig,
    rid: str,
    previous_id: str | None,
    answer: RewrittenResponse,
    status: str,
    prompt_tokens: int,
) -> None:
    """Record the background response the upstream accepted (`answer`, with the gateway's id `rid`)
    as a job, holding the request's estimate until it ends."""
    assert answer.upstream_id is not None, "checked by the caller"
    await jobs.record(
        state,
        call,
        Job(
            id=rid,
            kind="response",
            key_id=call.ctx.key.id,
            account_id=call.ctx.account.id,
            request_id=call.request_id,
            model=model.name,
            channel=channel.identity,
            upstream_id=answer.upstream_id,
            status=status,
            progress=0,
            hold=call.hold.amount if call.hold is not None else Decimal(0),
            created_at_ms=now_ms(),
            prices=prices_text(model.prices),  # what the hold was made at
            body=answer.body,
            previous_id=previous_id,
            prompt_tokens=prompt_tokens,
        ),
    )


async def advance(
    state: GatewayState,
    job: Job,
    model: ModelConfig,
    channel: ChannelConfig,
    answer: dict[str, Any],
    raw: bytes,
) -> None:
    """Act on the upstream's Response object (gateway.jobs.JobKind.advance)."""
    try:
        rewritten = rewrite_response(raw, job.id, job.previous_id)
    except InvalidJsonError:
        rewritten = None
    status = answer.get("status")
    status = status if isinstance(status, str) else None  # any JSON value, a list too (unhashable)
    if rewritten is None:
        await jobs.fail(state, job, "provider_error", "The model's provider sent a malformed answer.")
    elif status in CHARGED_ENDINGS:
        reported = rewritten.usage
        if reported is not None:
            usage = reported_usage(reported)
        else:
            usage = Usage(job.prompt_tokens, count_tokens(response_output_text(raw), model.tokenizer))
        ended = now_ms()
        # A cancelled response is charged what the upstream says it used; saying nothing, nothing.
        charged = reported is not None or status != "cancelled"
        record = billing.job_usage_record(job, model, status, usage, ended) if charged else None
        # A background response is stored upstream (store false is refused): its items are the
        # account's, for a later turn's item_reference (routes/kept_responses.py). Before the job
        # ends, so that a store away now leaves both for the next poll (the record is idempotent).
        await remember_items(state, job.account_id, output_item_ids(answer))
        await state.store.finish_job(
            job.id, status, error=None, record=record, now_ms=ended, body=rewritten.body
        )
    elif status == "failed":
        code, message = jobs.reported_error(answer, "server_error", "The model failed.")
        await jobs.fail(state, job, code, message, rewritten.body)
    elif jobs.too_old(state, job):
        await jobs.fail(state, job, "timeout", "The response did not finish in time.")
    else:
        running = status if isinstance(status, str) and status in JOB_RUNNING else job.status
        await jobs.later(state, job, running, 0, rewritten.body)


async def cancel(state: GatewayState, job: Job) -> None:
    """Ask the upstream to stop the response, and end the job as it answers (cancelled, or the end
    it had reached first)."""
    model = state.registry.get(job.model)
    channel = jobs.channel_of(model, job.channel)
    if model is None or channel is None:
        await jobs.fail(state, job, "model_removed", "The model is no longer configured.")
        return
    raw = await jobs.post(state, channel, f"{KIND.path}/{job.upstream_id}/cancel")
    answer = jobs.json_object(raw)
    if answer.get("status") in JOB_RUNNING:  # not stopped yet: the poller sees it end
        raise GatewayError("provider_error", "The model's provider did not cancel the response.")
    await advance(state, job, model, channel, answer, raw)


KIND: Final = jobs.JobKind("/responses", advance)
