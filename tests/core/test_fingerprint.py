"""Idempotency fingerprints through Python."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core import CoreError, fingerprint

PATH = "/v1/images/generations"
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=15,
)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=8))
def test_json_key_order_and_whitespace_do_not_matter(obj: dict[str, object]) -> None:
    compact = json.dumps(obj, separators=(",", ":")).encode()
    reordered = json.dumps(dict(reversed(list(obj.items()))), indent=3, sort_keys=False).encode()
    assert fingerprint("POST", PATH, compact, "application/json") == fingerprint(
        "POST", PATH, reordered, "application/json"
    )


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_different_bytes_differ(a: bytes, b: bytes) -> None:
    if a != b:
        assert fingerprint("POST", PATH, a, "audio/wav") != fingerprint("POST", PATH, b, "audio/wav")


def multipart(boundary: str, prompt: str, image: bytes) -> bytes:
    return (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n{prompt}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n'
            f"Content-Type: image/png\r\n\r\n"
        ).encode()
        + image
        + f"\r\n--{boundary}--\r\n".encode()
    )


@given(st.text(min_size=1, max_size=20).filter(lambda s: "\r" not in s), st.binary(max_size=100))
def test_multipart_boundary_does_not_matter(prompt: str, image: bytes) -> None:
    a = fingerprint("POST", PATH, multipart("aaa111", prompt, image), "multipart/form-data; boundary=aaa111")
    b = fingerprint("POST", PATH, multipart("zzz999", prompt, image), "multipart/form-data; boundary=zzz999")
    assert a == b


def form(boundary: str, fields: list[tuple[str, bytes]]) -> bytes:
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n'.encode() + v for n, v in fields
    ]
    return b"\r\n".join(parts) + f"\r\n--{boundary}--\r\n".encode()


@given(st.permutations([("prompt", b"a cat"), ("model", b"gpt-image-1"), ("size", b"1024x1024")]))
def test_multipart_fields_in_any_order_are_the_same_request(fields: list[tuple[str, bytes]]) -> None:
    """As a JSON object's keys (review: the openai client's order and another's were 409 reused);
    repeated fields (several images) keep their order."""
    ct = "multipart/form-data; boundary=b"
    first = fingerprint(
        "POST", PATH, form("b", [("prompt", b"a cat"), ("model", b"gpt-image-1"), ("size", b"1024x1024")]), ct
    )
    assert fingerprint("POST", PATH, form("b", list(fields)), ct) == first
    images = [("image[]", b"1"), ("image[]", b"2")]
    assert fingerprint("POST", PATH, form("b", images), ct) != fingerprint(
        "POST", PATH, form("b", images[::-1]), ct
    )


def test_key_method_and_path() -> None:
    body = b'{"prompt": "x"}'
    plain = fingerprint("POST", PATH, body)
    assert plain != fingerprint("POST", "/v1/videos", body)
    assert plain != fingerprint("POST", PATH, body, key=b"k" * 32)
    assert len(plain) == 64 and int(plain, 16) >= 0
    with pytest.raises(CoreError):
        fingerprint("POST", PATH, body, key=b"short")


def test_large_body_hashed_without_the_gil_is_stable() -> None:
    big = b"x" * (1 << 20)
    changed = big[:-1] + b"y"
    assert fingerprint("POST", PATH, big, "audio/wav") == fingerprint("POST", PATH, bytes(big), "audio/wav")
    assert fingerprint("POST", PATH, big, "audio/wav") != fingerprint("POST", PATH, changed, "audio/wav")


def reorder(value: object, rnd: random.Random) -> object:
    """The same JSON value with every object's members shuffled."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: reorder(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [reorder(v, rnd) for v in value]
    return value


@given(json_values, st.randoms(use_true_random=False), st.sampled_from([None, 1, 4]), st.booleans())
def test_nested_order_whitespace_and_escapes_do_not_matter(
    value: object, rnd: random.Random, indent: int | None, ascii_only: bool
) -> None:
    a = json.dumps(value).encode()
    b = json.dumps(reorder(value, rnd), indent=indent, ensure_ascii=ascii_only).encode()
    for content_type in (None, "application/json", "application/vnd.api+json; charset=utf-8"):
        assert fingerprint("POST", PATH, a, content_type) == fingerprint("POST", PATH, b, content_type)


def test_json_whatever_the_type_says_but_multipart() -> None:
    a, b = b'{"a": 1, "b": 2}', b'{"b":2,"a":1}'
    assert fingerprint("POST", PATH, a) == fingerprint("POST", PATH, b)
    # The gateway reads a JSON body as JSON under any type (spec review: curl -d's form type).
    assert fingerprint("POST", PATH, a, "text/plain") == fingerprint("POST", PATH, b, "application/json")
    # Not JSON although the type says so: taken byte for byte, still stable.
    assert fingerprint("POST", PATH, b"{oops", "application/json") == fingerprint(
        "POST", PATH, b"{oops", "application/json"
    )
    assert fingerprint("POST", PATH, b'{"a":1}') != fingerprint("POST", PATH, b'{"a":1.0}')
    assert fingerprint("post", PATH, a) == fingerprint("POST", PATH, a)


def test_key_must_be_32_bytes_and_changes_the_digest() -> None:
    body = b"x"
    for size in (0, 1, 31, 33, 64):
        with pytest.raises(CoreError):
            fingerprint("POST", PATH, body, key=bytes(size))
    assert fingerprint("POST", PATH, body, key=bytes(32)) != fingerprint("POST", PATH, body, key=b"\x01" * 32)
    assert fingerprint("POST", PATH, body, key=bytes(32)) == fingerprint("POST", PATH, body, key=bytes(32))


def test_multipart_parts_matter_and_malformed_falls_back_to_bytes() -> None:
    base = fingerprint("POST", PATH, multipart("b1", "cat", b"\x89PNG"), "multipart/form-data; boundary=b1")
    assert base != fingerprint(
        "POST", PATH, multipart("b1", "dog", b"\x89PNG"), "multipart/form-data; boundary=b1"
    )
    assert base != fingerprint(
        "POST", PATH, multipart("b1", "cat", b"\x89PNH"), "multipart/form-data; boundary=b1"
    )
    broken = b"--b1\r\nno blank line after the head"
    ct = "multipart/form-data; boundary=b1"
    assert fingerprint("POST", PATH, broken, ct) == fingerprint("POST", PATH, broken, ct)
    assert fingerprint("POST", PATH, broken, ct) != fingerprint("POST", PATH, broken + b"!", ct)


@given(st.binary(max_size=300), st.text(max_size=40))
def test_never_fails_on_arbitrary_input(body: bytes, content_type: str) -> None:
    assert len(fingerprint("POST", PATH, body, content_type)) == 64
    assert len(fingerprint("POST", PATH, body, "multipart/form-data; boundary=" + content_type)) == 64
