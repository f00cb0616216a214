"""A strict third-party client in the suite: the Vercel AI SDK (npm `ai`, `@ai-sdk/openai`,
`@ai-sdk/anthropic`; pinned in tests/js/package-lock.json, installed by `make test`) against the
gateway and the simulator, on chat completions, responses and messages: plain and streamed text,
structured output (both translation directions too), a mid-stream error and an error answer; and
on a chat model through the responses API, a tool loop and later turns with the SDK's defaults;
and generateImage.
The SDK validates every answer and every streamed chunk against its own schemas."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import Gateway, KeyHandle

JS = Path(__file__).resolve().parents[1] / "js"
SCRIPT = JS / "ai_sdk_clients.mjs"


def test_the_ai_sdk_on_every_text_shape(gw: Gateway, key: KeyHandle) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip(
            "node is not installed: the AI SDK test needs Node.js 20+ (and `npm ci --prefix tests/js`)"
        )
    if not (JS / "node_modules" / "ai").is_dir():
        pytest.fail("tests/js/node_modules is missing: run `make test` or `npm ci --prefix tests/js`")
    run = subprocess.run(
        [node, str(SCRIPT), gw.url, key.key], cwd=JS, capture_output=True, text=True, timeout=240, check=False
    )
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    names = {r["name"] for r in results}
    failed = [f"{r['name']}: {r['detail']}" for r in results if not r["ok"]]
    assert not failed, "\n\n".join(failed) + "\n" + run.stderr[-2000:]
    assert run.returncode == 0, run.stderr[-2000:]
    for shape in ("chat", "chat->claude", "responses", "responses->gpt", "messages", "messages->gpt"):
        for kind in ("generateText", "streamText", "generateObject", "streamObject"):
            assert f"{shape} {kind}" in names
    for shape in ("chat", "responses", "responses->gpt", "messages", "messages->gpt"):
        assert f"{shape} mid-stream error" in names
    assert "messages error body" in names
    assert {"messages at the root generateText", "messages at the root streamText"} <= names
    assert {"responses tool loop and next turn", "responses->gpt tool loop and next turn"} <= names
    for kind in (
        "generateText",
        "streamText",
        "generateObject",
        "streamObject",
        "mid-stream error",
        "tool loop and next turn",
    ):
        assert f"responses->claude {kind}" in names
    assert {"images openai/dall-e-3 generateImage", "images openai/gpt-image-1 generateImage"} <= names
