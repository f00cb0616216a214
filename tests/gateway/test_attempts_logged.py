"""What the request log keeps of a request's tries (Attempt.logged, written out field by field): every
field of the try in order, none of its span's, for a model's tries and a safety check's alike."""

from __future__ import annotations

import dataclasses

import orjson

from gateway.request_log import _attempts_json
from gateway.routing import Attempt
from gateway.safety import SafetyAttempt

SPAN_FIELDS = {"span_id", "started_ns", "ended_ns"}


def _expected(attempt: Attempt) -> dict[str, object]:
    return {
        f.name: getattr(attempt, f.name) for f in dataclasses.fields(attempt) if f.name not in SPAN_FIELDS
    }


def test_every_field_but_the_spans_is_logged_in_order() -> None:
    tries = [
        Attempt("primary", 1_700, 12, "provider_error", 502, span_id=7, started_ns=1, ended_ns=2),
        SafetyAttempt(
            "mod", 1_690, 3, span_id=9, model="omni-moderation", verdict="flagged", categories=["hate"]
        ),
    ]
    for attempt in tries:
        logged = attempt.logged()
        assert list(logged) == list(_expected(attempt))
        assert logged == _expected(attempt)


def test_the_models_own_tries_name_the_dropped_parameters() -> None:
    check = SafetyAttempt("mod", 1, model="m", verdict="passed")
    model_try = Attempt("primary", 2, 5)
    logged = orjson.loads(_attempts_json([check, model_try], ("logit_bias", "seed")))
    assert logged == [_expected(check), {**_expected(model_try), "dropped_params": ["logit_bias", "seed"]}]
    assert orjson.loads(_attempts_json([model_try], ())) == [_expected(model_try)]
