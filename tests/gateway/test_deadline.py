"""`within` keeps asyncio.timeout's contract: each case below is run with both, and must end alike."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from gateway.deadline import within

Timer = Callable[[float], Any]


def _asyncio_timeout(seconds: float) -> Any:
    return asyncio.timeout(seconds)


async def _enter(timer: Timer, seconds: float, body: Callable[[], Awaitable[str]]) -> str:
    """`body` under `timer`, whichever kind of context manager it is."""
    manager = timer(seconds)
    if isinstance(manager, within):
        with manager:
            return await body()
    async with manager:
        return await body()


async def _outcome(timer: Timer, seconds: float, body: Callable[[], Awaitable[str]]) -> tuple[str, int]:
    """How the block ended, and the task's pending cancellations afterwards."""
    task = asyncio.current_task()
    assert task is not None
    try:
        result = await _enter(timer, seconds, body)
    except TimeoutError:
        result = "timeout"
    except asyncio.CancelledError:
        result = "cancelled"
        task.uncancel()
    return result, task.cancelling()


async def _in_time() -> str:
    await asyncio.sleep(0.001)
    return "done"


async def _too_long() -> str:
    await asyncio.sleep(10)
    return "done"


async def _swallows_and_finishes() -> str:
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(10)
    return "done"


def _cancelled_by_other(delay: float) -> Callable[[], Awaitable[str]]:
    async def body() -> str:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_later(delay, task.cancel)
        await asyncio.sleep(10)
        return "done"

    return body


CASES: dict[str, tuple[float, Callable[[], Awaitable[str]]]] = {
    "in time": (1.0, _in_time),
    "past the deadline": (0.01, _too_long),
    "the block swallows the cancellation": (0.01, _swallows_and_finishes),
    "cancelled by someone else first": (1.0, _cancelled_by_other(0.01)),
    "cancelled by someone else after the deadline": (0.01, _cancelled_by_other(0.0)),
}


@pytest.mark.parametrize("use_uvloop", [False, True], ids=["asyncio", "uvloop"])
@pytest.mark.parametrize("case", list(CASES))
def test_within_ends_as_asyncio_timeout_does(case: str, use_uvloop: bool) -> None:
    seconds, body = CASES[case]
    run = uvloop.run if use_uvloop else asyncio.run
    theirs = run(_outcome(_asyncio_timeout, seconds, body))
    ours = run(_outcome(within, seconds, body))
    assert ours == theirs, case


def test_within_nested_in_a_longer_timeout_is_the_one_that_fires() -> None:
    async def main() -> str:
        async with asyncio.timeout(5):
            try:
                with within(0.01):
                    await asyncio.sleep(10)
            except TimeoutError:
                return "inner"
        return "none"

    assert asyncio.run(main()) == "inner"


def test_within_outside_a_task_is_refused() -> None:
    with pytest.raises(RuntimeError), within(1):
        pass
