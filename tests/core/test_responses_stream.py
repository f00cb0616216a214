"""The Responses API rewriter (streams and whole bodies), through Python."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core import InvalidJsonError, ResponsesStreamRewriter, SseParser, rewrite_response

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "sse" / "openai_responses_stream.txt"
).read_bytes()
UPSTREAM_ID = "resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654"


def run(chunks: list[bytes], previous: str | None = "resp_prev_gw") -> tuple[bytes, ResponsesStreamRewriter]:
    rw = ResponsesStreamRewriter("resp_gw", previous)
    out = b"".join(rw.feed(c) for c in chunks) + rw.finish()
    return out, rw


def events(out: bytes) -> list[tuple[str | None, str]]:
    parser = SseParser()
    return [(e.event, e.data) for e in [*parser.feed(out), *parser.finish()]]


def test_only_ids_change_and_done_is_added() -> None:
    out, rw = run([FIXTURE])
    got, original = events(out), events(FIXTURE)
    assert [name for name, _ in got] == [name for name, _ in original] + [None]
    assert got[-1] == (None, "[DONE]")
    for (_, new), (_, old) in zip(got[:-1], original, strict=True):
        new_obj, old_obj = json.loads(new), json.loads(old)
        assert new_obj.pop("id") == "resp_gw"
        if "response" in old_obj:
            assert new_obj["response"].pop("id") == "resp_gw"
            assert new_obj["response"].pop("previous_response_id") == "resp_prev_gw"
            del old_obj["response"]["id"], old_obj["response"]["previous_response_id"]
        assert new_obj == old_obj
    assert rw.upstream_id == UPSTREAM_ID and rw.done and rw.saw_output and rw.error is None
    assert rw.output_text == "Hi there!" and rw.finish_reason == "completed"
    assert rw.usage is not None
    assert (rw.usage.prompt_tokens, rw.usage.cached_tokens) == (37, 5)
    assert (rw.usage.completion_tokens, rw.usage.reasoning_tokens) == (11, 2)


@given(st.lists(st.integers(min_value=0, max_value=len(FIXTURE)), max_size=12))
def test_same_output_however_split(cuts: list[int]) -> None:
    points = sorted(cuts)
    chunks = [FIXTURE[a:b] for a, b in zip([0, *points], [*points, len(FIXTURE)], strict=True)]
    whole, _ = run([FIXTURE])
    split, rw = run(chunks)
    assert split == whole and rw.upstream_id == UPSTREAM_ID


@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    run([data])


def test_whole_body() -> None:
    body = b'{"id":"resp_up","previous_response_id":null,"usage":{"input_tokens":2,"output_tokens":3}}'
    answer = rewrite_response(body, "resp_gw", "resp_prev")
    assert json.loads(answer.body) == {
        "id": "resp_gw",
        "previous_response_id": None,
        "usage": {"input_tokens": 2, "output_tokens": 3},
    }
    assert answer.upstream_id == "resp_up"
    assert answer.usage is not None and answer.usage.total_tokens == 5
    for bad in (b"[]", b'{"id": "x"', b'{"id":"x"} tail', b""):
        with pytest.raises(InvalidJsonError):
            rewrite_response(bad, "resp_gw")
