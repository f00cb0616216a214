"""Token counts equal OpenAI's tiktoken, exactly.

The reference is OpenAI's tiktoken, loaded offline from the vocabulary files tiktoken-rs ships and
checked against the hashes tiktoken pins (see tests/tiktoken_reference.py).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

import tiktoken_reference
from gateway.core import (
    IMAGE_PART_TOKENS,
    CoreError,
    InvalidJsonError,
    UnknownEncodingError,
    count_chat_tokens,
    count_prompt_tokens,
    count_tokens,
    wav_seconds,
)

CORPUS = [
    "",
    "Hello, world!",
    "日本語のテキスト、中文、한국어 문장입니다.",
    "emoji 😀👍🏽🇫🇷 family 👨‍👩‍👧‍👦",
    "    leading spaces\n\n\ttabs\r\n  trailing   ",
    'def f(x):\n    return {"a": [1, 2, 3]}\n',
    "1234567890 3.14159 -42 1e10 0x1F",
    "a" * 500,
    "<|endoftext|> is text here",
    "It's we've they'll I'd DON'T",
    "مرحبا بالعالم שלום עולם",
    "Ünïcödé façade naïve café résumé",
    "<|endoftext|><|fim_prefix|><|im_start|>",
    "\u00a0\u2003\u3000 odd spaces\u200b",
    *(ch * 3000 for ch in ["a", " ", "\n", "1", "😀", "ab", "中", ".", "\t ", "x ", "\r\n"]),
]


@pytest.fixture(scope="module")
def reference() -> Callable[[str], tiktoken.Encoding]:
    encodings = tiktoken_reference.load()
    if encodings is None:
        pytest.skip("the tiktoken-rs crate's vocabulary files were not found (is cargo installed?)")
    return encodings.__getitem__


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_corpus_matches_tiktoken(reference: Callable[[str], tiktoken.Encoding], encoding: str) -> None:
    enc = reference(encoding)
    for text in CORPUS:
        assert count_tokens(text, encoding) == len(enc.encode_ordinary(text)), text  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_random_text_matches_tiktoken(reference: Callable[[str], tiktoken.Encoding], text: str) -> None:
    for encoding in ("o200k_base", "cl100k_base"):
        assert count_tokens(text, encoding) == len(reference(encoding).encode_ordinary(text))


# Text the core splits without its automaton (ASCII: its own scan, pretokenize.rs), with the
# characters its pattern tells apart, and now and then one past ASCII next to them.
_PARTS = [*"aZq'sStTlLdDmMrRvVeE0127 \t\n\r\x0b\x0c\x1f.,!/-_$", "'ll", "'VE", " \n", "\u00a0", "é", "٣"]
_ASCII_HEAVY = st.lists(st.sampled_from(_PARTS), max_size=60).map("".join)


@settings(max_examples=500, deadline=None)
@given(text=_ASCII_HEAVY | st.text(st.characters(max_codepoint=127), max_size=200))
def test_ascii_text_matches_tiktoken(reference: Callable[[str], tiktoken.Encoding], text: str) -> None:
    for encoding in ("o200k_base", "cl100k_base"):
        assert count_tokens(text, encoding) == len(reference(encoding).encode_ordinary(text))


def test_long_text_releases_the_gil_and_still_counts(reference: Callable[[str], tiktoken.Encoding]) -> None:
    text = "The quick brown fox. " * 2000
    assert count_tokens(text) == len(reference("o200k_base").encode_ordinary(text))


def test_chat_accounting_follows_openai(reference: Callable[[str], tiktoken.Encoding]) -> None:
    enc = reference("o200k_base")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
    ]
    expected = 3 + sum(
        3 + sum(len(enc.encode_ordinary(v)) for v in m.values() if isinstance(v, str)) + int("name" in m)
        for m in messages
    )
    expected += len(enc.encode_ordinary("Hi"))
    expected += 1_600  # the image part, whatever its size (rust/core/src/tokens.rs: IMAGE_PART_TOKENS)
    body = json.dumps({"model": "x", "messages": messages}).encode()
    assert count_chat_tokens(body) == expected


def test_tool_calls_and_tool_messages(reference: Callable[[str], tiktoken.Encoding]) -> None:
    enc = reference("cl100k_base")

    def n(text: str) -> int:
        return len(enc.encode_ordinary(text))

    messages = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "sunny"},
    ]
    expected = 3 + (3 + n("assistant") + n("get_weather") + n('{"city": "Paris"}'))
    expected += 3 + n("tool") + n("c") + n("sunny")
    body = json.dumps({"messages": messages}).encode()
    assert count_chat_tokens(body, "cl100k_base") == expected


def test_errors() -> None:
    with pytest.raises(UnknownEncodingError):
        count_tokens("x", "gpt2")  # type: ignore[arg-type]
    with pytest.raises(InvalidJsonError):
        count_chat_tokens(b"{}")
    with pytest.raises(ValueError):  # every core error is a ValueError
        count_chat_tokens(b"not json")
    for bad in (b"[[]]", b'{"messages": {}}', b'{"messages": ["x"]}'):
        with pytest.raises(InvalidJsonError):
            count_chat_tokens(bad)
    assert issubclass(UnknownEncodingError, CoreError) and issubclass(InvalidJsonError, CoreError)
    assert count_tokens("") == 0


_PDF_PIECES = st.sampled_from(
    [b"%PDF-1.7\n", b"/Type /Page ", b"/Type/Pages ", b"/ObjStm ", b"stream\r\n", b"endstream", b"/Type"]
)


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=2_000)
    | st.lists(_PDF_PIECES | st.binary(max_size=40), max_size=20).map(b"".join),
    kind=st.sampled_from(["file", "input_file", "document", "input_audio"]),
    wrapped=st.booleans(),
)
def test_media_parts_of_any_bytes_are_counted_not_raised(data: bytes, kind: str, wrapped: bool) -> None:
    """A media part's bytes are the client's (rust/core/src/media.rs reads base64, WAV headers and
    PDFs): whatever they are, counting never raises nor counts less than without the part, and a
    file that is a PDF is held at a page at least."""
    encoded = base64.b64encode(data).decode()
    url = f"data:application/pdf;base64,{encoded}" if wrapped else encoded
    parts: dict[str, dict[str, Any]] = {
        "file": {"type": "file", "file": {"file_data": url}},
        "input_file": {"type": "input_file", "file_data": url},
        "document": {"type": "document", "source": {"type": "base64", "data": encoded}},
        "input_audio": {"type": "input_audio", "input_audio": {"data": encoded}},
    }
    part = parts[kind]
    bare = count_chat_tokens(orjson.dumps({"messages": [{"role": "user", "content": []}]}))
    counted = count_chat_tokens(orjson.dumps({"messages": [{"role": "user", "content": [part]}]}))
    assert counted >= bare
    if kind != "input_audio" and data.startswith(b"%PDF"):
        assert counted - bare >= 3_000 + IMAGE_PART_TOKENS


_WAV_PIECES = st.sampled_from(
    [
        b"RIFF\x24\x00\x00\x00WAVE",
        b"fmt \x10\x00\x00\x00",
        b"\x01\x00\x01\x00\x80\x3e\x00\x00",
        b"data",
        b"\x00" * 8,
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=200) | st.lists(_WAV_PIECES | st.binary(max_size=12), max_size=12).map(b"".join)
)
def test_a_wavs_length_is_read_from_any_bytes_and_bounds_its_audio_part(data: bytes) -> None:
    """wav_seconds reads a client's upload header (transcription's hold and bill); whatever the
    bytes, it never raises, is None or a length >= 0, and an `input_audio` part of those bytes is
    held at that length's 10 tokens a second (the same reading: rust/core/src/media.rs)."""
    seconds = wav_seconds(data)
    if seconds is None:
        return
    assert seconds >= 0
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode()}}
    tokens, audio = count_prompt_tokens(orjson.dumps({"messages": [{"role": "user", "content": [part]}]}))
    assert audio == math.ceil(round(seconds * 10, 6)) and tokens >= audio
