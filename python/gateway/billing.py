"""Where a request's cost is decided and settled: the one place money moves, for every endpoint
and for jobs alike.

Every model request holds its estimated cost before it runs (gateway.funds). Transports (the routes'
plain and streamed flows, the job poller) only report what happened: the usage, what a stream
delivered, how it ended. Billing decides what that costs, settles the hold to it or releases it, and
builds the usage record; when the request closes (model_endpoint, before its answer is sent) the
charge, the usage record and the request log entry become durable as one step, and whatever hold a
handler left open is released then, so no hold leaks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from typing import Any

from .clock import span_ms
from .config import ModelConfig
from .context import Call
from .core import count_tokens
from .errors import GatewayError, invalid_request
from .estimates import TextEstimate
from .frozen import frozen
from .funds import ZERO, NotCovered
from .pricing import ReportedUsage, Usage, cost, prices_of_text, reported_usage
from .state import GatewayState
from .store import Job, KeptAnswer, RequestLog, UsageRecord


def estimate_usage(
    model: ModelConfig,
    prompt_tokens: int,
    payload: dict[str, Any] | None = None,
    *limits: str,
    audio_tokens: int = 0,
) -> Usage:
    """The most a text request may consume: its whole prompt and as much output as it may produce
    (the first of the request's `limits` parameters it sets, never more than the model's
    max_output_tokens, for each of the `n` choices it asks for), all of that output at the dearest
    price it may be billed at (output, reasoning, or audio output when the request asks for audio),
    the prompt at the dearest of the input and cache-write prices (the hour's too), and the
    prompt's `audio_tokens` at the audio input price where that is dearer still.
    A limit above max_output_tokens counts as max_output_tokens: the upstream is sent no more
    (cap_output). It knows which of `limits` the request set, so that a refusal can name the
    largest value that fits (gateway.estimates). A limit or `n` that is set (not null) but not a
    positive integer is refused (400): the most the request may cost could not be known, and an
    upstream that took `"n": "8"` would produce eight times what was held."""
    output, limit_set = model.max_output_tokens, None
    choices = 1
    speaks = False
    if payload is not None:
        for name in limits:
            value = _count_param(payload, name)
            if value is not None and limit_set is None:
                output = value if value < output else output  # not min(): 10x the instructions
                limit_set = name
        choices = _count_param(payload, "n") or 1
        modalities = payload.get("modalities")
        speaks = isinstance(modalities, list) and "audio" in modalities
    output *= choices
    prices = model.prices
    # Of the output, held at the dearest price it may be billed at (cost() takes reasoning first,
    # then audio, then text: one of them is the whole output).
    reasoning = audio_output = 0
    if speaks and prices.audio_output > prices.output and prices.audio_output > prices.reasoning:
        audio_output = output
    elif prices.reasoning > prices.output:
        reasoning = output
    # Of the prompt: its audio at the audio price where that is dearest; the rest (or all of it) at
    # the dearest write price where that is dearer than input: the whole prompt may be written to
    # the provider's cache, for an hour where the request asks for that.
    write = prices.cache_write_1h if prices.cache_write_1h > prices.cache_write else prices.cache_write
    audio = 0
    if audio_tokens and prices.audio_input > prices.input and prices.audio_input > write:
        audio = audio_tokens if audio_tokens < prompt_tokens else prompt_tokens
    written = prompt_tokens - audio if write > prices.input else 0
    # Positional, in field order (Usage's, then TextEstimate's): keywords cost ~0.3 us more.
    return TextEstimate(
        prompt_tokens,
        output,  # completion_tokens
        0,  # cached_tokens
        reasoning,
        written,  # cache_write_tokens
        audio,  # audio_prompt_tokens
        0,  # image_prompt_tokens
        written if prices.cache_write_1h > prices.cache_write else 0,  # cache_write_1h_tokens
        audio_output,  # audio_completion_tokens
        0,  # searches
        0,  # characters
        0,  # seconds
        0,  # images
        None,  # image_size
        None,  # image_quality
        limits,
        limit_set,
        choices,
    )


def cap_output(
    received: frozenset[str], model: ModelConfig, body: dict[str, Any], *limits: str
) -> tuple[str, ...]:
    """Make the request `body` ask for no more output than its hold will cover, before the hold is
    estimated from it (estimate_usage reads the first of `limits` that is set), in fields the
    model receives (`received`), since the others are dropped on the way to it:
    - a limit above the model's max_output_tokens is lowered to it;
    - a limit set only under names the model does not take goes under the first one it takes (a
      client's max_completion_tokens goes as max_tokens to a model that takes only that; one set
      under a name the model takes gets no second name), and every limit the request set says the
      same, the one the hold is estimated with;
    - a model that takes none of `limits` cannot be limited: the request's limits go, and the hold
      is its max_output_tokens.
    Returns `limits` with the one the client set first: the order to estimate the hold in, so that
    a refusal names the field the client sent (the name it used stays in `body` until
    send_output_limit).
    A request that sets no limit is left as it is here: the hold and a tokens-per-minute limit read
    it as the client sent it (gateway.ratelimits.reserved_tokens reserves a default output for it,
    where a limit the client chose is reserved whole). send_output_limit completes it afterwards."""
    given, named = None, None
    for name in limits:  # a loop, not next(generator): this runs on every text request
        given = body.get(name)
        if given is not None:
            named = name
            break
    asked = positive_int(given)
    if named is None or asked is None:
        return limits  # none set (send_output_limit), or refused by estimate_usage (400)
    taken = next((name for name in limits if name in received), None)
    value = asked if asked < model.max_output_tokens else model.max_output_tokens
    sent = False  # a limit the client set goes under a name the model takes
    for name in limits:
        if body.get(name) is not None:
            if taken is None:
                del body[name]
            else:
                body[name] = value
                sent = sent or name in received
    if taken is not None and not sent:
        # Only then: OpenAI refuses max_tokens and max_completion_tokens together (review: a
        # client's max_tokens went to gpt-4o with a max_completion_tokens added beside it).
        body[taken] = value
    return limits if named == limits[0] else (named, *(name for name in limits if name != named))


def send_output_limit(
    received: frozenset[str], model: ModelConfig, body: dict[str, Any], *limits: str
) -> None:
    """The request `body`'s output limits as its upstream takes them, once it is held (cap_output):
    the names the model does not take go (their value is under one it takes). When the
    configuration names max_output_tokens, a request that sets none of `limits` is sent it, in the
    first of them the model takes: else the model's own most, or its default, which may be
    larger, would decide how much it produces and is charged for, past what was held. (The default
    max_output_tokens is not sent unasked: it may be more than the model takes, and its upstream
    would refuse every such request.)"""
    given = False
    for name in limits:
        if body.get(name) is not None:
            given = True
            if name not in received:
                del body[name]
    if given or not model.max_output_tokens_set:
        return
    for name in limits:
        if name in received:
            body[name] = model.max_output_tokens
            return


# The most choices a chat request may ask for, as OpenAI's API takes (it refuses more, 400).
MAX_CHOICES = 128


def _count_param(payload: dict[str, Any], name: str) -> int | None:
    """The request's `name` when it is set: a positive integer, or 400 invalid_request (`n` also
    at most MAX_CHOICES: a billion choices is a malformed request, not one the balance is short
    for)."""
    value = payload.get(name)
    if value is None:
        return None
    count = positive_int(value)
    if count is None:
        raise invalid_request(f"`{name}` must be a positive integer.", name)
    if name == "n" and count > MAX_CHOICES:
        raise invalid_request(f"`n` must be at most {MAX_CHOICES}: the number of choices.", "n")
    return count


def positive_int(value: Any) -> int | None:
    """A request field that must be a positive integer (JSON true is not one), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def hold(
    state: GatewayState, call: Call, model: ModelConfig, estimate: Usage, now_ms: int | None = None
) -> None:
    """Set the estimated cost aside on the account and the key's limit, or refuse the request with
    insufficient_credits / key_budget_exceeded before it runs (spec 5.4, 7.5.1, 8), saying the most
    it could cost and, for a text request, the largest output limit the money covers. Its tokens
    are reserved first (gateway.ratelimits: 400 when they can never fit, 429 when not yet)."""
    call.model = model.name
    await state.limiter.reserve(call.rate, estimate, model.type)
    try:
        call.hold = await state.funds.hold(call.ctx, cost(model.prices, estimate), now_ms)
    except NotCovered as refused:
        raise refused.explained(model.prices, estimate, state.registry.forwarded_params(model)) from None


async def check_input_covered(state: GatewayState, call: Call, model: ModelConfig) -> None:
    """Before a large input is counted (routes/text.count_input): refuse at once a key whose money
    cannot cover even its first token; nothing stays held. Counting takes a thread up to seconds,
    which a key with nothing left would otherwise have for free, again and again (review)."""
    await _check_covered(state, call, cost(model.prices, Usage(prompt_tokens=1)), NotCovered.before_input)


async def check_output_covered(
    state: GatewayState, call: Call, model: ModelConfig, output_only: Usage, now_ms: int | None = None
) -> None:
    """Before a large prompt is counted (routes/text.py): refuse at once, as `hold` would after the
    count, when the money cannot cover even the output the request allows; nothing stays held."""
    await _check_covered(state, call, cost(model.prices, output_only), NotCovered.before_prompt, now_ms)


async def _check_covered(
    state: GatewayState,
    call: Call,
    amount: Decimal,
    refusal: Callable[[NotCovered], GatewayError],
    now_ms: int | None = None,
) -> None:
    """Whether the money covers `amount` now, held and released at once; `refusal` says why not."""
    try:
        held = await state.funds.hold(call.ctx, amount, now_ms)
    except NotCovered as refused:
        raise refusal(refused) from None
    state.funds.release(held, ZERO)


def release(state: GatewayState, call: Call) -> None:
    """The request ended without a charge (refused, failed upstream, nothing delivered)."""
    if call.hold is not None:
        state.funds.release(call.hold, Decimal(0))
    state.limiter.correct(call.rate, 0)


def _record(call: Call, model: ModelConfig, response_id: str, status: str, usage: Usage) -> UsageRecord:
    # Positional, in field order (USAGE_COLUMNS): keywords cost 0.3 us more, on every request.
    return UsageRecord(
        response_id,  # id
        call.request_id,
        call.ctx.key.id,
        call.ctx.account.id,
        model.name,
        status,
        usage.prompt_tokens,
        usage.completion_tokens,
        cost(model.prices, usage),
        *span_ms(call.started_ns),  # started_at_ms, ended_at_ms
    )


def settle(
    state: GatewayState, call: Call, model: ModelConfig, response_id: str, status: str, usage: Usage
) -> Decimal:
    """Charge the request's usage, exactly once: the hold closes at the actual cost and the usage
    record is made. It becomes durable with the request's log entry, in one step, when the request
    closes (`close`, before its answer is sent). Returns the charged cost."""
    record = _record(call, model, response_id, status, usage)
    call.settlement = record
    call.model, call.charged, call.usage_id = model.name, record.cost, record.id
    if call.hold is not None:
        state.funds.release(call.hold, record.cost)
    state.limiter.correct(call.rate, usage.total_tokens)
    return record.cost


@frozen
class StreamOutcome:
    """What a stream transport reports when a stream ends, however it ends."""

    complete: bool  # the model finished and the client was sent everything
    reported: ReportedUsage | None  # the upstream's own usage, when it sent one
    delivered_text: str  # the output the client was sent
    counted_prompt: int  # the gateway's own count of the prompt (the one its hold was made from)
    delivered_reasoning: str  # the reasoning among delivered_text (billed at its own price)
    counted_audio: int = 0  # of counted_prompt, its audio's tokens
    spoken: bool = False  # the answer is spoken: delivered_text is the transcript of audio
    # The upstream counts reasoning apart from output (providers.reasoning_apart): else delivered
    # reasoning is billed as output, as the upstream's own usage of a whole stream bills it.
    reasoning_apart: bool = True


def stream_usage(model: ModelConfig, outcome: StreamOutcome) -> Usage:
    """Spec 6.1.9: a stream is billed its full prompt plus the output the client was sent (the
    reasoning in it, which counts as output, at the price a whole stream's is: the model's reasoning
    price where the upstream counts reasoning apart, else its output price; review: cut short, a
    Claude stream's thinking cost more than the whole answer's); output generated after the stop
    is not billed, and a stream that sent no output is not billed. A complete stream is billed the
    upstream's own usage when it sent one; so is a spoken one whose usage came (its audio is
    counted only at its end, after the whole answer). A stream cut short is billed its prompt as
    the upstream counted it when it said (each kind at its price: cache reads and writes, audio),
    else as the gateway counted it (its audio too); a spoken one cut before its usage came, its
    delivered transcript's tokens as audio output, the least the audio sent with it can have taken
    (each audio token is a fraction of a second)."""
    reported = outcome.reported
    if reported is not None and (outcome.complete or reported.audio_completion_tokens):
        return reported_usage(reported)
    if not outcome.delivered_text:
        return Usage()
    reasoning = outcome.delivered_reasoning
    completion = count_tokens(outcome.delivered_text, model.tokenizer)
    reasoning_tokens = (
        count_tokens(reasoning, model.tokenizer) if reasoning and outcome.reasoning_apart else 0
    )
    spoken = completion - reasoning_tokens if outcome.spoken else 0
    if reported is not None and reported.prompt_tokens:
        said = reported_usage(reported)
        return replace(
            said,
            completion_tokens=completion,
            reasoning_tokens=reasoning_tokens,
            audio_completion_tokens=spoken,
        )
    return Usage(
        prompt_tokens=outcome.counted_prompt,
        completion_tokens=completion,
        reasoning_tokens=reasoning_tokens,
        audio_prompt_tokens=outcome.counted_audio,
        audio_completion_tokens=spoken,
    )


def settle_stream(
    state: GatewayState, call: Call, model: ModelConfig, response_id: str, outcome: StreamOutcome
) -> None:
    """The stream has ended: charge what it delivered (nothing when it delivered no output)."""
    usage = stream_usage(model, outcome)
    if usage.total_tokens == 0 and not outcome.complete:
        release(state, call)
        if call.progress_noted:
            state.store.forget_progress(response_id)
        return
    settle(state, call, model, response_id, "completed" if outcome.complete else "incomplete", usage)


def note_progress(
    state: GatewayState,
    call: Call,
    model: ModelConfig,
    response_id: str,
    outcome: StreamOutcome,
    entry: RequestLog,
) -> None:
    """A running stream's settlement so far, made durable so that a killed process still bills what
    the stream had delivered (Store.note_progress); it becomes the settlement only if the process dies."""
    usage = stream_usage(model, outcome)
    record = _record(call, model, response_id, "incomplete", usage)
    state.store.note_progress(record, replace(entry, cost=record.cost, usage_id=record.id))
    call.progress_noted = True


async def close(state: GatewayState, call: Call, entry: RequestLog, answer: KeptAnswer | None = None) -> bool:
    """The request has ended and `entry` is its log entry: close whatever hold is still open, and
    make its settlement durable with the entry and the `answer` its Idempotency-Key keeps, as one
    step (Store.settle); a request that was not charged is only logged. Returns whether `answer`
    was kept (so with a charge)."""
    release(state, call)
    record, call.settlement = call.settlement, None
    if record is None:
        state.store.log_request(entry)
    else:
        await state.store.settle(record, entry, answer)
    state.telemetry.model_request(call, entry, record)
    return record is not None and answer is not None


def hand_over_to_job(state: GatewayState, call: Call) -> list[tuple[str, str]]:
    """The request's hold becomes a job's own (gateway.jobs): taken off this process's leases in
    memory (the store moves it to the job's lease when it records the job); returns its pots."""
    hold = call.hold
    if hold is None:
        return []
    state.funds.release(hold, hold.amount)
    return [(pot.kind, pot.pot_id) for pot in hold.pots]


def job_usage_record(job: Job, model: ModelConfig, status: str, usage: Usage, ended_ms: int) -> UsageRecord:
    """The charge of a job that has ended, under the job's id (GET /v1/usage/{id}), at the prices
    it was held at; the store applies it as it ends the job and releases the job's hold
    (Store.finish_job)."""
    prices = model.prices if job.prices is None else prices_of_text(job.prices)
    return UsageRecord(
        id=job.id,
        request_id=job.request_id,
        key_id=job.key_id,
        account_id=job.account_id,
        model=job.model,
        status=status,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cost=cost(prices, usage),
        started_at_ms=job.created_at_ms,
        ended_at_ms=ended_ms,
    )
