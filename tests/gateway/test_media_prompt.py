"""A prompt's media parts are held at what a provider bills for them (gateway._core.count_chat_tokens,
rust/core/src/media.rs): a PDF by its pages, audio by its length, a file the gateway cannot see at
the most pages a provider reads, an image at the model's configured `image_tokens`. Before, audio
and files were held as nothing, and every image at 1,600 tokens whatever the model billed."""

from __future__ import annotations

import base64
import struct
import uuid
import zlib
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from harness import Gateway, chat_model, gateway

CHAT, CLAUDE, RESPONSES = "openai/gpt-4o-mini", "anthropic/claude-sonnet-4-5", "openai/gpt-4.1-mini"
PRICE_PER_TOKEN = Decimal("2.50") / 1_000_000  # the session gateway's input price
PAGE = 3_000 + 1_600  # a PDF page's text and its image


def _pdf(pages: int, packed: bool = False) -> bytes:
    """A PDF of `pages` pages (catalog, page tree, pages, trailer), its objects written out or
    compressed in an object stream (PDF 1.5)."""
    kids = " ".join(f"{i + 3} 0 R" for i in range(pages))
    objects = [
        (1, b"<< /Type /Catalog /Pages 2 0 R >>"),
        (2, f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode()),
        *((i + 3, b"<< /Type /Page /Parent 2 0 R >>") for i in range(pages)),
    ]
    trailer = b"trailer\n<< /Root 1 0 R >>\n%%EOF\n"
    if not packed:
        return b"%PDF-1.4\n" + b"".join(b"%d 0 obj\n%s\nendobj\n" % o for o in objects) + trailer
    header, data = b"", b""
    for number, body in objects:
        header += b"%d %d " % (number, len(data))
        data += body + b"\n"
    return (
        b"%%PDF-1.7\n9 0 obj << /Type /ObjStm /N %d /First %d /Filter /FlateDecode >>\nstream\n"
        % (len(objects), len(header))
        + zlib.compress(header + data)
        + b"\nendstream\nendobj\n"
        + trailer
    )


def _wav(seconds: int, rate: int = 16_000) -> bytes:
    data = bytes(seconds * rate * 2)
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + len(data))
        + b"WAVEfmt "
        + struct.pack("<I", 16)
        + fmt
        + (b"data" + struct.pack("<I", len(data)) + data)
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _chat(content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": CHAT, "max_tokens": 1, "messages": [{"role": "user", "content": content}]}


def _messages(block: dict[str, Any]) -> dict[str, Any]:
    return {"model": CLAUDE, "max_tokens": 1, "messages": [{"role": "user", "content": [block]}]}


def _responses(model: str, part: dict[str, Any]) -> dict[str, Any]:
    return {"model": model, "max_output_tokens": 16, "input": [{"role": "user", "content": [part]}]}


def _cost(gw: Gateway, balance: str, path: str, body: dict[str, Any]) -> httpx.Response:
    handle = gw.new_key(balance=balance)
    with gw.client(handle.key) as client:
        return client.post(path, json=body)


def _pdf_part(pages: int, packed: bool = False) -> str:
    return "data:application/pdf;base64," + _b64(_pdf(pages, packed))


def test_a_pdf_is_held_by_its_pages_on_every_shape(gw: Gateway) -> None:
    """Twenty pages hold 92,000 tokens ($0.23 here): refused on $0.20, served on $0.30, however the
    shape carries the file."""
    held = 20 * PAGE * PRICE_PER_TOKEN
    assert Decimal("0.20") < held < Decimal("0.30")
    for packed in (False, True):
        for path, body in (
            ("/v1/chat/completions", _chat([{"type": "file", "file": {"file_data": _pdf_part(20, packed)}}])),
            (
                "/v1/responses",
                _responses(RESPONSES, {"type": "input_file", "file_data": _pdf_part(20, packed)}),
            ),
            (
                "/v1/messages",
                _messages(
                    {
                        "type": "document",
                        "source": {
                            "type": "base64",
                            "media_type": "application/pdf",
                            "data": _b64(_pdf(20, packed)),
                        },
                    }
                ),
            ),
        ):
            refused = _cost(gw, "0.20", path, body)
            assert refused.status_code == 400, (path, packed, refused.text)
            assert refused.json()["error"]["code"] == "insufficient_credits", (path, refused.text)
            served = _cost(gw, "0.30", path, body)
            assert served.status_code == 200, (path, packed, served.text)


def test_a_file_the_gateway_cannot_see_is_held_at_the_most_pages(gw: Gateway) -> None:
    """A file named by id or URL: 100 pages ($1.15 here)."""
    for path, body in (
        ("/v1/chat/completions", _chat([{"type": "file", "file": {"file_id": "file-abc"}}])),
        (
            "/v1/responses",
            _responses(RESPONSES, {"type": "input_file", "file_url": "https://example.com/a.pdf"}),
        ),
        (
            "/v1/messages",
            _messages({"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}),
        ),
    ):
        refused = _cost(gw, "1.10", path, body)
        assert refused.status_code == 400, (path, refused.text)
        assert refused.json()["error"]["code"] == "insufficient_credits", (path, refused.text)


def test_audio_is_held_by_its_length(gw: Gateway) -> None:
    """A WAV by its header (ten tokens a second); compressed audio by its size at 8 kbit/s, so that
    2 MB of mp3 (2,000 s at most, 20,000 tokens, $0.05 here) is refused on $0.04."""
    mp3 = _chat([{"type": "input_audio", "input_audio": {"data": _b64(bytes(2_000_000)), "format": "mp3"}}])
    refused = _cost(gw, "0.04", "/v1/chat/completions", mp3)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "insufficient_credits", (
        refused.text
    )
    # Sixty seconds of WAV (1.9 MB) are 600 tokens: $0.0015, served on $0.01.
    wav = _chat([{"type": "input_audio", "input_audio": {"data": _b64(_wav(60)), "format": "wav"}}])
    served = _cost(gw, "0.01", "/v1/chat/completions", wav)
    assert served.status_code == 200, served.text


@pytest.fixture(scope="module")
def dear_images(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A model whose provider bills an image at up to 48,000 tokens (as GPT-4o mini does)."""
    models = chat_model(CHAT, "gpt-4o-mini", sim_url, extra="image_tokens = 48000")
    with gateway(tmp_path_factory.mktemp("dear-images"), models) as g:
        yield g


def test_an_image_is_held_at_the_models_image_tokens(gw: Gateway, dear_images: Gateway) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    body = _chat([{"type": "text", "text": uuid.uuid4().hex}, image])
    # 48,000 tokens are $0.12: refused on $0.10, where the default 1,600 ($0.004) is served.
    refused = _cost(dear_images, "0.10", "/v1/chat/completions", body)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "insufficient_credits", (
        refused.text
    )
    assert _cost(gw, "0.10", "/v1/chat/completions", body).status_code == 200


def test_image_tokens_must_be_a_positive_whole_number(tmp_path: Any) -> None:
    from gateway.config import ConfigError, load_settings

    for bad in ("0", "-5", '"many"', "1.5"):
        path = tmp_path / "gateway.toml"
        path.write_text(chat_model(CHAT, "gpt-4o-mini", "http://127.0.0.1:9", extra=f"image_tokens = {bad}"))
        with pytest.raises(ConfigError, match="image_tokens"):
            load_settings(path)
