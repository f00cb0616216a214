"""The third-party Python clients people point at gateways (LangChain, LiteLLM's SDK, the OpenAI Agents
SDK), unmodified, with only the gateway's base address and key: tools plain and streamed, structured
output, the Responses API, Messages (also translated to a chat model), embeddings, rerank, images and
an agent's tool loop (tests/clients/python_clients.py, in a process of its own). What each library
reported as a request's usage is what the gateway recorded for it (/v1/usage)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import Gateway, KeyHandle, eventually

SCRIPT = Path(__file__).resolve().parents[1] / "clients" / "python_clients.py"
CHECKS = (
    "langchain ChatOpenAI tools",
    "langchain ChatOpenAI tools streamed",
    "langchain ChatOpenAI responses api tools",
    "langchain ChatOpenAI responses api streamed",
    "langchain ChatOpenAI structured output",
    "langchain ChatAnthropic tools",
    "langchain ChatAnthropic tools streamed",
    "langchain ChatAnthropic on a chat model",
    "langchain OpenAIEmbeddings",
    "litellm completion tools",
    "litellm completion streamed",
    "litellm acompletion anthropic provider",
    "litellm embedding, rerank and image generation",
    "agents responses model",
    "agents responses model streamed",
    "agents chat completions model",
    "agents chat completions model streamed on a messages model",
)


def test_third_party_python_clients(gw: Gateway, key: KeyHandle) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), gw.url, key.key],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    failed = [f"{r['name']}:\n{r['detail']}" for r in results if not r["ok"]]
    assert not failed, "\n\n".join(failed) + "\n" + run.stderr[-2000:]
    assert run.returncode == 0, run.stderr[-2000:]
    assert [r["name"] for r in results] == list(CHECKS)

    requests = [request for r in results for request in r["requests"]]
    assert len(requests) >= 8  # chat, responses and messages answers whose ids the libraries show
    with gw.client(key.key) as client:
        for body_id, prompt, completion in requests:

            def recorded(body_id: str = body_id) -> dict[str, int] | None:
                answer = client.get(f"/v1/usage/{body_id}")
                return answer.json()["usage"] if answer.status_code == 200 else None

            usage = eventually(recorded, what=f"the usage record {body_id}")
            assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt, completion), body_id
