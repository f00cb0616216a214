"""Files through the translations: a chat `file` part or a Responses `input_file` reaching a messages
model (Claude) as a `document` block, a messages `document` reaching a chat model as a `file` part or
text, and the chat shape's files said to Bedrock (a Converse document) and Gemini (inline data); what
has no counterpart (a file kept upstream by id, a file by URL, a kind the model cannot read) is a 400
naming it. The official clients, the simulator checking each upstream's own rules."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import httpx
import openai
import pytest
from test_bedrock import MODEL as BEDROCK
from test_bedrock import bgw, converse_requests
from test_gemini import MODEL as GEMINI
from test_gemini import ggw
from test_gemini import sent as gemini_requests
from test_translation import CLAUDE, GPT, PNG_BASE64, marker

from harness import Gateway, KeyHandle, sim_requests

__all__ = ["bgw", "ggw"]  # the Bedrock and Gemini gateways, as fixtures here too

# A PDF of one page: what the gateway counts and the upstreams read (its bytes pass unchanged).
PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 612 792]>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"
)
PDF_BASE64 = base64.b64encode(PDF).decode()
PDF_URL = f"data:application/pdf;base64,{PDF_BASE64}"
NOTES = "Meeting notes: ship on Friday."
NOTES_URL = "data:text/plain;base64," + base64.b64encode(NOTES.encode()).decode()


@pytest.fixture
def oai(gw: Gateway, key: KeyHandle) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.openai_base, api_key=key.key, max_retries=0) as c:
        yield c


def test_chat_file_parts_reach_a_messages_model_as_documents(oai: openai.OpenAI, sim: httpx.Client) -> None:
    tag = marker()
    completion = oai.chat.completions.create(
        model=CLAUDE,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"Summarise these. {tag}"},
                    {"type": "file", "file": {"filename": "report.pdf", "file_data": PDF_URL}},
                    {"type": "file", "file": {"filename": "notes.txt", "file_data": NOTES_URL}},
                    {"type": "file", "file": {"file_data": PDF_BASE64}},  # bare base64: a PDF
                ],
            }
        ],
        max_completion_tokens=5,
    )
    assert completion.choices[0].message.content
    (received,) = sim_requests(sim, tag)
    assert received["messages"][0]["content"][1:] == [
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_BASE64},
            "title": "report.pdf",
        },
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": NOTES},
            "title": "notes.txt",
        },
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_BASE64},
        },
    ]


def test_text_files_of_other_types_reach_a_messages_model_as_text_documents(
    oai: openai.OpenAI, sim: httpx.Client
) -> None:
    """The family reads PDFs and plain text: a CSV, Markdown or JSON file is text, sent as a text
    document rather than refused."""
    tag = marker()
    files = {
        "t.csv": ("text/csv", "a,b\n1,2\n"),
        "r.md": ("text/markdown", "# Title\n"),
        "c.json": ("application/json", '{"a": 1}'),
    }
    parts: list[Any] = [
        {
            "type": "file",
            "file": {
                "filename": name,
                "file_data": f"data:{kind};base64," + base64.b64encode(text.encode()).decode(),
            },
        }
        for name, (kind, text) in files.items()
    ]
    oai.chat.completions.create(
        model=CLAUDE,
        messages=[{"role": "user", "content": [{"type": "text", "text": f"Read. {tag}"}, *parts]}],
        max_completion_tokens=5,
    )
    (received,) = sim_requests(sim, tag)
    assert received["messages"][0]["content"][1:] == [
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": text},
            "title": name,
        }
        for name, (_, text) in files.items()
    ]


def test_a_responses_input_file_reaches_claude_as_a_document_and_gpt_as_a_file(
    oai: openai.OpenAI, sim: httpx.Client
) -> None:
    for model in (CLAUDE, GPT):
        tag = marker()
        response = oai.responses.create(
            model=model,
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": f"What does it say? {tag}"},
                        {"type": "input_file", "filename": "report.pdf", "file_data": PDF_URL},
                    ],
                }
            ],
            max_output_tokens=16,
        )
        assert response.status == "completed" and response.output_text
        (received,) = sim_requests(sim, tag)
        part = received["messages"][-1]["content"][1]
        if model == CLAUDE:
            assert part == {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_BASE64},
                "title": "report.pdf",
            }
        else:
            assert part == {"type": "file", "file": {"file_data": PDF_URL, "filename": "report.pdf"}}


def test_messages_documents_reach_a_chat_model_as_a_file_and_text(
    gw: Gateway, key: KeyHandle, sim: httpx.Client
) -> None:
    tag = marker()
    with anthropic.Anthropic(base_url=gw.url, api_key=key.key, max_retries=0) as claude:
        message = claude.messages.create(
            model=GPT,
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_BASE64},
                            "title": "report.pdf",
                            "citations": {"enabled": True},
                        },
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": NOTES},
                        },
                        {
                            "type": "document",
                            "source": {
                                "type": "content",
                                "content": [
                                    {"type": "text", "text": "Slide 1"},
                                    {
                                        "type": "image",
                                        "source": {
                                            "type": "base64",
                                            "media_type": "image/png",
                                            "data": PNG_BASE64,
                                        },
                                    },
                                ],
                            },
                        },
                        {"type": "text", "text": f"Summarise. {tag}"},
                    ],
                }
            ],
        )
    assert message.content[0].type == "text"
    (received,) = sim_requests(sim, tag)
    assert received["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "file", "file": {"filename": "report.pdf", "file_data": PDF_URL}},
                {"type": "text", "text": NOTES},
                {"type": "text", "text": "Slide 1"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_BASE64}"}},
                {"type": "text", "text": f"Summarise. {tag}"},
            ],
        }
    ]


def test_a_pdf_is_held_and_billed_as_pages_through_the_translation(
    gw: Gateway, key: KeyHandle, oai: openai.OpenAI
) -> None:
    """The file is counted as a PDF on the way in (the hold) and the upstream's count bills it: the
    simulator counts the document as the gateway does, so the prompt's tokens are the file's pages."""
    plain = oai.chat.completions.create(
        model=CLAUDE, messages=[{"role": "user", "content": "Read it."}], max_completion_tokens=3
    )
    with_file = oai.chat.completions.create(
        model=CLAUDE,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Read it."},
                    {"type": "file", "file": {"filename": "a.pdf", "file_data": PDF_URL}},
                ],
            }
        ],
        max_completion_tokens=3,
    )
    assert plain.usage is not None and with_file.usage is not None
    assert with_file.usage.prompt_tokens > plain.usage.prompt_tokens + 1000  # a page's text and image


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {
                "model": CLAUDE,
                "messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-1"}}]}],
            },
            "messages[0].content[0].file.file_id",
        ),
        (
            "/v1/chat/completions",
            {
                "model": CLAUDE,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "file", "file": {"file_data": f"data:image/png;base64,{PNG_BASE64}"}}
                        ],
                    }
                ],
            },
            "messages[0].content[0].file.file_data",
        ),
        (
            "/v1/chat/completions",
            {
                "model": CLAUDE,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "file", "file": {"file_data": "data:text/plain;base64,/w=="}}],
                    }
                ],
            },
            "messages[0].content[0].file.file_data",
        ),
        (
            "/v1/messages",
            {
                "model": GPT,
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {"type": "url", "url": "https://example.com/a.pdf"},
                            }
                        ],
                    }
                ],
            },
            "messages[0].content[0].source",
        ),
        (
            "/v1/responses",
            {
                "model": CLAUDE,
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_file", "file_url": "https://example.com/a.pdf"}],
                    }
                ],
            },
            "input[0].content[0]",
        ),
        (
            "/v1/responses",
            {
                "model": CLAUDE,
                "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}],
            },
            "input",  # refused in the second translation (chat to messages): its place is the input
        ),
    ],
)
def test_files_without_a_counterpart_are_400(
    gw: Gateway, path: str, body: dict[str, Any], param: str
) -> None:
    key = gw.new_key(balance="0.000001")  # too little for any hold: the 400 comes first
    with gw.client(key.key) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and error["param"] == param, error
    assert gw.balance(key.account_id) == Decimal("0.000001")


FILE_PARTS: list[Any] = [
    {"type": "file", "file": {"filename": "Q3 report (final).pdf", "file_data": PDF_URL}},
    {"type": "file", "file": {"filename": "notes.txt", "file_data": NOTES_URL}},
]


def ask_with_files(gw: Gateway, model: str) -> str:
    """A chat request holding FILE_PARTS to `model`, answered; the tag its upstream's request has."""
    handle = gw.new_key(balance="5")
    tag = marker()
    with openai.OpenAI(api_key=handle.key, base_url=gw.url + "/v1", max_retries=0) as oai:
        answer = oai.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": [{"type": "text", "text": f"Read. {tag}"}, *FILE_PARTS]}],
            max_tokens=5,
        )
    assert answer.choices[0].message.content
    return tag


def test_files_said_to_bedrock_as_converse_documents(bgw: Gateway, sim: httpx.Client) -> None:
    (entry,) = converse_requests(sim, ask_with_files(bgw, BEDROCK))
    assert entry["body"]["messages"][0]["content"][1:] == [
        {"document": {"name": "Q3 report (final) pdf", "format": "pdf", "source": {"bytes": PDF_BASE64}}},
        {"document": {"name": "notes txt", "format": "txt", "source": {"bytes": NOTES_URL.split(",")[1]}}},
    ]


def test_files_said_to_gemini_as_inline_data(ggw: Gateway, sim: httpx.Client) -> None:
    entry = gemini_requests(sim, ask_with_files(ggw, GEMINI))
    assert entry["body"]["contents"][0]["parts"][1:] == [
        {"inlineData": {"mimeType": "application/pdf", "data": PDF_BASE64}},
        {"text": NOTES},
    ]


@pytest.mark.parametrize("model", [BEDROCK, GEMINI])
def test_a_file_bedrock_or_gemini_cannot_read_is_refused_before_the_hold(
    bgw: Gateway, ggw: Gateway, model: str
) -> None:
    """Checked before the hold, as a messages model's request is: a key with too little money for
    the file as the hold would count it (an unseen file: its most) still hears why (review: it heard
    key_budget_exceeded); a Responses or Messages request hears of its own field."""
    gw = bgw if model == BEDROCK else ggw
    key = gw.new_key(balance="0.000001")
    by_id = {"type": "file", "file": {"file_id": "file-1"}}
    cases: list[tuple[str, dict[str, Any], str]] = [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [by_id]}]},
            "messages[0].content[0].file.file_id",
        ),
        (
            "/v1/responses",
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
            "input",
        ),
        (
            "/v1/messages",
            {
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {
                                    "type": "content",
                                    "content": [
                                        {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
                                    ],
                                },
                            }
                        ],
                    }
                ],
            },
            "messages",
        ),
    ]
    with gw.client(key.key) as c:
        for path, body, param in cases:
            r = c.post(path, json={"model": model, **body})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert (error["code"], error["param"]) == ("invalid_request", param), (path, error)
            assert "`messages[" not in error["message"] or path == "/v1/chat/completions", error
    assert gw.balance(key.account_id) == Decimal("0.000001")


def test_converse_document_names_are_unique_and_short_and_never_alone(
    bgw: Gateway, sim: httpx.Client
) -> None:
    """Converse refuses a document name twice, one over 200 characters, and documents without a
    text block in their message (review)."""
    handle = bgw.new_key(balance="5")
    untitled: Any = {"type": "file", "file": {"file_data": PDF_URL}}
    long_name: Any = {"type": "file", "file": {"filename": "x" * 300 + ".pdf", "file_data": PDF_URL}}
    with openai.OpenAI(api_key=handle.key, base_url=bgw.url + "/v1", max_retries=0) as oai:
        tag = marker()
        oai.chat.completions.create(
            model=BEDROCK,
            messages=[
                {"role": "user", "content": [untitled, untitled, long_name]},
                {"role": "assistant", "content": "Read."},
                {"role": "user", "content": [untitled, {"type": "text", "text": f"And? {tag}"}]},
            ],
            max_tokens=5,
        )
    (entry,) = converse_requests(sim, tag)
    first, _, last = entry["body"]["messages"]
    names = [b["document"]["name"] for turn in (first, last) for b in turn["content"] if "document" in b]
    assert names[:2] == ["document", "document (2)"] and names[3] == "document (3)"
    assert len(names[2]) <= 200 and len(set(names)) == 4
    assert first["content"][-1] == {"text": "(see the attached document)"}  # documents alone: a text too
    assert [b for b in last["content"] if "text" in b] == [{"text": f"And? {tag}"}]


def test_files_given_as_data_are_read_as_their_data_url_says(oai: openai.OpenAI, sim: httpx.Client) -> None:
    """A data: URL not in base64 (percent-encoded), and a text's charset, are read as they say; an
    empty file or one that is not base64 is a 400 (review: they reached the model as a PDF)."""
    tag = marker()
    latin = "data:text/plain;charset=iso-8859-1;base64," + base64.b64encode("café".encode("latin-1")).decode()
    oai.chat.completions.create(
        model=CLAUDE,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"Read. {tag}"},
                    {"type": "file", "file": {"file_data": "data:text/plain,hello%20there"}},
                    {"type": "file", "file": {"file_data": latin}},
                ],
            }
        ],
        max_completion_tokens=3,
    )
    (received,) = sim_requests(sim, tag)
    sources = [b["source"] for b in received["messages"][0]["content"][1:]]
    assert [s["data"] for s in sources] == ["hello there", "café"]
    for bad in (
        "data:application/pdf;base64,",
        "data:text/plain;base64,",
        "data:application/pdf;base64,@@@",
        "@@@",
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            oai.chat.completions.create(
                model=CLAUDE,
                messages=[{"role": "user", "content": [{"type": "file", "file": {"file_data": bad}}]}],
            )
        body = refused.value.body
        assert isinstance(body, dict) and body["param"] == "messages[0].content[0].file.file_data", bad


def test_a_responses_text_file_reaches_a_chat_model_as_text(oai: openai.OpenAI, sim: httpx.Client) -> None:
    """The chat shape's file parts are PDFs (OpenAI refuses another kind there): a text file is
    said as its text (review)."""
    tag = marker()
    csv = "data:text/csv;base64," + base64.b64encode(b"a,b\n1,2\n").decode()
    oai.responses.create(
        model=GPT,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": f"Sum. {tag}"},
                    {"type": "input_file", "filename": "t.csv", "file_data": csv},
                ],
            }
        ],
    )
    (received,) = sim_requests(sim, tag)
    assert received["messages"][-1]["content"][1] == {"type": "text", "text": "a,b\n1,2\n"}


def test_count_tokens_refuses_what_the_messages_endpoint_would(gw: Gateway, key: KeyHandle) -> None:
    """A document a chat model cannot be sent (a URL) is a 400 when counted too, as when sent
    (review: it was counted as an unseen file); one it can is counted."""
    by_url = {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}
    as_pdf = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_BASE64},
    }
    with gw.client(key.key) as c:
        refused = c.post(
            "/v1/messages/count_tokens",
            json={"model": GPT, "messages": [{"role": "user", "content": [by_url]}]},
        )
        counted = c.post(
            "/v1/messages/count_tokens",
            json={"model": GPT, "messages": [{"role": "user", "content": [as_pdf]}]},
        )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages[0].content[0].source"
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 1000
