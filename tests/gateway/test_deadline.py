"""`within` keeps asyncio.timeout's contract: each case below is run with both, and must end alike."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from gateway import deadline
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


@pytest.mark.parametrize("use_uvloop", [False, True], ids=["asyncio", "uvloop"])
def test_blocks_of_one_length_share_a_timer_yet_each_ends_at_its_own_time(use_uvloop: bool) -> None:
    """Blocks of one length share one timer (gateway.deadline._Deadlines): one that ends in time
    leaves the others' deadlines as they were, and each later one times out when its own time is up,
    not at the deadline of the one begun before it."""
    seconds = 0.2

    async def block(start_after: float, body_seconds: float) -> tuple[str, float]:
        await asyncio.sleep(start_after)
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            with within(seconds):
                await asyncio.sleep(body_seconds)
            return "done", loop.time() - began
        except TimeoutError:
            return "timeout", loop.time() - began

    async def main() -> list[tuple[str, float]]:
        outcomes = await asyncio.gather(
            block(0.0, 0.02),  # ends in time: the shared timer's first deadline is gone
            block(0.05, 10),  # times out at its own deadline, 0.05 s after the first one's
            block(0.1, 0.15),  # ends in time, with the second still running
            block(0.12, 10),
        )
        return list(outcomes)

    run = uvloop.run if use_uvloop else asyncio.run
    outcomes = run(main())
    assert [what for what, _ in outcomes] == ["done", "timeout", "done", "timeout"]
    for what, took in outcomes:
        if what == "timeout":
            # uvloop's clock counts whole milliseconds: 0.2 s may read as 0.19999.
            assert seconds - 0.005 <= took < seconds + 0.15, outcomes


def test_a_block_begun_on_one_loop_ends_on_it_after_another_loop_ran() -> None:
    """A thread may run one loop, then another, then the first again: a block keeps its own loop's
    timer, whatever loop the thread ran meanwhile."""
    first = asyncio.new_event_loop()
    try:

        async def long_block() -> str:
            try:
                with within(0.1):
                    await asyncio.sleep(10)
            except TimeoutError:
                return "timeout"
            return "done"

        task = first.create_task(long_block())
        first.run_until_complete(asyncio.sleep(0))  # the block has begun
        assert asyncio.run(_outcome(within, 0.01, _too_long)) == ("timeout", 0)
        assert first.run_until_complete(task) == "timeout"
    finally:
        first.close()


def test_blocks_of_ever_new_lengths_do_not_grow_the_groups_for_ever() -> None:
    """Each length has its group; groups with no block running go once there are many, while a
    running block keeps its own and still times out."""

    async def main() -> str:
        try:
            with within(0.3):  # stays running across the churn below
                for i in range(5 * deadline.MAX_IDLE_GROUPS):
                    with within(10 + i / 1000):
                        pass
                assert len(deadline._deadlines.groups) <= deadline.MAX_IDLE_GROUPS + 1
                await asyncio.sleep(10)
        except TimeoutError:
            return "timeout"
        return "done"

    assert asyncio.run(main()) == "timeout"
