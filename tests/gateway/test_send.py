"""providers.base.send on real sockets: which failures a request that must not reach an upstream twice
(a job creation) may be retried after: only those before the request was sent."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import Settings
from gateway.errors import GatewayError
from gateway.providers.base import send
from gateway.providers.http import UpstreamClient
from harness import free_port


async def _send_to(port: int, replayable: bool) -> GatewayError:
    client = UpstreamClient(Settings(models=()))
    await client.start()
    try:
        with pytest.raises(GatewayError) as caught:
            await send(
                client,
                f"http://127.0.0.1:{port}/v1/videos",
                b'{"model": "m"}',
                {"content-type": "application/json"},
                stream=False,
                read_timeout=5,
                replayable=replayable,
            )
        return caught.value
    finally:
        await client.close()


async def _hang_up_after_reading(replayable: bool) -> tuple[GatewayError, int]:
    """An upstream that reads the whole request, then closes without answering."""
    received = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal received
        received += len(await reader.readuntil(b"\r\n\r\n"))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        err = await _send_to(port, replayable)
    return err, received


@pytest.mark.parametrize(("replayable", "retry"), [(True, "any"), (False, "never")])
def test_a_request_cut_off_after_it_was_sent(replayable: bool, retry: str) -> None:
    err, received = asyncio.run(_hang_up_after_reading(replayable))
    assert received > 0 and err.code == "provider_error" and err.retry == retry


@pytest.mark.parametrize("replayable", [True, False])
def test_a_refused_connection_may_always_be_retried(replayable: bool) -> None:
    err = asyncio.run(_send_to(free_port(), replayable))
    assert err.code == "provider_error" and err.retry == "any"
