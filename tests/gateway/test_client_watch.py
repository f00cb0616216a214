"""ClientWatch in-process, for both kinds of `receive` a server hands the app: Granian's, which
returns a future it resolves itself, and a coroutine function's (Starlette's test client, the
console's in-process calls). The whole path, on Granian, is in test_client_leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from starlette.requests import Request

from gateway.routes.common import ClientWatch, read_body

Message = dict[str, Any]


class FutureReceive:
    """Like Granian's: each call is a future; the test resolves them."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[Message]] = []

    def __call__(self) -> asyncio.Future[Message]:
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        return future


def coroutine_receive(messages: asyncio.Queue[Message]) -> Callable[[], Awaitable[Message]]:
    async def receive() -> Message:
        return await messages.get()

    return receive


async def _watched(receive: Any, body: Callable[[ClientWatch], Awaitable[None]]) -> ClientWatch:
    watch: ClientWatch | None = None

    async def request() -> None:
        nonlocal watch
        watch = ClientWatch(receive)
        try:
            await body(watch)
        except asyncio.CancelledError:
            assert watch.cancelled_for_client()
        finally:
            watch.stop()

    await asyncio.create_task(request())
    assert watch is not None
    return watch


def test_a_disconnect_from_a_future_receive_cancels_the_request() -> None:
    async def go() -> None:
        receive = FutureReceive()

        async def body(watch: ClientWatch) -> None:
            await asyncio.sleep(0)  # the request's first wait arms the watch
            receive.pending[0].set_result({"type": "http.disconnect"})
            await asyncio.sleep(10)  # cancelled at once

        watch = await asyncio.wait_for(_watched(receive, body), 5)
        assert watch.left

    asyncio.run(go())


def test_the_watch_is_armed_at_the_request_s_first_wait_and_never_without_one() -> None:
    """Arming sets Granian's thread to work on the request's core: not before the request waits
    (for the upstream, its request already written), and not at all for one that never waits."""

    async def go() -> None:
        receive = FutureReceive()

        async def works_then_waits(watch: ClientWatch) -> None:
            assert receive.pending == []  # made, not armed
            await asyncio.sleep(0)
            assert len(receive.pending) == 1

        await _watched(receive, works_then_waits)

        never = FutureReceive()

        async def never_waits(watch: ClientWatch) -> None:
            pass

        await _watched(never, never_waits)
        await asyncio.sleep(0)  # past the turn the watch would have been armed in
        assert never.pending == []

    asyncio.run(go())


def test_another_message_rearms_and_a_stopped_watch_ignores_the_disconnect() -> None:
    async def go() -> None:
        receive = FutureReceive()

        async def body(watch: ClientWatch) -> None:
            await asyncio.sleep(0)  # armed
            receive.pending[0].set_result({"type": "http.request", "body": b"", "more_body": False})
            await asyncio.sleep(0)
            assert len(receive.pending) == 2  # armed again

        watch = await _watched(receive, body)
        # The answer has gone out: the server resolves the pending receive, as Granian does.
        assert not receive.pending[1].done()  # left to the server, not cancelled
        receive.pending[1].set_result({"type": "http.disconnect"})
        await asyncio.sleep(0)
        assert not watch.left

    asyncio.run(go())


@pytest.mark.parametrize("leaves", [True, False])
def test_a_coroutine_receive_is_watched_in_a_task(leaves: bool) -> None:
    async def go() -> None:
        messages: asyncio.Queue[Message] = asyncio.Queue()

        async def body(watch: ClientWatch) -> None:
            if leaves:
                messages.put_nowait({"type": "http.disconnect"})
                await asyncio.sleep(10)  # armed at this wait, then cancelled at once
            else:
                await asyncio.sleep(0)

        watch = await asyncio.wait_for(_watched(coroutine_receive(messages), body), 5)
        assert watch.left is leaves

    asyncio.run(go())


@pytest.mark.parametrize("declared", [True, False])
def test_a_body_as_long_as_its_content_length_does_not_wait_for_the_closing_message(
    declared: bool,
) -> None:
    """Granian sends a body's bytes with more_body, then an empty closing message across threads:
    with a content-length, read_body returns at the bytes and leaves that message to the watch."""

    async def go() -> None:
        receive = FutureReceive()
        headers = [(b"content-length", b"7")] if declared else []
        request = Request({"type": "http", "method": "POST", "headers": headers}, receive)
        reading = asyncio.ensure_future(read_body(request, 100))
        await asyncio.sleep(0)
        receive.pending[0].set_result({"type": "http.request", "body": b'{"a":1}', "more_body": True})
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert reading.done() is declared
        if not declared:
            receive.pending[1].set_result({"type": "http.request", "body": b"", "more_body": False})
        assert await reading == b'{"a":1}'

    asyncio.run(go())
