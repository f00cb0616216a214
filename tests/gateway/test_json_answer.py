"""JsonAnswer (routes/common.py), the plain model answer's lean Response, writes the same head and
body Starlette's Response writes for the same answer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from starlette.responses import Response

from gateway.routes.common import JsonAnswer

_LATIN1 = st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f")
_NAMES = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyzABCXYZ-_0123456789"), min_size=1, max_size=20
).filter(lambda name: name.lower() not in ("content-length", "content-type"))


@given(
    body=st.binary(max_size=300), headers=st.dictionaries(_NAMES, st.text(_LATIN1, max_size=40), max_size=4)
)
def test_a_json_answer_is_starlette_s_response_for_the_same_answer(
    body: bytes, headers: dict[str, str]
) -> None:
    ours = JsonAnswer(body, headers)
    theirs = Response(body, media_type="application/json", headers=headers)
    assert ours.raw_headers == theirs.raw_headers
    assert (ours.body, ours.status_code, ours.background) == (
        theirs.body,
        theirs.status_code,
        theirs.background,
    )
    assert dict(ours.headers) == dict(theirs.headers)
