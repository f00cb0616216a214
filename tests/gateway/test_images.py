"""POST /v1/images/generations and /v1/images/edits with the official openai client: every image comes
back as a URL the gateway serves itself, for a limited time, priced per image and per token."""

from __future__ import annotations

import base64
import io
import os
import sqlite3
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.config import Prices
from gateway.pricing import Usage, cost
from gateway.routes import image_files
from gateway.routes.images import _dearest_variant
from gateway.sim.images import png
from harness import Gateway, KeyHandle, chat_model, eventually, gateway

GPT_IMAGE = "openai/gpt-image-1"
DALL_E = "openai/dall-e-3"
PRICES = Prices(
    input=Decimal("2.50"), cached_input=Decimal("1.25"), output=Decimal(10), image=Decimal("0.04")
)
PNG = png(4, 4, b"\x10\x80\xf0")
FILES = "/v1/images/files/"


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


def fetch(url: str) -> httpx.Response:
    """An image URL as any program would fetch it: no API key."""
    return httpx.get(url, timeout=10)


def sim_records(sim: httpx.Client, path: str, marker: str) -> list[dict[str, Any]]:
    return [e for e in sim.get("/_sim/requests").json() if e["path"] == path and marker in str(e)]


def usage_record(gw: Gateway, key: KeyHandle, rid: str) -> dict[str, Any]:
    with gw.client(key.key) as c:

        def found() -> httpx.Response | None:
            r = c.get(f"/v1/usage/{rid}")
            return r if r.status_code == 200 else None

        r = eventually(found, step=0.05, what=f"the usage record {rid}")
    assert r.status_code == 200
    record: dict[str, Any] = r.json()
    return record


def stored_tokens(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("SELECT token FROM images")}


def test_generate_two_images_as_gateway_urls_priced_per_token_and_image(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI, sim: httpx.Client
) -> None:
    prompt = "a lighthouse at dusk " + os.urandom(4).hex()
    before = gw.balance(key.account_id)
    raw = oai.images.with_raw_response.generate(model=GPT_IMAGE, prompt=prompt, n=2, size="1024x1024")
    result = raw.parse()
    body = raw.http_response.json()
    assert result.data is not None and len(result.data) == 2
    urls = [image.url for image in result.data]
    assert all(u is not None and u.startswith(gw.url + FILES) for u in urls)
    assert len(set(urls)) == 2
    for image in result.data:
        assert image.url is not None
        r = fetch(image.url)
        assert r.status_code == 200 and r.headers["content-type"] == "image/png"
        assert r.content.startswith(b"\x89PNG\r\n\x1a\n")
        # A GPT image model answers in base64, and clients written for it read that: kept beside the URL.
        assert image.b64_json is not None and base64.b64decode(image.b64_json) == r.content
    # The rest of the upstream's answer is kept.
    assert result.size == "1024x1024" and result.output_format == "png"
    assert result.usage is not None and result.usage.output_tokens == 2 * 1056

    charged = Decimal(raw.headers["x-service-cost"])
    usage = Usage(prompt_tokens=result.usage.input_tokens, completion_tokens=2 * 1056, images=2)
    assert charged == cost(PRICES, usage) > 0
    assert raw.headers["x-service-request-id"].startswith("req_")
    assert gw.wait_balance(key.account_id, before - charged) == before - charged
    record = usage_record(gw, key, body["id"])
    assert record["model"] == GPT_IMAGE and Decimal(str(record["cost"])) == charged
    assert record["usage"]["prompt_tokens"] == result.usage.input_tokens
    assert record["usage"]["completion_tokens"] == 2 * 1056

    (received,) = sim_records(sim, "/v1/images/generations", prompt)
    assert received["body"] == {"model": "gpt-image-1", "prompt": prompt, "n": 2, "size": "1024x1024"}


def test_upstream_links_are_downloaded_and_served_by_the_gateway(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI, sim_url: str
) -> None:
    prompt = "a red fox " + os.urandom(4).hex()
    raw = oai.images.with_raw_response.generate(model=DALL_E, prompt=prompt, size="256x256")
    result = raw.parse()
    assert result.data is not None and len(result.data) == 1
    image = result.data[0]
    assert image.url is not None and image.url.startswith(gw.url + FILES)
    assert sim_url not in image.url
    assert image.revised_prompt == "A simulated picture of: " + prompt
    served = fetch(image.url)
    assert served.status_code == 200 and served.headers["content-type"] == "image/png"
    # DALL-E reports no usage: the prompt's tokens as counted, and the image.
    record = usage_record(gw, key, raw.http_response.json()["id"])
    charged = Decimal(raw.headers["x-service-cost"])
    tokens = record["usage"]["prompt_tokens"]
    assert tokens > 0 and charged == cost(PRICES, Usage(prompt_tokens=tokens, images=1))


def test_dall_e_answer_carries_the_counted_usage(gw: Gateway, key: KeyHandle, oai: openai.OpenAI) -> None:
    """Spec 1.4.1: every successful response includes usage. DALL-E reports none: the answer gets
    OpenAI's image usage object with the tokens the gateway counted and billed."""
    raw = oai.images.with_raw_response.generate(model=DALL_E, prompt="a blue heron " + os.urandom(4).hex())
    result = raw.parse()
    assert result.usage is not None
    record = usage_record(gw, key, raw.http_response.json()["id"])
    tokens = record["usage"]["prompt_tokens"]
    assert tokens > 0
    assert raw.http_response.json()["usage"] == {
        "input_tokens": tokens,
        "input_tokens_details": {"text_tokens": tokens, "image_tokens": 0},
        "output_tokens": 0,
        "total_tokens": tokens,
    }
    assert result.usage.input_tokens == result.usage.total_tokens == tokens


def test_url_requested_from_a_base64_model(oai: openai.OpenAI) -> None:
    result = oai.images.generate(model=GPT_IMAGE, prompt="a kite", response_format="url")
    assert result.data is not None and result.data[0].url is not None
    assert fetch(result.data[0].url).content.startswith(b"\x89PNG")
    assert result.data[0].b64_json is None


def test_base64_requested_from_a_model_that_links(oai: openai.OpenAI) -> None:
    """`response_format: "b64_json"` (the AI SDK's generateImage asks so) gets the image's base64
    beside the gateway's URL (spec 2.4: every image has its URL), even from an upstream that
    answered with a link."""
    result = oai.images.generate(model=DALL_E, prompt="a kite", response_format="b64_json")
    assert result.data is not None
    (image,) = result.data
    assert image.url is not None and image.b64_json is not None
    assert base64.b64decode(image.b64_json) == fetch(image.url).content
    linked = oai.images.generate(model=DALL_E, prompt="a kite")
    assert linked.data is not None and linked.data[0].b64_json is None


def test_edit_with_image_and_mask(gw: Gateway, oai: openai.OpenAI, sim: httpx.Client) -> None:
    prompt = "add a hat " + os.urandom(4).hex()
    # Bytes without a type, as from an unnamed upload: the gateway labels the image by its content.
    raw = oai.images.with_raw_response.edit(
        model=GPT_IMAGE,
        image=("photo.png", PNG, "application/octet-stream"),
        mask=io.BytesIO(PNG),
        prompt=prompt,
        size="1024x1024",
    )
    result = raw.parse()
    assert result.data is not None and len(result.data) == 1 and result.data[0].url is not None
    assert fetch(result.data[0].url).content.startswith(b"\x89PNG")
    assert Decimal(raw.headers["x-service-cost"]) > 0
    (received,) = sim_records(sim, "/v1/images/edits", prompt)
    assert received["body"] == {"model": "gpt-image-1", "prompt": prompt, "size": "1024x1024"}
    files = {f["name"]: f for f in received["files"]}
    assert files["image"]["content_type"] == "image/png" and files["image"]["size"] == len(PNG)
    assert files["image"]["filename"] == "photo.png"
    assert files["mask"]["content_type"] == "image/png"
    assert result.usage is not None and result.usage.input_tokens_details.image_tokens == 323


def test_edit_with_several_images(oai: openai.OpenAI, sim: httpx.Client) -> None:
    prompt = "a collage " + os.urandom(4).hex()
    jpeg = b"\xff\xd8\xff\xe0" + bytes(32)
    result = oai.images.edit(model=GPT_IMAGE, image=[("a.png", PNG), ("b.jpg", jpeg)], prompt=prompt, n=2)
    assert result.data is not None and len(result.data) == 2
    (received,) = sim_records(sim, "/v1/images/edits", prompt)
    assert [(f["name"], f["content_type"]) for f in received["files"]] == [
        ("image[]", "image/png"),
        ("image[]", "image/jpeg"),
    ]


def test_unsupported_parameters_dropped(gw: Gateway, key: KeyHandle, sim: httpx.Client) -> None:
    prompt = "a boat " + os.urandom(4).hex()
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/images/generations",
            json={"model": GPT_IMAGE, "prompt": prompt, "quality": "low", "temperature": 1, "stream": False},
        )
    assert r.status_code == 200
    (received,) = sim_records(sim, "/v1/images/generations", prompt)
    assert received["body"] == {"model": "gpt-image-1", "prompt": prompt, "quality": "low"}
    with gw.client(key.key) as c:
        info = c.get("/model_group/info", params={"model_group": GPT_IMAGE}).json()
    params = info["data"][0]["supported_openai_params"]
    assert {"n", "size", "quality", "mask", "background"} <= set(params)
    # GPT image models refuse DALL-E's response_format and style (OpenAI: 400 unknown_parameter);
    # the gateway answers response_format itself. DALL-E's list is its own.
    assert not {"stream", "response_format", "style"} & set(params)
    with gw.client(key.key) as c:
        dall_e = c.get("/model_group/info", params={"model_group": DALL_E}).json()["data"][0]
    assert {"response_format", "style", "n", "size", "quality"} <= set(dall_e["supported_openai_params"])
    assert "background" not in dall_e["supported_openai_params"]
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/images/generations",
            json={"model": GPT_IMAGE, "prompt": prompt + " url", "response_format": "url", "style": "vivid"},
        )
    assert r.status_code == 200 and r.json()["data"][0]["url"].startswith(gw.url), r.text
    assert "b64_json" not in r.json()["data"][0]  # asked for a URL: only the URL
    (received,) = sim_records(sim, "/v1/images/generations", prompt + " url")
    assert received["body"] == {"model": "gpt-image-1", "prompt": prompt + " url"}


# Review: headers whose sides are past what an image can be made the hold trillions of dollars, and
# the answer insufficient_credits.
HUGE_PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR" + b"\xff" * 8 + b"\x08\x02\x00\x00\x00" + bytes(16)
HUGE_JPEG = b"\xff\xd8\xff\xc0\x00\x11\x08\xff\xff\xff\xff\x03" + bytes(20)


@pytest.mark.parametrize(
    ("files", "data", "param"),
    [
        ({"image": ("notes.png", b"just some text", "image/png")}, {"prompt": "p"}, "image"),
        ({"image": ("empty.png", b"", "image/png")}, {"prompt": "p"}, "image"),
        (
            {"image": ("a.png", PNG, "image/png"), "mask": ("m.png", b"GIF89a...", "image/png")},
            {"prompt": "p"},
            "mask",
        ),
        ({"image": ("a.png", HUGE_PNG, "image/png")}, {"prompt": "p"}, "image"),
        ({"image": ("a.jpg", HUGE_JPEG, "image/jpeg")}, {"prompt": "p"}, "image"),
        (
            {"image": ("a.png", PNG, "image/png"), "mask": ("m.png", HUGE_PNG, "image/png")},
            {"prompt": "p"},
            "mask",
        ),
        ({"image": ("a.png", PNG, "image/png")}, {}, "prompt"),
        ({"mask": ("m.png", PNG, "image/png")}, {"prompt": "p"}, "image"),
        ({"image": ("a.png", PNG, "image/png")}, {"prompt": "p", "model": "openai/gpt-4o-mini"}, "model"),
        *(({"image": ("a.png", PNG, "image/png")}, {"prompt": "p", "n": n}, "n") for n in ("ten", "٣", "0")),
    ],
)
def test_bad_edits_are_invalid_request(
    gw: Gateway, key: KeyHandle, files: dict[str, Any], data: dict[str, str], param: str
) -> None:
    before = gw.balance(key.account_id)
    with gw.client(key.key) as c:
        r = c.post("/v1/images/edits", files=files, data={"model": GPT_IMAGE, **data})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["code"], error["type"], error["param"]) == (
        "invalid_request",
        "invalid_request_error",
        param,
    )
    assert "x-service-request-id" in r.headers
    assert gw.balance(key.account_id) == before


def test_bad_image_through_the_client(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.images.edit(model=GPT_IMAGE, image=("a.png", b"%PDF-1.7 not an image"), prompt="p")
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "invalid_request"


def test_edit_over_the_request_limit_is_413(gw: Gateway, key: KeyHandle) -> None:
    big = PNG + bytes(10 * 1024 * 1024)
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/images/edits", files={"image": ("a.png", big)}, data={"model": GPT_IMAGE, "prompt": "p"}
        )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_a_streamed_generation_is_refused_before_anything_is_held(gw: Gateway, oai: openai.OpenAI) -> None:
    """The openai client asked for a stream reads only events: a JSON answer would be charged and
    read as nothing, so `stream: true` is 400 (param `stream`), for generations and edits."""
    with pytest.raises(openai.BadRequestError) as generated:
        list(oai.images.generate(model=GPT_IMAGE, prompt="a cat", stream=True, partial_images=2))
    with pytest.raises(openai.BadRequestError) as edited:
        list(oai.images.edit(model=GPT_IMAGE, prompt="a hat", image=("a.png", PNG), stream=True))
    for caught in (generated, edited):
        body = caught.value.body
        assert isinstance(body, dict) and (body["code"], body["param"]) == ("invalid_request", "stream")


def test_edit_body_must_be_multipart(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        r = c.post("/v1/images/edits", json={"model": GPT_IMAGE, "prompt": "p", "image": "x"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
        # A media type is case-insensitive (RFC 9110): a form said in capitals is a form.
        form = httpx.Request(
            "POST", "http://x", files={"image": ("a.png", PNG)}, data={"model": GPT_IMAGE, "prompt": "p"}
        )
        form.read()
        shouting = form.headers["content-type"].replace("multipart/form-data", "Multipart/Form-Data")
        r = c.post("/v1/images/edits", content=form.content, headers={"content-type": shouting})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": GPT_IMAGE}, "prompt"),
        ({"model": GPT_IMAGE, "prompt": "  "}, "prompt"),
        ({"model": "openai/gpt-4o-mini", "prompt": "a cat"}, "model"),
        ({"prompt": "a cat"}, "model"),
        # Held as one image, an `n` an upstream reads as ten would be charged as ten.
        *(({"model": DALL_E, "prompt": "a cat", "n": n}, "n") for n in ("10", True, 0, -1, 1.5, 11)),
        # Priced by name: a size or quality that is no name would be priced as the model's default.
        ({"model": GPT_IMAGE, "prompt": "a cat", "quality": 3}, "quality"),
        ({"model": DALL_E, "prompt": "a cat", "size": 1024}, "size"),
        # Review: sizes no model makes were refused as insufficient_credits ("up to $6250000000").
        *(
            ({"model": GPT_IMAGE, "prompt": "a cat", "size": size}, "size")
            for size in (
                "99999999x99999999",
                "100000x100000",
                "1024x0",
                "16385x1024",
                "9999999999x1",
                "1x" + "9" * 5000,
            )
        ),
    ],
)
def test_bad_generations_are_invalid_request(
    gw: Gateway, key: KeyHandle, body: dict[str, Any], param: str
) -> None:
    with gw.client(key.key) as c:
        r = c.post("/v1/images/generations", json=body)
    assert r.status_code == 400
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("invalid_request", param)


def test_image_model_on_another_endpoint_is_invalid_request(gw: Gateway, key: KeyHandle) -> None:
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/chat/completions", json={"model": GPT_IMAGE, "messages": [{"role": "user", "content": "hi"}]}
        )
    assert r.status_code == 400 and "/v1/images/generations" in r.json()["error"]["message"]
    assert "is an image model" in r.json()["error"]["message"]
    rid = r.headers["x-service-request-id"]  # logged under the model it named (console review)
    logged = eventually(lambda: gw.query("SELECT model FROM request_logs WHERE id = ?", rid))
    assert [tuple(row) for row in logged] == [(GPT_IMAGE,)]


def test_upstream_failure_is_provider_error_and_not_charged(gw: Gateway, key: KeyHandle) -> None:
    before = gw.balance(key.account_id)
    with gw.client(key.key) as c:
        r = c.post("/v1/images/generations", json={"model": GPT_IMAGE, "prompt": "[sim fail=500]"})
        refused = c.post("/v1/images/generations", json={"model": GPT_IMAGE, "prompt": "x", "n": 11})
    assert r.status_code == 502 and r.json()["error"]["code"] == "provider_error"
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request"
    time.sleep(0.2)  # a charge, if there were one, would have landed by now
    assert gw.balance(key.account_id) == before


def test_the_hold_covers_every_image_at_its_size(gw: Gateway) -> None:
    """GPT image models bill output tokens that grow with the images' number and area, so the hold
    counts them: a request that could take the balance below zero is refused before it runs, not
    charged in full afterwards (spec 8, the balance is a hard limit)."""
    # One image's bound here: 16,384 output tokens at $10 a million and $0.04, about $0.20.
    handle = gw.new_key(balance="0.40")
    with gw.client(handle.key) as c:
        one = c.post("/v1/images/generations", json={"model": GPT_IMAGE, "prompt": "a cat", "n": 1})
        three = c.post("/v1/images/generations", json={"model": GPT_IMAGE, "prompt": "a cat", "n": 3})
        huge = c.post(
            "/v1/images/generations", json={"model": GPT_IMAGE, "prompt": "a cat", "size": "8192x8192"}
        )
    assert one.status_code == 200, one.text
    charged = Decimal(one.headers["x-service-cost"])
    for refused in (three, huge):
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "insufficient_credits"
    assert gw.wait_balance(handle.account_id, Decimal("0.40") - charged) == Decimal("0.40") - charged


def test_file_url_needs_no_key_and_unknown_is_404(gw: Gateway, oai: openai.OpenAI) -> None:
    result = oai.images.generate(model=GPT_IMAGE, prompt="a tree")
    assert result.data is not None and result.data[0].url is not None
    token = result.data[0].url.rsplit("/", 1)[1]
    assert len(token) >= 43  # 32 random bytes, url-safe base64
    assert fetch(result.data[0].url).headers["x-content-type-options"] == "nosniff"
    r = fetch(gw.url + FILES + "nope" + token[4:])
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "not_found_error",
        "param": None,
        "code": "not_found",
    }


def test_url_ignores_a_host_header_not_allowed(gw: Gateway, key: KeyHandle) -> None:
    """Without public_base_url or allowed_hosts the URL is the listen address, whatever Host says
    (tests/gateway/test_public_urls.py has the allowed hosts)."""
    with gw.client(key.key) as c:
        r = c.post(
            "/v1/images/generations",
            json={"model": GPT_IMAGE, "prompt": "a cloud"},
            headers={"host": "images.example.test:8443"},
        )
    assert r.json()["data"][0]["url"].startswith(gw.url + FILES)


# ---------------------------------------------------------------- a gateway whose URLs live two seconds

TTL = 2.0


@pytest.fixture(scope="module")
def short(sim_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    models = chat_model(GPT_IMAGE, "gpt-image-1", sim_url, type_="image")
    tmp: Path = tmp_path_factory.mktemp("images-short")
    with gateway(
        tmp, models, f"image_url_ttl_seconds = {TTL}", 'public_base_url = "https://img.example.test/"'
    ) as g:
        yield g


def short_url(g: Gateway, url: str) -> str:
    """The configured public base stands for this gateway (a proxy in front of it would map it)."""
    assert url.startswith("https://img.example.test/v1/images/files/")
    return url.replace("https://img.example.test", g.url)


def test_url_served_then_404_after_ttl_and_row_purged_on_access(short: Gateway) -> None:
    handle = short.new_key()
    with openai.OpenAI(base_url=short.openai_base, api_key=handle.key, max_retries=0) as c:
        result = c.images.generate(model=GPT_IMAGE, prompt="a comet")
    assert result.data is not None and result.data[0].url is not None
    url = short_url(short, result.data[0].url)
    token = url.rsplit("/", 1)[1]
    assert token in stored_tokens(short.db_path)  # committed before the URL was handed out
    assert fetch(url).status_code == 200
    time.sleep(TTL + 0.2)  # past the URL's time to live: the window the test is about
    r = fetch(url)
    assert r.status_code == 404
    assert (r.json()["error"]["code"], r.json()["error"]["type"]) == ("not_found", "not_found_error")
    assert token not in stored_tokens(short.db_path)


def test_expired_images_are_purged_without_access(short: Gateway) -> None:
    handle = short.new_key()
    with short.client(handle.key) as c:
        r = c.post("/v1/images/generations", json={"model": GPT_IMAGE, "prompt": "a moon", "n": 2})
    tokens = {d["url"].rsplit("/", 1)[1] for d in r.json()["data"]}
    assert tokens <= stored_tokens(short.db_path)
    deadline = time.monotonic() + TTL + 5  # the purge runs every TTL seconds here
    while tokens & stored_tokens(short.db_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not tokens & stored_tokens(short.db_path)


def test_an_image_left_to_the_model_is_held_at_the_dearest_variant_of_what_it_names() -> None:
    """dall-e-3's prices (config/demo.toml): a request that names its size but not its quality holds
    that size's dearest quality, not the dearest image of every size; one that names neither holds
    the dearest of all."""
    images = (
        ("1024x1792", Decimal("0.08")),
        ("1792x1024", Decimal("0.08")),
        ("1024x1024/hd", Decimal("0.08")),
        ("1024x1792/hd", Decimal("0.12")),
        ("1792x1024/hd", Decimal("0.12")),
    )
    prices = Prices(image=Decimal("0.04"), images=images)
    assert _dearest_variant(prices, "1024x1024", None) == ("1024x1024", "hd")
    assert _dearest_variant(prices, "1024x1792", None) == ("1024x1792", "hd")
    assert _dearest_variant(prices, None, "standard") == ("1024x1792", "standard")
    assert _dearest_variant(prices, None, None) in {("1024x1792", "hd"), ("1792x1024", "hd")}
    assert _dearest_variant(Prices(image=Decimal("0.04")), "1024x1024", None) == ("1024x1024", None)


def test_an_edit_without_a_size_is_held_at_its_source_images_size(gw: Gateway) -> None:
    """Left to the model, an edit's output may follow its source image: one whose header says
    16000x16000 holds 245 times a 1024x1024 image's output, and a small balance cannot pay it
    (hostile review: it was held as 1024x1024 and charged $16 on a $1 balance). Past 16384 a side
    the image is refused (test_bad_edits_are_invalid_request)."""
    handle = gw.new_key(balance="1")
    huge = PNG[:16] + (16000).to_bytes(4, "big") + (16000).to_bytes(4, "big") + PNG[24:]
    with gw.client(handle.key) as c:
        refused = c.post(
            "/v1/images/edits",
            data={"model": GPT_IMAGE, "prompt": "a hat"},
            files={"image": ("big.png", huge, "image/png")},
        )
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "insufficient_credits", (
            refused.text
        )
        # The same image with a size named is held at that size.
        sized = c.post(
            "/v1/images/edits",
            data={"model": GPT_IMAGE, "prompt": "a hat", "size": "1024x1024"},
            files={"image": ("big.png", huge, "image/png")},
        )
    assert sized.status_code == 200, sized.text


def test_image_dimensions_come_from_the_headers() -> None:
    jpeg = (
        b"\xff\xd8\xff\xe0\x00\x10JFIF\x00"
        + bytes(9)
        + b"\xff\xc0\x00\x11\x08"
        + (123).to_bytes(2, "big")
        + (321).to_bytes(2, "big")
        + bytes(10)
    )
    riff = b"RIFF" + bytes(4) + b"WEBP"
    vp8x = riff + b"VP8X" + bytes(8) + (320).to_bytes(3, "little") + (122).to_bytes(3, "little")
    vp8l = riff + b"VP8L" + bytes(4) + b"\x2f" + (320 | 122 << 14).to_bytes(4, "little") + bytes(5)
    vp8 = (
        riff
        + b"VP8 "
        + bytes(7)
        + b"\x9d\x01\x2a"
        + (321).to_bytes(2, "little")
        + (123).to_bytes(2, "little")
    )
    for data in (png(321, 123, b"\x00\x00\x00"), jpeg, vp8x, vp8l, vp8):
        assert image_files.dimensions(data) == (321, 123), data[:16]
    assert image_files.dimensions(b"\x89PNG\r\n\x1a\n") is None
    assert image_files.dimensions(b"GIF89a" + bytes(20)) is None


@pytest.mark.parametrize("field", ["n", "size", "quality", "mask", "model", "prompt"])
def test_an_edit_field_given_twice_is_refused(gw: Gateway, key: KeyHandle, field: str) -> None:
    """The gateway holds and bills one copy of a field: an upstream that read the other would run
    another request than the one paid for (evasion review: n=5 in HD sent before n=1, held and
    charged as one standard image). Several `image` parts are several source images."""
    one = {"n": "1", "size": "1024x1024", "quality": "low", "model": GPT_IMAGE, "prompt": "p"}
    upload = ("m.png", PNG, "image/png")
    parts: list[tuple[str, Any]] = [
        ("image", ("a.png", PNG, "image/png")),
        ("image", ("b.png", PNG, "image/png")),
    ]
    parts += [(name, (None, value)) for name, value in one.items()]
    parts.append((field, upload if field == "mask" else (None, one[field])))
    if field == "mask":
        parts.append(("mask", upload))
    before = gw.balance(key.account_id)
    with gw.client(key.key) as c:
        r = c.post("/v1/images/edits", files=parts)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("invalid_request", field)
    assert gw.balance(key.account_id) == before
