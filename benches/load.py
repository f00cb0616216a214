"""Load generation: wrk (a C load generator, not a Python loop) for throughput and latency, and a
small streaming client for time to first token and the gap between chunks."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

LUA = """
wrk.method = "POST"
wrk.body = {body}
{headers}
done = function(summary, latency, requests)
  io.write(string.format('RESULT {{"requests":%d,"duration_us":%d,"p50":%d,"p90":%d,"p99":%d,"non2xx":%d,"errors":%d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


# Chat workloads answered whole (the rest stream); chat_keys is chat spread over many keys.
NOT_STREAMED = frozenset({"chat", "chat_keys", "chat_limited", "chat_prompt"})

# The chat_prompt workload's conversation (about 4 KB): a system prompt, two earlier turns and a
# question, in the prose and code a deployment's prompts hold.
_SYSTEM = (
    "You are a support assistant for a logistics company. Answer in plain English, cite the order"
    " number when there is one, never promise a delivery date the tracking data does not show, and"
    " hand the conversation to a person when the customer asks for a refund above 500 dollars. "
) * 8
_EARLIER = [
    (
        "user",
        "Hi, my order 48213-B was supposed to arrive on Tuesday but the tracking page has"
        " not moved since Monday morning. It says 'in transit, Rotterdam hub'. What is going on?",
    ),
    (
        "assistant",
        "Thanks for the order number. Order 48213-B left the Rotterdam hub on Monday at"
        " 09:14 and is now on a truck to the regional depot; scans resume when it is unloaded there,"
        " usually within 24 to 36 hours. I can see no exception on the shipment. Would you like me to"
        " set up a notification for the next scan?",
    ),
    (
        "user",
        "Yes please. Also, our integration pulls tracking events with this code and it has"
        " been failing since yesterday:\n\n```python\nimport requests\n\ndef events(order_id):\n"
        "    r = requests.get(f'https://api.example.com/v2/orders/{order_id}/events', timeout=10)\n"
        "    r.raise_for_status()\n    return [e for e in r.json()['events'] if e['type'] != 'noop']\n"
        "```\n\nIt raises KeyError: 'events'. Did the API change?",
    ),
    (
        "assistant",
        'The v2 API now pages its results: the body is {"data": [...], "next": ...}.'
        " Read r.json()['data'] and follow 'next' until it is null. The old field name was kept for"
        " a transition period that ended on the 1st.",
    ),
]
_QUESTION = (
    "Got it, thanks. Can you rewrite the function so that it follows the pages, retries twice on a"
    " 503 with a short backoff, and returns the events oldest first? Keep it dependency-free apart"
    " from requests, and add a docstring."
)

# With keys to spread the requests over, each request takes the next (wrk builds it per request).
ROTATE_KEYS = """
local keys = {{{keys}}}
local sent = 0
request = function()
  sent = sent + 1
  wrk.headers["authorization"] = "Bearer " .. keys[sent % #keys + 1]
  return wrk.format()
end
"""


@dataclass
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    failures: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def body(workload: str, model: str) -> bytes:
    """The request every path is sent for `workload` (its model name is the path's own)."""
    payload: dict[str, Any]
    if workload == "embeddings":
        payload = {"model": model, "input": "Say something.", "encoding_format": "float"}
    elif workload == "chat_prompt":
        messages = [{"role": "system", "content": _SYSTEM}]
        messages += [{"role": role, "content": text} for role, text in _EARLIER]
        messages.append({"role": "user", "content": _QUESTION})
        payload = {"model": model, "messages": messages}
    else:
        payload = {"model": model, "messages": [{"role": "user", "content": "Say something."}]}
        if workload not in NOT_STREAMED:
            payload["stream"] = True
    return json.dumps(payload).encode()


def _lua_string(text: str) -> str:
    return "[==[" + text + "]==]"


def wrk(
    url: str,
    body: bytes,
    headers: dict[str, str],
    connections: int,
    seconds: float,
    cpu: str,
    keys: Sequence[str] = (),
) -> WrkResult:
    """wrk's figures for `seconds` of POSTs of `body` over `connections` connections; with `keys`,
    each request is authorized by the next of them in turn."""
    header_lines = "\n".join(
        f"wrk.headers[ {_lua_string(k)} ] = {_lua_string(v)}" for k, v in headers.items()
    )
    if keys:
        header_lines += ROTATE_KEYS.format(keys=", ".join(_lua_string(k) for k in keys))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(LUA.format(body=_lua_string(body.decode()), headers=header_lines))
    try:
        out = subprocess.run(
            [
                "taskset",
                "-c",
                cpu,
                "wrk",
                "-t1",
                f"-c{connections}",
                f"-d{seconds:g}s",
                "--timeout",
                "30s",
                "-s",
                script.name,
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=seconds + 60,
        ).stdout
    finally:
        Path(script.name).unlink()
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    data = json.loads(line.removeprefix("RESULT "))
    return WrkResult(
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        p50_ms=data["p50"] / 1000,
        p90_ms=data["p90"] / 1000,
        p99_ms=data["p99"] / 1000,
        failures=data["non2xx"] + data["errors"],
    )


class StreamFailed(Exception):
    pass


@dataclass
class StreamTiming:
    ttft_p50_ms: float  # to the first bytes of the body
    first_token_p50_ms: float  # to the first chunk carrying content (not the role-only first chunk)
    chunk_gap_p50_us: float
    chunk_gap_p99_us: float
    chunks: int


def has_content(buffer: bytes) -> bool:
    """Whether the SSE bytes read so far hold a chat chunk whose delta has content."""
    for line in buffer.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        try:
            choices = json.loads(line[6:]).get("choices") or [{}]
        except ValueError:
            continue  # the line is not whole yet
        if (choices[0].get("delta") or {}).get("content"):
            return True
    return False


async def _stream_timing(url: str, body: bytes, headers: dict[str, str], count: int) -> StreamTiming:
    ttfts: list[float] = []
    first_tokens: list[float] = []
    gaps: list[float] = []
    chunks = 0
    async with aiohttp.ClientSession() as session:
        for i in range(count + 5):
            start = time.perf_counter()
            last = None
            seen = b""
            token_at: float | None = None
            n = 0
            async with session.post(url, data=body, headers=headers) as response:
                if response.status != 200:
                    text = (await response.read())[:200].decode(errors="replace")
                    raise StreamFailed(f"the server answered {response.status}: {text}")
                async for chunk in response.content.iter_any():
                    now = time.perf_counter()
                    if token_at is None:
                        seen += chunk
                        if has_content(seen):
                            token_at = now
                    if last is None:
                        if i >= 5:  # the first streams warm up
                            ttfts.append(now - start)
                    elif i >= 5:
                        gaps.append(now - last)
                    last = now
                    n += 1
            if i >= 5 and token_at is not None:
                first_tokens.append(token_at - start)
            chunks = max(chunks, n)
    gaps.sort()
    return StreamTiming(
        ttft_p50_ms=statistics.median(ttfts) * 1000,
        first_token_p50_ms=statistics.median(first_tokens) * 1000 if first_tokens else 0.0,
        chunk_gap_p50_us=statistics.median(gaps) * 1e6 if gaps else 0.0,
        chunk_gap_p99_us=gaps[int(len(gaps) * 0.99)] * 1e6 if gaps else 0.0,
        chunks=chunks,
    )


def stream_timing(url: str, body: bytes, headers: dict[str, str], count: int = 30) -> StreamTiming:
    """One stream at a time: time to the first bytes of the body and to the first content token
    (the fair comparison: a gateway holds its first bytes back until the first token, spec 6.1.7,
    while the upstream sends a role-only chunk first), and the median gap between reads."""
    return asyncio.run(_stream_timing(url, body, headers, count))
