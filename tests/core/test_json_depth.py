"""json_nesting_depth: how deeply a request body nests, read from its bytes before they are parsed
(gateway.routes.common.parse_object refuses past MAX_JSON_DEPTH)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gateway.core import json_nesting_depth

# Strings full of what a bracket scanner could mistake for structure.
TRICKY_TEXT = st.text(alphabet='[]{}"\\ a\n\u00e9', max_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY_TEXT, inner, max_size=4),
    max_leaves=40,
)


def depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


@given(JSON_VALUES, st.booleans())
def test_the_depth_is_the_parsed_value_s(value: object, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert json_nesting_depth(text, 10_000) == depth(value)


@given(JSON_VALUES, st.integers(min_value=0, max_value=6))
def test_counting_stops_past_the_limit(value: object, limit: int) -> None:
    found = json_nesting_depth(json.dumps(value).encode(), limit)
    assert found == min(depth(value), limit + 1)


@given(st.binary(max_size=300))
def test_any_bytes_get_an_answer(raw: bytes) -> None:
    assert 0 <= json_nesting_depth(raw, 50) <= 51


def test_a_deep_body_is_measured_without_recursion() -> None:
    deep = b"[" * 1_000_000 + b"]" * 1_000_000
    assert json_nesting_depth(deep, 2_000_000) == 1_000_000
    assert json_nesting_depth(deep, 100) == 101
