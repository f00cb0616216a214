"""Money leased by one worker and not used is no reason for another to refuse (gateway.funds: the
recall), through `gateway serve` with two workers on the embedded store."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from gateway.config import load_settings
from harness import chat_model, free_port, new_key, query, running

pytestmark = pytest.mark.slow


def test_a_balance_leased_by_one_worker_serves_a_burst_on_both(tmp_path: Path, sim_url: str) -> None:
    """One request leases the balance's first share to whichever worker takes it (half of it: two
    workers); at once a burst whose holds come to 99 % of the balance arrives on both workers. The
    worker that runs short recalls the other's unused lease and every request is answered."""
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[server]\nport = {port}\nworkers = 2\n[store]\npath = "{tmp_path / "gw.db"}"\n'
        + chat_model("test/slow", "sim-chat+tokens=3+ttft=1500ms", sim_url)
        + chat_model("test/fast", "sim-chat+tokens=3", sim_url)
    )
    settings = load_settings(config)
    key, broke = new_key(settings, Decimal(1)), new_key(settings, Decimal(0))
    url = f"http://127.0.0.1:{port}"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000}
    headers = {"authorization": f"Bearer {key.key}"}

    async def burst() -> tuple[Decimal, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
            first = await client.post("/v1/chat/completions", json={**body, "model": "test/fast"})
            assert first.status_code == 200, first.text
            # What one hold of this request is: the refusal of a key without money says.
            probe = await client.post(
                "/v1/chat/completions",
                json={**body, "model": "test/slow"},
                headers={"authorization": f"Bearer {broke.key}"},
            )
            assert probe.status_code == 400 and probe.json()["error"]["code"] == "insufficient_credits"
            most = re.search(r"may cost up to \$([0-9.]+)", probe.json()["error"]["message"])
            assert most is not None, probe.text
            hold = Decimal(most.group(1))
            count = int(Decimal("0.99") / hold)
            async with httpx.AsyncClient(
                base_url=url, headers=headers, timeout=60, limits=httpx.Limits(max_connections=count)
            ) as many:
                answers = await asyncio.gather(
                    *(
                        many.post("/v1/chat/completions", json={**body, "model": "test/slow"})
                        for _ in range(count)
                    )
                )
            return hold, answers

    with running(["serve", "--config", str(config)], port):
        hold, answers = asyncio.run(burst())
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {200: len(answers)}, [a.text for a in answers if a.status_code != 200][:3]
    assert len(answers) * hold <= Decimal("0.99")
    [(balance,)] = query(settings, "SELECT balance FROM accounts WHERE id = ?", key.account_id)
    assert Decimal(str(balance)) > 0
